"""Where the frozen encoder's prefix runs: torch on the learner, or an exported graph on an inference
accelerator through ONNX Runtime (any execution provider) or OpenVINO.

Every backend answers the same contract (DESIGN.md, EncoderBackend): `prepare(visual, calibration)`
once, then `run(images, state)` → [x0, …, xk], the k + 1 token arrays `encode_rest` takes. The
ONNX backends export (and quantise) the prefix into a work directory and reuse the file on the
next run with the same settings; the file name holds the settings and a digest of the weights,
image size and calibration frames, so a resumed or retrained encoder never meets a stale file.
Evaluation workers in separate processes may prepare one file at once: each writes a temporary
file of its own (`hetlab.files.atomic_path`) and renames it into place, so none fails and the
file any of them opens is whole.
An INT8 backend decides the quantisation's overflow fix for the int8 kernels of its own provider or
device (`cpu_isa`), so a file made for one CPU's kernels is not reused for another's.
A requested device that is missing is an error, never a silent fall back to another.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib.util
import threading
from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np
import torch

from hetlab.errors import UserError
from hetlab.onnx_export import require_onnx_runtime
from hetlab.cpu_isa import int8_kernels
from hetlab.offload.export import cut_prefix, export_prefix, onnx_inputs, output_names
from hetlab.offload.quantise import QuantiseConfig, quantise_prefix
from hetlab.policies.ar_actor import VisualEncoder

PRECISIONS = ("int8", "fp32")
# Short names for `make_backend`; "ort:<provider>" and "openvino:<device>" reach any other.
ORT_SHORT_NAMES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
OPENVINO_MISSING = "OpenVINO is not installed: pip install openvino"

Calibration = tuple[np.ndarray, np.ndarray]  # (images uint8 or [0, 1] float (N, 3, H, W), raw state (N, 14))


class EncoderBackend(ABC):
    """Runs the visual encoder's layers before `boundary` (1..L)."""

    name: str
    boundary: int

    @abstractmethod
    def prepare(self, visual: VisualEncoder, calibration: Calibration | None = None) -> None:
        """Take the (frozen) encoder; INT8 backends calibrate on the frames, FP32 ones ignore them."""

    @abstractmethod
    def run(self, images: torch.Tensor, state: torch.Tensor) -> list[torch.Tensor]:
        """[x0, …, xk] for uint8 or [0, 1] float images (B, 3, H, W) and raw state (B, 14)."""

    @abstractmethod
    def describe(self) -> dict:
        """What runs where: backend, provider or device, precision, boundary."""


class TorchBackend(EncoderBackend):
    """FP32 on the learner device: the baseline the offloaded backends are measured against."""

    name = "torch"

    def __init__(self, boundary: int, device: str | torch.device = "cpu"):
        self.boundary, self.device = boundary, torch.device(device)
        self.visual: VisualEncoder | None = None

    def prepare(self, visual: VisualEncoder, calibration: Calibration | None = None) -> None:
        visual.check_boundary(self.boundary, lowest=1)
        # A frozen copy: whatever the learner does to its own encoder, this one stays as prepared.
        self.visual = copy.deepcopy(visual).to(self.device).eval().requires_grad_(False)

    @torch.no_grad()
    def run(self, images: torch.Tensor, state: torch.Tensor) -> list[torch.Tensor]:
        if self.visual is None:
            raise RuntimeError("prepare() the backend before run()")
        images = images.to(self.device, non_blocking=True)
        images = images.float().div_(255) if images.dtype == torch.uint8 else images.float()
        return self.visual.encode_prefix(images, state.to(self.device, non_blocking=True).float(), self.boundary)

    def describe(self) -> dict:
        return {"backend": self.name, "device": str(self.device), "precision": "fp32", "boundary": self.boundary}


