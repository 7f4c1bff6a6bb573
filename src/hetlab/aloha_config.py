"""The ALOHA task's facts that options default from, and `hetlab aloha record`'s options.

Outside the hetlab.aloha package, whose import registers the gymnasium env (and so imports
gymnasium and numpy), so that the command line builds its help without them; hetlab.aloha.env
and hetlab.aloha.record take these from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

EPISODE_STEPS = 400  # an episode is truncated after 400 steps (8 s at 50 Hz)
# "high" is the scene file's own rendering; "fast" draws no shadows and no multisampling.
RenderQuality = Literal["high", "fast"]
RENDER_QUALITIES: tuple[str, ...] = ("high", "fast")


@dataclass(frozen=True, kw_only=True)
class RecordConfig:
    episodes: int = 50  # episodes the dataset should hold when done
    out: Path  # dataset directory; an existing recording there is continued
    height: int = 480  # image height in pixels (even, ≥ 64)
    width: int = 640  # image width in pixels (even, ≥ 64)
    # "fast" (no shadows, no multisampling) renders ~8× quicker than the scene's own "high"; a policy
    # is evaluated at the quality its dataset was recorded at.
    render_quality: RenderQuality = "fast"
    workers: int = 1  # processes rolling out and encoding episodes; 0 = one per core
    first_seed: int = 0  # the seed of the first episode of a new dataset
    steps: int = EPISODE_STEPS  # frames per episode
    # False records episodes the expert fails too (short test recordings end before the handover).
    successful_only: bool = True
    give_up_after: int = 20  # consecutive failed seeds that stop the recording (something is broken)
