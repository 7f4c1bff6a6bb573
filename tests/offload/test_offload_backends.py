"""Encoder backends: the ONNX Runtime prefix's k + 1 arrays continue through `encode_rest` to every
layer, prepared files are reused only for the same settings, two processes preparing one file (or
one feature cache) both succeed, and a device or boundary that cannot work is a one-line UserError,
never a fall back."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys

import onnxruntime as ort
import onnxruntime.quantization
import pytest
import torch

from hetlab.errors import UserError
from hetlab.offload.backends import (OPENVINO_MISSING, OnnxRuntimeBackend, OpenVinoBackend, TorchBackend,
                                     available_offload_devices, make_backend, prefix_model)
from hetlab.cpu_isa import int8_kernels
from hetlab.offload.feature_cache import FeatureCache, build_feature_cache
from hetlab.offload.fidelity import mean_cosine
from hetlab.offload.quantise import QuantiseConfig

SIZE = (64, 96)
# Every layer continued from this random-init tiny encoder's INT8 tokens (see test_offload_export) measured
# 0.99936–0.99956 cosine to FP32 with VNNI kernels.
INT8_COSINE = 0.998


@pytest.fixture(scope="module")
def batch(frames):
    images, state = frames(6, seed=5)
    return torch.from_numpy(images), torch.from_numpy(state)


@pytest.fixture(scope="module")
def calibration(frames):
    return frames(16, seed=6)


@pytest.fixture(scope="module")
def every_layer(visual, batch):
    """The FP32 torch encoder's [x1, …, x4] for `batch`."""
    images, state = batch
    with torch.no_grad():
        return visual(images.float() / 255, state)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_int8_prefix_tokens_continue_to_every_layer(visual, workdir, fp32_prefixes, batch, calibration, every_layer, k):
    before = {path: path.stat().st_mtime_ns for path in workdir.glob("prefix-*-fp32-*.onnx")}
    backend = OnnxRuntimeBackend(k, SIZE, workdir)
    backend.prepare(visual, calibration)
    assert {path: path.stat().st_mtime_ns for path in workdir.glob("prefix-*-fp32-*.onnx")} == before  # reused
    assert backend.model_path.name.startswith(f"prefix-k{k}-int8-percentile-99.999-Conv_MatMul-")
    tokens = backend.run(*batch)
    assert len(tokens) == k + 1
    assert all(t.dtype == torch.float32 and t.device.type == "cpu" and t.shape == (6, 7, 32) for t in tokens)
    with torch.no_grad():
        layers = visual.encode_rest(tokens, k)
    assert len(layers) == 4
    for i, (got, want) in enumerate(zip(layers, every_layer), start=1):
        assert mean_cosine(got, want) >= INT8_COSINE, f"boundary {k}, layer {i}"
    kernels = int8_kernels("onnxruntime", "CPUExecutionProvider")  # this CPU's: the overflow fix is decided for it
    assert backend.describe() == {"backend": "onnxruntime", "provider": "CPUExecutionProvider", "precision": "int8",
                                  "boundary": k, "threads": None, "model": str(backend.model_path),
                                  "quantise": dataclasses.asdict(QuantiseConfig().resolved(kernels)),
                                  "int8_kernels": kernels.describe()}


