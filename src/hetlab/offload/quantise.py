"""Static A8W8 quantisation of an exported prefix with ONNX Runtime (QDQ format).

The FP32 graph first goes through ONNX Runtime's recommended pre-processing (symbolic shape
inference and graph optimisation, `quant_pre_process`); then the calibration frames run through
it to fix each quantised activation's range, and QuantizeLinear/DequantizeLinear pairs with
int8 scales are inserted around the operators of `op_types`. QDQ rather than the QOperator
format because every execution provider reads it (CPU, CUDA/TensorRT, OpenVINO, QNN, VitisAI)
and fuses the pairs into its own int8 kernels. Signed int8 activations and weights (S8S8) is
ONNX Runtime's recommended first choice for QDQ on CPUs.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from hetlab.errors import UserError
from hetlab.onnx_export import require_onnx_runtime
from hetlab.files import atomic_path
from hetlab.offload.export import onnx_inputs

CALIBRATION_BATCH = 8  # frames per calibration run (the histogram is over all of them either way)


@dataclass(frozen=True)
class QuantiseConfig:
    method: Literal["percentile", "minmax", "entropy"] = "percentile"  # how activation ranges are calibrated
    percentile: float = 99.999  # percentile method: the share of |activation| values the range covers
    # Operator types to quantise; None = every type ONNX Runtime can. Conv and MatMul alone kept the
    # study's tokens closest to FP32 (the adds, norms and softmax stay in float).
    op_types: tuple[str, ...] | None = ("Conv", "MatMul")
    per_channel: bool = True  # one weight scale per output channel rather than per tensor
    # Activation zero points fixed at 0: TensorRT needs it, and OpenVINO 2026.4's CPU plugin cannot
    # compile this model's int8 MatMuls with others. ONNX Runtime's CPU provider takes either
    # (symmetric cost the tiny model ~3e-5 of cosine).
    symmetric_activations: bool = False

    def __post_init__(self):
        if self.method not in ("percentile", "minmax", "entropy"):
            raise UserError(f"quantisation method {self.method!r}: choose percentile, minmax or entropy")
        if not 0 < self.percentile <= 100:
            raise UserError(f"percentile {self.percentile:g} is outside (0, 100]; the study uses 99.999")
        if self.op_types is not None and not self.op_types:
            raise UserError("op_types is empty: name the operator types to quantise (e.g. Conv MatMul), or all")

    @property
    def tag(self) -> str:
        """The settings in a file name, e.g. percentile-99.999-Conv_MatMul."""
        parts = [self.method] + ([f"{self.percentile:g}"] if self.method == "percentile" else [])
        parts.append("_".join(self.op_types) if self.op_types is not None else "all")
        return "-".join(parts + ([] if self.per_channel else ["per_tensor"]) +
                        (["symmetric"] if self.symmetric_activations else []))


def quantise_prefix(fp32_path: Path | str, int8_path: Path | str, images: np.ndarray, state: np.ndarray,
                    cfg: QuantiseConfig = QuantiseConfig()) -> Path:
    """Write the A8W8 QDQ model of `fp32_path` calibrated on (images, state) to `int8_path`."""
    require_onnx_runtime()
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    methods = {"percentile": CalibrationMethod.Percentile, "minmax": CalibrationMethod.MinMax,
               "entropy": CalibrationMethod.Entropy}
    int8_path = Path(int8_path)
    int8_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hetlab-quantise-") as scratch, atomic_path(int8_path) as tmp, \
            contextlib.redirect_stdout(io.StringIO()):  # the calibrators print progress notes
        prepared = Path(scratch) / "prepared.onnx"
        quant_pre_process(str(fp32_path), str(prepared))
        quantize_static(
            prepared, tmp, Frames(images, state), quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(cfg.op_types) if cfg.op_types is not None else None,
            per_channel=cfg.per_channel, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
            calibrate_method=methods[cfg.method],
            extra_options={"ActivationSymmetric": cfg.symmetric_activations,
                           **({"CalibPercentile": cfg.percentile} if cfg.method == "percentile" else {})})
    return int8_path


class Frames:
    """Calibration frames in batches: an ONNX Runtime CalibrationDataReader (its ABC takes any class
    with `get_next`, so onnxruntime is imported only when quantising)."""

    def __init__(self, images: np.ndarray, state: np.ndarray):
        if len(images) != len(state) or not len(images):
            raise ValueError(f"calibration needs as many states as images, at least one: {len(images)} vs {len(state)}")
        self.images, self.state, self.start = images, state, 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.start >= len(self.images):
            return None
        stop = self.start + CALIBRATION_BATCH
        batch = onnx_inputs(self.images[self.start:stop], self.state[self.start:stop])
        self.start = stop
        return batch
