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
from pathlib import Path

import numpy as np

from hetlab.onnx_export import require_onnx_runtime
from hetlab.files import atomic_path
from hetlab.cpu_isa import int8_kernels
from hetlab.offload.config import QuantiseConfig
from hetlab.offload.export import onnx_inputs

CALIBRATION_BATCH = 8  # frames per calibration run (the histogram is over all of them either way)


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
