"""The exported graphs as thin modules around the untouched PyTorch LLaDA-V (docs/DESIGN.md "Seer, exactly"-5).

In:  an ``DiffusionMLLM`` (real weights, or on the ``meta`` device for export), the model's special tokens and its
     Seer calibration; the contract of each graph from ``seer_trt.contracts.graphs``.
Out: one ``nn.Module`` per graph whose ``forward`` takes that graph's inputs in order and returns its outputs
     in order. They are exported by ``seer_export.onnx.options`` and serve as the PyTorch side of parity.

Nothing here re-implements the model: each module calls ``DiffusionMLLM`` (``forward``, ``hidden_states``,
``tile_features``) and reads the MLP statistic through ``seer_export.reference.seer.capture_mlp`` hooks and the probe
through ``seer_export.reference.seer.probe_score``, so the graphs compute what the reference computes. Special ids are baked in as constants from ``SpecialTokens`` (the
manifest records them). Suppression uses ``where`` (``bias * mask`` turns -inf * 0 into NaN, docs/DESIGN.md "Toolchain facts").
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from seer_export.models.families import ranks_by_score, suppressed_ids
from seer_export.models.mllm import DiffusionMLLM
from seer_export.reference.seer import capture_mlp, mlp_statistic, normalise, probe_score
from seer_trt.contracts.config import SeerConfig, SpecialTokens
from seer_trt.contracts.graphs import GRAPHS, top_k


def suppress_masked(logits: torch.Tensor, gen_ids: torch.Tensor, special: SpecialTokens,
                    ids: tuple[int, ...] | None = None) -> torch.Tensor:  # fmt: skip
    """-inf for the suppressed special ids at masked positions: the graph form of ``sampler.suppress_special``.

    ``ids``: the suppressed set (``seer_export.models.families.suppressed_ids``; default LLaDA-V's, empty for
    LaViDa). It is a comparison against scalar ids (no index tensor), so no tensor constant is lifted into the graph
    and the module exports from the ``meta`` device.
    """
    ids = special.suppressed_ids if ids is None else ids
    if not ids:
        return logits
    vocab = torch.arange(logits.shape[-1], device=logits.device)  # [V]
    banned = vocab == ids[0]
    for idx in ids[1:]:
        banned = banned | (vocab == idx)
    hit = (gen_ids == special.mask_id)[..., None] & banned  # [B, G, V]
    return torch.where(hit, torch.full_like(logits, float("-inf")), logits)


def logsumexp(x: torch.Tensor) -> torch.Tensor:
    """log(sum(exp(x))) over the last axis with the maximum shifted out explicitly (ReduceMax, Exp, ReduceSum, Log):
    an importer that builds ONNX ReduceLogSumExp as a plain log(sum(exp(x))) overflows in fp32 past a logit of 88."""
    top = x.amax(dim=-1, keepdim=True)
    return (top + torch.log(torch.exp(x - top).sum(dim=-1, keepdim=True)))[..., 0]


def log1p(x: torch.Tensor) -> torch.Tensor:
    """log(1 + x) for x >= 0 from ops every importer has: below 1e-2 the series to x^4 (error < x^5 / 5, far below
    fp32's resolution), above it Log(1 + x), whose rounding of 1 + x no longer matters."""
    series = x * (1 - x * (0.5 - x * (1 / 3 - x * 0.25)))
    return torch.where(x < 1e-2, series, torch.log(1 + x))


def log1m(e: torch.Tensor) -> torch.Tensor:
    """log(1 - e) for 0 <= e <= 1 in fp32 without cancellation: below 1e-2 the series -e(1 + e/2 + e^2/3 + e^3/4),
    above it the log of 1 - e (which ``one_minus`` gives for e near 1)."""
    series = -e * (1 + e * (0.5 + e * (1 / 3 + e * 0.25)))
    return torch.where(e < 1e-2, series, torch.log(1 - e))


def dream_scores(suppressed: torch.Tensor, x0: torch.Tensor, top: torch.Tensor,
                 s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Dream's two scores of softmax(``suppressed``) [B, G, V] fp32, from ``greedy``'s maximum ``top`` [B, G, 1] and
    s (the mass beside x0, relative to it): ``log_margin`` = log(p1 - p2) (``topk_margin`` ranks by p1 - p2, and
    p1 - p2 = (1 - e^d) / (1 + s), d the second logit minus the first: near a tie 1 - e^d comes from its series, near
    a clear top from ``log1m``, so the order survives fp32 near 1) and ``neg_entropy`` = sum p log(p + 1e-10)
    (``entropy``; x0's own term p1 (log(1 + 1e-10 (1 + s)) - log(1 + s)) from ``log1p``, not from log(p1) near 1)."""
    second = torch.topk(suppressed, 2, dim=-1).values[..., 1]  # [B, G]
    d = second - top[..., 0]  # <= 0
    near_tie = -d * (1 + d * (0.5 + d * (1 / 6 + d / 24)))  # 1 - e^d for small |d|
    gap = torch.where(d > -1e-2, torch.log(near_tie), log1m(torch.exp(d)))  # log(1 - e^d)
    log_margin = torch.clamp(gap - log1p(s), min=-1e30)  # an exact tie ranks last, finitely (-inf: not eligible)
    p = torch.exp(suppressed - top) / (1 + s)[..., None]  # [B, G, V]
    is_x0 = torch.arange(suppressed.shape[-1], device=x0.device) == x0[..., None]
    others = torch.where(is_x0, torch.zeros_like(p), p * torch.log(p + 1e-10)).sum(-1)
    own = (log1p(1e-10 * (1 + s)) - log1p(s)) / (1 + s)
    return log_margin, others + own


def greedy(logits: torch.Tensor, gen_ids: torch.Tensor, special: SpecialTokens,
           ids: tuple[int, ...] | None = None, scores: bool = False, top: int = 0) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """x0 [B, G] int64, its log-probability and the end-token probability [B, G] float32, from one reduction.

    ``x0`` is the argmax of the suppressed logits and ``log_confidence`` its log softmax probability
    (``low_confidence`` remasking): -log(1 + s), s = sum over the other ids of exp(l - l[x0]). Near p = 1 the
    probability itself cannot rank in fp32 (0.99993229 for two different positions) but s keeps fp32's relative
    resolution, so the order and thresholds match a float64 softmax (docs/DESIGN.md "Decoding strategies").
    ``p_end`` = p(<|eot_id|>) + p(<|endoftext|>) under the *unsuppressed* softmax (what ``seer.step_zero``
    reads): its normaliser is the suppressed one plus the suppressed ids' own mass at masked positions, four
    columns, so no second softmax over the vocabulary is computed. ``ids``: the suppressed set (``suppress_masked``).
    ``scores``: also Dream's ``log_margin`` and ``neg_entropy`` (``dream_scores``). ``top``: also the ``top`` largest
    suppressed logits and their ids [B, G, top] (``top_logits``, ``top_ids``), what the host samples from.
    """
    ids = special.suppressed_ids if ids is None else ids
    logits = logits.float()  # the vocabulary reduction in fp32, also in fp16 graphs
    suppressed = suppress_masked(logits, gen_ids, special, ids)  # [B, G, V]
    x0 = suppressed.argmax(-1)  # [B, G]
    top_logit = suppressed.gather(-1, x0[..., None])  # [B, G, 1] the maximum
    others = torch.exp(
        suppressed - top_logit
    )  # [B, G, V]; 1 at x0, which the sum must not hold (it would round s away)
    is_x0 = torch.arange(suppressed.shape[-1], device=x0.device) == x0[..., None]
    s = torch.where(is_x0, torch.zeros_like(others), others).sum(-1)  # [B, G] mass beside x0, relative to it
    log_confidence = -log1p(s)
    lse = top_logit[..., 0] + log1p(s)  # log-sum-exp of the suppressed logits
    if ids:
        masked = (gen_ids == special.mask_id)[..., None]  # [B, G, 1]
        banned = torch.stack([logits[..., i] for i in ids], dim=-1)  # [B, G, 4]
        banned = torch.where(masked, banned, torch.full_like(banned, float("-inf")))
        lse_all = logsumexp(torch.cat([lse[..., None], banned], dim=-1))  # the unsuppressed normaliser
    else:  # nothing suppressed: one normaliser
        lse_all = lse
    p_end = torch.exp(logits[..., special.eot_id] - lse_all) + torch.exp(logits[..., special.endoftext_id] - lse_all)
    out = (x0, log_confidence, p_end, *(dream_scores(suppressed, x0, top_logit, s) if scores else ()))
    if top:
        values, indices = torch.topk(suppressed, top, dim=-1)
        out = (*out, values, indices)
    return out


PROBE_INITIALIZER = "seer_probe"  # the probe's weight vector in the step_zero graph (from the calibration)


class _Graph(nn.Module):
    """Holds the model as ``llada``: initializer names are ``llada.`` + the checkpoint's names."""

    PREFIX = "llada."

    def __init__(self, model: DiffusionMLLM, special: SpecialTokens, seer: SeerConfig) -> None:
        super().__init__()
        self.llada = model
        self.special = special
        self.suppressed = suppressed_ids(model.config.family, special)  # the family's loop: LLaDA-V's four, or none
        self.scores = ranks_by_score(model.config.family)  # Dream's: denoise also returns its scores
        self.seer = seer

    def _embeds(self, prefix_embeds: torch.Tensor, gen_ids: torch.Tensor) -> torch.Tensor:
        """[B, P + G, D]: the prompt, then the answer window's token embeddings."""
        gen = self.llada.model.embed_tokens(gen_ids).to(prefix_embeds.dtype)
        return torch.cat([prefix_embeds, gen], dim=1)


class EmbedGraph(_Graph):
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.llada.model.embed_tokens(input_ids)  # [B, S, D]


class VisionGraph(_Graph):
    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.llada.tile_features(pixel_values)  # [N, T, D], after the projector
        return features, self.llada.model.image_newline.to(features.dtype)  # [D]: spliced by the runtime


class ImageTokensGraph(_Graph):
    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.llada.image_ids(pixel_values)  # [N, T] int64: codes + the tokenizer's length


class StepZeroGraph(_Graph):
    """Early exit: embeddings and decoder layers 0..k only, then layer k's MLP statistic and, for a probe
    calibration, the probe's score on the residual stream after layer k (docs/DESIGN.md "Seer, exactly")."""

    def __init__(self, model: DiffusionMLLM, special: SpecialTokens, seer: SeerConfig) -> None:
        super().__init__(model, special, seer)
        if seer.signal == "probe":  # an initializer of its own (PROBE_INITIALIZER), not a checkpoint tensor
            self.register_buffer(PROBE_INITIALIZER, torch.tensor(seer.probe_weights, dtype=torch.float32))

    def forward(
        self, prefix_embeds: torch.Tensor, gen_ids: torch.Tensor, segment_ids: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        k, p = self.seer.probe_layer, prefix_embeds.shape[1]
        with capture_mlp(self.llada, (k,)) as seen:
            hidden = self.llada.hidden_states(self._embeds(prefix_embeds, gen_ids), segment_ids, position_ids,
                                              upto=k + 1)  # fmt: skip
        # read where the logits are: the answer positions, or (a shifted family) the positions before them
        stat = mlp_statistic(seen[k], self.seer.statistic, self.seer.tau_abs)  # [B, P + G] float32
        stat = self.llada.answer_states(stat[..., None], segment_ids, p)[..., 0]  # [B, G]
        if self.seer.signal != "probe":
            return stat
        weight = getattr(self, PROBE_INITIALIZER)
        return stat, probe_score(normalise(self.llada.answer_states(hidden, segment_ids, p)), self.seer, weight)


class _CachedGraph(_Graph):
    """A window graph with the prompt K/V cache (``seer_trt.contracts.graphs.cache_specs``): after the four window inputs,
    ``past_weights`` [M] and per layer the cached keys and values [M, B, H_kv, C, hd] (C may be 0); after its own
    outputs, per layer the keys and values [B, H_kv, P, hd] of the prompt positions it computed (P may be 0)."""

    def _logits(self, prefix_embeds, gen_ids, segment_ids, position_ids, past_weights, past):
        pairs = list(zip(past[0::2], past[1::2], strict=True))  # (key, value) per layer
        logits, present = self.llada.forward_cached(prefix_embeds, gen_ids, segment_ids, position_ids, past_weights,
                                                    pairs)  # fmt: skip
        return logits, tuple(t for kv in present for t in kv)  # [B, G, V] answer positions only; key, value per layer


class DenoiseGraph(_CachedGraph):
    """The one window graph: every denoising step, and step zero at full depth (end-token signal)."""

    def forward(
        self, prefix_embeds: torch.Tensor, gen_ids: torch.Tensor, segment_ids: torch.Tensor, position_ids: torch.Tensor,
        past_weights: torch.Tensor, *past: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:  # fmt: skip
        logits, present = self._logits(prefix_embeds, gen_ids, segment_ids, position_ids, past_weights, past)
        top = top_k(self.llada.config.text.vocab_size)
        return *greedy(logits, gen_ids, self.special, self.suppressed, self.scores, top), *present


class DenoiseLogitsGraph(_CachedGraph):
    def forward(
        self, prefix_embeds: torch.Tensor, gen_ids: torch.Tensor, segment_ids: torch.Tensor, position_ids: torch.Tensor,
        past_weights: torch.Tensor, *past: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:  # fmt: skip
        logits, present = self._logits(prefix_embeds, gen_ids, segment_ids, position_ids, past_weights, past)
        return suppress_masked(logits, gen_ids, self.special, self.suppressed), *present  # [B, G, V] float32


MODULES: dict[str, Callable[[DiffusionMLLM, SpecialTokens, SeerConfig], _Graph]] = {
    "embed": EmbedGraph,
    "vision": VisionGraph,
    "image_tokens": ImageTokensGraph,
    "step_zero": StepZeroGraph,
    "denoise": DenoiseGraph,
    "denoise_logits": DenoiseLogitsGraph,
}
assert set(MODULES) == set(GRAPHS), "every graph of seer_trt.contracts.graphs needs a module here"


def build(name: str, model: DiffusionMLLM, special: SpecialTokens, seer: SeerConfig) -> nn.Module:
    """The module of graph ``name`` around ``model``, in eval mode."""
    return MODULES[name](model, special, seer).eval()
