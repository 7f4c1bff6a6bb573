"""`hetlab offload tune` on a tiny Phase-A run: each condition trained and timed in its own process, the
feature cache's build charged to it, the fastest (or least-energy) condition chosen; bad input refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetlab.errors import UserError
from hetlab.imitation.config import OffloadTuneConfig
from hetlab.imitation.offload_tune import Measured, _choose, _quantise_for, tune_offload
from hetlab.offload.config import QuantiseConfig
from hetlab.imitation.phase_a import train_phase_a
from hetlab.imitation.presets import PhaseAConfig


@pytest.fixture(scope="module")
def phase_a_run(tiny_aloha_dataset, tmp_path_factory) -> Path:
    return train_phase_a(PhaseAConfig(dataset=tiny_aloha_dataset, preset="tiny", train_episodes="0-1", steps=2,
                                      loader_workers=0, runs_dir=tmp_path_factory.mktemp("runs")))


def tune(run: Path, **options) -> OffloadTuneConfig:
    return OffloadTuneConfig(from_run=run, train_episodes="0-1", calibration_episodes="0-1", **options)


def test_every_condition_is_timed_and_the_fastest_for_the_run_is_chosen(phase_a_run, tmp_path):
    """The command as a user runs it: its --json output is the result alone, what each condition's
    own process prints goes to stderr."""
    out = tmp_path / "tune.json"
    done = subprocess.run([sys.executable, "-m", "hetlab.cli", "offload", "tune", "--from", str(phase_a_run),
                           "--train-episodes", "0-1", "--calibration-episodes", "0-1", "--seconds", "5",
                           "--conditions", "learner,L2,cache", "--offload-devices", "cpu", "--cache-episodes", "0",
                           "--steps", "2000", "--out", str(out), "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    rows = {row["condition"]: row for row in result["conditions"]}
    assert list(rows) == ["learner", "L2", "cache"]
    assert rows["L2"]["offload_device"] == "cpu" and rows["learner"]["offload_device"] is None
    assert all(row["samples_per_s"] > 0 and row["peak_memory_bytes"] > 0 for row in rows.values())
    assert rows["learner"]["speed_vs_learner"] == 1.0
    # The cache was not built for episodes 0-1: its build, scaled from episode 0's, is charged to the run.
    assert rows["cache"]["build_s"] > 0 and "estimated from" in rows["cache"]["notes"][0]
    # The sample cache was the tuning's own: gone, where Phase B's caches would be.
    assert not list((phase_a_run / "offload").glob("cache-*"))
    assert rows["cache"]["seconds_for_run"] == pytest.approx(
        rows["cache"]["build_s"] + 2000 * 8 / rows["cache"]["samples_per_s"])
    # By energy where a power meter (RAPL, NVML) read every condition, else by time.
    by_energy = all(row["joules_per_sample"] is not None for row in rows.values())
    assert result["objective"] == ("energy" if by_energy else "time")
    cheapest = min(rows.values(), key=lambda row: row["joules_for_run" if by_energy else "seconds_for_run"])
    assert result["choice"]["condition"] == cheapest["condition"]
    assert json.loads(out.read_text())["choice"] == result["choice"]


def test_with_power_read_for_every_condition_the_least_energy_wins_over_the_fastest():
    fast = Measured("L4", "cpu", samples_per_s=20.0, joules_per_sample=3.0, peak_memory_bytes=1)
    frugal = Measured("L1", "openvino:NPU", samples_per_s=10.0, joules_per_sample=1.0, peak_memory_bytes=1,
                      symmetric_activations=True)
    learner = Measured("learner", None, samples_per_s=8.0, joules_per_sample=4.0, peak_memory_bytes=1)
    assert _choose([learner, fast, frugal], 1000)["choice"] == {
        "condition": "L1", "offload_device": "openvino:NPU",
        "options": "--condition L1 --offload-device openvino:NPU --quantise.symmetric-activations"}
    unread = Measured("cache", None, samples_per_s=40.0, joules_per_sample=None, peak_memory_bytes=1)
    by_time = _choose([learner, fast, frugal, unread], 1000)
    assert by_time["objective"] == "time" and by_time["choice"]["condition"] == "cache"
    # A cache whose build takes longer than the run saves is not chosen.
    slow_build = Measured("cache", None, samples_per_s=40.0, joules_per_sample=None, peak_memory_bytes=1, build_s=1e4)
    assert _choose([learner, fast, slow_build], 1000)["choice"]["condition"] == "L4"


def test_openvino_prefixes_are_quantised_with_symmetric_activations_and_the_others_as_asked():
    asked = QuantiseConfig()
    assert _quantise_for("openvino", asked).symmetric_activations and _quantise_for("openvino:GPU", asked) \
        .symmetric_activations
    assert _quantise_for("cpu", asked) == asked and _quantise_for(None, asked) == asked


@pytest.mark.parametrize(("options", "message"), [
    ({"seconds": 1.0}, "at least 5 s"),
    ({"offload_devices": "ort:NoSuchExecutionProvider"}, "not an offload device here"),
    ({"conditions": "learner,L9"}, "--conditions"),
    ({"cache_dtype": "bf16"}, "--cache-dtype"),
])
def test_bad_options_are_refused_before_any_training(phase_a_run, tmp_path, options, message):
    with pytest.raises(UserError, match=message):
        tune_offload(tune(phase_a_run, out=tmp_path / "tune.json", **options))
    assert not (tmp_path / "tune.json").exists()