class OnnxRuntimeBackend(EncoderBackend):
    """The exported prefix (FP32, or A8W8 QDQ) in an ONNX Runtime session on one execution provider."""

    name = "onnxruntime"

    def __init__(self, boundary: int, image_size: tuple[int, int], workdir: Path | str,
                 provider: str = "CPUExecutionProvider", precision: str = "int8",
                 quantise: QuantiseConfig = QuantiseConfig(), threads: int | None = None):
        self.ort = require_onnx_runtime()
        available = self.ort.get_available_providers()
        if provider not in available:
            raise UserError(f"ONNX Runtime here has no {provider} (it has {', '.join(available)}); install the "
                            "onnxruntime build that ships it (e.g. onnxruntime-gpu for CUDAExecutionProvider)")
        _check_precision(precision)
        self.boundary, self.image_size, self.workdir = boundary, tuple(image_size), Path(workdir)
        self.provider, self.precision, self.threads = provider, precision, threads
        self.kernels = int8_kernels("onnxruntime", provider)
        self.quantise = quantise.resolved(self.kernels)
        self.model_path: Path | None = None
        self.session = None

    def prepare(self, visual: VisualEncoder, calibration: Calibration | None = None) -> None:
        self.model_path = prefix_model(visual, self.boundary, self.image_size, self.workdir, self.precision,
                                       self.quantise, calibration)
        options = self.ort.SessionOptions()
        if self.threads:
            options.intra_op_num_threads = self.threads
        self.session = self.ort.InferenceSession(str(self.model_path), options, providers=[self.provider])
        if self.provider not in self.session.get_providers():  # ONNX Runtime falls back to CPU with a warning
            raise UserError(f"ONNX Runtime could not start {self.provider} (see its log above); fix its "
                            "installation or pick another offload device")

    def run(self, images: torch.Tensor, state: torch.Tensor) -> list[torch.Tensor]:
        if self.session is None:
            raise RuntimeError("prepare() the backend before run()")
        outputs = self.session.run(output_names(self.boundary), onnx_inputs(images, state))
        return [torch.from_numpy(tokens) for tokens in outputs]

    def describe(self) -> dict:
        return {"backend": self.name, "provider": self.provider, "precision": self.precision,
                "boundary": self.boundary, "threads": self.threads, "model": str(self.model_path),
                **(_int8_settings(self) if self.precision == "int8" else {})}


class OpenVinoBackend(EncoderBackend):
    """The same ONNX file (OpenVINO reads the QDQ pairs as int8) compiled for an OpenVINO device."""

    name = "openvino"

    def __init__(self, boundary: int, image_size: tuple[int, int], workdir: Path | str, device: str = "CPU",
                 precision: str = "int8", quantise: QuantiseConfig = QuantiseConfig()):
        self.core = openvino_core()
        if device not in self.core.available_devices:
            raise UserError(f"OpenVINO here has no device {device} (it has {', '.join(self.core.available_devices)})")
        _check_precision(precision)
        self.boundary, self.image_size, self.workdir = boundary, tuple(image_size), Path(workdir)
        self.device, self.precision = device, precision
        self.kernels = int8_kernels("openvino", device)
        self.quantise = quantise.resolved(self.kernels)
        self.model_path: Path | None = None
        self.compiled = None

    def prepare(self, visual: VisualEncoder, calibration: Calibration | None = None) -> None:
        self.model_path = prefix_model(visual, self.boundary, self.image_size, self.workdir, self.precision,
                                       self.quantise, calibration)
        try:
            # OpenVINO's CPU plugin runs float ops in bf16 where the CPU has it unless told not to. An INT8
            # model's float ops (norms, softmax, the products the overflow fix keeps) run in f32 too: as
            # exact as the FP32 encoder's on every CPU, and an ISA cap below bf16 leaves no bf16 kernels.
            config = {"INFERENCE_PRECISION_HINT": "f32"} if self.precision == "fp32" or self.device == "CPU" else {}
            self.compiled = self.core.compile_model(str(self.model_path), self.device, config)
        except RuntimeError as e:
            if self.precision == "int8" and not self.quantise.symmetric_activations:
                # OpenVINO 2026.4's CPU plugin fails on this model's int8 MatMuls with activation zero points.
                raise UserError(f"OpenVINO cannot compile {self.model_path.name} for {self.device} (int8 activations "
                                "with zero points); quantise with symmetric activations "
                                "(QuantiseConfig(symmetric_activations=True))") from e
            raise

    def run(self, images: torch.Tensor, state: torch.Tensor) -> list[torch.Tensor]:
        if self.compiled is None:
            raise RuntimeError("prepare() the backend before run()")
        results = self.compiled(onnx_inputs(images, state))
        return [torch.from_numpy(np.asarray(results[name])) for name in output_names(self.boundary)]

    def describe(self) -> dict:
        return {"backend": self.name, "device": self.device, "precision": self.precision, "boundary": self.boundary,
                "model": str(self.model_path), **(_int8_settings(self) if self.precision == "int8" else {})}


