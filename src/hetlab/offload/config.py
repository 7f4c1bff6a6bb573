"""Phase B's INT8 quantisation settings (`--quantise.*`), apart from the quantiser (quantise.py), which
needs numpy and ONNX Runtime: the command line builds its help from them without either."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from hetlab.cpu_isa import Int8Kernels
from hetlab.errors import UserError


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
