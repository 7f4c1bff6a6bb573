"""A tiny random-init visual encoder, its prefixes exported once per session, and smooth test images.

Exporting one prefix takes seconds, so the four FP32 prefixes are made once, through the backends'
file cache (`prefix_model`, which calls `export_prefix`), into a session work directory; a test
that builds an ONNX Runtime backend for the same encoder in that directory reuses them.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from hetlab.offload.backends import prefix_model
from hetlab.offload.quantise import QuantiseConfig
from hetlab.policies.ar_actor import ARActor, ARActorConfig, VisualEncoder

HEIGHT, WIDTH = 64, 96
TINY = ARActorConfig(d_model=32, heads=2, feedforward=64, expert_feedforward=64, backbone_width=8, chunk=10)


@contextmanager
def one_torch_thread():
    """One intra-op thread: tiny models on a busy 2-core machine crawl with more."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def single_threaded_torch():
    """Every test here runs with one torch thread (the session fixtures below set it themselves)."""
    with one_torch_thread():
        yield


def smooth_images(count: int, seed: int) -> np.ndarray:
    """(count, 3, HEIGHT, WIDTH) uint8 frames like a rendered scene: a few low-frequency waves per
    channel and one flat-coloured square, not white noise (whose activations quantise unlike a camera's)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH] / np.array([HEIGHT, WIDTH])[:, None, None]
    images = np.empty((count, 3, HEIGHT, WIDTH))
    for frame in images:
        for channel in frame:
            channel[:] = rng.uniform(0.2, 0.8)
            for fy, fx, phase, amplitude in rng.uniform([0, 0, 0, 0], [3, 3, 2 * np.pi, 0.15], (3, 4)):
                channel += amplitude * np.sin(2 * np.pi * (fy * y + fx * x) + phase)
        top, left = rng.integers(0, HEIGHT - 16), rng.integers(0, WIDTH - 16)
        frame[:, top:top + 16, left:left + 16] = rng.uniform(0, 1, (3, 1, 1))
    return (np.clip(images, 0, 1) * 255).round().astype(np.uint8)


@pytest.fixture(scope="session")
def frames():
    """`frames(count, seed)`: smooth uint8 images and raw states drawn around the encoder's state statistics."""

    def make(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        state = np.random.default_rng(seed).standard_normal((count, TINY.state_dim)).astype(np.float32)
        return smooth_images(count, seed), state

    return make


@pytest.fixture(scope="session")
def visual() -> VisualEncoder:
    """The tiny model's visual encoder, random init (seed 0), eval mode. Read-only by convention."""
    torch.manual_seed(0)
    return ARActor(TINY).eval().visual


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("offload")


@pytest.fixture(scope="session")
def fp32_prefixes(visual, workdir) -> dict[int, Path]:
    """Boundary k → the FP32 ONNX prefix of `visual` for k = 1..4, in `workdir`."""
    with one_torch_thread():
        return {k: prefix_model(visual, k, (HEIGHT, WIDTH), workdir, "fp32", QuantiseConfig(), None)
                for k in range(1, 5)}
