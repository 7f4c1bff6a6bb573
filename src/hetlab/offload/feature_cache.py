"""Frozen-feature cache: the encoder's output tokens for every training frame, computed once.

Phase B's encoder is frozen and sees no image augmentation, so each frame always yields the
same tokens x1..xL (the action expert rebuilds its K/V from them). They are computed once,
stored memory-mapped, and Phase B then reads tokens instead of decoding video and running the
encoder. Storage: FP16, or INT8 with one FP16 scale per token (symmetric, absmax / 127).
A cache directory is written under a temporary name of its own builder and renamed whole, so a
half-built one is never read; when two builds race, the one that renames first wins and the
other uses its cache.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from hetlab.errors import UserError
from hetlab.files import fsync_directory, fsync_tree, space_checked, temporary_sibling, write_text_atomic

BUILD_BATCH = 16


def _encode_all(visual, dataset, camera: str, state_key: str) -> Iterator[tuple[int, np.ndarray]]:
    for start in range(0, len(dataset), BUILD_BATCH):
        items = [dataset[i] for i in range(start, min(start + BUILD_BATCH, len(dataset)))]
        images = torch.stack([item[camera] for item in items]).float().div_(255)
        state = torch.stack([item[state_key] for item in items])
        with torch.no_grad():
            yield start, torch.stack(visual(images, state), dim=1).numpy()  # (B, L, T, D)


def build_feature_cache(visual, dataset, out: Path, dtype: Literal["fp16", "int8"], camera: str, state_key: str,
                        key: dict, progress=None) -> dict:
    """Encode every frame of `dataset` (in its order) into the cache directory `out`; `key`
    (which checkpoint, episodes, image size) is stored so a stale cache is never used. Returns the
    meta of the cache now at `out` (another build's, if that one finished first)."""
    if dtype not in ("fp16", "int8"):
        raise UserError(f"feature cache dtype must be fp16 or int8, got {dtype!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(out, directory=True)
    try:
        with space_checked(out):
            meta = _write_cache(visual, dataset, tmp, dtype, camera, state_key, key, progress)
        return _publish(meta, tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_cache(visual, dataset, tmp: Path, dtype: str, camera: str, state_key: str, key: dict, progress) -> dict:
    """The whole cache in the (empty) directory `tmp`, on disk; returns its meta."""
    started = time.perf_counter()
    visual.eval()
    probe = dataset[0]
    with torch.no_grad():
        layers = visual(probe[camera][None].float().div_(255), probe[state_key][None])
    shape = (len(dataset), len(layers), *layers[0].shape[1:])
    tokens = _reserved(np.lib.format.open_memmap(tmp / "tokens.npy", "w+", np.float16 if dtype == "fp16" else np.int8,
                                                 shape))
    scales = _reserved(np.lib.format.open_memmap(tmp / "scales.npy", "w+", np.float16, shape[:3])) if dtype == "int8" \
        else None
    job = progress.add_task("feature cache", total=len(dataset)) if progress is not None else None
    for start, block in _encode_all(visual, dataset, camera, state_key):
        rows = slice(start, start + len(block))
        if scales is None:
            tokens[rows] = block
        else:
            scale = np.maximum(np.abs(block).max(axis=-1), 1e-8) / 127.0
            tokens[rows] = np.clip(np.rint(block / scale[..., None]), -127, 127)
            scales[rows] = scale
        if job is not None:
            progress.update(job, advance=len(block))
    tokens.flush()
    if scales is not None:
        scales.flush()
    meta = {"key": key, "frames": shape[0], "layers": shape[1], "tokens": shape[2], "d_model": shape[3], "dtype": dtype,
            "build_s": time.perf_counter() - started,
            "bytes": sum(p.stat().st_size for p in tmp.iterdir())}
    write_text_atomic(tmp / "meta.json", json.dumps(meta, indent=2))
    fsync_tree(tmp)
    return meta


def _reserved(array: np.memmap) -> np.memmap:
    """`array` with its file's blocks allocated now: a full disk fails here with ENOSPC, where writing
    into the sparse mapping later would kill the process with SIGBUS."""
    with open(array.filename, "r+b") as f:
        os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
    return array


def _publish(meta: dict, tmp: Path, out: Path) -> dict:
    """Rename the built cache `tmp` to `out`. Where another build of the same key got there first its
    cache stays (a Phase-B run may be reading it) and this one is dropped; anything else at `out`
    (a stale or broken cache) is replaced."""
    while True:
        try:
            tmp.rename(out)  # over nothing or an empty directory; never over a full one
            fsync_directory(out.parent)
            return meta
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        try:
            there = json.loads((out / "meta.json").read_text())
        except (OSError, ValueError):
            there = None
        if isinstance(there, dict) and there.get("key") == meta["key"] and there.get("dtype") == meta["dtype"]:
            return there
        aside = temporary_sibling(out, directory=True)
        try:
            out.rename(aside)  # the empty `aside` is replaced; fails only if another build moved `out` first
        except FileNotFoundError:
            pass
        shutil.rmtree(aside, ignore_errors=True)


class FeatureCache:
    """Read side: `tokens(indices)` → the L layer outputs of those frames, float32."""

    def __init__(self, root: Path, key: dict):
        meta_path = root / "meta.json"
        if not meta_path.is_file():
            raise UserError(f"{root}: no feature cache here (meta.json missing); it is rebuilt by Phase B's cache condition")
        self.meta = _intact(meta_path, lambda: json.loads(meta_path.read_text()))
        if _intact(meta_path, lambda: self.meta["key"]) != key:
            raise UserError(f"{root}: this cache was built for {self.meta['key']}, not {key}; delete it to rebuild")
        frames, int8 = _intact(meta_path, lambda: (int(self.meta["frames"]), self.meta["dtype"] == "int8"))
        self._tokens = _intact(root / "tokens.npy", lambda: _rows(root / "tokens.npy", frames))
        self._scales = _intact(root / "scales.npy", lambda: _rows(root / "scales.npy", frames)) if int8 else None

    def __len__(self) -> int:
        return self.meta["frames"]

    def tokens(self, indices) -> list[torch.Tensor]:
        order = np.asarray(indices)
        block = self._tokens[order].astype(np.float32)
        if self._scales is not None:
            block *= self._scales[order].astype(np.float32)[..., None]
        return list(torch.from_numpy(block).unbind(dim=1))


def _intact(path: Path, read):
    """`read()`, with what a damaged file of the cache raises as one line naming `path` (a cache
    is renamed into place whole, so a damaged one was harmed on disk since)."""
    try:
        return read()
    except (ValueError, KeyError, TypeError, OSError) as e:
        raise UserError(f"{path}: the feature cache is damaged ({type(e).__name__}: {e}); delete {path.parent} "
                        "to rebuild it") from e


def _rows(path: Path, frames: int) -> np.ndarray:
    """One of the cache's arrays, memory-mapped; ValueError unless it holds a row per frame."""
    array = np.load(path, mmap_mode="r")
    if len(array) != frames:
        raise ValueError(f"it holds {len(array)} frames, the cache {frames}")
    return array
