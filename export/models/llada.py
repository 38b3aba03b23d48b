"""The LLaDA-8B language model in plain PyTorch, with the checkpoint's own parameter names (docs/DESIGN.md §3).

In:  input embeddings [B, S, D], ``segment_ids`` [B, S] (0 = padding; attention only between equal non-zero
     ids, so one forward serves left-padded and packed batches) and ``position_ids`` [B, S].
Out: final hidden states [B, S, D] (``model.norm`` applied); ``lm_head`` lives on the top-level module.

A Llama block with bidirectional attention: RMSNorm (in fp32), RoPE, multi-head attention, SwiGLU MLP.
Names: ``embed_tokens``, ``layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
mlp.{gate,up,down}_proj}``, ``norm``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from seer_export.models.config import TextConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()  # the variance in fp32 even in fp16 graphs
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope(position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """cos, sin [B, 1, S, head_dim] for rotate-half RoPE, computed in fp32."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=position_ids.device).float() / head_dim)
    freqs = position_ids.float()[..., None] * inv_freq  # [B, S, head_dim / 2]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [B, 1, S, head_dim]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def attention_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """Boolean [B, 1, S, S]: query i may attend key j iff both carry the same non-zero segment id.

    A padding query (segment 0) may attend itself only, so its softmax has one finite entry instead of NaN.
    """
    same = segment_ids[:, :, None] == segment_ids[:, None, :]  # [B, S, S]
    valid = (segment_ids != 0)[:, :, None]
    eye = torch.eye(segment_ids.shape[1], dtype=torch.bool, device=segment_ids.device)
    return ((same & valid) | eye)[:, None]


class Attention(nn.Module):
    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.theta = cfg.rope_theta
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)  # [B, H, S, hd]
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # bidirectional: no causal mask
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """SwiGLU. ``down_proj``'s input ``silu(gate(x)) * up(x)`` is the tensor the Seer statistic reads."""

    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), mask, cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))
