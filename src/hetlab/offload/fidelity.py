"""How close the INT8 prefix's tokens stay to the FP32 encoder's, per split boundary.

For each boundary k the prefix is exported, quantised on calibration frames, and run on held-out
frames; fidelity is the mean over those frames of the cosine similarity between the INT8 tokens
x_k (the array the learner continues from, flattened per frame) and the FP32 torch encoder's.
The study calibrates on 48 frames evenly spaced over episodes 0–7, measures on 40 frames evenly
spaced over the held-out episodes 40–49, and aims for a cosine ≥ 0.9975 at every boundary.
Besides the cosines it names the quantisation as made (the overflow fix decided for the provider's
int8 kernels) and the CPU the kernels ran on, and says in words where a boundary misses the goal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from hetlab.aloha.record import CAMERA_KEY
from hetlab.datasets.lerobot import LeRobotDataset
from hetlab.errors import UserError
from hetlab.offload.backends import OnnxRuntimeBackend, TorchBackend
from hetlab.cpu_isa import Int8Kernels
from hetlab.offload.quantise import QuantiseConfig
from hetlab.policies.ar_actor import VisualEncoder

CALIBRATION_EPISODES = range(0, 8)
HELDOUT_EPISODES = range(40, 50)
CALIBRATION_FRAMES, HELDOUT_FRAMES = 48, 40
GOAL = 0.9975  # the study's target cosine at every boundary
RUN_BATCH = 8  # held-out frames per run, so full-size images fit in memory
CALIBRATION_OPTIONS = "another calibration (--quantise.method, --quantise.percentile)"


@dataclass(frozen=True)
class Fidelity:
    """What `fidelity` measured and how the INT8 models were made and run (plain values, for JSON)."""

    cosines: dict[int, float]  # boundary k → mean INT8-vs-FP32 cosine of x_k
    quantise: dict  # the QuantiseConfig the models were made with, overflow_fix decided (on/off)
    int8_kernels: dict  # where they ran: target, CPU model and flags, whether int8 sums saturate and why
    choice: str  # the two above in words: "overflow fix on for onnxruntime CPUExecutionProvider on …"
    below_goal: str | None  # None where every boundary meets GOAL; else where not, why, and what to try


def fidelity(visual: VisualEncoder, image_size: tuple[int, int], workdir: Path, dataset: Path | str,
             boundaries: Sequence[int] = (1, 2, 3, 4), quantise: QuantiseConfig = QuantiseConfig(),
             provider: str = "CPUExecutionProvider", *, calibration_episodes: Sequence[int] = CALIBRATION_EPISODES,
             heldout_episodes: Sequence[int] = HELDOUT_EPISODES, threads: int | None = None, progress=None) -> Fidelity:
    """Mean INT8-vs-FP32 cosine of x_k over the held-out frames of `dataset` (at `image_size`), for
    each boundary k of the (frozen) encoder `visual`.

    The quantised models go to `workdir` and are reused by later calls with the same settings.
    `progress` (a rich Progress) shows one step per boundary."""
    check_held_out(calibration_episodes, heldout_episodes)
    if not boundaries:
        raise UserError("no split boundaries given: name at least one of 1..4")
    for k in boundaries:
        visual.check_boundary(k, lowest=1)
    backends = {k: OnnxRuntimeBackend(k, image_size, workdir, provider, "int8", quantise, threads)
                for k in boundaries}  # a missing provider fails before any frame is decoded
    calibration = evenly_spaced_frames(dataset, calibration_episodes, CALIBRATION_FRAMES, image_size)
    images, state = (torch.from_numpy(x) for x in evenly_spaced_frames(dataset, heldout_episodes, HELDOUT_FRAMES,
                                                                         image_size))
    reference = TorchBackend(max(boundaries))
    reference.prepare(visual)
    expected = _run_batched(reference, images, state)
    job = progress.add_task("fidelity", total=len(boundaries)) if progress is not None else None
    cosines = {}
    for k, backend in backends.items():
        backend.prepare(visual, calibration)
        cosines[k] = mean_cosine(_run_batched(backend, images, state)[k], expected[k])
        if job is not None:
            progress.update(job, advance=1, description=f"fidelity k={k}: {cosines[k]:.5f}")
    made = backends[boundaries[0]]  # every boundary's backend made the same choice for the same kernels
    return Fidelity(cosines, asdict(made.quantise), made.kernels.describe(),
                    f"overflow fix {made.quantise.overflow_fix} for {made.kernels}",
                    shortfall(cosines, made.quantise.overflow_fix, made.kernels))


def shortfall(cosines: dict[int, float], overflow_fix: str, kernels: Int8Kernels) -> str | None:
    """Where the cosines miss GOAL, what the int8 kernels tell of why, and what to try; None where none misses."""
    missed = ", ".join(f"L{k} {cosine:.5f}" for k, cosine in cosines.items() if cosine < GOAL)
    if not missed:
        return None
    where = "this CPU" if kernels.cpu is not None else kernels.target
    if kernels.saturating and overflow_fix == "off":
        advice = "quantise with the overflow fix (--quantise.overflow-fix on, or auto)"
    elif kernels.saturating:
        advice = f"the overflow fix is on and not enough: try {CALIBRATION_OPTIONS}, a CPU with VNNI or AMX, or FP32"
    else:
        advice = (f"the loss is the quantisation's own: try {CALIBRATION_OPTIONS} or fewer quantised operator types "
                  "(--quantise.op-types)")
    return f"below the {GOAL} goal on {where} at {missed}: {kernels.reason}; {advice}"


def _run_batched(backend, images: torch.Tensor, state: torch.Tensor) -> list[torch.Tensor]:
    """The backend's token arrays over all frames, RUN_BATCH frames at a time."""
    parts = [backend.run(images[i:i + RUN_BATCH], state[i:i + RUN_BATCH]) for i in range(0, len(images), RUN_BATCH)]
    return [torch.cat(arrays) for arrays in zip(*parts)]


