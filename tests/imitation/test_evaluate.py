"""Closed-loop evaluation: worker processes, deterministic per seed, Wilson intervals, bad input."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from hetlab.imitation.evaluate import ChunkPolicy, EvalConfig, eval_env, evaluate
from hetlab.measure.stats import wilson_interval
from hetlab.imitation.phase_a import train_phase_a
from hetlab.imitation.presets import PRESETS, PhaseAConfig
from hetlab.imitation.run_files import ARActorRun, read_run_config
from hetlab.cli import main
from hetlab.datasets.lerobot_writer import DatasetSpec, LeRobotWriter
from hetlab.errors import UserError

MAX_STEPS = 30  # a few policy chunks per episode keeps the test short; the task's episodes are 400 steps


@pytest.fixture(scope="module")
def run(tiny_aloha_dataset, tmp_path_factory):
    return train_phase_a(PhaseAConfig(dataset=tiny_aloha_dataset, preset="tiny", train_episodes="0-1", steps=2,
                                      loader_workers=0, runs_dir=tmp_path_factory.mktemp("runs")))


def test_one_and_two_workers_give_the_same_json(run, tmp_path):
    reports = []
    for workers in (1, 2):
        out = tmp_path / f"eval-{workers}-workers"
        result = evaluate(EvalConfig(run=run, seeds="2000-2001", workers=workers, videos=1, max_steps=MAX_STEPS,
                                     out=out))
        assert result["workers"] == workers
        reports.append((out / "results.json").read_text())
        assert (out / "videos" / "seed-2000.mp4").stat().st_size > 0
        assert not (out / "videos" / "seed-2001.mp4").exists()
    assert reports[0] == reports[1]
    report = json.loads(reports[0])
    assert [r["seed"] for r in report["per_seed"]] == [2000, 2001]
    assert all(r["steps"] == MAX_STEPS or r["success"] for r in report["per_seed"])
    assert report["wilson95"] == list(wilson_interval(report["successes"], 2))
    assert report["held_out"] is True  # the tiny recording's episodes come from seeds 0 and 1


def test_seeds_the_run_trained_on_are_refused_unless_memorisation_is_asked_for(run, tmp_path):
    with pytest.raises(UserError, match=r"--seeds 1: the training episodes were recorded from these seeds, so they are "
                                        r"not held out; evaluate on others \(e.g. 2000-2049\) or pass "
                                        "--on-training-seeds"):
        evaluate(EvalConfig(run=run, seeds="1-3", out=tmp_path / "eval"))
    assert not (tmp_path / "eval").exists()
    report = evaluate(EvalConfig(run=run, seeds="1", workers=1, videos=0, max_steps=2, on_training_seeds=True,
                                 out=tmp_path / "eval"))
    assert report["held_out"] is False and json.loads((tmp_path / "eval" / "results.json").read_text())["held_out"] is False


def test_evaluation_renders_at_the_runs_size_and_render_quality(run):
    config = read_run_config(run)
    assert config["render_quality"] == "fast"  # the tiny recording's
    env = eval_env(ARActorRun.from_json(config, run))
    assert (env.height, env.width, env.render_quality) == (*config["image_size"], "fast")
    # Runs from before the setting were recorded at the scene's own quality.
    older = {key: value for key, value in config.items() if key != "render_quality"}
    assert eval_env(ARActorRun.from_json(older, run)).render_quality == "high"


def test_wilson_interval_against_the_formula():
    # 7 successes in 20: centre and half-width by hand (z = 1.96).
    z, n, p = 1.96, 20, 7 / 20
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low, high = wilson_interval(7, 20)
    assert low == pytest.approx(centre - half) and high == pytest.approx(centre + half)
    assert wilson_interval(0, 10)[0] == 0.0 and 0.0 < wilson_interval(0, 10)[1] < 0.35
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0) and wilson_interval(10, 10)[0] > 0.65


@pytest.mark.parametrize(("seeds", "message"), [("2001-2000", "ends before it starts"), ("", "takes a range"),
                                                ("2001,2000", "increasing order")])
def test_bad_seeds_fail_before_any_worker_starts(run, tmp_path, seeds, message):
    with pytest.raises(UserError, match=message):
        evaluate(EvalConfig(run=run, seeds=seeds, out=tmp_path / "eval"))
    assert not (tmp_path / "eval").exists()


def test_cli_rejects_a_directory_that_is_not_a_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["aloha", "eval", str(tmp_path), "--seeds", "2000-2001"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "not a run directory" in err and len(err.strip().splitlines()) == 1


class ChunkCounter:
    """Stands in for the AR-Actor where only the chunk schedule matters: the n-th chunk it
    generates plans action 100·n + k for its k-th step."""

    class cfg:
        chunk = 5

    def __init__(self):
        self.generated = 0
        self.parallel: set[bool] = set()

    def act(self, images, state, steps, parallel):
        planned = 100.0 * self.generated + np.arange(steps, dtype=np.float32)
        self.generated += 1
        self.parallel.add(parallel)
        return torch.from_numpy(np.repeat(planned[None, :, None], 2, axis=2))


def actions_of(policy: ChunkPolicy, steps: int) -> list[float]:
    image, state = np.zeros((4, 4, 3), np.uint8), np.zeros(14, np.float32)
    return [float(policy(image, state)[0]) for _ in range(steps)]


def test_chunks_run_in_turn_or_replan_every_few_steps():
    assert actions_of(ChunkPolicy(ChunkCounter(), 0), 7) == [0, 1, 2, 3, 4, 100, 101]
    assert actions_of(ChunkPolicy(ChunkCounter(), 2), 5) == [0, 1, 100, 101, 200]
    model = ChunkCounter()
    assert actions_of(ChunkPolicy(model, 0, decode="parallel"), 6) == [0, 1, 2, 3, 4, 100]
    assert model.parallel == {True}


def test_temporal_ensembling_weights_the_running_chunks_as_act_does():
    m = 0.01
    executed = actions_of(ChunkPolicy(ChunkCounter(), 0, temporal_ensemble=m), 8)  # a new chunk every step (ACT)
    for step, action in enumerate(executed):
        # Chunk n (made at step n) plans 100·n + (step − n) for this step; the last `chunk` of them still run.
        running = list(range(max(0, step - ChunkCounter.cfg.chunk + 1), step + 1))
        weights = np.exp(-m * np.arange(len(running)))  # the oldest first, weighted most
        expected = sum(w * (100 * n + step - n) for w, n in zip(weights, running)) / weights.sum()
        assert action == pytest.approx(expected, rel=1e-6), step
    # Every 2 steps: only the chunks made so far count.
    assert actions_of(ChunkPolicy(ChunkCounter(), 2, temporal_ensemble=0.0), 3) == [0, 1, pytest.approx((2 + 100) / 2)]


def test_evaluation_records_temporal_ensembling_and_refuses_a_negative_weight(run, tmp_path):
    report = evaluate(EvalConfig(run=run, seeds="2000", workers=1, videos=0, max_steps=12, replan_every=4,
                                 temporal_ensemble=0.01, out=tmp_path / "ensembled"))
    saved = json.loads((tmp_path / "ensembled" / "results.json").read_text())
    assert saved["temporal_ensemble"] == 0.01 and saved["replan_every"] == 4 and report["episodes"] == 1
    with pytest.raises(UserError, match="--temporal-ensemble must be ≥ 0"):
        evaluate(EvalConfig(run=run, seeds="2000", temporal_ensemble=-1.0, out=tmp_path / "bad"))


def test_parallel_decoding_needs_a_run_trained_with_every_history_input_maskable(run, tiny_aloha_dataset, tmp_path,
                                                                                   monkeypatch):
    with pytest.raises(UserError, match=r"--decode parallel masks every history input, which .* never saw in "
                                        r"training \(max_history_mask 0.5\); use --decode autoregressive"):
        evaluate(EvalConfig(run=run, seeds="2000", decode="parallel", out=tmp_path / "refused"))
    assert not (tmp_path / "refused").exists()
    tiny = PRESETS["tiny"]
    monkeypatch.setitem(PRESETS, "tiny",
                        dataclasses.replace(tiny, model=dataclasses.replace(tiny.model, max_history_mask=1.0)))
    maskable = train_phase_a(PhaseAConfig(dataset=tiny_aloha_dataset, preset="tiny", train_episodes="0-1", steps=2,
                                          loader_workers=0, runs_dir=tmp_path / "runs"))
    report = evaluate(EvalConfig(run=maskable, seeds="2000", workers=1, videos=0, max_steps=12, decode="parallel",
                                 out=tmp_path / "parallel"))
    assert report["episodes"] == 1 and json.loads((tmp_path / "parallel" / "results.json").read_text())["decode"] == "parallel"


def test_a_kept_checkpoint_is_evaluated_by_its_step(run, tmp_path):
    report = evaluate(EvalConfig(run=run, seeds="2000", workers=1, videos=0, max_steps=2, checkpoint=2))
    assert report["step"] == 2 and report["out"] == str(run / "eval" / "2000-step2")
    with pytest.raises(UserError, match=r"keeps no checkpoint of step 5; it keeps step\(s\) 2"):
        evaluate(EvalConfig(run=run, seeds="2000", checkpoint=5, out=tmp_path / "eval"))
    assert not (tmp_path / "eval").exists()


def test_a_dataset_that_does_not_name_its_seeds_leaves_held_out_unknown(tmp_path):
    # A LeRobot dataset made elsewhere has no `seed` column: nothing to refuse, and the report says so.
    spec = DatasetSpec(fps=50, task="t", robot_type="aloha", state_names=tuple(f"q{i}" for i in range(14)),
                       action_names=tuple(f"u{i}" for i in range(14)), cameras=("observation.images.top",),
                       height=64, width=96)
    rng = np.random.default_rng(0)
    with LeRobotWriter(tmp_path / "elsewhere", spec) as writer:
        writer.add_episode({"observation.images.top": rng.integers(0, 255, (12, 64, 96, 3), dtype=np.uint8)},
                           rng.standard_normal((12, 14)).astype(np.float32),
                           rng.standard_normal((12, 14)).astype(np.float32))
    run = train_phase_a(PhaseAConfig(dataset=tmp_path / "elsewhere", preset="tiny", train_episodes="0", steps=2,
                                     loader_workers=0, runs_dir=tmp_path / "runs"))
    report = evaluate(EvalConfig(run=run, seeds="0", workers=1, videos=0, max_steps=2, out=tmp_path / "eval"))
    assert report["held_out"] is None
