"""Seer reference path in PyTorch: step-zero statistics, boundary, truncated generation (docs/DESIGN.md "Seer, exactly").

In:  the model, left-padded prompts, generation settings, the model's Seer calibration.
Out: step-zero profiles (per layer MLP statistics, the RMS-normalised residual stream a probe reads, end-token
     probability, step 0's logits) and the Seer ``Generation`` (tokens, L*, steps).

The statistics are read with forward hooks around the untouched model: ``gate_proj``'s output (fraction of
negative pre-activations) and ``down_proj``'s input h = silu(gate(x)) * up(x) (fraction of |h| < tau_abs),
both in float32 over the hidden units, at answer positions only. A pass that stops at the probe layer is the
early exit the step-zero graph implements; a full-depth pass also yields step 0's logits.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import torch

from seer_export.models.mllm import DiffusionMLLM, window_layout
from seer_export.reference.sampler import Generation, generate, suppress_special
from seer_trt.contracts.config import PROBE_EPS, GenerationConfig, SeerConfig, SpecialTokens
from seer_trt.contracts.errors import ConfigError
from seer_trt.runtime.boundary import detect


@dataclasses.dataclass(frozen=True)
class StepZero:
    abs_below: np.ndarray  # [B, layers, N] float32: mean(|h| < tau_abs) per probed layer
    gate_negative: np.ndarray  # [B, layers, N] float32: mean(gate(x) < 0) per probed layer
    layers: tuple[int, ...]  # which decoder layers the middle axis holds
    p_end: np.ndarray | None  # [B, N] float32: p(<|eot_id|>) + p(<|endoftext|>), full depth only
    logits: torch.Tensor | None  # [B, N, V]: step 0's logits, full depth only
    residual: np.ndarray | None = None  # [B, layers, N, D] float32: RMS-normalised residual stream after each layer

    def profile(self, seer: SeerConfig) -> np.ndarray:
        """[B, N]: the signal ``seer`` names, at its probe layer."""
        if seer.signal == "end_token_prob":
            if self.p_end is None:
                raise ConfigError("the end_token_prob signal needs a full-depth step-zero pass (full_depth=True)")
            return self.p_end
        if seer.probe_layer not in self.layers:
            raise ConfigError(f"probe layer {seer.probe_layer} was not captured (layers {self.layers}); probe it")
        k = self.layers.index(seer.probe_layer)
        if seer.signal == "probe":
            if self.residual is None:
                raise ConfigError("the probe signal needs the residual stream (step_zero(..., residual=True))")
            return probe_score(torch.from_numpy(self.residual[:, k]), seer).numpy()
        stats = self.abs_below if seer.statistic == "abs_below" else self.gate_negative
        return stats[:, k]


def normalise(hidden: torch.Tensor) -> torch.Tensor:
    """The residual stream as the probe reads it: float32, RMS-normalised per position, no learned weight."""
    x = hidden.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + PROBE_EPS)


def probe_score(features: torch.Tensor, seer: SeerConfig, weight: torch.Tensor | None = None) -> torch.Tensor:
    """[..., S] float32: sigmoid(w . features + b), the probe's probability of "at or past the end".

    Args:
        features: [..., S, D] ``normalise``d residual stream.
        seer: the calibration holding the probe's weights and bias.
        weight: [D] the weights as a tensor (the graph's initializer); default: from ``seer``.
    """
    if weight is None:
        weight = torch.tensor(seer.probe_weights, dtype=torch.float32)
    return torch.sigmoid(features @ weight + seer.probe_bias)


@contextlib.contextmanager
def capture_mlp(model: DiffusionMLLM, layers: tuple[int, ...]):
    """Record each probed layer's ``gate_proj`` output and ``down_proj`` input during a forward."""
    seen: dict[int, dict[str, torch.Tensor]] = {k: {} for k in layers}
    handles = []
    for k in layers:
        mlp = model.model.layers[k].mlp
        handles.append(mlp.gate_proj.register_forward_hook(lambda m, i, o, k=k: seen[k].__setitem__("gate", o)))
        handles.append(mlp.down_proj.register_forward_pre_hook(lambda m, i, k=k: seen[k].__setitem__("h", i[0])))
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def mlp_statistic(seen: dict[str, torch.Tensor], statistic: str, tau_abs: float) -> torch.Tensor:
    """[B, S] float32: one probed layer's statistic over its hidden units, from ``capture_mlp``'s record.

    ``abs_below``: mean(|h| < tau_abs) of down_proj's input h; ``gate_negative``: mean(gate(x) < 0). Both in
    float32 whatever the model's dtype (docs/DESIGN.md "Seer, exactly"); the step-zero graphs compute exactly this.
    """
    if statistic == "abs_below":
        return (seen["h"].float().abs() < tau_abs).float().mean(-1)
    if statistic == "gate_negative":
        return (seen["gate"].float() < 0).float().mean(-1)
    raise ConfigError(f"unknown statistic {statistic!r}; expected 'abs_below' or 'gate_negative'")


@torch.no_grad()
def step_zero(
    model: DiffusionMLLM,
    prefix_embeds: torch.Tensor,
    prefix_valid: torch.Tensor,
    gen_length: int,
    special: SpecialTokens,
    layers: tuple[int, ...] | None = None,
    tau_abs: float = 1e-3,
    full_depth: bool = True,
    residual: bool = False,
) -> StepZero:
    """The step-zero pass: every answer position is the mask token.

    Args:
        layers: decoder layers to probe (all by default; () for none).
        full_depth: run every layer and the head (gives ``p_end`` and ``logits``); otherwise stop after the
            deepest probed layer, as the early-exit step-zero graph does.
        residual: also record the ``normalise``d residual stream after each probed layer (the probe's input).
    """
    n_layers = len(model.model.layers)
    layers = tuple(range(n_layers)) if layers is None else tuple(layers)
    batch, prompt_len = prefix_embeds.shape[:2]
    kept = torch.full((batch,), gen_length, device=prefix_embeds.device)
    segment_ids, position_ids = window_layout(prefix_valid, kept, gen_length)
    gen_ids = torch.full((batch, gen_length), special.mask_id, dtype=torch.long, device=prefix_embeds.device)

    def answer(x: torch.Tensor) -> torch.Tensor:  # [B, P + N, ...] -> where the answer's predictions are read
        return model.answer_states(x, segment_ids, prompt_len)

    streams: dict[int, torch.Tensor] = {}
    hooks = []
    if residual:
        for k in layers:
            hooks.append(model.model.layers[k].register_forward_hook(
                lambda m, i, o, k=k: streams.__setitem__(k, normalise(answer(o)))))  # fmt: skip
    try:
        with capture_mlp(model, layers) as seen:
            if full_depth:
                logits = model(prefix_embeds, gen_ids, segment_ids, position_ids)  # [B, N, V]
            else:
                embeds = torch.cat([prefix_embeds, model.model.embed_tokens(gen_ids)], dim=1)
                model.hidden_states(embeds, segment_ids, position_ids, upto=max(layers, default=-1) + 1)
                logits = None
    finally:
        for h in hooks:
            h.remove()

    def stack(statistic: str) -> np.ndarray:  # [B, layers, N]
        if not layers:
            return np.zeros((batch, 0, gen_length), dtype=np.float32)
        stats = [answer(mlp_statistic(seen[k], statistic, tau_abs)[..., None])[..., 0] for k in layers]
        return torch.stack(stats, 1).cpu().numpy()

    p_end = None
    if logits is not None:
        p = torch.softmax(logits.float(), dim=-1)
        p_end = (p[..., special.eot_id] + p[..., special.endoftext_id]).cpu().numpy()
    hidden = torch.stack([streams[k] for k in layers], 1).cpu().numpy() if residual and layers else None
    return StepZero(stack("abs_below"), stack("gate_negative"), layers, p_end, logits, hidden)


@torch.no_grad()
def seer_generate(
    model: DiffusionMLLM,
    prefix_embeds: torch.Tensor,
    prefix_valid: torch.Tensor,
    gen: GenerationConfig,
    special: SpecialTokens,
    seer: SeerConfig,
    seed: int | list[int] = 0,
    early_stop: bool = False,
) -> tuple[Generation, np.ndarray]:
    """Seer: step zero, boundary, one-shot truncation, denoising on the kept window (``early_stop``: see
    ``seer_export.reference.sampler.generate``).

    An MLP statistic or a probe at layer k: the early exit (layers 0..k), then step 0 runs on the kept window (and
    its end tail, ``SeerConfig.tail``).
    The end-token signal: one full-depth pass, whose logits over the kept positions serve as step 0 (docs/DESIGN.md "Seer, exactly").
    Returns the generation and the step-zero profile [B, N] the boundary was read from.
    """
    layers = () if seer.full_depth else (seer.probe_layer,)
    zero = step_zero(model, prefix_embeds, prefix_valid, gen.gen_length, special, layers, seer.tau_abs,
                     full_depth=seer.full_depth, residual=seer.signal == "probe")  # fmt: skip
    profile = zero.profile(seer)
    kept = detect(profile, seer)
    # A full-depth step zero already holds step 0's predictions over the kept positions: reuse them.
    out = generate(
        model,
        prefix_embeds,
        prefix_valid,
        gen,
        special,
        kept=kept,
        step0_logits=zero.logits,
        seed=seed,
        early_stop=early_stop,
        tail=seer.tails(kept, gen.gen_length),
        tail_token=seer.tail_token,
    )
    return out, profile


__all__ = ["StepZero", "capture_mlp", "mlp_statistic", "normalise", "probe_score", "seer_generate", "step_zero",
           "suppress_special"]  # fmt: skip
