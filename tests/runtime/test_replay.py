"""The shared-memory replay buffer, its sampler and the replay stager, with real spawned writers.

Every transition a writer stores encodes where it came from: observation values are
1000·step + env (+0.5 for the next observation), so a sampled batch can be checked against
what that (step, env) must hold, whatever row it came from.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import numpy as np
import pytest

from hetlab.devices import pick_device
from hetlab.errors import UserError
from hetlab.runtime.replay import ReplayBuffer, ReplayLayout, ReplayStager, sample

SPAWN = multiprocessing.get_context("spawn")
GAMMA = 0.9


@pytest.fixture(autouse=True)
def importable_by_children(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2]))


def layout(rows: int = 40, collectors: int = 2, envs: int = 3) -> ReplayLayout:
    return ReplayLayout(rows, collectors, envs, {"policy": 2, "critic": 3}, action_size=1, queue_size=4)


def reward(step, env):
    return 0.01 * step + env


def ends(step, env) -> tuple[bool, bool]:
    """(terminated, truncated) of a step: episodes end every 7 steps, every other one by time."""
    if (step + env) % 7 != 6:
        return False, False
    return ((step + env) // 7) % 2 == 0, ((step + env) // 7) % 2 == 1


def transition(collector: int, step: int, lay: ReplayLayout) -> dict[str, np.ndarray]:
    envs = np.arange(collector * lay.envs_per_collector, (collector + 1) * lay.envs_per_collector)
    code = 1000.0 * step + envs
    done = np.array([ends(step, env) for env in envs])
    return {
        "policy_obs": np.repeat(code[:, None], 2, 1), "critic_obs": np.repeat(code[:, None], 3, 1),
        "actions": code[:, None] / 1000.0, "rewards": reward(step, envs),
        "terminated": done[:, 0], "truncated": done[:, 1],
        "next_policy_obs": np.repeat(code[:, None] + 0.5, 2, 1), "next_critic_obs": np.repeat(code[:, None] + 0.5, 3, 1),
    }


def write_steps(replay: ReplayBuffer, collector: int, steps: int, first: int = 0, commit: bool = True) -> None:
    """Write steps first..steps-1 of one collector, committing each (for a reader: a stager)."""
    for step in range(first, steps):
        replay.write(collector, step, transition(collector, step, replay.layout))
        if commit:
            replay.commit({"collector": collector, "steps": step + 1})


def child_writer(replay: ReplayBuffer, collector: int, steps: int) -> None:
    replay.attach()
    write_steps(replay, collector, steps)
    replay.close()


def expected_n_step(step: int, env: int, end: int, n: int) -> tuple[float, float, float]:
    """(n-step reward, bootstrap factor, code of the bootstrapping observation), by brute force."""
    total, discount = 0.0, 1.0
    for k in range(n):
        if step + k >= end:
            break
        total += discount * reward(step + k, env)
        discount *= GAMMA
        terminated, truncated = ends(step + k, env)
        last = step + k
        if terminated:
            return total, 0.0, 1000.0 * last + env + 0.5
        if truncated:
            break
    return total, discount, 1000.0 * last + env + 0.5


def out_arrays(lay: ReplayLayout, batch: int) -> dict[str, np.ndarray]:
    p, c, a = lay.obs_sizes["policy"], lay.obs_sizes["critic"], lay.action_size
    return {"policy_obs": np.empty((batch, p), np.float32), "critic_obs": np.empty((batch, c), np.float32),
            "actions": np.empty((batch, a), np.float32), "rewards": np.empty(batch, np.float32),
            "bootstrap": np.empty(batch, np.float32), "next_policy_obs": np.empty((batch, p), np.float32),
            "next_critic_obs": np.empty((batch, c), np.float32)}


def check_batch(out: dict[str, np.ndarray], steps: np.ndarray, lay: ReplayLayout, n: int) -> None:
    codes = out["policy_obs"][:, 0].astype(np.int64)
    for i, code in enumerate(codes.tolist()):
        step, env = divmod(code, 1000)
        collector = env // lay.envs_per_collector
        first = max(0, steps[collector] - lay.rows + lay.guard_rows)
        assert first <= step < steps[collector], (step, steps[collector])
        total, bootstrap, next_code = expected_n_step(step, env, steps[collector], n)
        assert out["rewards"][i] == pytest.approx(total, rel=1e-5)
        assert out["bootstrap"][i] == pytest.approx(bootstrap, rel=1e-6)
        assert out["next_policy_obs"][i, 0] == next_code and out["next_critic_obs"][i, 2] == next_code
        assert out["critic_obs"][i, 1] == code and out["actions"][i, 0] == pytest.approx(code / 1000.0)


@pytest.mark.parametrize("n", [1, 3])
def test_n_step_rewards_bootstrap_and_next_observations(n):
    lay = layout()
    with ReplayBuffer(lay) as replay:
        write_steps(replay, 0, 25, commit=False)
        write_steps(replay, 1, 60, commit=False)  # wraps around its 40 rows
        steps = np.array([25, 60])
        out = out_arrays(lay, 512)
        sample(replay, steps, np.random.default_rng(0), GAMMA, n, out)
        check_batch(out, steps, lay, n)
        drawn = {int(c) // 1000 for c in out["policy_obs"][:, 0]}
        assert min(drawn) == 0 and max(drawn) == 59  # both ends of the windows are reachable


def test_sampler_never_returns_an_unwritten_or_overwritten_row():
    """The buffer is poisoned with NaN; a spawned writer laps it twice while a stager samples."""
    lay = layout(rows=30, collectors=1, envs=4)
    with ReplayBuffer(lay) as replay:
        for array in replay.arrays.values():
            array[...] = np.nan
        stager = ReplayStager(replay, pick_device("cpu"), batch_size=64, gamma=GAMMA, n_step=3,
                              updates_per_step=1000.0, learning_starts=1, seed=0)
        stager.start()
        child = SPAWN.Process(target=child_writer, args=(replay, 0, 70))
        child.start()
        try:
            seen = 0
            while child.is_alive() or seen < 20:
                staged = stager.next(timeout=30)
                assert staged is not None
                batch, _, _ = staged
                steps = stager.snapshot_steps()
                for value in batch.values():
                    assert not value.isnan().any()
                codes = batch["policy_obs"][:, 0].long() // 1000
                assert (codes >= 0).all() and (codes < steps[0]).all()
                # Each field of a transition comes from the same (step, env): no half-overwritten rows.
                assert (batch["critic_obs"][:, 0] == batch["policy_obs"][:, 0]).all()
                seen += 1
        finally:
            stager.stop()
            child.join(30)
        assert child.exitcode == 0


def test_stager_keeps_the_update_to_data_ratio():
    lay = layout(rows=50, collectors=2, envs=2)
    with ReplayBuffer(lay) as replay:
        stager = ReplayStager(replay, pick_device("cpu"), batch_size=8, gamma=GAMMA, n_step=1,
                              updates_per_step=2.0, learning_starts=5, seed=0)
        stager.start()
        try:
            write_steps(replay, 0, 4)
            write_steps(replay, 1, 4)
            assert stager.next(timeout=0.5) is None  # mean 4 steps < learning_starts 5
            write_steps(replay, 0, 6, first=4)
            write_steps(replay, 1, 6, first=4)  # mean 6: (6 - 5 + 1) × 2 = 4 updates are paid for
            for _ in range(4):
                assert stager.next(timeout=10) is not None
            assert stager.next(timeout=0.5) is None
        finally:
            stager.stop()


def test_save_and_load_restore_the_windows_and_a_new_start_cuts_episodes_at_the_end(tmp_path):
    lay = layout()
    steps = np.array([25, 60])
    with ReplayBuffer(lay) as replay:
        write_steps(replay, 0, 25, commit=False)
        write_steps(replay, 1, 60, commit=False)
        replay.save(tmp_path / "replay", steps)
        before = {name: array.copy() for name, array in replay.arrays.items()}
    with ReplayBuffer(lay) as restored:
        restored.load(tmp_path / "replay", steps)
        for collector, committed in enumerate(steps.tolist()):
            first, end = restored.window(committed)
            rows = np.arange(first, end) % lay.rows
            cols = restored.columns(collector)
            for name, array in restored.arrays.items():
                np.testing.assert_array_equal(array[rows, cols], before[name][rows, cols])
            # A collector that starts over there ends its episodes at the last step, and only there.
            restored.end_episodes(collector, committed)
            last = (end - 1) % lay.rows
            assert (np.maximum(restored.arrays["terminated"][last, cols], restored.arrays["truncated"][last, cols]) == 1).all()
            assert (restored.arrays["truncated"][last, cols] != before["truncated"][last, cols]).any()
            np.testing.assert_array_equal(restored.arrays["truncated"][rows[:-1], cols], before["truncated"][rows[:-1], cols])


def test_a_buffer_too_small_for_the_guard_rows_is_refused():
    with pytest.raises(UserError, match="replay-capacity"):
        layout(rows=8)
