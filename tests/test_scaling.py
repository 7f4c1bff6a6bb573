"""The scaling model of `hetlab tune --explain`: fitted back from stage costs it generated, and its
predictions bounded by the ceilings it names."""

from __future__ import annotations

import pytest

from hetlab.train.scaling import ScalingModel, fit_scaling, scaling_table
from hetlab.train.tune import Setting

# A collector step: 2 ms + 20 µs per env; an update: 100 ms + 300 ms / threads; 50 ms hand-over.
TRUE = ScalingModel(step_fixed_s=0.002, step_per_env_s=20e-6, update_serial_s=0.1, update_parallel_s=0.3,
                    handover_s=0.05, envs=512, horizon=24)


def measurements(model: ScalingModel):
    """What tune would have measured on two cores of a machine that behaves as `model` says."""
    collector = {(e, 1): e / (model.step_fixed_s + model.step_per_env_s * e) for e in (512, 256)}
    collector[(512, 2)] = 1.6 * collector[(512, 1)]
    update_seconds = {(n, "own"): model.update_s(n) for n in (1, 2)} | {(2, "bf16"): 0.2}
    samples = model.samples
    predicted, measured = {}, {}
    for setting in (Setting(1, 2, 2), Setting(2, 1, 2)):
        collect = setting.collectors * collector[(512 // setting.collectors, setting.physics_threads)]
        predicted[setting] = samples / (samples / collect + update_seconds[(2, "own")])
        measured[setting] = samples / (samples / predicted[setting] + model.handover_s)
    return collector, update_seconds, predicted, measured


def test_the_fit_recovers_the_stage_costs_and_the_hand_over():
    fitted = fit_scaling(*measurements(TRUE), envs=512, horizon=24)
    for name in ("step_fixed_s", "step_per_env_s", "update_serial_s", "update_parallel_s", "handover_s"):
        assert getattr(fitted, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name


def test_more_cores_help_until_the_serial_parts_cap_them():
    rows = scaling_table(TRUE, [1, 2, 4, 16, 128, 4096], accelerator_update_s=0.01)
    sync = [row["cpu_sync"] for row in rows]
    assert sync == sorted(sync) and sync[1] > 1.3 * sync[0]
    ceilings = TRUE.ceilings(0.01)
    assert sync[-1] < ceilings["sync CPU learner (serial update + hand-over)"]
    # Thousands of collectors of a few envs each: every rollout step still costs the per-step 2 ms.
    limit = TRUE.samples / (TRUE.horizon * TRUE.step_fixed_s + TRUE.update_serial_s + TRUE.handover_s)
    assert sync[-1] == pytest.approx(limit, rel=0.02)
    # Async on two cores: one collector of one thread and a learner of one.
    assert rows[0]["cpu_async"] is None
    assert rows[1]["cpu_async"] == pytest.approx(min(TRUE.collect_rate(1), TRUE.samples / (TRUE.update_s(1) + 0.05)))
    # An accelerator's 10 ms update beats the CPU's on every core count, and never passes its ceiling.
    assert all(row["accelerator_sync"] > row["cpu_sync"] for row in rows)
    assert rows[0]["accelerator_async"] is None
    assert all(row["accelerator_async"] <= ceilings["accelerator learner (update + hand-over)"] + 1e-9
               for row in rows[1:])


def test_one_probe_per_stage_fits_proportional_costs():
    """A one-core machine probes one envs count and one thread count: no fixed part can be told apart."""
    fitted = fit_scaling({(512, 1): 10_000.0}, {(1, "own"): 0.4}, {}, {}, envs=512, horizon=24)
    assert (fitted.step_fixed_s, fitted.update_serial_s, fitted.handover_s) == (0.0, 0.0, 0.0)
    assert fitted.collect_rate(4) == pytest.approx(40_000.0) and fitted.update_s(4) == pytest.approx(0.1)