def prefix_model(visual: VisualEncoder, boundary: int, image_size: tuple[int, int], workdir: Path,
                 precision: str, quantise: QuantiseConfig, calibration: Calibration | None) -> Path:
    """The prefix's ONNX file for these settings in `workdir`: reused if there, else exported (and quantised)."""
    visual.check_boundary(boundary, lowest=1)
    digest = hashlib.blake2b(repr(tuple(image_size)).encode(), digest_size=5)
    for key, tensor in visual.state_dict().items():
        digest.update(f"{key}{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().numpy().tobytes())
    weights = digest.hexdigest()
    # Every shallower prefix is cut from the deepest one, so one encoder is traced once.
    deepest = workdir / f"prefix-k{len(visual.layers)}-fp32-{weights}.onnx"
    if not _reusable(deepest):
        export_prefix(visual, len(visual.layers), *image_size, deepest)
    fp32 = workdir / f"prefix-k{boundary}-fp32-{weights}.onnx"
    if not _reusable(fp32):
        cut_prefix(visual, deepest, boundary, fp32)
    if precision == "fp32":
        return fp32
    if calibration is None:
        raise ValueError("an INT8 backend calibrates on frames: prepare(visual, (images, state))")
    for frames in calibration:
        digest.update(np.ascontiguousarray(frames).tobytes())
    int8 = workdir / f"prefix-k{boundary}-int8-{quantise.tag}-{digest.hexdigest()}.onnx"
    if not _reusable(int8):
        quantise_prefix(fp32, int8, *calibration, quantise)
    return int8


def _reusable(path: Path) -> bool:
    """Whether an earlier export left `path`; a damaged one (written whole, then harmed on disk)
    is refused in one line, since every run that used it would fail on it."""
    if not path.is_file():
        return False
    import onnx
    from google.protobuf.message import DecodeError

    try:
        onnx.load(str(path))
    except (DecodeError, ValueError, OSError) as e:
        raise UserError(f"{path}: cannot read this exported model ({type(e).__name__}: {e}); the file is damaged, "
                        "delete it and it is exported again") from e
    return True


def make_backend(offload_device: str, boundary: int, image_size: tuple[int, int], workdir: Path | str, *,
                 precision: str | None = None, quantise: QuantiseConfig = QuantiseConfig(),
                 threads: int | None = None, learner_device: str | torch.device = "cpu") -> EncoderBackend:
    """A backend by short name: cpu, cuda (ONNX Runtime's CPU/CUDA providers), ort:<provider>,
    openvino[:<device>], or torch (FP32 on `learner_device`). precision: int8 (default on the
    offload devices) or fp32 (torch's only)."""
    if offload_device == "torch":
        if precision not in (None, "fp32"):
            raise UserError(f"the torch backend runs FP32 only, not {precision}; offload to cpu, cuda, ort:<provider> "
                            "or openvino for INT8")
        return TorchBackend(boundary, learner_device)
    precision = precision or "int8"
    if offload_device == "openvino" or offload_device.startswith("openvino:"):
        device = offload_device.partition(":")[2] or "CPU"
        return OpenVinoBackend(boundary, image_size, workdir, device, precision, quantise)
    if offload_device in ORT_SHORT_NAMES:
        provider = ORT_SHORT_NAMES[offload_device]
    elif offload_device.startswith("ort:") and offload_device != "ort:":
        provider = offload_device.removeprefix("ort:")
    else:
        raise UserError(f"offload device {offload_device!r}: choose torch, cpu, cuda, openvino[:<device>] or "
                        "ort:<ONNX Runtime provider> (`available_offload_devices` lists what this machine has)")
    return OnnxRuntimeBackend(boundary, image_size, workdir, provider, precision, quantise, threads)


def available_offload_devices() -> dict[str, str]:
    """Each offload device name → "available", or why it is not."""
    devices = {"torch": "available"}
    try:
        providers = require_onnx_runtime().get_available_providers()
    except UserError as e:
        devices.update({name: str(e) for name in ORT_SHORT_NAMES})
    else:
        for name, provider in ORT_SHORT_NAMES.items():
            devices[name] = "available" if provider in providers else \
                f"ONNX Runtime here has no {provider} (it has {', '.join(providers)})"
        devices.update({f"ort:{provider}": "available" for provider in providers})
    try:
        core = openvino_core()
    except UserError as e:
        devices["openvino"] = str(e)
    else:
        devices["openvino"] = "available"
        devices.update({f"openvino:{device}": "available" for device in core.available_devices})
    return devices


def _int8_settings(backend: OnnxRuntimeBackend | OpenVinoBackend) -> dict:
    """The quantisation as made (overflow fix decided) and the int8 kernels it was decided for."""
    return {"quantise": dataclasses.asdict(backend.quantise), "int8_kernels": backend.kernels.describe()}


_openvino_core = None
_openvino_core_lock = threading.Lock()


def openvino_core():
    """The process's one OpenVINO Core, made on first use and kept until the process exits.

    One Core, never several: each Core loads its own CPU plugin, and each CPU plugin, when loaded,
    swaps in an alternate signal stack of its own on the loading thread (saving the one before); when
    unloaded it unmaps that stack, putting the saved one back only if its own is still current
    (OpenVINO's SigAltStackSetup). Two Cores unloaded in the order they were made, not the reverse
    (garbage collection, or a traceback keeping the first alive, decides that order), leave the thread
    on an unmapped signal stack: the next signal handled there (SIGCHLD under torch's DataLoader
    handler when any child exits, Ctrl-C's SIGINT) kills the process with a bare SIGSEGV, and even
    faulthandler cannot report it, as its handler needs that stack too.
    """
    global _openvino_core
    if importlib.util.find_spec("openvino") is None:
        raise UserError(OPENVINO_MISSING)
    with _openvino_core_lock:
        if _openvino_core is None:
            import openvino

            _openvino_core = openvino.Core()
        return _openvino_core


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise UserError(f"precision {precision!r}: choose int8 or fp32")