def test_fp32_onnx_runtime_and_torch_backends_agree(visual, workdir, fp32_prefixes, batch):
    onnx_backend = make_backend("cpu", 3, SIZE, workdir, precision="fp32", threads=1)
    torch_backend = make_backend("torch", 3, SIZE, workdir)
    assert isinstance(onnx_backend, OnnxRuntimeBackend) and isinstance(torch_backend, TorchBackend)
    for backend in (onnx_backend, torch_backend):
        backend.prepare(visual)
    assert onnx_backend.model_path == fp32_prefixes[3]
    # At rtol 1e-5 the atol needed was ≤ 1.9e-6 over ATen default/avx2/avx512 and oneDNN AVX2 caps, ONNX Runtime
    # native or on AVX2 (valgrind).
    for got, want in zip(onnx_backend.run(*batch), torch_backend.run(*batch), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch_backend.describe() == {"backend": "torch", "device": "cpu", "precision": "fp32", "boundary": 3}


def test_other_quantisation_settings_or_frames_make_another_file(visual, workdir, fp32_prefixes, calibration):
    def prepared(quantise=QuantiseConfig(), frames=calibration):
        backend = OnnxRuntimeBackend(2, SIZE, workdir, quantise=quantise)
        backend.prepare(visual, frames)
        return backend.model_path

    first = prepared()
    written = first.stat().st_mtime_ns
    assert prepared() == first and first.stat().st_mtime_ns == written
    minmax = prepared(QuantiseConfig(method="minmax", op_types=None))
    assert minmax.name.startswith("prefix-k2-int8-minmax-all-")
    images, state = calibration
    other_frames = prepared(frames=(images[::-1].copy(), state[::-1].copy()))
    assert len({first, minmax, other_frames}) == 3


def test_two_workers_preparing_one_int8_file_both_get_a_whole_one(visual, workdir, fp32_prefixes, calibration,
                                                                  batch, tmp_path, monkeypatch):
    """Evaluation workers (separate processes) of one Phase-B run prepare the same INT8 prefix at once.
    Here a second worker quantises it from start to finish while the first is still writing its copy."""
    for fp32 in workdir.glob("prefix-*-fp32-*.onnx"):  # exported once per session; only the INT8 file is new
        shutil.copy(fp32, tmp_path)
    written = []
    quantize_static = onnxruntime.quantization.quantize_static

    def quantise_while_another_worker_does(model_input, model_output, *args, **kwargs):
        quantize_static(model_input, model_output, *args, **kwargs)
        written.append(model_output)
        if len(written) == 1:
            OnnxRuntimeBackend(1, SIZE, tmp_path).prepare(visual, calibration)

    monkeypatch.setattr(onnxruntime.quantization, "quantize_static", quantise_while_another_worker_does)
    first = OnnxRuntimeBackend(1, SIZE, tmp_path)
    first.prepare(visual, calibration)
    assert len(written) == 2 and written[0] != written[1]
    assert len(first.run(*batch)) == 2
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


class AnotherBuildMidway:
    """A progress display for build_feature_cache whose first update runs a whole second build of the
    same cache, as another Phase-B process of the cache condition would."""

    def __init__(self, build):
        self.build, self.other = build, None

    def add_task(self, *args, **kwargs) -> int:
        return 0

    def update(self, *args, **kwargs) -> None:
        if self.other is None:
            self.other = self.build()


def test_two_builds_of_one_feature_cache_both_use_the_first_finished(visual, frames, tmp_path):
    images, state = frames(6, seed=21)
    dataset = [{"image": torch.from_numpy(i), "state": torch.from_numpy(s)} for i, s in zip(images, state)]
    out, key = tmp_path / "cache-fp16-0-1", {"phase_a_step": 20, "train_episodes": "0-1", "image_size": list(SIZE)}

    def build(progress=None) -> dict:
        return build_feature_cache(visual, dataset, out, "fp16", "image", "state", key, progress)

    midway = AnotherBuildMidway(build)
    meta = build(midway)
    assert midway.other is not None and meta == midway.other  # the first to finish won; the other uses it
    with torch.no_grad():
        expected = visual(torch.from_numpy(images).float() / 255, torch.from_numpy(state))
    cached = FeatureCache(out, key).tokens(range(6))
    for got, want in zip(cached, expected, strict=True):
        torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)  # fp16 storage
    assert [p.name for p in tmp_path.iterdir()] == [out.name]


