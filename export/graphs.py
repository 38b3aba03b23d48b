"""The exported graphs as thin modules around the untouched PyTorch LLaDA-V (docs/DESIGN.md §4-5).

In:  an ``LLaDAV`` (real weights, or on the ``meta`` device for export), the model's special tokens and its
     Seer calibration; the contract of each graph from ``seer_trt.graphs``.
Out: one ``nn.Module`` per graph whose ``forward`` takes that graph's inputs in order and returns its outputs
     in order. They are exported by ``seer_export.onnx_export`` and serve as the PyTorch side of parity.

Nothing here re-implements the model: each module calls ``LLaDAV`` (``forward``, ``hidden_states``,
``tile_features``) and reads the MLP statistic through ``seer_export.seer.capture_mlp`` hooks, so the graphs
compute what the reference computes. Special ids are baked in as constants from ``SpecialTokens`` (the
manifest records them). Suppression uses ``where`` (``bias * mask`` turns -inf * 0 into NaN, docs/DESIGN.md §11).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from seer_export.models.llada_v import LLaDAV
from seer_export.seer import capture_mlp, mlp_statistic
from seer_trt.config import SeerConfig, SpecialTokens
from seer_trt.graphs import GRAPHS


def suppress_masked(logits: torch.Tensor, gen_ids: torch.Tensor, special: SpecialTokens) -> torch.Tensor:
    """-inf for the suppressed special ids at masked positions: the graph form of ``sampler.suppress_special``.

    The suppressed set is a comparison against scalar ids (no index tensor), so no tensor constant is lifted
    into the graph and the module exports from the ``meta`` device.
    """
    vocab = torch.arange(logits.shape[-1], device=logits.device)  # [V]
    banned = vocab == special.suppressed_ids[0]
    for idx in special.suppressed_ids[1:]:
        banned = banned | (vocab == idx)
    hit = (gen_ids == special.mask_id)[..., None] & banned  # [B, G, V]
    return torch.where(hit, torch.full_like(logits, float("-inf")), logits)


def greedy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x0 = argmax [B, G] int64 and its softmax probability [B, G] float32 (``low_confidence`` remasking)."""
    logits = logits.float()  # the vocabulary softmax in fp32, also in fp16 graphs
    x0 = logits.argmax(-1)
    confidence = torch.softmax(logits, dim=-1).gather(-1, x0[..., None])[..., 0]
    return x0, confidence


class _Graph(nn.Module):
    """Holds the model as ``llada``: initializer names are ``llada.`` + the checkpoint's names."""

    PREFIX = "llada."

    def __init__(self, model: LLaDAV, special: SpecialTokens, seer: SeerConfig) -> None:
        super().__init__()
        self.llada = model
        self.special = special
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


class StepZeroGraph(_Graph):
    """Early exit: embeddings and decoder layers 0..k only, then the statistic of layer k's MLP."""

    def forward(
        self, prefix_embeds: torch.Tensor, gen_ids: torch.Tensor, segment_ids: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        k = self.seer.probe_layer
        with capture_mlp(self.llada, (k,)) as seen:
            self.llada.hidden_states(self._embeds(prefix_embeds, gen_ids), segment_ids, position_ids, upto=k + 1)
        stat = mlp_statistic(seen[k], self.seer.statistic, self.seer.tau_abs)  # [B, P + G] float32
        return stat[:, prefix_embeds.shape[1] :]  # [B, G]


class StepZeroFullGraph(_Graph):
    """Every layer's statistic, the end-token probability, and step 0's greedy predictions (docs/DESIGN.md §4)."""

    def forward(
        self, prefix_embeds: torch.Tensor, gen_ids: torch.Tensor, segment_ids: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        layers = tuple(range(len(self.llada.model.layers)))
        with capture_mlp(self.llada, layers) as seen:
            logits = self.llada(prefix_embeds, gen_ids, segment_ids, position_ids)  # [B, G, V] float32
        answer = slice(prefix_embeds.shape[1], None)
        stats = [mlp_statistic(seen[k], self.seer.statistic, self.seer.tau_abs)[:, answer] for k in layers]
        probs = torch.softmax(logits, dim=-1)  # unsuppressed, as seer.step_zero reads p_end
        p_end = probs[..., self.special.eot_id] + probs[..., self.special.endoftext_id]  # [B, G]
        x0, confidence = greedy(suppress_masked(logits, gen_ids, self.special))
        return torch.stack(stats, dim=1), p_end, x0, confidence


class DenoiseGraph(_Graph):
    def forward(
        self, prefix_embeds: torch.Tensor, gen_ids: torch.Tensor, segment_ids: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.llada(prefix_embeds, gen_ids, segment_ids, position_ids)  # [B, G, V], answer positions only
        return greedy(suppress_masked(logits, gen_ids, self.special))


class DenoiseLogitsGraph(_Graph):
    def forward(
        self, prefix_embeds: torch.Tensor, gen_ids: torch.Tensor, segment_ids: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        logits = self.llada(prefix_embeds, gen_ids, segment_ids, position_ids)
        return suppress_masked(logits, gen_ids, self.special)  # [B, G, V] float32


MODULES: dict[str, Callable[[LLaDAV, SpecialTokens, SeerConfig], _Graph]] = {
    "embed": EmbedGraph,
    "vision": VisionGraph,
    "step_zero": StepZeroGraph,
    "step_zero_full": StepZeroFullGraph,
    "denoise": DenoiseGraph,
    "denoise_logits": DenoiseLogitsGraph,
}
assert set(MODULES) == set(GRAPHS), "every graph of seer_trt.graphs needs a module here"


def build(name: str, model: LLaDAV, special: SpecialTokens, seer: SeerConfig) -> nn.Module:
    """The module of graph ``name`` around ``model``, in eval mode."""
    return MODULES[name](model, special, seer).eval()
