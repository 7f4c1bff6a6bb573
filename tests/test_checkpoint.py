"""Checkpoints: flushed to disk before checkpoint.json names them, and checkpoint.json names a
complete checkpoint whatever moment a save is cut short at, a second save of one iteration included."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import hetlab.checkpoint as checkpoint
from hetlab.checkpoint import KEEP, load_checkpoint, mark_best, read_best, save_checkpoint
from hetlab.errors import UserError


def state(value: float) -> dict:
    return {"weights": torch.full((3,), value), "buffer": np.arange(4) * value, "step": int(value)}


def named(run: Path) -> str:
    return json.loads((run / "checkpoint.json").read_text())["latest"]


def test_save_and_load_round_trip(tmp_path):
    save_checkpoint(tmp_path, 5, state(5.0))
    loaded = load_checkpoint(tmp_path)
    assert torch.equal(loaded["weights"], torch.full((3,), 5.0)) and loaded["step"] == 5
    np.testing.assert_array_equal(loaded["buffer"], np.arange(4) * 5.0)


@pytest.mark.parametrize("crash_at", ["rename", "pointer"])
def test_a_second_save_of_one_iteration_cut_short_leaves_the_first(tmp_path, monkeypatch, crash_at):
    """Phase B saves its last step twice when the run ends on a checkpoint boundary. Cut short before
    or after the new directory is renamed into place, checkpoint.json still names a whole one."""
    save_checkpoint(tmp_path, 10, state(1.0))

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed")

    if crash_at == "rename":
        monkeypatch.setattr(Path, "rename", crash)
    else:
        monkeypatch.setattr(checkpoint, "write_text_atomic", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 10, state(2.0))
    monkeypatch.undo()
    assert load_checkpoint(tmp_path)["weights"][0] == 1.0
    # The next save goes on as usual and clears what the cut-short one left.
    save_checkpoint(tmp_path, 10, state(3.0))
    assert load_checkpoint(tmp_path)["weights"][0] == 3.0
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [named(tmp_path)]


def test_a_second_save_of_one_iteration_alternates_between_two_names(tmp_path):
    for value, name in [(1.0, "0000010"), (2.0, "0000010-b"), (3.0, "0000010")]:
        save_checkpoint(tmp_path, 10, state(value))
        assert named(tmp_path) == name and load_checkpoint(tmp_path)["weights"][0] == value
        assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [name]


def test_the_newest_are_kept_and_other_files_left_alone(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / ".DS_Store").write_bytes(b"")
    (checkpoints / ".0000002.0123456789abcdef.tmp").mkdir()  # a save killed before its rename
    for iteration in range(1, 5):
        save_checkpoint(tmp_path, iteration, state(float(iteration)))
    assert sorted(p.name for p in checkpoints.iterdir()) == [".DS_Store", *[f"{i:07d}" for i in range(5 - KEEP, 5)]]
    assert named(tmp_path) == "0000004"


def test_keep_zero_keeps_every_checkpoint_and_any_kept_one_loads_by_iteration(tmp_path):
    for iteration in (100, 200, 300):
        save_checkpoint(tmp_path, iteration, state(float(iteration)), keep=0)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["0000100", "0000200", "0000300"]
    assert load_checkpoint(tmp_path)["weights"][0] == 300.0
    assert load_checkpoint(tmp_path, 100)["weights"][0] == 100.0
    save_checkpoint(tmp_path, 200, state(2.5), keep=0)  # a second save of 200 is read, not the first
    assert load_checkpoint(tmp_path, 200)["weights"][0] == 2.5
    with pytest.raises(UserError, match=r"keeps no checkpoint of step 150; it keeps step\(s\) 100, 200, 300"):
        load_checkpoint(tmp_path, 150)


def test_the_best_checkpoint_outlives_newer_ones_and_loads_by_name(tmp_path):
    save_checkpoint(tmp_path, 1, state(1.0))
    with pytest.raises(UserError, match="has no best checkpoint; runs trained with --eval-every N keep"):
        load_checkpoint(tmp_path, "best")
    save_checkpoint(tmp_path, 2, state(2.0))
    mark_best(tmp_path, 2, {"eval/return": 7.5})
    for iteration in (3, 4, 5):
        save_checkpoint(tmp_path, iteration, state(float(iteration)))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["0000002", "0000004", "0000005"]
    assert load_checkpoint(tmp_path, "best")["weights"][0] == 2.0 and read_best(tmp_path)["eval/return"] == 7.5
    assert load_checkpoint(tmp_path, "latest")["weights"][0] == load_checkpoint(tmp_path, "5")["weights"][0] == 5.0
    with pytest.raises(UserError, match="--checkpoint 'newest': give an iteration"):
        load_checkpoint(tmp_path, "newest")


def test_every_file_is_on_disk_before_checkpoint_json_names_it(tmp_path, monkeypatch):
    events = []
    fsync = os.fsync

    def recording_fsync(fd):
        events.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    def extra(directory: Path) -> None:
        (directory / "replay").mkdir()
        np.save(directory / "replay" / "obs.npy", np.zeros(3))

    monkeypatch.setattr(os, "fsync", recording_fsync)
    save_checkpoint(tmp_path, 1, state(1.0), write_extra=extra)
    pointer = events.index(str(tmp_path))  # checkpoint.json's rename made durable: the last step
    before = [Path(path) for path in events[:pointer]]
    written = {path.name for path in before}
    assert {"tensors.safetensors", "state.json", "obs.npy", "replay"} <= written
    assert Path(tmp_path / "checkpoints") in before  # the checkpoint's rename, before the pointer's