@pytest.mark.parametrize("damaged", ["tokens.npy", "meta.json"])
def test_a_damaged_feature_cache_is_one_line_naming_it(visual, frames, tmp_path, damaged):
    images, state = frames(4, seed=22)
    dataset = [{"image": torch.from_numpy(i), "state": torch.from_numpy(s)} for i, s in zip(images, state)]
    out, key = tmp_path / "cache-int8-0-1", {"phase_a_step": 20, "train_episodes": "0-1", "image_size": list(SIZE)}
    build_feature_cache(visual, dataset, out, "int8", "image", "state", key)
    os.truncate(out / damaged, (out / damaged).stat().st_size // 2)
    with pytest.raises(UserError, match=f"the feature cache is damaged .*; delete {out} to rebuild it") as error:
        FeatureCache(out, key)
    assert str(error.value).startswith(f"{out / damaged}: ") and "\n" not in str(error.value)


def test_a_damaged_exported_prefix_is_one_line_naming_it(visual, fp32_prefixes, tmp_path):
    for path in fp32_prefixes.values():
        shutil.copy(path, tmp_path / path.name)
    damaged = tmp_path / fp32_prefixes[2].name
    os.truncate(damaged, damaged.stat().st_size // 2)
    with pytest.raises(UserError, match="the file is damaged, delete it and it is exported again") as error:
        prefix_model(visual, 2, SIZE, tmp_path, "fp32", QuantiseConfig(), None)
    assert str(damaged) in str(error.value) and "\n" not in str(error.value)


def test_a_provider_onnx_runtime_lacks_here_is_a_user_error(workdir):
    available = ort.get_available_providers()
    missing = next(p for p in ("CUDAExecutionProvider", "TensorrtExecutionProvider", "QNNExecutionProvider")
                   if p not in available)
    with pytest.raises(UserError, match=rf"ONNX Runtime here has no {missing} \(it has .*CPUExecutionProvider"):
        OnnxRuntimeBackend(1, SIZE, workdir, provider=missing)
    with pytest.raises(UserError, match=rf"no {missing}"):
        make_backend(f"ort:{missing}", 1, SIZE, workdir)
    assert f"ort:{missing}" not in available_offload_devices()


def test_openvino_without_the_package_is_a_user_error(workdir, monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # what importing it meets where it is not installed
    with pytest.raises(UserError, match="^OpenVINO is not installed: pip install openvino$"):
        OpenVinoBackend(1, SIZE, workdir)
    with pytest.raises(UserError, match="OpenVINO is not installed"):
        make_backend("openvino:NPU", 1, SIZE, workdir)
    assert available_offload_devices()["openvino"] == OPENVINO_MISSING


def test_available_offload_devices_name_what_works_and_why_not():
    devices = available_offload_devices()
    assert devices["torch"] == devices["cpu"] == devices["ort:CPUExecutionProvider"] == "available"
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert devices["cuda"] == "available"
    else:
        assert devices["cuda"].startswith("ONNX Runtime here has no CUDAExecutionProvider (it has ")


@pytest.mark.parametrize("k", [0, 5])
def test_a_boundary_outside_1_to_L_is_refused(visual, workdir, k):
    for backend in (TorchBackend(k), OnnxRuntimeBackend(k, SIZE, workdir, precision="fp32")):
        with pytest.raises(UserError, match=f"split boundary {k} is outside 1..4"):
            backend.prepare(visual)


@pytest.mark.parametrize("name, options, message", [
    ("npu", {}, "offload device .npu.: choose torch, cpu, cuda"),
    ("ort:", {}, "offload device .ort:.: choose torch"),
    ("torch", {"precision": "int8"}, "the torch backend runs FP32 only"),
    ("cpu", {"precision": "fp16"}, "precision 'fp16': choose int8 or fp32"),
])
def test_impossible_backend_choices_are_user_errors(workdir, name, options, message):
    with pytest.raises(UserError, match=message):
        make_backend(name, 2, SIZE, workdir, **options)


def test_impossible_quantisation_settings_are_user_errors():
    with pytest.raises(UserError, match="quantisation method 'max'"):
        QuantiseConfig(method="max")
    with pytest.raises(UserError, match="percentile 0 is outside"):
        QuantiseConfig(percentile=0)
    with pytest.raises(UserError, match="op_types is empty"):
        QuantiseConfig(op_types=())
