"""AR-Actor: a visual encoder and an autoregressive action expert that reads every encoder layer.

Visual encoder (frozen and offloaded in Phase B):
    image (B, 3, H, W) in [0, 1] ─ ImageNet normalisation ─ ResNet18 ─ 1×1 projection ─┐
    state (B, 14) ─ dataset normalisation ─ linear ─ state token ─────────────────────┴─ x0
    x0 = [state token, h·w image tokens] + positions (2-D sinusoidal for the image grid)
    x_i = encoder layer i (x_{i-1}),  i = 1..L  (post-norm Transformer, as ACT's)

Action expert: a causal Transformer decoder over the chunk of actions. Its layer i cross-attends
to keys/values made from x_i by its own layer norm and projections, so whoever holds the tokens
x_1..x_L can rebuild all K/V: the offload boundary k (`encode_prefix` on the accelerator,
`encode_rest` on the learner) never cuts through the action expert. Input position t is the
embedding of action t−1 (a learned start token at t = 0); training uses teacher forcing with a
random share of those history inputs replaced by a learned mask token, so the expert learns not
to lean on its own past outputs; inference generates the chunk one action at a time with a
key/value cache, or, for a model trained with every history input maskable (`max_history_mask`
1), in one pass with all of them masked (`parallel`, as ACT decodes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from hetlab.errors import UserError
from hetlab.policies.resnet import ResNet18

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ARActorConfig:
    d_model: int = 512
    heads: int = 8
    encoder_layers: int = 4
    feedforward: int = 3200  # encoder layers
    # Decoder layers; sized so the default model has the study's ≈51.5 M parameters.
    expert_feedforward: int = 3472
    backbone_width: int = 64  # ResNet18's first-stage channels (64 = torchvision's)
    # The backbone's batch norm: "frozen" with ImageNet weights, "batch" (trained) from scratch;
    # see hetlab.policies.resnet. Phase A picks it; runs from before it existed were "frozen".
    backbone_norm: Literal["frozen", "batch"] = "frozen"
    state_dim: int = 14
    action_dim: int = 14
    chunk: int = 100  # actions predicted per query
    dropout: float = 0.1
    max_history_mask: float = 0.5  # per sample, a share u ~ U(0, this) of history inputs is masked


def sinusoidal_grid(height: int, width: int, dim: int) -> torch.Tensor:
    """(height·width, dim) 2-D sine/cosine positions: half the channels encode the row, half the column."""
    quarter = dim // 4
    frequencies = 1.0 / (10000.0 ** (torch.arange(quarter, dtype=torch.float32) / quarter))
    rows = torch.arange(height, dtype=torch.float32)[:, None] * frequencies
    cols = torch.arange(width, dtype=torch.float32)[:, None] * frequencies
    row_part = torch.cat([rows.sin(), rows.cos()], dim=1)[:, None, :].expand(height, width, 2 * quarter)
    col_part = torch.cat([cols.sin(), cols.cos()], dim=1)[None, :, :].expand(height, width, 2 * quarter)
    grid = torch.cat([row_part, col_part], dim=2).reshape(height * width, 4 * quarter)
    return F.pad(grid, (0, dim - 4 * quarter))


class Attention(nn.Module):
    """Multi-head attention with separate projections, so cross-attention K/V can be made apart."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        if dim % heads:
            raise UserError(f"d_model {dim} is not divisible by {heads} heads")
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(dim, dim) for _ in range(4))

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.heads, -1)).transpose(1, 2)  # (B, T, D) → (B, heads, T, D/heads)

    def attend(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, causal: bool = False) -> torch.Tensor:
        out = F.scaled_dot_product_attention(self.split(self.q_proj(query)), keys, values, is_causal=causal)
        return self.out_proj(out.transpose(1, 2).flatten(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attend(x, self.split(self.k_proj(x)), self.split(self.v_proj(x)))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__()
        self.linear1, self.linear2, self.dropout = nn.Linear(dim, hidden), nn.Linear(hidden, dim), nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.dropout(F.relu(self.linear1(x))))


class EncoderLayer(nn.Module):
    """Post-norm self-attention + feed-forward."""

    def __init__(self, cfg: ARActorConfig):
        super().__init__()
        self.attention = Attention(cfg.d_model, cfg.heads)
        self.feedforward = FeedForward(cfg.d_model, cfg.feedforward, cfg.dropout)
        self.norm1, self.norm2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.dropout(self.attention(x)))
        return self.norm2(x + self.dropout(self.feedforward(x)))


