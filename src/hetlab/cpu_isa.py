"""Whether the int8 kernels an INT8 model will run on add their products in saturating 16-bit lanes.

x86 int8 kernels (ONNX Runtime's MLAS, oneDNN under OpenVINO's CPU device) multiply u8 by s8 and
add the products in pairs. With VNNI (AVX-512 VNNI or AVX-VNNI: vpdpbusd) or AMX the pairs go
straight into 32-bit sums; without them (AVX2, AVX-512 without VNNI) vpmaddubsw adds each pair in a
16-bit lane that saturates at ±32767, so large activations times large weights are clipped: the
tiny encoder's cosine to FP32 drops from 0.9998 to 0.984 (ONNX Runtime) and 0.947 (OpenVINO).
Arm's kernels (sdot/udot or widening multiplies) and GPUs/NPUs do not saturate.

The flags are the ones the kernels see: numpy's runtime CPUID view, which follows an emulator
(valgrind) or a hypervisor's mask, as the kernels' own CPUID checks do; /proc/cpuinfo adds AVX-VNNI
and AMX, which numpy does not name. oneDNN also honours an ISA cap in its environment
(ONEDNN_MAX_CPU_ISA, or the older DNNL_MAX_CPU_ISA).
"""

from __future__ import annotations

import importlib
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# The flags that decide the int8 path, by their /proc/cpuinfo names; numpy's names for those it knows.
INT8_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
NUMPY_NAMES = {"avx2": "AVX2", "avx512f": "AVX512F", "avx512_vnni": "AVX512VNNI"}
# Each one adds int8 products into 32-bit sums, best first.
WIDE_ACCUMULATION = {"amx_int8": "AMX", "avx512_vnni": "AVX-512 VNNI", "avx_vnni": "AVX-VNNI"}

# oneDNN's ISA caps → which of WIDE_ACCUMULATION they leave usable (dnnl_cpu_isa_t's bit masks:
# AVX512_CORE drops AVX2_VNNI's AVX-VNNI bit, AVX10_1_512 = AVX512_CORE_FP16 has it again).
# ALL and DEFAULT cap nothing; an unknown name is taken as a cap without any of them.
_AVX512_VNNI, _BOTH_VNNI = frozenset({"avx512_vnni"}), frozenset({"avx512_vnni", "avx_vnni"})
ONEDNN_CAPS = {
    "SSE41": frozenset(), "AVX": frozenset(), "AVX2": frozenset(), "AVX512_CORE": frozenset(),
    "AVX2_VNNI": frozenset({"avx_vnni"}), "AVX2_VNNI_2": frozenset({"avx_vnni"}),
    "AVX512_CORE_VNNI": _AVX512_VNNI, "AVX512_CORE_BF16": _AVX512_VNNI,
    "AVX10_1_512": _BOTH_VNNI, "AVX512_CORE_FP16": _BOTH_VNNI,
    **dict.fromkeys(("AVX10_1_512_AMX", "AVX512_CORE_AMX", "AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16"),
                    frozenset(WIDE_ACCUMULATION)),
}
NO_CAP = ("ALL", "DEFAULT")

# ONNX Runtime execution providers that run the x86 CPU kernels above → whether they are oneDNN's
# (which honour its ISA cap); any other provider runs on an accelerator or with kernels of its own.
ORT_CPU_PROVIDERS = {"CPUExecutionProvider": False, "DnnlExecutionProvider": True, "OpenVINOExecutionProvider": True}


@dataclass(frozen=True)
class CpuFeatures:
    model: str  # e.g. "AMD EPYC 7763 64-Core Processor"
    arch: str  # platform.machine(): x86_64, aarch64, arm64…
    flags: frozenset[str]  # those of INT8_FLAGS the kernels can use

    @property
    def x86(self) -> bool:
        return self.arch.lower() in ("x86_64", "amd64", "i386", "i686")

    @property
    def flags_in_order(self) -> list[str]:
        """The flags in INT8_FLAGS's order."""
        return [flag for flag in INT8_FLAGS if flag in self.flags]

    def describe(self) -> dict:
        return {"cpu": self.model, "arch": self.arch, "cpu_flags": self.flags_in_order}


