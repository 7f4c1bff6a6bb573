"""What the imitation half trains on: the demonstrations, checked against what the policy reads, and
each step's batch. Everything random is a function of (seed, step) — the batch order, the history
mask, the image shifts, dropout — so a resumed run continues exactly where the uninterrupted one
would have been, and every Phase-B condition of a seed meets the same batches and masks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from hetlab.aloha.record import CAMERA_KEY, recorded_render_quality
from hetlab.datasets.lerobot import ACTION, STATE, LeRobotDataset
from hetlab.errors import UserError
from hetlab.seeds import parse_seeds


def random_shift(images: torch.Tensor, pixels: int, generator: torch.Generator) -> torch.Tensor:
    """Each image of (N, C, H, W) moved by up to ±`pixels` in each direction, its edge rows and
    columns repeated into the gap; the offsets are drawn on the CPU from `generator`."""
    if pixels == 0:
        return images
    height, width = images.shape[-2:]
    padded = torch.nn.functional.pad(images, (pixels,) * 4, mode="replicate")
    offsets = torch.randint(0, 2 * pixels + 1, (len(images), 2), generator=generator).tolist()
    return torch.stack([image[:, y:y + height, x:x + width] for image, (y, x) in zip(padded, offsets)])


def batch_indices(step: int, batch: int, frames: int, seed: int) -> np.ndarray:
    """Frames of batch `step`: consecutive slices of one seeded permutation per epoch."""
    positions = step * batch + np.arange(batch)
    epochs, offsets = np.divmod(positions, frames)
    return np.array([np.random.default_rng([seed, int(e)]).permutation(frames)[o] for e, o in zip(epochs, offsets)])


class StepBatches(torch.utils.data.Sampler):
    """Batch index lists for steps start..stop−1 (a DataLoader batch_sampler)."""

    def __init__(self, start: int, stop: int, batch: int, frames: int, seed: int):
        self.start, self.stop, self.batch, self.frames, self.seed = start, stop, batch, frames, seed

    def __len__(self) -> int:
        return self.stop - self.start

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.start, self.stop):
            yield batch_indices(step, self.batch, self.frames, self.seed).tolist()


def step_generator(seed: int, step: int) -> torch.Generator:
    """The CPU generator of one step's history mask."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def dropout_seed(seed: int, step: int) -> int:
    """The global torch seed of one step (dropout), apart from the history mask's stream."""
    return seed * 1_000_003 + step + 500_000


def open_dataset(path: Path | None, episodes: str, image_size: tuple[int, int], chunk: int,
                 expected_by: str, render_quality: str | None = None) -> LeRobotDataset:
    """The training frames, after checking the dataset has what the policy reads, recorded at the
    size (and render quality, when given) that `expected_by` (e.g. "the cpu preset") renders at."""
    if path is None:
        raise UserError("--dataset is required: a LeRobot v3 cube-transfer dataset (make one with `hetlab aloha record`)")
    dataset = LeRobotDataset(path, parse_seeds(episodes, "--train-episodes"), action_horizon=chunk,
                             image_size=image_size)
    check_recording(dataset.info, path, image_size, render_quality, expected_by)
    features = dataset.info["features"]
    for key, shape in ((STATE, [14]), (ACTION, [14])):
        if key not in features or list(features[key]["shape"]) != shape:
            raise UserError(f"{path}: the AR-Actor needs a {key} feature of shape {shape}; "
                            f"this dataset has {features.get(key, {}).get('shape', 'none')}")
    if CAMERA_KEY not in dataset.video_keys:
        raise UserError(f"{path}: the AR-Actor reads the {CAMERA_KEY} camera; this dataset has "
                        f"{', '.join(dataset.video_keys) or 'no cameras'}")
    return dataset


def check_recording(info: dict, path: Path, image_size: tuple[int, int], render_quality: str | None,
                    expected_by: str) -> None:
    """UserError unless the dataset's camera was recorded at `image_size` and `render_quality`:
    evaluation renders the run's size and quality, so frames made otherwise would not transfer."""
    camera = info["features"].get(CAMERA_KEY)
    if camera is None:
        return  # open_dataset names the missing camera
    recorded = (tuple(camera["shape"][:2]), recorded_render_quality(info))
    wanted = (tuple(image_size), render_quality or recorded[1])
    if recorded != wanted:
        (h, w), quality = wanted
        raise UserError(f"{path} was recorded at {recorded[0][0]}×{recorded[0][1]} with render quality {recorded[1]}; "
                        f"{expected_by} expects {h}×{w} at {quality} (record one with `hetlab aloha record "
                        f"--height {h} --width {w} --render-quality {quality}`)")


def device_batch(batch: dict, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(images in [0, 1], state, actions, is_pad) on the learner device."""
    images = batch[CAMERA_KEY].to(device, non_blocking=True).float().div_(255)
    return (images, batch[STATE].to(device, non_blocking=True), batch[ACTION].to(device, non_blocking=True),
            batch["action_is_pad"].to(device, non_blocking=True))
