"""SAC, TD3, FastSAC and FlashSAC learn cartpole-balance through the real off-policy runtime.

Each test calls `hetlab.train.launch.train` in-process, so everything a real run uses takes part: the
spawned transition collector, the shared-memory replay buffer with its commit handshake, the
sample-before-transfer stager with its n-step returns and bootstrap factors, the update-to-data
ratio kept from both sides, and the weight broadcast back to the collector's actor copy.

cartpole-balance: 1 continuous action, reward ≈ 1 per step the pole stays up, episodes of at most
500 steps; a uniform-random policy (the warm-up's) keeps it up for ≈ 25–35 steps.

Budgets are iterations, never wall time: the collectors keep the update-to-data ratio (at most
`lead` env steps ahead of the learner's updates), so an iteration — horizon × updates_per_step
updates on horizon steps of every env — is the same amount of learning however loaded the box
is, and the test means the same thing on a busy CI runner as on an idle laptop. The warm-up
(`learning_starts` steps of random actions) precedes the first iteration and costs only env
steps, which are cheap here, so it is generous.

Shared choices for a 2-core CPU box: 32 envs in one collector, 64×64 networks (FlashSAC: one
residual block of width 32), learning rates 1e-3 (TD3's actor 3e-4), `updates_per_step` 2,
horizon 50, so 100 updates per iteration, and 40–50 iterations (≈ 20–40 s each on 2 cores). The logged
`mean_return` is the mean return of the last 100 finished episodes, so it lags the policy: the
thresholds are on that lagging mean, measured over seeds 0, 1, 2 (see each case's comment).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from hetlab.algos.fastsac import FastSACConfig
from hetlab.algos.flashsac import FlashSACConfig
from hetlab.algos.sac import SACConfig
from hetlab.algos.td3 import TD3Config
from hetlab.train.config import AlgoConfigs, OffPolicyConfig, TrainConfig
from hetlab.train.launch import train

pytestmark = pytest.mark.serial  # the collectors' pace against the learner's shapes what is learnt

ENVS = 32
HORIZON = 50
SMALL = {"actor_hidden": (64, 64), "critic_hidden": (64, 64)}


@dataclass(frozen=True)
class Case:
    config: object  # the algorithm's config, as TrainConfig takes it
    iterations: int
    threshold: float  # the mean return of the last 100 episodes must reach this within the iterations (the run stops there)


CASES = {
    # SAC: α starts at 0.1 rather than the paper's 1, so the entropy bonus does not swamp the ≈ 1 per
    # step reward early on (α 1 was not tried at this budget). Measured after 50 iterations (5 000 updates):
    # 250 and 316 (seeds 1, 2), 270 (seed 0 with a 20-step warm-up); the threshold 150 leaves a
    # margin of ~100 on the worst seed while still asking for episodes 4–5× the random policy's.
    "sac": Case(
        SACConfig(**SMALL, actor_learning_rate=1e-3, critic_learning_rate=1e-3, alpha_learning_rate=1e-3,
                  init_alpha=0.1, updates_per_step=2, learning_starts=100),
        iterations=50, threshold=150,
    ),
    # TD3: τ 0.02 instead of 0.005 — with the delayed (every 2nd update) target updates, 0.005 moves
    # the values too slowly for 5 000 updates, and the deterministic actor first saturates at ±1
    # (episodes of 13 steps) before it recovers: seeds 0/1/2 ended at 125/142/100 with τ 0.005 vs
    # 184/158/146 with 0.02. Actor rate 3e-4 (1e-3 saturated it for longer) and a 200-step random
    # warm-up. TD3 is the noisiest of the four here (its mean rises, dips by ~30, rises again), so
    # the threshold is 100: ≥ 3× the random policy, ~45 below the worst seed.
    "td3": Case(
        TD3Config(**SMALL, actor_learning_rate=3e-4, critic_learning_rate=1e-3, updates_per_step=2,
                  learning_starts=200, tau=0.02),
        iterations=50, threshold=100,
    ),
    # FastSAC: Holosoma's defaults are for thousands of envs on a GPU (batch 8192, 8 updates per
    # vectorised step, 512/256/128 and 768/384/192 networks); shrunk here to batch 256, 2 updates
    # per step and 64×64 networks. The C51 support moves from [−20, 20] to [−10, 40] with 51
    # atoms: returns of ≈ 1 per step reach 1 / (1 − γ) ≈ 33 at γ 0.97, past the default's 20.
    # After 40 iterations (4 000 updates) seeds 1/2 reach 376/316 (seed 0 ≈ 380, read off a 50-iteration
    # run); threshold 200.
    "fastsac": Case(
        FastSACConfig(**SMALL, actor_learning_rate=1e-3, critic_learning_rate=1e-3, alpha_learning_rate=1e-3,
                      batch_size=256, updates_per_step=2, learning_starts=100, v_min=-10.0, v_max=40.0,
                      num_atoms=51),
        iterations=40, threshold=200,
    ),
    # FlashSAC: the reference's defaults are for thousands of envs on a GPU (batch 2048, two blocks of
    # width 128 / 256 with 4× inner layers); shrunk here to batch 128 and one block of width 32 with a
    # 2× inner layer, since its update (BatchNorm over current and next state-actions, unit-norm
    # projections after every step) is the slowest of the four; 40 iterations rather than 50.
    # After 40 iterations (4 000 updates) seeds 1/2 reach 148/352 (seed 0 ≈ 190, read off a
    # 50-iteration run): the widest spread of the four, hence the threshold 100.
    "flashsac": Case(
        FlashSACConfig(actor_hidden=32, critic_hidden=32, actor_blocks=1, critic_blocks=1, expansion=2,
                       learning_rate=1e-3, batch_size=128, updates_per_step=2, learning_starts=100),
        iterations=40, threshold=100,
    ),
}


@pytest.mark.parametrize("algo", list(CASES))
def test_off_policy_algorithm_learns_to_balance_cartpole_through_the_runtime(tmp_path, algo):
    case = CASES[algo]
    cfg = TrainConfig(
        algo=algo, task="cartpole-balance", envs=ENVS, collectors=1, horizon=HORIZON,
        max_iterations=case.iterations, target_return=case.threshold, seed=0, checkpoint_every=10_000,
        runs_dir=str(tmp_path / "runs"),
        off_policy=OffPolicyConfig(replay_capacity=100_000, inference="collector"),
        algos=AlgoConfigs(**{algo: case.config}),
    )
    run_dir = train(cfg)
    summary = json.loads((run_dir / "summary.json").read_text())
    history = json.loads((run_dir / "history.json").read_text())
    returns = [row["mean_return"] for row in history]
    # The curve reaches the threshold within the iterations, and the run stops there (--target-return).
    assert summary["stopped_by"] == "target_return", (algo, [round(r) for r in returns])
    assert summary["iterations"] <= case.iterations and returns[-1] >= case.threshold > max(returns[:-1])
    # Every update the iterations promise was done, on data the collector kept the ratio for.
    assert summary["updates"] == summary["iterations"] * cfg.updates_per_iteration
    assert all(r == r for r in returns), "every iteration should have finished episodes to average"
    # The first logged value is the random warm-up's (plus the first iteration's) episodes.
    assert summary["mean_return_first"] < 60, summary
    assert summary["mean_return_last"] >= 2 * summary["mean_return_first"], (algo, [round(r) for r in returns])
