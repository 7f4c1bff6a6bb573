"""Each task's recipe: the algorithm and options `hetlab train --task T` uses when `--algo` is not given.

A recipe is plain data: option names as `cpu_defaults` spells them (the command line's name with
underscores: `envs`, `ppo.actor_hidden`, `off_policy.replay_capacity`), the values sized for an
accelerator learner in `options`, over them those for a CPU learner in `cpu`, and over those the
ones for a CPU with native bfloat16 matrix units (AVX512_BF16 or AMX) in `native_bf16`. Every option
given on the command line, in a --config file or to `train_policy` wins over the recipe; the run's
config.json records which values came from it (`option_sources`). `time_to_solve` is what was
measured with it, on the hardware it names (docs/benchmarks.md has the run behind each number).
A task without a recipe trains with PPO and the algorithm's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hetlab.devices import LearnerDevice


@dataclass(frozen=True)
class Recipe:
    algo: str
    options: dict[str, object]  # on any learner
    cpu: dict[str, object] = field(default_factory=dict)  # on a CPU learner, over `options`
    native_bf16: dict[str, object] = field(default_factory=dict)  # on a CPU learner with native bf16, over `cpu`
    time_to_solve: str = ""  # measured with this recipe, naming the hardware; "" = not solved yet

    def for_device(self, device: LearnerDevice) -> dict[str, object]:
        if device.is_accelerator:
            return dict(self.options)
        return {**self.options, **self.cpu, **(self.native_bf16 if device.bf16 else {})}


# Every recipe evaluates 128 episodes deterministically at its cadence, so that --until-solved can
# stop it and `best` names the best policy by the task's criteria' evaluation.
RECIPES: dict[str, Recipe] = {
    "cartpole-balance": Recipe(
        algo="ppo",
        # A pole on a cart needs no rsl_rl-sized networks: 64-64 trains it about twice as fast.
        options={"envs": 128, "horizon": 32, "ppo.actor_hidden": (64, 64), "ppo.critic_hidden": (64, 64),
                 "eval_every": 10, "eval_envs": 128},
        time_to_solve="12–15 s (seeds 0, 1; 2-core AMD EPYC with AVX-512, no GPU)",
    ),
    "go1-joystick-flat": Recipe(
        algo="ppo",
        # Playground's discount for this task: at 0.99 linear tracking stalled at 0.50 (23 M env steps);
        # at 0.97 it passed 0.75 at 8 M (docs/benchmarks.md#time-to-solve). A 10 ms physics step (the
        # task's own: 4 ms) steps 2.5× fewer substeps, and its policies pass "solved" at 4 ms too.
        # Solving took 950–1,550 iterations of 512 envs (11.7–19.0 M env steps); at the default 1,000
        # one run stopped an evaluation short of it, so the recipe allows 2,000.
        options={"ppo.gamma": 0.97, "sim_dt": 0.01, "eval_every": 50, "eval_envs": 128, "max_iterations": 2000},
        # Two cores: 512 envs, smaller networks than rsl_rl's 512-256-128, gentler initial exploration.
        cpu={"envs": 512, "ppo.actor_hidden": (256, 128, 64), "ppo.critic_hidden": (256, 128, 64),
             "ppo.init_noise_std": 0.5},
        # bf16 hidden layers (fp32 outputs) run 1.2× the env steps per second end to end, and seeds 1 and 2
        # solved at 18.4 and 14.1 M env steps with them, at 19.0 and 14.1 M in fp32.
        native_bf16={"ppo.bf16": True},
        time_to_solve="11.8–13.1 min in bf16 (seeds 0, 1; 2-core Intel Xeon with AMX, no GPU); 12.5–18 min in fp32 "
                      "(seeds 1, 0; 2-core AMD EPYCs, Zen 5, with AVX-512, no GPU)",
    ),
    "g1-walk-flat": Recipe(
        algo="ppo",
        # Go1's recipe at the G1's finest stable physics step (5 ms; its own is 2 ms; at 10 ms it
        # diverges). The task's penalty curriculum is what lets it stand: without it the same
        # settings left episodes at 58 of 1,000 steps after 8 M env steps (docs/benchmarks.md).
        # rsl_rl's discount, not Go1's 0.97: over the same 8–9 M env steps (seeds 1, 2) the policies
        # stood through 75–87 % of unpushed episodes against 31–34 %. Mirrored batches walk about 1.3×
        # sooner per env step, and the G1's collectors, not its update, bound a run on two cores.
        # Linear tracking at twice the task's weight with a third of PPO's entropy bonus: each alone fixed
        # what the other broke (noisier, swaying gaits at 0.01; standing, hardly walking at the task's
        # weight); together, on seeds 1 and 2, linear tracking 0.52-0.53 at 9.2 M env steps against 0.38-0.42.
        # Not solved in 23 M env steps: it trains until --until-solved or --max-seconds stops it.
        options={"ppo.gamma": 0.99, "ppo.symmetry": True, "ppo.entropy_coef": 0.003,
                 "reward_weights": {"tracking_lin_vel": 4.0}, "sim_dt": 0.005, "eval_every": 50, "eval_envs": 128,
                 "max_iterations": 10_000},
        cpu={"envs": 512, "ppo.actor_hidden": (256, 128, 64), "ppo.critic_hidden": (256, 128, 64),
             "ppo.init_noise_std": 0.5},
    ),
}
