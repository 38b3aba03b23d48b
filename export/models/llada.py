"""The LLaDA-8B language model in plain PyTorch, with the checkpoint's own parameter names (docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch").

In:  input embeddings [B, S, D], ``segment_ids`` [B, S] (0 = padding; attention only between equal non-zero
     ids, so one forward serves left-padded and packed batches) and ``position_ids`` [B, S].
Out: final hidden states [B, S, D] (``model.norm`` applied); ``lm_head`` lives on the top-level module.

A Llama block with bidirectional attention: RMSNorm (in fp32), RoPE, multi-head or grouped-query attention
(``num_key_value_heads``; K/V stay grouped, repeated only inside the products), optional q/k/v biases (``qkv_bias``,
as Qwen2's and Dream's attention has them), SwiGLU MLP.
Names: ``embed_tokens``, ``layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
mlp.{gate,up,down}_proj}``, ``norm``.

A prompt K/V cache (docs/DESIGN.md "Prompt K/V cache") adds a second attention path, ``forward_cached``: the keys and values of
``past`` positions come from M cached snapshots combined with weights w (reuse: M = 1, w = 1; a forecast: its
extrapolation weights). The combination is never formed: scores against the past are ``sum_m w_m q K_m^T`` and
their output ``sum_m w_m P V_m``, so each snapshot is read once and nothing the size of the cache is written.

    queries (this call) ─► [ scores vs past (weighted over snapshots) | scores vs this call's keys ] ─► mask
                        ─► one softmax ─► sum_m w_m P_past V_m + P_now V_now
"""

from __future__ import annotations

import math

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
        if torch.compiler.is_exporting():  # the form ONNX Runtime fuses into SimplifiedLayerNormalization
            x = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        else:
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
    if torch.compiler.is_exporting():  # one small MatMul instead of Slice, Neg, Slice, Concat
        return x @ _rotation(x.shape[-1], x.dtype, x.device)
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotation(head_dim: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """R [hd, hd] with x @ R = cat(-x[half:], x[:half]) exactly (each column holds one +-1)."""
    eye = torch.eye(head_dim // 2, dtype=dtype, device=device)
    zero = torch.zeros_like(eye)
    return torch.cat([torch.cat([zero, eye], dim=1), torch.cat([-eye, zero], dim=1)], dim=0)


def attention_mask(segment_ids: torch.Tensor, past: int = 0) -> torch.Tensor:
    """Boolean [B, 1, S, past + S]: query i (the last S positions) may attend key j (all past + S) iff both carry
    the same non-zero segment id.

    A padding query (segment 0) may attend itself only, so its softmax has one finite entry instead of NaN.
    ``segment_ids`` [B, past + S] covers the cached positions first, then this call's.
    """
    queries = segment_ids[:, past:]  # [B, S]
    same = queries[:, :, None] == segment_ids[:, None, :]  # [B, S, past + S]
    valid = (queries != 0)[:, :, None]
    s = queries.shape[1]
    keys = torch.arange(segment_ids.shape[1], device=segment_ids.device)
    eye = keys[None, :] == torch.arange(s, device=segment_ids.device)[:, None] + past  # [S, past + S]
    return ((same & valid) | eye)[:, None]


def predecessors(segment_ids: torch.Tensor, start: int) -> torch.Tensor:
    """[B, S - start] int64: for each position from ``start`` on, the index of the position before it in its row
    (the nearest earlier one with the same segment id), or its own index when it has none (a row's first position,
    as Dream's ``cat(logits[:, :1], logits[:, :-1])`` keeps position 0's own logits).

    Dream's logit shift over any layout: left-padded rows (a row's first answer position reads the last prompt
    position) and packed rows (each reads its own prompt's last position) alike, from comparisons only.
    """
    s = segment_ids.shape[1]
    keys = torch.arange(s, device=segment_ids.device)  # [S]
    queries = keys[start:]  # [G]
    same = (segment_ids[:, start:, None] == segment_ids[:, None, :]) & (keys[None, None, :] < queries[None, :, None])
    before = torch.where(same, keys[None, None, :], torch.full_like(same, -1, dtype=keys.dtype)).amax(-1)  # [B, G]
    return torch.where(before < 0, queries[None, :], before)


def gather_positions(hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``hidden`` [B, S, D] at positions ``index`` [B, G] -> [B, G, D] (one GatherElements)."""
    return hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))


class Attention(nn.Module):
    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.theta = cfg.rope_theta
        bias = cfg.qkv_bias  # Qwen2 / Dream: q, k and v carry biases, the output projection none
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=False)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q [B, H, S, hd], k and v [B, H_kv, S, hd], q and k after RoPE."""
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v

    def _heads(self, kv: torch.Tensor) -> torch.Tensor:
        """K or V with the query heads' count along axis -3 (grouped-query attention repeats each K/V head)."""
        if self.kv_heads == self.heads:
            return kv
        # each K/V head g times in a row (repeat_interleave's order), as Unsqueeze, Expand, Reshape: the exporter's
        # repeat_interleave over a 5-D cache with dynamic axes gave a graph ONNX Runtime could not run
        *lead, h, c, d = kv.shape
        g = self.heads // self.kv_heads
        return kv.unsqueeze(-3).expand(*lead, h, g, c, d).reshape(*lead, h * g, c, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.project(x, cos, sin)
        out = F.scaled_dot_product_attention(q, self._heads(k), self._heads(v), attn_mask=mask)  # bidirectional
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))

    def forward_cached(
        self, x: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past_k: torch.Tensor,
        past_v: torch.Tensor, weights: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """Attention of this call's S positions over cached ``past_k`` / ``past_v`` [M, B, H_kv, C, hd] (combined
        with ``weights`` [M]) and over themselves; ``mask`` [B, 1, S, C + S] is additive (0 or -inf), made once for
        all layers. Returns the output [B, S, D] and this call's k, v [B, H_kv, S, hd] (k after RoPE)."""
        b, s, _ = x.shape
        q, k, v = self.project(x, cos, sin)
        qs = q * (1.0 / math.sqrt(self.head_dim))  # scaled before the products: [B, H, S, hd], not [.., C + S]
        m, w = past_k.shape[0], weights.to(q.dtype)[None]  # [1, M]

        def combine(per_snapshot: torch.Tensor) -> torch.Tensor:  # [M, ...] -> sum_m w_m x_m, one MatMul
            return (w @ per_snapshot.reshape(m, -1)).reshape(per_snapshot.shape[1:])

        past_scores = combine(qs[None] @ self._heads(past_k).transpose(-1, -2))  # [B, H, S, C]
        scores = torch.cat([past_scores, qs @ self._heads(k).transpose(-1, -2)], dim=-1) + mask  # [B, H, S, C + S]
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)  # fp32 softmax, also in fp16 graphs
        c = past_k.shape[-2]
        past_out = combine(probs[None, ..., :c] @ self._heads(past_v))  # [B, H, S, hd]
        out = past_out + probs[..., c:] @ self._heads(v)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1)), k, v


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

    def forward_cached(self, x: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       past_k: torch.Tensor, past_v: torch.Tensor,
                       weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """``forward`` over cached K/V (``Attention.forward_cached``); also returns this call's k and v."""
        attn, k, v = self.self_attn.forward_cached(self.input_layernorm(x), mask, cos, sin, past_k, past_v, weights)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), k, v