def check_held_out(calibration_episodes: Sequence[int], heldout_episodes: Sequence[int]) -> None:
    """Calibration must not see the frames fidelity is measured on."""
    overlap = sorted(set(calibration_episodes) & set(heldout_episodes))
    if overlap:
        raise UserError(f"episode(s) {overlap} are both calibration and held-out episodes; calibrate on others "
                        f"(the study calibrates on {_span(CALIBRATION_EPISODES)} and holds out "
                        f"{_span(HELDOUT_EPISODES)})")


def evenly_spaced_frames(dataset_root: Path | str, episodes: Sequence[int], count: int,
                         image_size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """`count` frames evenly spaced over the concatenated frames of `episodes`: images uint8
    (count, 3, H, W) at `image_size` (the run's training size) and raw state (count, 14)."""
    frames = LeRobotDataset(dataset_root, list(episodes), image_size=tuple(image_size))
    if CAMERA_KEY not in frames.video_keys:
        raise UserError(f"{dataset_root}: the AR-Actor reads the {CAMERA_KEY} camera; this dataset has "
                        f"{', '.join(frames.video_keys) or 'no cameras'}")
    if not 1 <= count <= len(frames):
        raise UserError(f"{dataset_root}: episodes {_span(episodes)} hold {len(frames)} frames; cannot pick {count}")
    picks = np.linspace(0, len(frames) - 1, count).round().astype(int)
    images = np.stack([frames[int(i)][CAMERA_KEY].numpy() for i in picks])
    return images, frames.state[picks].copy()


def mean_cosine(tokens: torch.Tensor, reference: torch.Tensor) -> float:
    """Mean over frames of the cosine similarity of each frame's flattened token array."""
    cosines = torch.nn.functional.cosine_similarity(tokens.flatten(1).double(), reference.flatten(1).double())
    return float(cosines.mean())


def _span(episodes: Sequence[int]) -> str:
    episodes = list(episodes)
    contiguous = episodes == list(range(episodes[0], episodes[-1] + 1)) if episodes else False
    return f"{episodes[0]}–{episodes[-1]}" if contiguous and len(episodes) > 1 else str(episodes)
