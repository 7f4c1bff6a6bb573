"""The exported prefix: ONNX Runtime reproduces torch at every boundary in FP32 (k = 4 exported,
k = 1..3 cut from it), the A8W8 model stays close to it, and what cannot work is refused before
any file appears."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort
import pytest
import torch
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

from hetlab.errors import UserError
from hetlab.offload.export import cut_prefix, export_prefix, onnx_inputs, output_names
from hetlab.offload.fidelity import mean_cosine
from hetlab.offload.quantise import QuantiseConfig, quantise_prefix

# A random-init tiny encoder on smooth images keeps x_k within cosine 0.9992–0.9994 of FP32 at k = 1..4
# with VNNI kernels and 0.9991 with the overflow fix (on VNNI kernels, and on AVX2 ones in test_overflow_fix),
# while a broken calibration falls below 0.998: 0.9978 with the state ×10, 0.995 from one frame, 0.88 from black images.
INT8_COSINE = 0.998


def expected_tokens(visual, images: np.ndarray, state: np.ndarray) -> list[torch.Tensor]:
    with torch.no_grad():
        return visual.encode_prefix(torch.from_numpy(images).float() / 255, torch.from_numpy(state), 4)


def test_fp32_prefix_reproduces_torch_at_every_boundary(visual, fp32_prefixes, frames):
    images, state = frames(5, seed=1)
    expected = expected_tokens(visual, images, state)
    for k, path in fp32_prefixes.items():
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        images_input = session.get_inputs()[0]
        assert [i.name for i in session.get_inputs()] == ["images", "state"]
        assert isinstance(images_input.shape[0], str)  # only the batch is free
        assert images_input.shape[1:] == [3, 64, 96]
        assert [o.name for o in session.get_outputs()] == output_names(k)
        outputs = session.run(None, onnx_inputs(images, state))
        assert len(outputs) == k + 1
        # At rtol 1e-5 the atol needed was ≤ 1.9e-6 over ATen default/avx2/avx512 and oneDNN AVX2 caps,
        # ONNX Runtime native or on AVX2 (valgrind).
        for got, want in zip(outputs, expected):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


def test_int8_prefix_stays_close_at_every_boundary(visual, fp32_prefixes, frames, tmp_path):
    calibration, (images, state) = frames(48, seed=2), frames(40, seed=3)
    expected = expected_tokens(visual, images, state)
    for k, fp32 in fp32_prefixes.items():
        int8 = quantise_prefix(fp32, tmp_path / f"k{k}.onnx", *calibration, QuantiseConfig())
        graph = onnx.load(int8).graph
        quantised = [n for n in graph.node if n.op_type == "QuantizeLinear"]
        zero_points = {i.name: i for i in graph.initializer}
        assert quantised and all(zero_points[n.input[2]].data_type == onnx.TensorProto.INT8 for n in quantised)
        outputs = ort.InferenceSession(str(int8), providers=["CPUExecutionProvider"]).run(
            output_names(k), onnx_inputs(images, state))
        cosine = mean_cosine(torch.from_numpy(outputs[k]), expected[k])
        assert cosine >= INT8_COSINE, f"boundary {k}: cosine {cosine:.5f}"


def test_symmetric_activations_have_zero_points_of_zero(fp32_prefixes, frames, tmp_path):
    """What TensorRT and OpenVINO's CPU plugin need (see QuantiseConfig.symmetric_activations)."""
    int8 = quantise_prefix(fp32_prefixes[2], tmp_path / "k2.onnx", *frames(16, seed=7),
                           QuantiseConfig(symmetric_activations=True))
    graph = onnx.load(int8).graph
    initializers = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    zero_points = [initializers[n.input[2]] for n in graph.node if n.op_type == "QuantizeLinear"]
    assert zero_points and all(np.all(z == 0) for z in zero_points)


def test_a_failed_quantisation_leaves_no_file(fp32_prefixes, frames, tmp_path):
    images, state = frames(4, seed=4)
    out = tmp_path / "k1.onnx"
    with pytest.raises(InvalidArgument, match=r"(?s)invalid dimensions for input: images.*Got: 32 Expected: 64"):
        quantise_prefix(fp32_prefixes[1], out, images[:, :, :32], state)  # the graph takes 64×96 images
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("k", [0, 5])
def test_a_boundary_outside_1_to_L_is_refused(visual, tmp_path, k):
    with pytest.raises(UserError, match=f"split boundary {k} is outside 1..4"):
        export_prefix(visual, k, 64, 96, tmp_path / "prefix.onnx")
    assert list(tmp_path.iterdir()) == []


def test_a_prefix_is_cut_only_from_a_deeper_one(visual, fp32_prefixes, tmp_path):
    with pytest.raises(ValueError, match="ends at tokens_1"):
        cut_prefix(visual, fp32_prefixes[1], 2, tmp_path / "k2.onnx")
    assert list(tmp_path.iterdir()) == []
