"""ResNet18 feature extractor with frozen batch norm, keyed like torchvision's.

torchvision does not import beside the pinned torch here, so the network is written out; its
parameter and buffer names match `torchvision.models.resnet18().state_dict()`, so an ImageNet
weights file (`resnet18-f37072d3.pth` or a safetensors copy) loads with `load_imagenet`. The
classifier (`fc`) is left out: the policy reads the last feature map. `width` scales every
stage's channels (64 → torchvision's network; tests use a narrow one).
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


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = _conv3x3(cin, cout, stride), FrozenBatchNorm2d(cout)
        self.conv2, self.bn2 = _conv3x3(cout, cout), FrozenBatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), FrozenBatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """(B, 3, H, W) normalised image → (B, 8·width, ⌈H/32⌉, ⌈W/32⌉) feature map."""

    def __init__(self, width: int = 64):
        super().__init__()
        self.out_channels = 8 * width
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = FrozenBatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        channels = [width, width, 2 * width, 4 * width, 8 * width]
        for stage in range(1, 5):
            stride = 1 if stage == 1 else 2
            blocks = nn.Sequential(BasicBlock(channels[stage - 1], channels[stage], stride),
                                   BasicBlock(channels[stage], channels[stage], 1))
            setattr(self, f"layer{stage}", blocks)

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
