"""Normalisation statistics as LeRobot computes and stores them.

Each feature gets min, max, mean, std (over frames, per dimension) and count. Images get one
value per channel, shaped (3, 1, 1) and scaled to [0, 1], from an evenly spaced subsample of an
episode's frames, downsampled to ~150 px, as LeRobot does: a few hundred frames pin the
per-channel mean and std down to well under 1 %. Episodes' stats combine exactly (means
weighted by count, variances by the parallel formula), so the dataset's stats are kept up to
date episode by episode without reading any earlier episode again.
"""

from __future__ import annotations

import numpy as np

STAT_NAMES = ("min", "max", "mean", "std", "count")
IMAGE_SAMPLES_MIN, IMAGE_SAMPLES_MAX = 100, 10_000
IMAGE_TARGET_SIZE, IMAGE_DOWNSAMPLE_FROM = 150, 300


def array_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """Stats of (frames, dims) or (frames,) values over frames; every stat has shape (dims,) or (1,)."""
    values = np.asarray(values, dtype=np.float64)
    values = values.reshape(len(values), -1)
    return {
        "min": values.min(axis=0),
        "max": values.max(axis=0),
        "mean": values.mean(axis=0),
        "std": values.std(axis=0),
        "count": np.array([len(values)]),
    }


def image_sample_indices(num_frames: int) -> np.ndarray:
    """Which frames of an episode the image stats read: all of a short episode, ~n^0.75 of a long one."""
    num_samples = max(min(IMAGE_SAMPLES_MIN, num_frames), min(int(num_frames ** 0.75), IMAGE_SAMPLES_MAX))
    return np.round(np.linspace(0, num_frames - 1, num_samples)).astype(int)


def image_stats(frames: np.ndarray) -> dict[str, np.ndarray]:
    """Per-channel stats in [0, 1], shape (3, 1, 1), of (frames, H, W, 3) uint8 images."""
    sample = frames[image_sample_indices(len(frames))]
    height, width = sample.shape[1:3]
    if max(height, width) >= IMAGE_DOWNSAMPLE_FROM:
        step = max(height, width) // IMAGE_TARGET_SIZE
        sample = sample[:, ::step, ::step]
    pixels = sample.reshape(-1, 3).astype(np.float64) / 255.0
    return {
        "min": pixels.min(axis=0).reshape(3, 1, 1),
        "max": pixels.max(axis=0).reshape(3, 1, 1),
        "mean": pixels.mean(axis=0).reshape(3, 1, 1),
        "std": pixels.std(axis=0).reshape(3, 1, 1),
        "count": np.array([len(sample)]),
    }


def aggregate(episode_stats: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One feature's stats over several episodes, from each episode's stats."""
    counts = np.array([s["count"][0] for s in episode_stats], dtype=np.float64)
    means = np.stack([s["mean"] for s in episode_stats])
    variances = np.stack([s["std"] for s in episode_stats]) ** 2
    weights = counts.reshape(-1, *([1] * (means.ndim - 1))) / counts.sum()
    mean = (means * weights).sum(axis=0)
    variance = ((variances + (means - mean) ** 2) * weights).sum(axis=0)
    return {
        "min": np.min(np.stack([s["min"] for s in episode_stats]), axis=0),
        "max": np.max(np.stack([s["max"] for s in episode_stats]), axis=0),
        "mean": mean,
        "std": np.sqrt(variance),
        "count": np.array([int(counts.sum())]),
    }


def from_episode_rows(rows: list[dict]) -> dict[str, dict[str, np.ndarray]]:
    """The dataset's stats (what meta/stats.json holds) from its episodes' metadata rows, whose
    `stats/<feature>/<stat>` columns hold each episode's own."""
    by_feature: dict[str, list[dict[str, np.ndarray]]] = {}
    for row in rows:
        episode_stats: dict[str, dict[str, np.ndarray]] = {}
        for column, value in row.items():
            if column.startswith("stats/"):
                feature, name = column[len("stats/"):].rsplit("/", 1)
                episode_stats.setdefault(feature, {})[name] = np.asarray(value)
        for feature, by_stat in episode_stats.items():
            by_feature.setdefault(feature, []).append(by_stat)
    return {feature: aggregate(by_episode) for feature, by_episode in by_feature.items()}


def to_json(stats: dict[str, dict[str, np.ndarray]]) -> dict:
    return {feature: {name: np.asarray(value).tolist() for name, value in by_stat.items()}
            for feature, by_stat in stats.items()}


def from_json(stats: dict) -> dict[str, dict[str, np.ndarray]]:
    return {feature: {name: np.asarray(value) for name, value in by_stat.items()}
            for feature, by_stat in stats.items()}
