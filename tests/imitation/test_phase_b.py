"""Phase B end to end on a tiny Phase-A run: conditions start alike and see the same batches;
the cache condition reproduces the learner-only one; bad settings fail before training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hetlab.imitation.data import batch_indices, open_dataset
from hetlab.imitation.phase_a import train_phase_a
from hetlab.imitation.presets import PhaseAConfig
from hetlab.imitation.run_files import ARActorRun
from hetlab.aloha.record import CAMERA_KEY
from hetlab.checkpoint import load_checkpoint
from hetlab.datasets.lerobot import STATE
from hetlab.errors import UserError
from hetlab.offload.feature_cache import FeatureCache
from hetlab.run_history import read_history
from hetlab.imitation.phase_b import (PhaseBConfig, _backend, frozen_encoder, new_action_expert, train_phase_b,
                                      with_phase_a_schedule)

STEPS = 4


@pytest.fixture(scope="module")
def phase_a_run(tiny_aloha_dataset, tmp_path_factory) -> Path:
    return train_phase_a(PhaseAConfig(dataset=tiny_aloha_dataset, preset="tiny", train_episodes="0-1", steps=20,
                                      loader_workers=0, runs_dir=tmp_path_factory.mktemp("runs")))


def phase_b(run: Path, out: Path, **options) -> PhaseBConfig:
    options = {"calibration_episodes": "0-1", "steps": STEPS, **options}
    return PhaseBConfig(from_run=run, seed=2000, train_episodes="0-1", out=out, **options)


def final_expert(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir)["action_expert"]


@pytest.fixture(scope="module")
def learner_run(phase_a_run, tmp_path_factory) -> Path:
    return train_phase_b(phase_b(phase_a_run, tmp_path_factory.mktemp("b") / "learner", condition="learner"))


def test_every_condition_of_a_seed_starts_from_the_same_expert(phase_a_run):
    model, _, _ = frozen_encoder(phase_a_run)
    first, again = (new_action_expert(model.cfg, 2000, model.action_expert).state_dict() for _ in range(2))
    other = new_action_expert(model.cfg, 2001, model.action_expert).state_dict()
    assert all(torch.equal(first[key], again[key]) for key in first)
    assert not torch.equal(first["head.weight"], other["head.weight"])
    # The action normalisation is the dataset's, from Phase A, not the fresh module's identity.
    assert torch.equal(first["action_std"], model.action_expert.action_std)


def test_offloaded_fp32_prefix_trains_like_the_learner_only_condition(phase_a_run, learner_run, tmp_path, figures):
    """Same initial expert, batches, masks and dropout: with the prefix in FP32 (ONNX Runtime on
    the CPU) the only difference from learner-only is float rounding, so the weights agree closely."""
    offloaded = train_phase_b(phase_b(phase_a_run, tmp_path / "L2", condition="L2", offload_precision="fp32"))
    expected, got = final_expert(learner_run), final_expert(offloaded)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], atol=2e-4, rtol=1e-3)
    summary = json.loads((offloaded / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["encoder"]["boundary"] == 2
    assert summary["breakdown_s"]["producer"]["inference"] > 0
    assert set(summary["breakdown_s"]["learner"]) == {"wait_data", "transfer", "encode", "update"}
    assert (offloaded / "timeline.png").is_file()


def test_int8_condition_runs_and_says_how_power_was_measured(phase_a_run, tmp_path):
    run = train_phase_b(phase_b(phase_a_run, tmp_path / "L1", condition="L1"))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["encoder"]["precision"] == "int8" and summary["samples"] == STEPS * 8
    for device in summary["power"]:  # a number with its method, or why there is none
        assert (device["joules"] is None) == (device["method"] is None)
        assert device["joules"] is not None or device["not_measured"]
    assert summary["peak_memory"]["bytes"] > 0 and summary["peak_memory"]["what"]


def test_cache_condition_reproduces_the_learner_only_batches(phase_a_run, learner_run, tmp_path):
    run = train_phase_b(phase_b(phase_a_run, tmp_path / "cache", condition="cache"))
    summary = json.loads((run / "summary.json").read_text())
    cache = FeatureCache(Path(phase_a_run) / "offload" / "cache-fp16-0-1", summary["cache"]["key"])
    model, config, _ = frozen_encoder(phase_a_run)
    dataset = open_dataset(config.dataset(), "0-1", config.image_size, model.cfg.chunk,
                           f"Phase-A run {phase_a_run}", config.render_quality)
    indices = batch_indices(1, 8, len(dataset), 2000)
    items = [dataset[int(i)] for i in indices]
    images = torch.stack([item[CAMERA_KEY] for item in items]).float() / 255
    with torch.no_grad():
        expected = model.visual(images, torch.stack([item[STATE] for item in items]))
    for got, want in zip(cache.tokens(indices), expected):
        torch.testing.assert_close(got, want, atol=2e-2, rtol=1e-2)  # FP16 storage
    reference = final_expert(learner_run)
    for key, value in final_expert(run).items():
        torch.testing.assert_close(value, reference[key], atol=5e-3, rtol=1e-2)


def test_a_resumed_run_ends_where_the_straight_one_does(phase_a_run, learner_run, tmp_path):
    """The checkpoint holds the expert and its optimizer; batches, masks and dropout are functions of
    (seed, step): 2 steps, then a resume to STEPS, give the straight run's weights exactly."""
    first = train_phase_b(phase_b(phase_a_run, tmp_path / "resumed", condition="learner", steps=2))
    resumed = train_phase_b(PhaseBConfig(resume=first, steps=STEPS))
    assert resumed == first
    expected, got = final_expert(learner_run), final_expert(resumed)
    assert all(torch.equal(got[key], expected[key]) for key in expected)
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["first_step"] == 2 and summary["samples"] == (STEPS - 2) * 8
    with pytest.raises(UserError, match=f"already trained {STEPS} steps; pass --steps above {STEPS}"):
        train_phase_b(PhaseBConfig(resume=first, steps=STEPS))
    with pytest.raises(UserError, match="--lr asks for 0.01 where the run has 0.001"):
        train_phase_b(PhaseBConfig(resume=first, steps=STEPS + 2, lr=1e-2))
    with pytest.raises(UserError, match="is a Phase-A run; resume it with --phase A"):
        train_phase_b(PhaseBConfig(resume=phase_a_run, steps=STEPS))


