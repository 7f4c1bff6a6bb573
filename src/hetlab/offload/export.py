"""The visual encoder's prefix up to boundary k as ONNX, checked against torch with ONNX Runtime.

The graph is `VisualEncoder.encode_prefix(images, state, k)`: inputs "images" (float32
[batch, 3, H, W] in [0, 1]) and "state" (float32 [batch, 14], raw: the normalisation is inside),
outputs "tokens_0" … "tokens_k" (float32 [batch, 1 + h·w, d_model]). Only the batch is free:
the image size fixes the token grid, and accelerator compilers (QNN, VitisAI, OpenVINO NPU)
want every other dimension static. Exported as `hetlab.deploy.export` exports policies: torch's
torch.export-based exporter, weights inside the one file.

Tracing takes seconds (most of it torch.export), so shallower prefixes can instead be cut out of
an exported deeper one (`cut_prefix`): the same nodes up to tokens_k, hence the same numbers.
Either way the file is checked before it is renamed into place.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import numpy as np
import torch

from hetlab.onnx_export import quiet_exporter, require_onnx_runtime
from hetlab.files import atomic_path
from hetlab.policies.ar_actor import VisualEncoder

TOLERANCE = 1e-4  # max |ONNX Runtime − torch| over a token array, relative to its largest |value| (≥ 1)
PARITY_BATCH = 3  # not the traced batch of 2, so the check also proves the batch axis is free


def export_prefix(visual: VisualEncoder, k: int, height: int, width: int, path: Path | str) -> Path:
    """Write the prefix before boundary k (1..L) for height×width images to `path`; return it."""
    visual.check_boundary(k, lowest=1)
    ort = require_onnx_runtime()
    prefix = Prefix.of(visual, k)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    batch = torch.export.Dim("batch")
    example = (torch.rand(2, 3, height, width), prefix.visual.state_mean.expand(2, -1).clone())
    with atomic_path(path) as tmp, quiet_exporter(), warnings.catch_warnings():
        # Both inputs share the one batch Dim; the exporter notes that the name is used once.
        warnings.filterwarnings("ignore", message=".*axis name.*will not be used", category=UserWarning)
        torch.onnx.export(prefix, example, tmp, dynamo=True, external_data=False, verbose=False,
                          input_names=["images", "state"], output_names=output_names(k),
                          dynamic_shapes=({0: batch}, {0: batch}))
        _check_parity(ort, tmp, prefix, height, width)
    return path


def cut_prefix(visual: VisualEncoder, source: Path | str, k: int, path: Path | str) -> Path:
    """Write the prefix before boundary k, cut from `source` (an exported prefix of `visual` with
    boundary ≥ k), to `path`; return it."""
    import onnx.utils

    visual.check_boundary(k, lowest=1)
    ort = require_onnx_runtime()
    model = onnx.load(str(source))
    available = [output.name for output in model.graph.output]
    if output_names(k)[-1] not in available:
        raise ValueError(f"{source} ends at {available[-1]}; it cannot give the prefix before boundary {k}")
    height, width = (dim.dim_value for dim in model.graph.input[0].type.tensor_type.shape.dim[2:])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        onnx.save(onnx.utils.Extractor(model).extract_model(["images", "state"], output_names(k)), str(tmp))
        _check_parity(ort, tmp, Prefix.of(visual, k), height, width)
    return path


class Prefix(torch.nn.Module):
    """encode_prefix at a fixed boundary, as a module the exporter can trace."""

    def __init__(self, visual: VisualEncoder, k: int):
        super().__init__()
        self.visual, self.k = visual, k

    @classmethod
    def of(cls, visual: VisualEncoder, k: int) -> Prefix:
        """Over a CPU copy in eval mode: the caller's encoder may be training or on an accelerator."""
        return cls(copy.deepcopy(visual).cpu(), k).eval()

    def forward(self, images: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.visual.encode_prefix(images, state, self.k))


def output_names(k: int) -> list[str]:
    return [f"tokens_{i}" for i in range(k + 1)]


def onnx_inputs(images, state) -> dict[str, np.ndarray]:
    """The graph's inputs from uint8 (0..255) or float ([0, 1]) images and raw state, numpy or torch."""
    images, state = (x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
                     for x in (images, state))
    images = images.astype(np.float32) / 255 if images.dtype == np.uint8 else images.astype(np.float32, copy=False)
    return {"images": np.ascontiguousarray(images), "state": np.ascontiguousarray(state, dtype=np.float32)}


def _check_parity(ort, path: Path, prefix: Prefix, height: int, width: int) -> None:
    """Random images and states drawn around the dataset's (the encoder's normaliser) through both."""
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(PARITY_BATCH, 3, height, width, generator=generator)
    visual = prefix.visual
    state = visual.state_mean + visual.state_std * torch.randn(PARITY_BATCH, visual.cfg.state_dim, generator=generator)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    exported = session.run(output_names(prefix.k), onnx_inputs(images, state))
    with torch.no_grad():
        expected = [t.numpy() for t in prefix(images, state)]
    for i, (got, want) in enumerate(zip(exported, expected)):
        error = float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max()))
        if not error <= TOLERANCE:
            raise RuntimeError(f"the exported prefix's tokens_{i} differ from torch's by {error:.3g} "
                               f"(relative) > {TOLERANCE:g}")