class VisualEncoder(nn.Module):
    """Image + state → [x0, x1, …, xL] token arrays of shape (B, 1 + h·w, d_model)."""

    def __init__(self, cfg: ARActorConfig):
        super().__init__()
        self.cfg = cfg
        self.backbone = ResNet18(cfg.backbone_width, cfg.backbone_norm)
        self.image_projection = nn.Conv2d(self.backbone.out_channels, cfg.d_model, 1)
        self.state_projection = nn.Linear(cfg.state_dim, cfg.d_model)
        self.state_position = nn.Parameter(torch.zeros(cfg.d_model))
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.register_buffer("image_mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1))
        self.register_buffer("image_std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1))
        self.register_buffer("state_mean", torch.zeros(cfg.state_dim))
        self.register_buffer("state_std", torch.ones(cfg.state_dim))

    def input_tokens(self, images: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        features = self.image_projection(self.backbone((images - self.image_mean) / self.image_std))
        height, width = features.shape[-2:]
        image_tokens = features.flatten(2).transpose(1, 2)
        image_tokens = image_tokens + sinusoidal_grid(height, width, self.cfg.d_model).to(image_tokens)
        state_token = self.state_projection((state - self.state_mean) / self.state_std) + self.state_position
        return torch.cat([state_token[:, None, :], image_tokens], dim=1)

    def check_boundary(self, k: int, lowest: int = 0) -> None:
        if not lowest <= k <= len(self.layers):
            raise UserError(f"split boundary {k} is outside {lowest}..{len(self.layers)} (encoder layers run before the split)")

    def encode_prefix(self, images: torch.Tensor, state: torch.Tensor, k: int) -> list[torch.Tensor]:
        """The part before boundary k: [x0, x1, …, xk] (k + 1 arrays)."""
        self.check_boundary(k)
        tokens = [self.input_tokens(images, state)]
        for layer in self.layers[:k]:
            tokens.append(layer(tokens[-1]))
        return tokens

    def encode_rest(self, tokens: list[torch.Tensor], k: int) -> list[torch.Tensor]:
        """From `encode_prefix`'s k + 1 arrays, the outputs of every encoder layer [x1, …, xL]."""
        self.check_boundary(k)
        if len(tokens) != k + 1:
            raise ValueError(f"boundary {k} takes {k + 1} token arrays (x0..x{k}), got {len(tokens)}")
        outputs = list(tokens[1:])
        x = tokens[-1]
        for layer in self.layers[k:]:
            x = layer(x)
            outputs.append(x)
        return outputs

    def forward(self, images: torch.Tensor, state: torch.Tensor) -> list[torch.Tensor]:
        return self.encode_rest(self.encode_prefix(images, state, 0), 0)


class DecoderLayer(nn.Module):
    """Post-norm causal self-attention, cross-attention to one encoder layer, feed-forward."""

    def __init__(self, cfg: ARActorConfig):
        super().__init__()
        self.self_attention = Attention(cfg.d_model, cfg.heads)
        self.cross_attention = Attention(cfg.d_model, cfg.heads)
        self.memory_norm = nn.LayerNorm(cfg.d_model)  # applied to the encoder tokens before K/V
        self.feedforward = FeedForward(cfg.d_model, cfg.expert_feedforward, cfg.dropout)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(cfg.d_model) for _ in range(3))
        self.dropout = nn.Dropout(cfg.dropout)

    def memory(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys and values rebuilt from one encoder layer's output tokens."""
        normed = self.memory_norm(tokens)
        return self.cross_attention.split(self.cross_attention.k_proj(normed)), \
            self.cross_attention.split(self.cross_attention.v_proj(normed))

    def forward(self, x: torch.Tensor, memory: tuple[torch.Tensor, torch.Tensor],
                cache: list[torch.Tensor] | None = None) -> torch.Tensor:
        """x: (B, T, D). With `cache` (a list this layer appends its keys/values to), x holds only
        the newest positions and attends to every earlier one."""
        attention = self.self_attention
        keys, values = attention.split(attention.k_proj(x)), attention.split(attention.v_proj(x))
        if cache is not None:
            if cache:
                keys, values = torch.cat([cache[0], keys], dim=2), torch.cat([cache[1], values], dim=2)
            cache[:] = [keys, values]
        causal = x.shape[1] > 1  # one new position may see the whole cache
        x = self.norm1(x + self.dropout(attention.attend(x, keys, values, causal=causal)))
        x = self.norm2(x + self.dropout(self.cross_attention.attend(x, *memory)))
        return self.norm3(x + self.dropout(self.feedforward(x)))


class ActionExpert(nn.Module):
    def __init__(self, cfg: ARActorConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.action_embedding = nn.Linear(cfg.action_dim, cfg.d_model)
        self.start_token = nn.Parameter(torch.randn(cfg.d_model) * 0.02)
        self.mask_token = nn.Parameter(torch.randn(cfg.d_model) * 0.02)
        self.positions = nn.Parameter(torch.randn(cfg.chunk, cfg.d_model) * 0.02)
        self.head = nn.Linear(cfg.d_model, cfg.action_dim)
        self.register_buffer("action_mean", torch.zeros(cfg.action_dim))
        self.register_buffer("action_std", torch.ones(cfg.action_dim))

    def normalise(self, actions: torch.Tensor) -> torch.Tensor:
        return (actions - self.action_mean) / self.action_std

    def unnormalise(self, actions: torch.Tensor) -> torch.Tensor:
        return actions * self.action_std + self.action_mean

    def memories(self, layer_tokens: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if len(layer_tokens) != len(self.layers):
            raise ValueError(f"the action expert reads {len(self.layers)} encoder layers, got {len(layer_tokens)}")
        return [layer.memory(tokens) for layer, tokens in zip(self.layers, layer_tokens)]

    def forward(self, layer_tokens: list[torch.Tensor], actions: torch.Tensor,
                history_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher-forced prediction of the normalised chunk (B, chunk, action_dim) from the
        normalised `actions`; `history_mask` (B, chunk) marks history inputs to hide."""
        batch = actions.shape[0]
        history = self.action_embedding(actions[:, :-1])
        x = torch.cat([self.start_token.expand(batch, 1, -1), history], dim=1)
        if history_mask is not None:
            x = torch.where(history_mask[..., None], self.mask_token.to(x), x)
        x = x + self.positions[: x.shape[1]]
        for layer, memory in zip(self.layers, self.memories(layer_tokens)):
            x = layer(x, memory)
        return self.head(x)

    @torch.no_grad()
    def generate(self, layer_tokens: list[torch.Tensor], steps: int | None = None,
                 parallel: bool = False) -> torch.Tensor:
        """Normalised chunk (B, steps, action_dim): one action per decoder pass, each fed back as
        the next history input, or (`parallel`) all in one pass with every history input masked."""
        steps = self.cfg.chunk if steps is None else steps
        if not 1 <= steps <= self.cfg.chunk:
            raise ValueError(f"generate 1..{self.cfg.chunk} actions (the chunk), not {steps}")
        if parallel:
            batch = layer_tokens[0].shape[0]
            masked = torch.ones(batch, steps, dtype=torch.bool)
            masked[:, 0] = False  # the start token, never masked in training either
            return self(layer_tokens, layer_tokens[0].new_zeros(batch, steps, self.cfg.action_dim), masked)
        memories = self.memories(layer_tokens)
        caches: list[list[torch.Tensor]] = [[] for _ in self.layers]
        x = self.start_token.expand(layer_tokens[0].shape[0], 1, -1)
        actions = []
        for t in range(steps):
            x = x + self.positions[t]
            for layer, memory, cache in zip(self.layers, memories, caches):
                x = layer(x, memory, cache)
            actions.append(self.head(x))
            x = self.action_embedding(actions[-1])
        return torch.cat(actions, dim=1)


def random_history_mask(batch: int, chunk: int, max_share: float, generator: torch.Generator) -> torch.Tensor:
    """(batch, chunk) bool: each sample hides a share u ~ U(0, max_share) of its history inputs
    (never the start token). Drawn on the CPU from `generator`, so every condition of a study
    that seeds it alike masks the same positions."""
    share = torch.rand(batch, 1, generator=generator) * max_share
    mask = torch.rand(batch, chunk, generator=generator) < share
    mask[:, 0] = False
    return mask


class ARActor(nn.Module):
    def __init__(self, cfg: ARActorConfig = ARActorConfig()):
        super().__init__()
        self.cfg = cfg
        self.visual = VisualEncoder(cfg)
        self.action_expert = ActionExpert(cfg)

    def set_normalisation(self, state_mean, state_std, action_mean, action_std) -> None:
        """Dataset statistics; stored in the model so a checkpoint acts on raw observations."""
        floor = 1e-2  # a joint that never moves in the demos would otherwise divide by ~0
        for buffer, value in ((self.visual.state_mean, state_mean), (self.visual.state_std, state_std),
                              (self.action_expert.action_mean, action_mean), (self.action_expert.action_std, action_std)):
            buffer.copy_(torch.as_tensor(value, dtype=torch.float32))
        self.visual.state_std.clamp_(min=floor)
        self.action_expert.action_std.clamp_(min=floor)

    def forward(self, images: torch.Tensor, state: torch.Tensor, actions: torch.Tensor,
                history_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Normalised chunk predicted from raw images [0, 1], raw state and raw teacher actions."""
        return self.action_expert(self.visual(images, state), self.action_expert.normalise(actions), history_mask)

    @torch.no_grad()
    def act(self, images: torch.Tensor, state: torch.Tensor, steps: int | None = None,
            parallel: bool = False) -> torch.Tensor:
        """Raw action chunk (B, steps, action_dim) for raw images [0, 1] and raw state."""
        return self.action_expert.unnormalise(self.action_expert.generate(self.visual(images, state), steps, parallel))


def chunk_l1(predicted: torch.Tensor, target: torch.Tensor, is_pad: torch.Tensor) -> torch.Tensor:
    """Mean L1 over the chunk steps inside the episode (ACT's reconstruction loss)."""
    keep = (~is_pad)[..., None].to(predicted)
    return ((predicted - target).abs() * keep).sum() / (keep.sum() * predicted.shape[-1]).clamp(min=1)


def parameter_split(model: ARActor) -> dict[str, int]:
    """Parameter counts as the study's Table I splits them."""
    def count(*modules) -> int:
        return sum(p.numel() for m in modules for p in (m.parameters() if isinstance(m, nn.Module) else [m]))

    visual = model.visual
    split = {
        "backbone": count(visual.backbone),
        "projection": count(visual.image_projection, visual.state_projection, visual.state_position),
        "encoder": count(visual.layers),
        "action_expert": count(model.action_expert),
    }
    split["total"] = sum(split.values())
    if split["total"] != count(model):
        raise RuntimeError(f"the split counts {split['total']:,} parameters of the model's {count(model):,}; "
                           "a module of the AR-Actor is missing from it")
    return split


def encoder_grid(height: int, width: int) -> tuple[int, int]:
    """Image-token grid of the ResNet18 feature map for an image size."""
    for _ in range(5):  # conv1, maxpool, layer2..layer4 halve (rounding up)
        height, width = math.ceil(height / 2), math.ceil(width / 2)
    return height, width