def test_the_new_expert_trains_at_the_phase_a_rate_unless_told_falling_over_the_last_share(phase_a_run, learner_run,
                                                                                         tmp_path):
    phase_a = json.loads((phase_a_run / "config.json").read_text())["phase_a"]
    assert json.loads((learner_run / "config.json").read_text())["phase_b"]["lr"] == phase_a["lr"]
    decaying = train_phase_b(phase_b(phase_a_run, tmp_path / "decay", condition="learner", lr=2e-3, lr_decay=0.5))
    saved = json.loads((decaying / "config.json").read_text())["phase_b"]
    assert (saved["lr"], saved["lr_decay"]) == (2e-3, 0.5)
    # The last of 4 steps, 1 step before the end of a 2-step decay: half the rate.
    assert json.loads((decaying / "history.json").read_text())[-1]["lr"] == pytest.approx(1e-3)


def test_the_schedule_comes_from_the_phase_a_run_where_the_command_line_gives_none(phase_a_run):
    config = json.loads((phase_a_run / "config.json").read_text())
    decaying = ARActorRun.from_json({**config, "phase_a": {**config["phase_a"], "lr": 3e-4, "lr_decay": 0.25}},
                                    phase_a_run)
    cfg = PhaseBConfig(from_run=phase_a_run)
    assert (with_phase_a_schedule(cfg, decaying).lr, with_phase_a_schedule(cfg, decaying).lr_decay) == (3e-4, 0.25)
    given = with_phase_a_schedule(PhaseBConfig(from_run=phase_a_run, lr=1e-5, lr_decay=0.0), decaying)
    assert (given.lr, given.lr_decay) == (1e-5, 0.0)
    # Older Phase-A runs stored only a rate that was asked for, and no decay: the preset's rate, constant.
    older_options = {key: value for key, value in config["phase_a"].items() if key != "lr_decay"}
    older = ARActorRun.from_json({**config, "phase_a": {**older_options, "lr": None}}, phase_a_run)
    assert (with_phase_a_schedule(cfg, older).lr, with_phase_a_schedule(cfg, older).lr_decay) == (1e-3, 0.0)


def test_the_learner_precision_is_the_one_asked_for(phase_a_run, learner_run, tmp_path):
    bf16 = train_phase_b(phase_b(phase_a_run, tmp_path / "bf16", condition="learner", precision="bf16"))
    assert json.loads((bf16 / "config.json").read_text())["phase_b"]["precision"] == "bf16"
    expected, got = final_expert(learner_run), final_expert(bf16)
    assert any(not torch.equal(got[key], expected[key]) for key in expected)  # autocast changed the sums


def test_the_torch_offload_backend_runs_on_the_learner_device(phase_a_run):
    model, _, _ = frozen_encoder(phase_a_run)
    cfg = phase_b(phase_a_run, None, condition="L2", offload_device="torch", offload_precision="fp32")
    backend = _backend(cfg, model, torch.device("meta"))  # a device other than the CPU, available everywhere
    assert backend.describe()["device"] == "meta"


@pytest.mark.parametrize(("options", "message"), [
    ({"condition": "L5"}, "choose one of learner, L1, L2, L3, L4, cache"),
    ({"lr": 0.0}, "--lr must be > 0, got 0.0"),
    ({"lr_decay": 1.5}, "--lr-decay is a share of the steps, from 0 to 1; got 1.5"),
    ({"steps": 0}, "--steps must be ≥ 1, got 0"),
    ({"condition": "L1", "offload_device": "ort:NoSuchExecutionProvider"}, "has no NoSuchExecutionProvider"),
    ({"condition": "L1", "calibration_episodes": "38-45"}, "both calibration and held-out"),
    ({"power_command": "false"}, "power"),
    ({"eval_every": -1}, "--eval-every must be ≥ 0"),
    ({"eval_every": 2, "eval_seeds": "0-1"}, "--eval-seeds 0, 1: the training episodes were recorded from these seeds"),
])
def test_bad_settings_fail_before_training(phase_a_run, tmp_path, options, message):
    out = tmp_path / "run"
    with pytest.raises(UserError, match=message):
        train_phase_b(phase_b(phase_a_run, out, **options))
    assert not (out / "summary.json").exists()


def test_eval_every_puts_the_checkpoints_closed_loop_success_in_the_runs_rows(phase_a_run, tmp_path):
    run = train_phase_b(phase_b(phase_a_run, tmp_path / "run", condition="L1", eval_every=STEPS, eval_seeds="2000"))
    evaluated = [row for row in read_history(run) if "eval/success_rate" in row]
    assert [row["step"] for row in evaluated] == [STEPS]
    report = json.loads((run / "eval" / f"2000-step{STEPS}" / "results.json").read_text())
    assert report["held_out"] and evaluated[0]["eval/successes"] == report["successes"]
