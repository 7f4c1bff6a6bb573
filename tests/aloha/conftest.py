"""A real ALOHA cube-transfer dataset, recorded once per session by the real recorder.

2 episodes of 60 frames at 64×96 (64 is AV1's smallest side), seeds 0 and 1; 60 steps end the
episodes long before the handover, so the expert "fails" and they are recorded anyway
(successful_only=False). About 15 s. Rendering picks its headless GL backend itself
(hetlab.headless_gl: a MUJOCO_GL already set is used, else EGL, else OSMesa), as the recorder's
own tests rely on, so nothing is set here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hetlab.aloha.record import RecordConfig, record

TINY_ALOHA = dict(episodes=2, height=64, width=96, steps=60)


@pytest.fixture(scope="session")
def tiny_aloha_dataset(tmp_path_factory) -> Path:
    """The dataset directory (read-only by convention: copy it before damaging it)."""
    out = tmp_path_factory.mktemp("tiny_aloha") / "aloha"
    record(RecordConfig(out=out, successful_only=False, workers=1, **TINY_ALOHA))
    return out
