"""A tiny LeRobot v3.0 dataset of synthetic episodes: 2 × 40 frames of 96×128 video.

The frames are smooth gradients with a moving square, like a rendered scene, so AV1 at the
writer's settings reproduces them at well over 30 dB PSNR; state and action are random.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from hetlab.datasets.lerobot_writer import DatasetSpec, LeRobotWriter

CAMERA = "observation.images.top"
EPISODES, STEPS, HEIGHT, WIDTH, FPS = 2, 40, 96, 128, 50
SPEC = DatasetSpec(fps=FPS, task="Move the square.", robot_type="toy", state_names=tuple(f"q{i}" for i in range(14)),
                   action_names=tuple(f"u{i}" for i in range(14)), cameras=(CAMERA,), height=HEIGHT, width=WIDTH)


@dataclass(frozen=True)
class TinyDataset:
    root: Path
    spec: DatasetSpec
    images: list[np.ndarray]  # per episode: (STEPS, HEIGHT, WIDTH, 3) uint8 as written
    state: list[np.ndarray]
    action: list[np.ndarray]


def synthetic_frames(episode: int, steps: int = STEPS) -> np.ndarray:
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    frames = np.empty((steps, HEIGHT, WIDTH, 3), np.uint8)
    for t in range(steps):
        frames[t, ..., 0] = 40 + x * 150 // WIDTH
        frames[t, ..., 1] = 30 + y * 120 // HEIGHT + 40 * episode
        frames[t, ..., 2] = 90 + t
        top, left = 20 + t // 2, 10 + t + 20 * episode
        frames[t, top:top + 24, left:left + 24] = (230, 40, 40)
    return frames


def write_tiny_dataset(root: Path) -> TinyDataset:
    rng = np.random.default_rng(0)
    images, state, action = [], [], []
    with LeRobotWriter(root, SPEC) as writer:
        for episode in range(EPISODES):
            images.append(synthetic_frames(episode))
            state.append(rng.standard_normal((STEPS, 14)).astype(np.float32))
            action.append(rng.standard_normal((STEPS, 14)).astype(np.float32))
            writer.add_episode({CAMERA: images[-1]}, state[-1], action[-1], extra={"seed": 100 + episode})
    return TinyDataset(root, SPEC, images, state, action)


@pytest.fixture
def make_frames():
    """`make_frames(episode, steps)`: the synthetic frames of an episode."""
    return synthetic_frames


@pytest.fixture(scope="session")
def tiny_dataset_once(tmp_path_factory) -> TinyDataset:
    return write_tiny_dataset(tmp_path_factory.mktemp("tiny") / "dataset")


@pytest.fixture
def tiny_dataset(tiny_dataset_once, tmp_path) -> TinyDataset:
    """A copy of the tiny dataset this test may damage."""
    root = tmp_path / "dataset"
    shutil.copytree(tiny_dataset_once.root, root)
    return TinyDataset(root, SPEC, tiny_dataset_once.images, tiny_dataset_once.state, tiny_dataset_once.action)
