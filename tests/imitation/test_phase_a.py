"""Phase A on a real (tiny) recording: the loss falls, a checkpoint acts, a resumed run is
bit-identical to an uninterrupted one, the batch order covers every frame, and bad input fails
with one clear message before any work."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import hetlab.imitation.phase_a as phase_a
from hetlab.imitation.data import batch_indices, random_shift
from hetlab.imitation.phase_a import train_phase_a
from hetlab.imitation.presets import PRESETS, PhaseAConfig
from hetlab.imitation.run_files import RUN_KIND, load_policy, load_weights, read_run
from hetlab.imitation.schedule import learning_rate
from hetlab.checkpoint import load_checkpoint
from hetlab.datasets.lerobot_writer import DatasetSpec, LeRobotWriter
from hetlab.errors import UserError
from hetlab.policies.ar_actor import ARActor, ARActorConfig
from hetlab.run_history import read_history

TINY = PRESETS["tiny"]
FRAMES = 2 * 60  # tiny_aloha_dataset: 2 episodes × 60 frames


@pytest.fixture(autouse=True)
def one_torch_thread(monkeypatch):
    """One intra-op thread: tiny models on a busy 2-core machine crawl with more. train_phase_a sets
    the count to (cores − loader workers) itself, so it is told there is one core."""
    before = torch.get_num_threads()
    monkeypatch.setattr(phase_a, "cpu_count", lambda: 1)
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_run(dataset: Path, runs_dir: Path, steps: int, **overrides) -> Path:
    options = dict(dataset=dataset, preset="tiny", train_episodes="0-1", runs_dir=runs_dir, steps=steps,
                   loader_workers=0)
    return train_phase_a(PhaseAConfig(**(options | overrides)))


def model_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run)["model"]


# --- training -------------------------------------------------------------------------------------

def test_loss_falls_and_the_checkpoint_acts(tiny_aloha_dataset, tmp_path, figures):
    # Measured on this recording: loss 0.715 (steps 1–10) → 0.134 at step 100 → 0.101 at 120.
    steps = 120
    run = tiny_run(tiny_aloha_dataset, tmp_path, steps, loader_workers=1)
    assert run.parent == tmp_path / RUN_KIND
    history = read_history(run)
    assert [row["step"] for row in history] == list(range(TINY.log_every, steps + 1, TINY.log_every))
    assert history[0]["loss"] >= 5 * history[-1]["loss"], [round(row["loss"], 3) for row in history]
    assert all(np.isfinite(row["grad_norm"]) and row["samples_per_s"] > 0 for row in history)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == summary["session_steps"] == steps and summary["stopped_by"] == "steps"
    assert summary["first_loss"] == history[0]["loss"] and summary["last_loss"] == history[-1]["loss"]
    assert (run / "loss.png").stat().st_size > 0
    assert list((run / "tensorboard").iterdir())

    config = json.loads((run / "config.json").read_text())
    assert config["kind"] == RUN_KIND and config["image_size"] == [TINY.height, TINY.width]
    assert config["render_quality"] == "fast"  # the recording's, which evaluation renders at
    assert config["phase_a"]["steps"] == steps
    model, loaded = load_policy(run)
    assert not model.training
    assert (loaded.phase, loaded.model, loaded.image_size, loaded.render_quality, loaded.options) == \
        ("A", model.cfg, (TINY.height, TINY.width), "fast", config["phase_a"])
    # Trained from scratch (no ImageNet weights), the backbone's batch norm is trained too.
    assert model.cfg == dataclasses.replace(TINY.model, backbone_norm="batch")
    saved = model_weights(run)
    assert all(torch.equal(value, saved[key]) for key, value in model.state_dict().items())
    # The dataset statistics travel with the weights.
    assert not torch.equal(model.visual.state_std, torch.ones(14))
    images = torch.rand(2, 3, TINY.height, TINY.width)
    chunk = model.act(images, torch.zeros(2, 14))
    assert chunk.shape == (2, TINY.model.chunk, 14) and torch.isfinite(chunk).all()


def test_resumed_run_is_bit_identical_to_an_uninterrupted_one(tiny_aloha_dataset, tmp_path, monkeypatch):
    # With dropout and shifted images (the tiny preset has neither), so their per-step seeding is
    # checked too, beside the batch order, the history masks and the optimizer state.
    with_dropout = dataclasses.replace(TINY, model=dataclasses.replace(TINY.model, dropout=0.1), image_shift=3)
    monkeypatch.setitem(PRESETS, "tiny", with_dropout)
    n = 6
    straight = tiny_run(tiny_aloha_dataset, tmp_path / "a", 2 * n)
    interrupted = tiny_run(tiny_aloha_dataset, tmp_path / "b", n)
    assert load_checkpoint(interrupted)["step"] == n
    resumed = train_phase_a(PhaseAConfig(resume=interrupted, steps=2 * n))
    assert resumed == interrupted

    final, expected = load_checkpoint(resumed), load_checkpoint(straight)
    assert final["step"] == expected["step"] == 2 * n
    assert final["model"].keys() == expected["model"].keys()
    for key, value in expected["model"].items():
        assert torch.equal(final["model"][key], value), key
    assert expected["optimizer"]["state"]
    for key, state in expected["optimizer"]["state"].items():  # Adam's moments and step counts
        for name, value in state.items():
            assert torch.equal(final["optimizer"]["state"][key][name], value), (key, name)
    summary = json.loads((resumed / "summary.json").read_text())
    assert (summary["steps"], summary["session_steps"]) == (2 * n, n)

    # Checkpoints every 2 steps, every one kept when asked (to evaluate along the way).
    monkeypatch.setitem(PRESETS, "tiny", dataclasses.replace(with_dropout, checkpoint_every=2))
    train_phase_a(PhaseAConfig(resume=resumed, steps=2 * n + 4, keep_checkpoints=0))
    assert [p.name for p in sorted((resumed / "checkpoints").iterdir())][-3:] == \
        [f"{2 * n:07d}", f"{2 * n + 2:07d}", f"{2 * n + 4:07d}"]

    # A resumed run keeps its options: another preset's model would not fit the checkpoint.
    with pytest.raises(UserError, match=f"--preset cpu: {resumed} was trained with tiny and a resumed run keeps its "
                                        "options"):
        train_phase_a(PhaseAConfig(resume=resumed, steps=3 * n, preset="cpu"))
    assert load_checkpoint(resumed)["step"] == 2 * n + 4
    # Every launch is in meta.json; the refused one left no trace.
    assert len(json.loads((resumed / "meta.json").read_text())["launches"]) == 3


def test_a_run_from_before_history_json_resumes_and_keeps_its_rows(tiny_aloha_dataset, tmp_path):
    run = tiny_run(tiny_aloha_dataset, tmp_path, 20)
    rows = read_history(run)
    # As Phase A wrote it then: a row per line, the last one cut short by the kill that ended the run.
    (run / "history.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows) + '{"step": 2')
    (run / "history.json").unlink()
    assert read_history(run) == rows
    train_phase_a(PhaseAConfig(resume=run, steps=30))
    assert [row["step"] for row in read_history(run)] == [10, 20, 30]
    assert read_history(run)[:2] == rows and not (run / "history.jsonl").exists()


def test_the_learning_rate_falls_over_the_last_share_of_the_steps(tiny_aloha_dataset, tmp_path):
    rates = [learning_rate(step, 1e-3, 0.25, 100) for step in range(100)]
    assert rates[:75] == [1e-3] * 75 and rates[75] == 1e-3
    assert all(a > b > 0 for a, b in zip(rates[75:], rates[76:])) and rates[-1] == pytest.approx(1e-3 / 25)
    assert learning_rate(99, 1e-3, 0.0, 100) == 1e-3

    run = tiny_run(tiny_aloha_dataset, tmp_path, 20, lr=1e-3, lr_decay=0.5, image_shift=2)
    logged = {row["step"]: row["lr"] for row in read_history(run)}  # the rate of the step that ended the row
    assert logged == {10: 1e-3, 20: pytest.approx(1e-4)}
    options = json.loads((run / "config.json").read_text())["phase_a"]
    assert (options["lr"], options["lr_decay"], options["image_shift"]) == (1e-3, 0.5, 2)


def test_shifted_images_are_the_originals_moved_with_their_edges_repeated():
    images = torch.rand(16, 3, 12, 20)
    shifted = random_shift(images, 3, torch.Generator().manual_seed(0))
    assert shifted.shape == images.shape
    assert torch.equal(shifted, random_shift(images, 3, torch.Generator().manual_seed(0)))
    assert torch.equal(random_shift(images, 0, torch.Generator()), images)
    moved = 0
    for original, image in zip(images, shifted):
        # Some offset (dy, dx) in ±3 maps the original's inside onto the shifted image's.
        matches = [(dy, dx) for dy in range(-3, 4) for dx in range(-3, 4)
                   if torch.equal(image[:, 3 + dy:9 + dy, 3 + dx:17 + dx], original[:, 3:9, 3:17])]
        assert len(matches) == 1, matches
        moved += matches[0] != (0, 0)
    assert moved >= 12  # 1 in 49 offsets is (0, 0)


def test_batch_indices_cover_every_frame_once_per_epoch_and_are_deterministic():
    frames, batch, seed = 37, 8, 3
    epochs = 3
    steps = -(-epochs * frames // batch)
    stream = np.concatenate([batch_indices(step, batch, frames, seed) for step in range(steps)])
    orders = [stream[e * frames:(e + 1) * frames] for e in range(epochs)]
    for order in orders:
        assert sorted(order.tolist()) == list(range(frames))
    assert not np.array_equal(orders[0], orders[1]), "each epoch reshuffles"
    assert not np.array_equal(orders[0], np.arange(frames))
    for step in (0, 4, 5, 13):  # a batch is a function of (step, seed) alone
        np.testing.assert_array_equal(batch_indices(step, batch, frames, seed), stream[step * batch:(step + 1) * batch])
    assert not np.array_equal(batch_indices(0, batch, frames, seed), batch_indices(0, batch, frames, seed + 1))


# --- bad input ------------------------------------------------------------------------------------

def write_dataset(root: Path, state_dim: int = 14, camera: str = "observation.images.top", steps: int = 12,
                  size: tuple[int, int] = (TINY.height, TINY.width)) -> Path:
    """A small LeRobot dataset of one episode, shaped unlike the cube transfer where asked."""
    spec = DatasetSpec(fps=50, task="t", robot_type="aloha", state_names=tuple(f"q{i}" for i in range(state_dim)),
                       action_names=tuple(f"u{i}" for i in range(14)), cameras=(camera,), height=size[0],
                       width=size[1])
    rng = np.random.default_rng(0)
    with LeRobotWriter(root, spec) as writer:
        writer.add_episode({camera: rng.integers(0, 255, (steps, *size, 3), dtype=np.uint8)},
                           rng.standard_normal((steps, state_dim)).astype(np.float32),
                           rng.standard_normal((steps, 14)).astype(np.float32))
    return root


def assert_refused_before_work(runs_dir: Path, match: str, **cfg) -> None:
    with pytest.raises(UserError, match=match) as error:
        train_phase_a(PhaseAConfig(preset="tiny", runs_dir=runs_dir, loader_workers=0, **cfg))
    assert "\n" not in str(error.value)
    assert not runs_dir.exists(), "no run directory for a run that never started"


@pytest.mark.parametrize("option, match", [({"lr_decay": 1.5}, "--lr-decay is a share of the steps, from 0 to 1"),
                                           ({"image_shift": -1}, "--image-shift must be ≥ 0 pixels")])
def test_a_bad_schedule_or_augmentation_is_refused(tiny_aloha_dataset, tmp_path, option, match):
    assert_refused_before_work(tmp_path / "runs", match, dataset=tiny_aloha_dataset, **option)


def test_missing_or_absent_dataset_is_refused(tmp_path):
    assert_refused_before_work(tmp_path / "runs", "--dataset is required")
    assert_refused_before_work(tmp_path / "runs", "no such dataset directory", dataset=tmp_path / "absent")


@pytest.mark.parametrize("episodes, match", [("0-2", r"episode\(s\) \[2\] out of range"),
                                             ("1-0", "ends before it starts"),
                                             ("1,0", "increasing order"),
                                             ("first", "--train-episodes takes a range")])
def test_bad_train_episodes_are_refused(tiny_aloha_dataset, tmp_path, episodes, match):
    assert_refused_before_work(tmp_path / "runs", match, dataset=tiny_aloha_dataset, train_episodes=episodes)


def test_a_dataset_with_other_state_or_cameras_is_refused(tmp_path):
    seven = write_dataset(tmp_path / "seven", state_dim=7)
    assert_refused_before_work(tmp_path / "runs", r"observation.state feature of shape \[14\]; this dataset has \[7\]",
                               dataset=seven, train_episodes="0")
    wrist = write_dataset(tmp_path / "wrist", camera="observation.images.wrist")
    assert_refused_before_work(tmp_path / "runs", "reads the observation.images.top camera; this dataset has "
                               "observation.images.wrist", dataset=wrist, train_episodes="0")


def test_a_dataset_recorded_at_another_size_than_the_presets_is_refused(tmp_path):
    # Evaluation renders at the preset's size; frames resized from another would not match them.
    square = write_dataset(tmp_path / "square", size=(64, 64))
    assert_refused_before_work(tmp_path / "runs", "recorded at 64×64 with render quality high; the tiny preset "
                               r"expects 64×96 at high \(record one with `hetlab aloha record --height 64 --width 96 "
                               "--render-quality high`", dataset=square, train_episodes="0")


def test_load_policy_refuses_what_is_not_an_ar_actor_run(tmp_path):
    with pytest.raises(UserError, match="not a run directory"):
        load_policy(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"kind": "ppo"}))
    with pytest.raises(UserError, match="not an AR-Actor run"):
        load_policy(tmp_path)
    with pytest.raises(UserError, match="not a run directory"):
        train_phase_a(PhaseAConfig(resume=tmp_path / "absent"))
    # An AR-Actor run whose config.json lost an entry (edited by hand, or written by another version).
    (tmp_path / "config.json").write_text(json.dumps({"kind": RUN_KIND, "phase": "A", "image_size": [64, 96]}))
    with pytest.raises(UserError, match=r"config.json does not hold what an AR-Actor run records \(KeyError\('model'\)\)"):
        read_run(tmp_path)


def test_load_weights_names_another_model_size(tmp_path):
    tiny = ARActor(TINY.model).state_dict()
    wider = ARActor(ARActorConfig(d_model=64, heads=2, feedforward=64, expert_feedforward=64, backbone_width=8,
                                  chunk=10))
    with pytest.raises(UserError, match="another model size") as error:
        load_weights(wider, tiny, tmp_path)
    assert "\n" not in str(error.value) and str(tmp_path) in str(error.value)
    del tiny["action_expert.head.bias"]
    with pytest.raises(UserError, match="action_expert.head.bias is missing"):
        load_weights(ARActor(TINY.model), tiny, tmp_path)


# --- the command line -----------------------------------------------------------------------------

HETLAB = str(Path(sys.executable).with_name("hetlab"))


def hetlab(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([HETLAB, *args], capture_output=True, text=True, timeout=120, env=env)


def test_cli_trains_and_refuses_bad_input_in_one_line(tiny_aloha_dataset, tmp_path, refusal):
    result = hetlab("aloha", "train", "--dataset", str(tiny_aloha_dataset), "--preset", "tiny", "--steps", "2",
                    "--train-episodes", "0-1", "--runs-dir", str(tmp_path / "runs"), "--loader-workers", "0")
    assert result.returncode == 0, result.stderr
    [run] = (tmp_path / "runs" / RUN_KIND).iterdir()
    assert result.stdout.splitlines()[0] == str(run)
    assert "step 2, loss" in result.stdout
    assert load_checkpoint(run)["step"] == 2

    for args, message in [
        (["--dataset", str(tmp_path / "absent"), "--preset", "tiny"], "no such dataset directory"),
        (["--dataset", str(tiny_aloha_dataset), "--preset", "tiny", "--steps", "0"], "--steps must be ≥ 1, got 0"),
        (["--dataset", str(tiny_aloha_dataset), "--preset", "tiny", "--lr", "0"], "--lr must be > 0, got 0.0"),
        (["--dataset", str(tiny_aloha_dataset), "--seed", "-1"], "--seed must be ≥ 0, got -1"),
        (["--dataset", str(tiny_aloha_dataset), "--max-seconds", "-3"], "--max-seconds must be ≥ 0"),
        (["--dataset", str(tiny_aloha_dataset), "--keep-checkpoints", "-1"], "--keep-checkpoints must be ≥ 0"),
        (["--dataset", str(tiny_aloha_dataset), "--condition", "L2"], "--condition is an option of Phase B"),
        (["--phase", "B", "--from", str(run), "--preset", "tiny"], "--preset is an option of Phase A"),
        (["--phase", "B", "--from", str(run), "--compile", "on"], "--compile is an option of Phase A"),
    ]:
        assert message in refusal("aloha", "train", "--runs-dir", tmp_path / "refused", *args)
    assert not (tmp_path / "refused").exists()


def test_eval_every_puts_the_checkpoints_closed_loop_success_in_the_runs_rows(tiny_aloha_dataset, tmp_path):
    run = tiny_run(tiny_aloha_dataset, tmp_path, 4, eval_every=2, eval_seeds="2000", keep_checkpoints=1)
    evaluated = [row for row in read_history(run) if "eval/success_rate" in row]
    assert [row["step"] for row in evaluated] == [2, 4]
    for row in evaluated:
        report = json.loads((run / "eval" / f"2000-step{row['step']}" / "results.json").read_text())
        assert report["step"] == row["step"] and report["seeds"] == "2000" and report["held_out"]
        assert row["eval/success_rate"] == report["success_rate"] and row["eval/successes"] == report["successes"]
        assert row["eval/wilson_low"] <= row["eval/success_rate"] <= row["eval/wilson_high"]
        assert row["loss"] > 0 and row["samples_per_s"] > 0


@pytest.mark.parametrize("option, match", [
    ({"eval_every": -1}, "--eval-every must be ≥ 0"),
    ({"eval_every": 2, "eval_seeds": "0-1"}, "--eval-seeds 0, 1: the training episodes were recorded from these seeds"),
    ({"eval_every": 2, "eval_seeds": "5-2"}, "--eval-seeds 5-2: the range 5-2 ends before it starts")])
def test_a_bad_evaluation_cadence_is_refused_before_work(tiny_aloha_dataset, tmp_path, option, match):
    assert_refused_before_work(tmp_path / "runs", match, dataset=tiny_aloha_dataset, train_episodes="0-1", **option)