@dataclass(frozen=True)
class Int8Kernels:
    """Where an INT8 model runs, and whether its int8 kernels saturate there."""

    target: str  # e.g. "onnxruntime CPUExecutionProvider", "openvino GPU"
    saturating: bool
    reason: str  # in words, for reports
    cpu: CpuFeatures | None  # the host CPU, when the target computes on it

    def describe(self) -> dict:
        return {"target": self.target, "saturating": self.saturating, "reason": self.reason,
                **(self.cpu.describe() if self.cpu is not None else {})}

    def __str__(self) -> str:
        """e.g. "onnxruntime CPUExecutionProvider on AMD EPYC (x86_64, int8 flags: avx2): no VNNI or AMX: …"."""
        cpu = f" on {self.cpu.model} ({self.cpu.arch}, int8 flags: {' '.join(self.cpu.flags_in_order) or 'none'})" \
            if self.cpu is not None else ""
        return f"{self.target}{cpu}: {self.reason}"


def int8_kernels(runtime: str, device: str, cpu: CpuFeatures | None = None,
                 environ: Mapping[str, str] = os.environ) -> Int8Kernels:
    """The int8 kernels of `runtime` ("onnxruntime" with an execution provider, or "openvino" with a
    device) on `cpu` (default: this host's) under the ISA cap in `environ`."""
    target = f"{runtime} {device}"
    if runtime == "onnxruntime":
        on_cpu, onednn = device in ORT_CPU_PROVIDERS, ORT_CPU_PROVIDERS.get(device, False)
    elif runtime == "openvino":
        on_cpu = onednn = "CPU" in device.upper() or device.upper() == "AUTO"  # AUTO may start on the CPU
    else:
        raise ValueError(f"runtime {runtime!r}: onnxruntime or openvino")
    if not on_cpu:
        return Int8Kernels(target, False, f"{device} does not run the x86 CPU kernels that saturate", None)
    cpu = cpu if cpu is not None else host_cpu()
    if not cpu.x86:
        return Int8Kernels(target, False, f"{cpu.arch} int8 kernels sum in 32 bits (dot-product or widening "
                                          "instructions)", cpu)
    cap = (environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA") or "").upper() if onednn else ""
    usable = cpu.flags if cap in ("", *NO_CAP) else cpu.flags & ONEDNN_CAPS.get(cap, frozenset())
    wide = [name for flag, name in WIDE_ACCUMULATION.items() if flag in usable]
    if wide:
        return Int8Kernels(target, False, f"{wide[0]} sums int8 products in 32 bits", cpu)
    capped = f" under ONEDNN_MAX_CPU_ISA={cap}" if cpu.flags & set(WIDE_ACCUMULATION) else ""
    return Int8Kernels(target, True, f"no VNNI or AMX{capped}: u8×s8 products are added in pairs in saturating "
                                     "16-bit lanes (vpmaddubsw)", cpu)


def host_cpu() -> CpuFeatures:
    """This machine's CPU as its int8 kernels see it."""
    cpuinfo = Path("/proc/cpuinfo")
    return cpu_features(platform.machine(), _numpy_cpu_features(), cpuinfo.read_text() if cpuinfo.is_file() else "")


def cpu_features(arch: str, numpy_view: Mapping[str, bool] | None, cpuinfo: str) -> CpuFeatures:
    """The CPU from numpy's runtime CPUID view (None where numpy does not expose it) and /proc/cpuinfo's text."""
    fields = dict(line.split(":", 1) for line in cpuinfo.splitlines() if ":" in line)  # the last core's
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    model = fields.get("model name") or platform.processor() or "unknown CPU"
    listed = set(fields.get("flags", "").split()) & set(INT8_FLAGS)
    if numpy_view is None:
        return CpuFeatures(model, arch, frozenset(listed))
    seen = {flag for flag, key in NUMPY_NAMES.items() if numpy_view.get(key)}
    # /proc/cpuinfo is the kernel's view of the silicon; it speaks for what the process sees only where
    # it agrees with numpy's CPUID view (not under an emulator such as valgrind, which hides AVX-512).
    trusted = listed - set(NUMPY_NAMES) if seen == listed & set(NUMPY_NAMES) else set()
    return CpuFeatures(model, arch, frozenset(seen | trusted))


def _numpy_cpu_features() -> Mapping[str, bool] | None:
    for module in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):  # numpy ≥ 2, numpy 1.x
        try:
            return importlib.import_module(module).__cpu_features__
        except (ImportError, AttributeError):  # private to numpy: it may move
            continue
    return None
