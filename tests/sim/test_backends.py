"""The physics backends side by side: what each one can run, `bench sim --sim all`, and how far
MotrixSim's trajectories are from MuJoCo's on the same model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hetlab.sim import SIMS
from hetlab.tasks.go1_joystick import Go1JoystickFlat
from hetlab.tasks.throughput import SimBenchConfig, run_sim_bench


def test_a_task_the_backend_cannot_read_is_refused_naming_the_sensor(refusal):
    line = refusal("train", "--sim", "motrix", "--task", "g1-walk-flat", "--max-seconds", "5")
    assert "MotrixSim does not compute sensor 'left_foot_force' (type mjSENS_FORCE)" in line


def test_a_backend_whose_extra_is_missing_is_refused_with_the_install_line(refusal, monkeypatch):
    monkeypatch.setitem(SIMS, "motrix", dataclasses.replace(SIMS["motrix"], needs="motrixsim-not-installed"))
    line = refusal("bench", "sim", "--sim", "motrix", "--seconds", "1")
    assert line == "error: --sim motrix: motrixsim-not-installed is not installed: pip install 'hetlab[motrix]'"


def test_warp_where_it_cannot_run_is_refused_saying_why(refusal):
    """Without its extra: the install line; with it but no CUDA device: the GPU it needs."""
    reason = SIMS["warp"].unavailable()
    if reason is None:
        pytest.skip("MuJoCo Warp can run here: a CUDA device is present")
    line = refusal("train", "--sim", "warp", "--task", "cartpole-balance", "--max-seconds", "5")
    assert line == f"error: --sim warp: {reason}"
    assert reason in ("mujoco-warp is not installed: pip install 'hetlab[warp]'",
                      "it needs an NVIDIA GPU with CUDA and Warp finds none here; use --sim mujoco or --sim motrix")


def test_bench_sim_all_measures_every_backend_and_names_what_it_skipped():
    result = run_sim_bench(SimBenchConfig(task="cartpole-balance", sim="all", envs=16, seconds=0.6, rounds=2))
    usable = [name for name, sim in SIMS.items() if sim.unavailable() is None]
    assert [r["sim"] for r in result["results"]] == usable
    assert result["unavailable"] == {name: f"--sim {name}: {SIMS[name].unavailable()}"
                                     for name in SIMS if name not in usable}
    for r in result["results"]:
        assert r["physics_steps_per_s"] > 0 and r["env_steps_per_s"] > 0 and len(r["per_round"]["physics_share"]) == 2
    skipped = run_sim_bench(SimBenchConfig(task="g1-walk-flat", sim="all", envs=4, seconds=0.2, rounds=1))
    assert [r["sim"] for r in skipped["results"]] == ["mujoco"]
    assert set(skipped["unavailable"]) == set(SIMS) - {"mujoco"}
    assert "left_foot_force" in skipped["unavailable"]["motrix"]


def test_go1_stands_alike_on_motrix_and_mujoco():
    """Go1 on its keyframe controls for 1 s. The first tens of milliseconds differ most (MuJoCo's
    soft contacts let the feet bounce; MotrixSim's solver settles them directly, and it ignores the
    pyramidal cone and Euler damping the model asks for); once standing, both hold the same pose:
    measured 1.2 mm of trunk height and 0.034 rad of joint angle apart."""
    spec = Go1JoystickFlat.build_spec(Go1JoystickFlat.Config())
    sims = [SIMS[name].make(spec, 2, threads=1, seed=0, keyframe=Go1JoystickFlat.keyframe) for name in ("mujoco", "motrix")]
    for sim in sims:
        sim.step(None, 250)
    mujoco_sim, motrix_sim = sims
    for sim in sims:
        assert np.abs(sim.qvel).max() < 0.1  # standing still
        assert 0.25 < sim.qpos[0, 2] < 0.28
    assert abs(mujoco_sim.qpos[0, 2] - motrix_sim.qpos[0, 2]) < 0.003
    assert np.abs(mujoco_sim.qpos[:, 7:] - motrix_sim.qpos[:, 7:]).max() < 0.06
