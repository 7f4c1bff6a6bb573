"""What exporting a torch module to ONNX needs: the `export` extra, and a quiet exporter.

Used for a trained policy (`hetlab.deploy.export`) and for the visual encoder's prefix
(`hetlab.offload.export`).
"""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager
from types import ModuleType

from hetlab.extras import require


def require_onnx_runtime(needed_for: str = "ONNX export") -> ModuleType:
    """onnxruntime, after checking that the whole `export` extra (onnx, onnxscript) is there."""
    for module in ("onnx", "onnxscript"):
        require("export", module, needed_for)
    return require("export", "onnxruntime", needed_for)


@contextmanager
def quiet_exporter():
    """Hide the exporter's chatter that is not about this model (deprecations inside torch,
    a note per torchvision op it skips registering)."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        logger.setLevel(level)
