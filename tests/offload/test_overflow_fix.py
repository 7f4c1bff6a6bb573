"""The overflow fix for x86 int8 kernels without VNNI or AMX: what it changes in the quantised graph,
that backends decide it for their own kernels and name it in the file, and that it holds the tiny
encoder's INT8 tokens close to FP32 where the saturating kernels really run. Those kernels are
forced on this machine: ONNX Runtime's under valgrind (whose CPUID shows AVX2 without AVX-512 or
VNNI), OpenVINO's under oneDNN's ISA cap ONEDNN_MAX_CPU_ISA=AVX2, each in a process of its own."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
import torch

import hetlab.cpu_isa as cpu_isa
from hetlab.offload.backends import OnnxRuntimeBackend
from hetlab.cpu_isa import CpuFeatures, cpu_features, int8_kernels
from hetlab.offload.export import onnx_inputs
from hetlab.offload.fidelity import mean_cosine
from hetlab.offload.quantise import QuantiseConfig, activation_products, quantise_prefix

SIZE = (64, 96)
# On a VNNI CPU the tiny encoder's INT8 tokens stay ≥ 0.9997 close to FP32 with or without the fix;
# on saturating kernels without it they fall to ~0.98 (ONNX Runtime) and ~0.95 (OpenVINO).
INT8_COSINE = 0.998
AVX2_ONLY = CpuFeatures("an AVX2-only x86 CPU", "x86_64", frozenset({"avx2"}))
OUTPUTS_SCRIPT = Path(__file__).with_name("int8_outputs.py")
X86 = platform.machine().lower() in ("x86_64", "amd64")


def quantised(fp32: Path, out: Path, frames, overflow_fix: str, **settings) -> onnx.GraphProto:
    return onnx.load(quantise_prefix(fp32, out, *frames(16, seed=6),
                                     QuantiseConfig(overflow_fix=overflow_fix, **settings))).graph


def int8_weights(graph: onnx.GraphProto) -> list[np.ndarray]:
    initializers = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    return [initializers[n.input[0]] for n in graph.node if n.op_type == "DequantizeLinear"
            and n.input[0] in initializers and initializers[n.input[0]].dtype == np.int8]


def activation_products_quantised(graph: onnx.GraphProto) -> list[bool]:
    """For each MatMul of two activations (neither operand a weight, int8 or float): whether it takes int8 operands."""
    initializers = {i.name for i in graph.initializer}
    dequantised = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    weights = initializers | {output for output, source in dequantised.items() if source in initializers}
    return [all(name in dequantised for name in node.input) for node in graph.node
            if node.op_type == "MatMul" and not weights & set(node.input)]


def test_the_fix_quantises_weights_to_7_bits_and_keeps_activation_products_in_float(fp32_prefixes, frames, tmp_path):
    off = quantised(fp32_prefixes[2], tmp_path / "off.onnx", frames, "off")
    on = quantised(fp32_prefixes[2], tmp_path / "on.onnx", frames, "on")
    assert max(np.abs(w.astype(int)).max() for w in int8_weights(off)) == 127
    assert max(np.abs(w.astype(int)).max() for w in int8_weights(on)) <= 64  # 7 bits: |w| ≤ 64
    assert len(int8_weights(on)) == len(int8_weights(off))  # every weight is still int8
    # Two attention products (Q·Kᵀ, A·V) per layer, quantised without the fix and in float with it.
    assert activation_products_quantised(off) == [True] * 4
    assert activation_products_quantised(on) == [False] * 4
    assert len(activation_products(onnx.load(fp32_prefixes[2]))) == 4


def test_auto_decides_for_the_backend_s_kernels_and_names_the_file(visual, workdir, fp32_prefixes, frames, monkeypatch):
    monkeypatch.setattr(cpu_isa, "host_cpu", lambda: AVX2_ONLY)
    fixed = OnnxRuntimeBackend(2, SIZE, workdir)
    fixed.prepare(visual, frames(16, seed=6))
    assert "-Conv_MatMul-overflow_fix-" in fixed.model_path.name
    described = fixed.describe()
    assert described["quantise"]["overflow_fix"] == "on"
    assert described["int8_kernels"]["saturating"] is True
    assert (described["int8_kernels"]["cpu"], described["int8_kernels"]["cpu_flags"]) == ("an AVX2-only x86 CPU", ["avx2"])
    unfixed = OnnxRuntimeBackend(2, SIZE, workdir, quantise=QuantiseConfig(overflow_fix="off"))
    unfixed.prepare(visual, frames(16, seed=6))
    assert unfixed.model_path.name.startswith("prefix-k2-int8-percentile-99.999-Conv_MatMul-")  # as before the fix
    assert "overflow_fix" not in unfixed.model_path.name and unfixed.describe()["quantise"]["overflow_fix"] == "off"


def outputs_elsewhere(command: list[str], runtime: str, models: list[Path], images: np.ndarray, state: np.ndarray,
                      tmp_path: Path, env: dict[str, str] | None = None) -> tuple[list[dict], dict]:
    """Each model's outputs computed by int8_outputs.py under `command`, and the CPU features numpy saw there."""
    frames, out = tmp_path / "frames.npz", tmp_path / "outputs.npz"
    np.savez(frames, **onnx_inputs(images, state))
    done = subprocess.run([*command, sys.executable, str(OUTPUTS_SCRIPT), runtime, str(frames), str(out),
                           *map(str, models)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    arrays = np.load(out)
    per_model = [{int(key.rpartition("_")[2]): torch.from_numpy(arrays[key]) for key in arrays
                  if key.startswith(f"{i}-tokens_")} for i in range(len(models))]
    return per_model, json.loads(done.stdout)


def cosines(outputs: dict[int, torch.Tensor], visual, images: np.ndarray, state: np.ndarray) -> dict[int, float]:
    """x_k's cosine to the FP32 encoder's at every boundary k = 1..4 of a k = 4 prefix's outputs."""
    with torch.no_grad():
        expected = visual.encode_prefix(torch.from_numpy(images).float() / 255, torch.from_numpy(state), 4)
    return {k: mean_cosine(outputs[k], expected[k]) for k in range(1, 5)}


@pytest.mark.skipif(shutil.which("valgrind") is None,
                    reason="valgrind is not installed: it is how this test forces ONNX Runtime's AVX2 int8 path")
@pytest.mark.skipif(not X86, reason="valgrind shows an x86 process an AVX2 CPU; elsewhere there is no path to force")
def test_onnx_runtime_on_an_avx2_cpu_needs_the_fix_and_auto_gives_it(visual, fp32_prefixes, frames, tmp_path):
    auto = QuantiseConfig().resolved(int8_kernels("onnxruntime", "CPUExecutionProvider", AVX2_ONLY))
    assert auto.overflow_fix == "on"
    calibration, (images, state) = frames(16, seed=6), frames(8, seed=3)  # 8 frames: valgrind is slow
    models = [quantise_prefix(fp32_prefixes[4], tmp_path / f"{name}.onnx", *calibration, cfg)
              for name, cfg in (("off", QuantiseConfig(overflow_fix="off")), ("auto", auto))]
    (off, fixed), numpy_view = outputs_elsewhere(["valgrind", "--tool=none", "-q"], "onnxruntime", models,
                                                 images, state, tmp_path)
    # What the kernels saw is an AVX2-only CPU (valgrind hides /proc/cpuinfo's AVX-512 and VNNI from CPUID).
    assert cpu_features(platform.machine(), numpy_view, "").flags == AVX2_ONLY.flags
    off, fixed = cosines(off, visual, images, state), cosines(fixed, visual, images, state)
    # The saturating kernels ran: without the fix every boundary is further from FP32 than with it,
    # and the deeper ones miss the goal (this tiny encoder: 0.9990, 0.9986, 0.9973, 0.9966).
    assert all(off[k] < fixed[k] for k in off) and min(off.values()) < INT8_COSINE, (off, fixed)
    assert min(fixed.values()) >= INT8_COSINE, fixed


@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="the openvino extra is not installed")
@pytest.mark.skipif(not X86, reason="oneDNN's ISA cap names x86 instruction sets")
def test_openvino_under_an_avx2_cap_needs_the_fix_and_auto_gives_it(visual, fp32_prefixes, frames, tmp_path):
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    symmetric = QuantiseConfig(symmetric_activations=True)  # as OpenVINO's CPU plugin needs
    auto = symmetric.resolved(int8_kernels("openvino", "CPU", environ=env))
    assert auto.overflow_fix == "on"
    calibration, (images, state) = frames(16, seed=6), frames(8, seed=3)
    models = [quantise_prefix(fp32_prefixes[4], tmp_path / f"{name}.onnx", *calibration, cfg)
              for name, cfg in (("off", QuantiseConfig(symmetric_activations=True, overflow_fix="off")),
                                ("auto", auto))]
    (off, fixed), _ = outputs_elsewhere([], "openvino", models, images, state, tmp_path, env)
    off, fixed = cosines(off, visual, images, state), cosines(fixed, visual, images, state)
    assert max(off.values()) < INT8_COSINE, off  # the capped, saturating kernels ran
    assert min(fixed.values()) >= INT8_COSINE, fixed
