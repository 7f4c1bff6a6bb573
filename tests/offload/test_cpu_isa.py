"""Which int8 kernels saturate, decided from explicit CPU flag sets, oneDNN ISA caps and devices, and
the overflow-fix setting that follows: auto turns it on exactly where the kernels saturate."""

from __future__ import annotations

import platform

import pytest

from hetlab.errors import UserError
from hetlab.cpu_isa import INT8_FLAGS, CpuFeatures, cpu_features, host_cpu, int8_kernels
from hetlab.offload.quantise import QuantiseConfig


def x86(*flags: str) -> CpuFeatures:
    return CpuFeatures("test CPU", "x86_64", frozenset(flags))


AVX2 = x86("avx2")  # AMD Zen 2/3, Intel Haswell–Comet Lake
AVX512 = x86("avx2", "avx512f")  # Intel Skylake-SP: AVX-512 without VNNI
AVX512_VNNI = x86("avx2", "avx512f", "avx512_vnni")  # Cascade Lake, Ice Lake, AMD Zen 4
AVX_VNNI = x86("avx2", "avx_vnni")  # Intel Alder Lake and later client CPUs
AMX = x86("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")  # Sapphire Rapids
ARM64 = CpuFeatures("Neoverse-V2", "aarch64", frozenset())
CPU_TARGETS = [("onnxruntime", "CPUExecutionProvider"), ("openvino", "CPU")]


@pytest.mark.parametrize("runtime, device", CPU_TARGETS)
@pytest.mark.parametrize("cpu, saturating", [(AVX2, True), (AVX512, True), (AVX512_VNNI, False), (AVX_VNNI, False),
                                             (AMX, False), (ARM64, False)])
def test_int8_sums_saturate_on_x86_cpus_without_vnni_or_amx(runtime, device, cpu, saturating):
    kernels = int8_kernels(runtime, device, cpu, environ={})
    assert (kernels.saturating, kernels.cpu) == (saturating, cpu)
    assert QuantiseConfig().resolved(kernels).overflow_fix == ("on" if saturating else "off")


@pytest.mark.parametrize("cap, cpu, saturating", [
    ("AVX2", AMX, True),
    ("AVX512_CORE", AVX512_VNNI, True),
    ("avx512_core_vnni", AVX512_VNNI, False),  # oneDNN reads the cap in any case
    ("AVX512_CORE_BF16", AVX512_VNNI, False),
    ("AVX2_VNNI", AVX_VNNI, False),
    ("AVX2_VNNI", AVX512_VNNI, True),  # AVX2_VNNI allows the VEX AVX-VNNI only, which this CPU lacks
    ("AVX512_CORE_VNNI", AVX_VNNI, True),  # and AVX512_CORE_VNNI allows AVX-512 VNNI only
    ("AVX512_CORE_AMX", AMX, False),
    ("AVX512_CORE_AMX", AVX2, True),  # a cap only ever takes away
    ("ALL", AVX512_VNNI, False),
    ("SOMETHING_NEWER", AVX512_VNNI, True),  # a cap this check does not know: the fix, to be safe
])
def test_openvino_s_cpu_kernels_follow_onednn_s_isa_cap(cap, cpu, saturating):
    kernels = int8_kernels("openvino", "CPU", cpu, environ={"ONEDNN_MAX_CPU_ISA": cap})
    assert kernels.saturating is saturating
    # The reason names the cap where the cap, not the CPU, takes VNNI and AMX away.
    assert (f"ONEDNN_MAX_CPU_ISA={cap.upper()}" in kernels.reason) is (saturating and cpu is not AVX2)


def test_only_onednn_reads_the_cap_under_either_of_its_names():
    assert int8_kernels("openvino", "CPU", AVX512_VNNI, environ={"DNNL_MAX_CPU_ISA": "AVX2"}).saturating
    assert int8_kernels("onnxruntime", "DnnlExecutionProvider", AVX512_VNNI, {"ONEDNN_MAX_CPU_ISA": "AVX2"}).saturating
    # ONNX Runtime's own CPU kernels (MLAS) pick their instructions by CPUID alone.
    assert not int8_kernels("onnxruntime", "CPUExecutionProvider", AVX512_VNNI, {"ONEDNN_MAX_CPU_ISA": "AVX2"}).saturating


@pytest.mark.parametrize("runtime, device", [("onnxruntime", "CUDAExecutionProvider"),
                                             ("onnxruntime", "TensorrtExecutionProvider"),
                                             ("onnxruntime", "QNNExecutionProvider"), ("openvino", "GPU"),
                                             ("openvino", "NPU")])
def test_accelerators_do_not_need_the_fix_whatever_the_cpu(runtime, device):
    kernels = int8_kernels(runtime, device, AVX2, environ={"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert (kernels.saturating, kernels.cpu) == (False, None)
    assert QuantiseConfig().resolved(kernels).overflow_fix == "off"
    assert kernels.describe() == {"target": f"{runtime} {device}", "saturating": False, "reason": kernels.reason}


@pytest.mark.parametrize("device", ["CPU", "AUTO", "HETERO:GPU,CPU"])
def test_openvino_devices_that_may_compute_on_the_cpu_are_judged_by_it(device):
    assert int8_kernels("openvino", device, AVX2, environ={}).saturating


def test_valgrind_s_cpuid_view_wins_over_proc_cpuinfo():
    cpuinfo = ("processor\t: 0\nmodel name\t: AMD EPYC 9B45\nflags\t\t: fpu sse4_1 avx2 avx512f avx512_vnni avx_vnni "
               "amx_int8\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 9B45\n")
    native = {"AVX2": True, "AVX512F": True, "AVX512VNNI": True}
    everything = x86(*INT8_FLAGS).flags
    assert cpu_features("x86_64", native, cpuinfo) == CpuFeatures("AMD EPYC 9B45", "x86_64", everything)
    # Under valgrind the process sees an AVX2 CPU: what numpy does not name (AVX-VNNI, AMX) is not taken
    # from /proc/cpuinfo either, since it no longer describes what the process sees.
    under_valgrind = {"AVX2": True, "AVX512F": False, "AVX512VNNI": False}
    assert cpu_features("x86_64", under_valgrind, cpuinfo).flags == {"avx2"}
    assert cpu_features("x86_64", None, cpuinfo).flags == everything  # numpy without its CPUID view


def test_this_host_is_read_as_numpy_sees_it():
    from numpy._core._multiarray_umath import __cpu_features__

    cpu = host_cpu()
    assert cpu.arch == platform.machine() and cpu.model
    assert ("avx2" in cpu.flags) is bool(__cpu_features__.get("AVX2"))
    assert ("avx512_vnni" in cpu.flags) is bool(__cpu_features__.get("AVX512VNNI"))
    assert int8_kernels("onnxruntime", "CPUExecutionProvider").cpu == cpu


def test_the_overflow_fix_setting():
    assert QuantiseConfig(overflow_fix="on").resolved(int8_kernels("openvino", "GPU")).overflow_fix == "on"
    assert QuantiseConfig(overflow_fix="off").resolved(int8_kernels("openvino", "CPU", AVX2, {})).overflow_fix == "off"
    assert QuantiseConfig(overflow_fix="on").tag == "percentile-99.999-Conv_MatMul-overflow_fix"
    assert QuantiseConfig(overflow_fix="off").tag == "percentile-99.999-Conv_MatMul"
    with pytest.raises(ValueError, match="resolve it for the target first"):
        QuantiseConfig().tag  # auto names no file
    with pytest.raises(UserError, match=r"^overflow_fix 'yes': choose auto, on or off$"):
        QuantiseConfig(overflow_fix="yes")
