"""The SigLIP vision tower as LLaDA-V uses it, with the checkpoint's parameter names (docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch").

In:  pixel tiles [N, 3, S, S], normalised with mean = std = 0.5.
Out: patch features [N, T, C] (T = (S / patch)^2, 729 at 384 px): the output of the last *kept* encoder layer.

LLaDA-V (LLaVA-OneVision's SigLipVisionTower) deletes the tower's last encoder layer, replaces the pooling
head with Identity and reads ``hidden_states[-1]``, i.e. before ``post_layernorm``. ``post_layernorm`` stays
a parameter (the checkpoint stores it) but is not applied. Names below ``vision_model``: ``embeddings.
{patch_embedding, position_embedding}``, ``encoder.layers.{i}.{layer_norm1, self_attn.{q,k,v,out}_proj,
layer_norm2, mlp.{fc1, fc2}}``, ``post_layernorm``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from seer_export.models.config import VisionConfig


class Embeddings(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv2d(3, cfg.hidden_size, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.position_embedding = nn.Embedding(cfg.tokens_per_tile, cfg.hidden_size)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(pixels).flatten(2).transpose(1, 2)  # [N, T, C]
        return x + self.position_embedding.weight[None]


class Attention(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.heads = cfg.num_attention_heads
        c = cfg.hidden_size
        self.q_proj, self.k_proj = nn.Linear(c, c), nn.Linear(c, c)
        self.v_proj, self.out_proj = nn.Linear(c, c), nn.Linear(c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, c = x.shape
        q, k, v = (p(x).view(n, t, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(out.transpose(1, 2).reshape(n, t, c))


class MLP(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))  # gelu_pytorch_tanh


class EncoderLayer(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.self_attn = Attention(cfg)
        self.layer_norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class Encoder(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.kept_layers))


class VisionTransformer(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.embeddings = Embeddings(cfg)
        self.encoder = Encoder(cfg)
        self.post_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)  # stored, never applied

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(pixels)
        for layer in self.encoder.layers:
            x = layer(x)
        return x


class SigLipVisionModel(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.vision_model = VisionTransformer(cfg)


class SigLipVisionTower(nn.Module):
    """Holds ``vision_tower.vision_model`` so names match ``model.vision_tower.vision_tower.vision_model.*``."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.vision_tower = SigLipVisionModel(cfg)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.vision_tower.vision_model(pixels)
