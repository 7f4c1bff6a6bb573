"""Static A8W8 quantisation of an exported prefix with ONNX Runtime (QDQ format).

The FP32 graph first goes through ONNX Runtime's recommended pre-processing (symbolic shape
inference and graph optimisation, `quant_pre_process`); then the calibration frames run through
it to fix each quantised activation's range, and QuantizeLinear/DequantizeLinear pairs with
int8 scales are inserted around the operators of `op_types`. QDQ rather than the QOperator
format because every execution provider reads it (CPU, CUDA/TensorRT, OpenVINO, QNN, VitisAI)
and fuses the pairs into its own int8 kernels. Signed int8 activations and weights (S8S8) is
ONNX Runtime's recommended first choice for QDQ on CPUs.

On x86 CPUs without VNNI or AMX the int8 kernels add u8×s8 products in pairs in saturating 16-bit
lanes (`cpu_isa`). The overflow fix keeps every pair below the limit: weights quantised to 7 bits
(the kernels shift activations to u8: 255·64 + 255·64 = 32640 < 32767) and the MatMuls of two
activations (attention's Q·Kᵀ and A·V, whose second operand is a full 8-bit activation) left in
float. It costs ~1e-5 of cosine where it is not needed.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np

from hetlab.errors import UserError
from hetlab.onnx_export import require_onnx_runtime
from hetlab.files import atomic_path
from hetlab.cpu_isa import Int8Kernels, int8_kernels
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
    # 7-bit weights and float activation×activation MatMuls (NNCF's name for the same fix); auto = on
    # where the int8 kernels the model runs on saturate, resolved by each backend for its own device.
    overflow_fix: Literal["auto", "on", "off"] = "auto"

    def __post_init__(self):
        if self.method not in ("percentile", "minmax", "entropy"):
            raise UserError(f"quantisation method {self.method!r}: choose percentile, minmax or entropy")
        if not 0 < self.percentile <= 100:
            raise UserError(f"percentile {self.percentile:g} is outside (0, 100]; the study uses 99.999")
        if self.op_types is not None and not self.op_types:
            raise UserError("op_types is empty: name the operator types to quantise (e.g. Conv MatMul), or all")
        if self.overflow_fix not in ("auto", "on", "off"):
            raise UserError(f"overflow_fix {self.overflow_fix!r}: choose auto, on or off")

    def resolved(self, kernels: Int8Kernels) -> QuantiseConfig:
        """These settings with overflow_fix auto decided for the int8 kernels the model will run on."""
        if self.overflow_fix != "auto":
            return self
        return replace(self, overflow_fix="on" if kernels.saturating else "off")

    @property
    def tag(self) -> str:
        """The settings in a file name, e.g. percentile-99.999-Conv_MatMul-overflow_fix. Off leaves
        the names files had before the fix existed (they were made without it)."""
        if self.overflow_fix == "auto":
            raise ValueError("overflow_fix auto names no file: resolve it for the target first (resolved())")
        parts = [self.method] + ([f"{self.percentile:g}"] if self.method == "percentile" else [])
        parts.append("_".join(self.op_types) if self.op_types is not None else "all")
        return "-".join(parts + ([] if self.per_channel else ["per_tensor"]) +
                        (["symmetric"] if self.symmetric_activations else []) +
                        (["overflow_fix"] if self.overflow_fix == "on" else []))


def quantise_prefix(fp32_path: Path | str, int8_path: Path | str, images: np.ndarray, state: np.ndarray,
                    cfg: QuantiseConfig = QuantiseConfig()) -> Path:
    """Write the A8W8 QDQ model of `fp32_path` calibrated on (images, state) to `int8_path`. An
    overflow_fix of auto is decided for ONNX Runtime's CPU provider on this machine."""
    require_onnx_runtime()
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    cfg = cfg.resolved(int8_kernels("onnxruntime", "CPUExecutionProvider"))
    methods = {"percentile": CalibrationMethod.Percentile, "minmax": CalibrationMethod.MinMax,
               "entropy": CalibrationMethod.Entropy}
    int8_path = Path(int8_path)
    int8_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hetlab-quantise-") as scratch, atomic_path(int8_path) as tmp, \
            contextlib.redirect_stdout(io.StringIO()):  # the calibrators print progress notes
        prepared = Path(scratch) / "prepared.onnx"
        quant_pre_process(str(fp32_path), str(prepared))
        fix = cfg.overflow_fix == "on"
        quantize_static(
            prepared, tmp, Frames(images, state), quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(cfg.op_types) if cfg.op_types is not None else None,
            per_channel=cfg.per_channel, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
            reduce_range=fix, nodes_to_exclude=activation_products(onnx.load(str(prepared))) if fix else None,
            calibrate_method=methods[cfg.method],
            extra_options={"ActivationSymmetric": cfg.symmetric_activations,
                           **({"CalibPercentile": cfg.percentile} if cfg.method == "percentile" else {})})
    return int8_path


def activation_products(model) -> list[str]:
    """The names of the MatMul nodes of an onnx.ModelProto that multiply two activations (no weight operand)."""
    weights = {tensor.name for tensor in model.graph.initializer}
    return [node.name for node in model.graph.node if node.op_type == "MatMul" and not weights & set(node.input)]


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
