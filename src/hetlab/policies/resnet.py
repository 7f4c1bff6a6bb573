"""ResNet18 feature extractor, keyed like torchvision's.

torchvision does not import beside the pinned torch here, so the network is written out; its
parameter and buffer names match `torchvision.models.resnet18().state_dict()`, so an ImageNet
weights file (`resnet18-f37072d3.pth` or a safetensors copy) loads with `load_imagenet`. The
classifier (`fc`) is left out: the policy reads the last feature map. `width` scales every
stage's channels (64 → torchvision's network; tests use a narrow one).

`norm`: "frozen" batch norm (fixed statistics and affine map, as DETR/ACT use it) belongs with
ImageNet weights, whose statistics it keeps. Trained from scratch it is the identity, and then
nothing keeps the activations' scale: they shrink stage by stage until every image gives nearly
the same tokens and the policy acts from its joint state alone. From scratch, "batch" (trained
batch norm; its running statistics serve in eval mode and fold into the convolutions on export)
keeps them normalised.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from hetlab.errors import UserError


class FrozenBatchNorm2d(nn.Module):
    """Batch norm with fixed statistics and affine parameters (as DETR/ACT freeze it): small
    robot-learning batches would make trained statistics noisy, and a fixed affine map can be
    folded into the convolution when the encoder is exported."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(channels))
        self.register_buffer("bias", torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        state_dict.pop(prefix + "num_batches_tracked", None)  # torchvision's BatchNorm2d has it; unused here
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale[None, :, None, None] + shift[None, :, None, None]


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


NORMS = {"frozen": FrozenBatchNorm2d, "batch": nn.BatchNorm2d}


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, norm: type[nn.Module]):
        super().__init__()
        self.conv1, self.bn1 = _conv3x3(cin, cout, stride), norm(cout)
        self.conv2, self.bn2 = _conv3x3(cout, cout), norm(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), norm(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """(B, 3, H, W) normalised image → (B, 8·width, ⌈H/32⌉, ⌈W/32⌉) feature map."""

    def __init__(self, width: int = 64, norm: str = "frozen"):
        super().__init__()
        self.out_channels = 8 * width
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = NORMS[norm](width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        channels = [width, width, 2 * width, 4 * width, 8 * width]
        for stage in range(1, 5):
            stride = 1 if stage == 1 else 2
            blocks = nn.Sequential(BasicBlock(channels[stage - 1], channels[stage], stride, NORMS[norm]),
                                   BasicBlock(channels[stage], channels[stage], 1, NORMS[norm]))
            setattr(self, f"layer{stage}", blocks)
        for module in self.modules():  # torchvision's initialisation, for training from scratch
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))


def load_imagenet(backbone: ResNet18, path: Path) -> None:
    """Load torchvision ResNet18 weights (.pth state dict or .safetensors) into `backbone`."""
    if not path.is_file():
        raise UserError(f"{path}: no such weights file; download torchvision's resnet18-f37072d3.pth or drop the option")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(path)
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
    state = {key: value for key, value in state.items() if not key.startswith("fc.")}
    own = backbone.state_dict()
    wrong = [key for key in own if key in state and state[key].shape != own[key].shape]
    missing = [key for key in own if key not in state]
    if wrong or missing:
        raise UserError(f"{path}: not torchvision ResNet18 weights for this backbone (width {backbone.out_channels // 8}): "
                        f"{len(missing)} missing, {len(wrong)} wrong-shaped tensors, e.g. {(missing + wrong)[0]}")
    backbone.load_state_dict(state, strict=False)
