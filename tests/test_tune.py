"""`hetlab tune` and `hetlab train --tune`: the settings it considers, its model, a real tuning of
cartpole that `hetlab train` then takes from the cache, and its one-line refusals."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from hetlab.devices import cpu_count
from hetlab.train.tune import Setting, StageRates, candidates, predicted_rate


def test_candidates_split_the_envs_evenly_within_the_cores():
    assert candidates(128, 2, "sync", accelerator=False) == [
        Setting(1, 1, 1), Setting(1, 1, 2), Setting(1, 2, 1), Setting(1, 2, 2), Setting(2, 1, 1), Setting(2, 1, 2)]
    # 6 envs do not split over 4 collectors; every setting uses at most the 4 cores for physics; the
    # learner, which runs while the collectors wait, 1, 2 or 4 threads; 6 cores: 1, 2, 4 or 6.
    sync = candidates(6, 4, "sync", accelerator=False)
    assert {s.collectors for s in sync} == {1, 2}
    assert all(s.collectors * s.physics_threads <= 4 for s in sync)
    assert {s.torch_threads for s in sync} == {1, 2, 4}
    # 6 cores: every count a power of two or all that is left (3 collectors × 2 threads among them).
    six = candidates(6, 6, "sync", accelerator=False)
    assert {s.torch_threads for s in six} == {1, 2, 4, 6} and Setting(6, 1, 1) in six
    assert {s.physics_threads for s in six if s.collectors == 2} == {1, 2, 3}
    # Async on a CPU learner: physics and torch threads share the cores, each side gets one at least.
    assert candidates(128, 2, "async", accelerator=False) == [Setting(1, 1, 1)]
    assert all(s.collectors * s.physics_threads + s.torch_threads <= 4 for s in candidates(128, 4, "async", False))
    # A learner on an accelerator only launches kernels: one torch thread, physics takes every core.
    assert {s.torch_threads for s in candidates(128, 4, "async", accelerator=True)} == {1}


def test_sync_adds_the_stages_times_and_async_waits_for_the_slower():
    rates = StageRates(collector={(100, 1): 1000.0, (50, 1): 800.0},
                       update_seconds={(2, "own"): 0.5, (1, "own"): 2.0})
    one, two = Setting(1, 1, 2), Setting(2, 1, 2)
    # 100 envs × 10 steps: 1 s of collecting at 1,000 env-steps/s, then 0.5 s of update.
    assert predicted_rate(one, rates, 100, 10, "sync") == pytest.approx(1000 / 1.5)
    # Two collectors of 50 envs each step 800/s: 1,600 together.
    assert predicted_rate(two, rates, 100, 10, "sync") == pytest.approx(1000 / (1000 / 1600 + 0.5))
    # Async: the learner absorbs 1,000 samples per 2 s on one thread, slower than the collector.
    assert predicted_rate(Setting(1, 1, 1), rates, 100, 10, "async") == pytest.approx(500.0)


@pytest.mark.serial  # its end-to-end checks time themselves
def test_tune_picks_the_faster_checked_setting_and_train_takes_it_from_the_cache(hetlab_here, tmp_path, monkeypatch):
    monkeypatch.setenv("HETLAB_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "tuned.toml"
    done = hetlab_here("tune", "--task", "cartpole-balance", "--seconds", "20", "--out", out, "--json", "--explain")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    # The scaling model, fitted to the same probes: one row per core count, async only from 2 cores on.
    scaling = result["scaling"]["predicted"]
    assert [row["cores"] for row in scaling] == sorted({1, 2, 4, 8, 16, 32, 64, 128, cpu_count()})
    assert scaling[0]["cpu_async"] is None and all(row["cpu_sync"] > 0 for row in scaling)
    measured = {(m["collectors"], m["threads"], m["torch_threads"]): m["env_steps_per_s"] for m in result["measured"]}
    chosen = result["chosen"]
    # The hand defaults and the best predicted other setting checked end to end; the faster one chosen.
    assert len(measured) == 2 and tuple(result["defaults"].values()) in measured
    predicted = {(p["collectors"], p["threads"], p["torch_threads"]): p["env_steps_per_s"] for p in result["predicted"]}
    other = next(setting for setting in measured if setting != tuple(result["defaults"].values()))
    assert predicted[other] == max(rate for setting, rate in predicted.items()
                                   if setting != tuple(result["defaults"].values()))
    assert measured[tuple(chosen.values())] == max(measured.values()) > 0
    assert chosen["threads"] <= cpu_count() and chosen["torch_threads"] <= cpu_count()
    assert {k: v for k, v in tomllib.loads(out.read_text()).items()} == chosen
    assert [Path(f).parent.name for f in result["files"]] == ["tune", out.parent.name]

    # `--tune` finds it in the cache (no probing: the run starts at once) and records the values as tuned,
    # over what a --config file gave for them.
    runs, options_file = tmp_path / "runs", tmp_path / "options.toml"
    options_file.write_text("collectors = 1\nthreads = 1\n")
    done = hetlab_here("train", "--task", "cartpole-balance", "--config", options_file, "--tune", "--max-iterations", "2",
                       "--eval-every", "0", "--runs-dir", runs)
    assert done.returncode == 0, done.stderr
    assert "tuned setting for this machine and run" in done.stderr and "tuning" not in done.stderr
    run_dir = Path(done.stdout.splitlines()[0])
    config = json.loads((run_dir / "config.json").read_text())
    for option in ("collectors", "threads", "torch_threads"):
        assert config[option] == chosen[option] and config["option_sources"][option] == "tune"
    assert f"--torch-threads {chosen['torch_threads']}" in done.stdout


@pytest.mark.parametrize("args, says", [
    (("tune", "--task", "cartpole-balance", "--seconds", "5"), "at least 20 s"),
    (("tune", "--task", "cartpole-balance", "--explain", "--accelerator-update-ms", "-1"), "must be ≥ 0"),
    (("tune", "--task", "cartpole-balance", "--algo", "sac"), "tuning --algo sac is not available"),
    (("train", "--task", "cartpole-balance", "--tune", "--ppo.compile"), "tuning a compiled run is not available"),
    (("train", "--task", "cartpole-balance", "--tune", "--resume", "runs/x"), "a resumed run keeps its own"),
    (("train", "--task", "cartpole-balance", "--torch-threads", "999"), "exceeds the"),
    (("train", "--task", "cartpole-balance", "--tune", "--collectors", "1", "--torch-threads", "1"),
     "--tune chooses --collectors, --threads, --torch-threads itself; drop --collectors, --torch-threads or drop --tune"),
    # Refused before any probing: the bad option, not 90 s of tuning, is what the user hears about.
    (("train", "--task", "cartpole-balance", "--tune", "--envs", "0"), "--envs must be at least 1"),
    (("tune", "--task", "no-such-task"), "unknown task 'no-such-task'"),
])
def test_tune_refuses_bad_input_in_one_line(refusal, args, says, tmp_path):
    assert says in refusal(*args, "--runs-dir" if args[0] == "train" else "--out",
                           tmp_path / ("runs" if args[0] == "train" else "t.toml"))
