"""Atomic writes: flushed to disk before the rename and the rename made durable, one temporary file
per writer, nothing left behind, and temporary names recognised (only ours) after a crash."""

from __future__ import annotations

import os

import pytest

import hetlab.files as files
from hetlab.files import atomic_path, temporary_target, write_text_atomic


def test_the_file_is_flushed_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    events = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recording_replace(src, dst):
        events.append(("replace", str(src), str(dst)))
        replace(src, dst)

    monkeypatch.setattr(files.os, "fsync", recording_fsync)
    monkeypatch.setattr(files.os, "replace", recording_replace)
    target = tmp_path / "config.json"
    write_text_atomic(target, "{}")
    [(_, tmp, _)] = [event for event in events if event[0] == "replace"]
    assert events == [("fsync", tmp), ("replace", tmp, str(target)), ("fsync", str(tmp_path))]
    assert target.read_text() == "{}"


def test_two_writers_of_one_file_each_write_their_own_temporary(tmp_path):
    """A second writer (another process quantising the same encoder file, say) starts and finishes
    while the first is writing: both succeed, the file is whole, no temporary is left."""
    target = tmp_path / "prefix.onnx"
    with atomic_path(target) as first:
        first.write_text("first")
        with atomic_path(target) as second:
            assert second != first and second.suffix == first.suffix == ".onnx"
            second.write_text("second")
        assert target.read_text() == "second" and first.read_text() == "first"
    assert target.read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["prefix.onnx"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="killed"):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_temporary_files_are_new_files_with_the_usual_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        with atomic_path(tmp_path / "info.json") as tmp:
            assert tmp.is_file() and tmp.stat().st_size == 0
            assert tmp.stat().st_mode & 0o777 == 0o644  # not mkstemp's 0o600
    finally:
        os.umask(umask)


@pytest.mark.parametrize("name, target", [
    (".file-002.parquet.0123456789abcdef.tmp.parquet", "file-002.parquet"),
    (".file-002.parquet.tmp.parquet", "file-002.parquet"),  # the name earlier versions used
    (".0000100-b.0123456789abcdef.tmp", "0000100-b"),
    (".DS_Store", None),
    (".gitattributes", None),
    (".git", None),
    ("file-000.parquet", None),
    (".file-002.parquet.0123456789abcdef.tmp.json", None),  # a suffix that is not its target's
])
def test_temporary_names_are_recognised_and_others_are_not(name, target):
    assert temporary_target(name) == target


def test_temporary_names_made_here_are_recognised(tmp_path):
    for name in ("file-000.parquet", "info.json", "0000007"):
        with atomic_path(tmp_path / name) as tmp:
            assert temporary_target(tmp) == name
