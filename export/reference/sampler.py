"""Reference sampler with LLaDA-V ``generate_with_embeds`` semantics, batched (docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch").

In:  the model, left-padded prompt embeddings [B, P, D] with validity [B, P], generation settings, special
     tokens, and optionally the kept window L* per row (Seer truncation) and step 0's logits.
Out: ``Generation``: answer ids [B, N] (positions >= L* stay masks), L* and the steps each row used.

Per step: logits of the answer window; at still-masked positions the endoftext / startoftext / header ids are
-inf (not in LaViDa's loop: ``seer_export.models.families``); x0 = argmax (Gumbel-max in float64 when temperature > 0); confidence = softmax probability of x0
(``low_confidence``) or uniform noise (``random``); positions outside the row's current block (or past its
L*) get -inf; each row commits its top-k, k from ``seer_trt.runtime.schedule``. As upstream, the mask id itself is not
suppressed: a trained model never predicts it (it is never a training target). Upstream is batch 1 with a Python
loop over rows; here the top-k is a rank comparison over the batch, so left-padded rows match batch 1.

``gen.decoding`` picks the commit rule (docs/DESIGN.md "Decoding strategies"): ``fixed`` is the top-k above;
``threshold:τ`` commits every eligible position with probability >= τ (at least the most confident one, Fast-dLLM);
``factor:f`` the n most confident while the n-th has probability >= 1 - f / (n + 1) (LLaDA-V's Fast-dLLM hook,
written from its rule: upstream also commits the last masked position when it alone fails its bound, and ranks
positions past the block as masked ones; here only eligible positions count). Under those two a row's block is the
one of its first position still to commit, and it runs until done. Confidences are compared as float64
log-probabilities.

``early_stop`` is upstream's ``stopping_criteria=['<|eot_id|>']``, what LLaDA-V's demo and evaluation run
(docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch"): once a row has committed an ``<|eot_id|>``, only positions before its first one may commit
(a top-k that finds fewer eligible positions commits fewer), and the row stops, using no more forward passes,
when no position before it is masked. The answer (ids before the first ``<|eot_id|>``) is then complete.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from seer_export.models.families import suppressed_ids
from seer_export.models.mllm import DiffusionMLLM, window_layout
from seer_trt.contracts.config import SCORED, GenerationConfig, SpecialTokens
from seer_trt.contracts.errors import ConfigError
from seer_trt.runtime.schedule import plan_schedule


@dataclasses.dataclass(frozen=True)
class Generation:
    tokens: np.ndarray  # [B, N] int64 answer ids; masks past each row's kept window
    kept: np.ndarray  # [B] int64 L* (N without truncation)
    steps: np.ndarray  # [B] int64 denoising steps (forward passes) each row used


def suppress_special(logits: torch.Tensor, masked: torch.Tensor, special: SpecialTokens,
                     ids: tuple[int, ...] | None = None) -> torch.Tensor:  # fmt: skip
    """-inf for the suppressed special ids at masked positions. ``where``, not ``bias * mask`` (-inf * 0 = NaN).
    ``ids``: the suppressed set (default LLaDA-V's four; ``seer_export.models.families.suppressed_ids``)."""
    ids = special.suppressed_ids if ids is None else ids
    if not ids:
        return logits
    ids = torch.tensor(ids, device=logits.device)
    cols = logits[..., ids]  # [B, N, 4]
    logits = logits.clone()
    logits[..., ids] = torch.where(masked[..., None], torch.full_like(cols, float("-inf")), cols)
    return logits


def commit_top_k(confidence: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Boolean [B, N]: each row's ``k[b]`` most confident positions (stable order breaks ties by position)."""
    order = torch.sort(confidence, dim=1, descending=True, stable=True).indices  # [B, N]
    rank = torch.empty_like(order).scatter_(
        1, order, torch.arange(order.shape[1], device=order.device).expand_as(order)
    )
    return rank < k[:, None]


def commit_rule(rule: tuple[str, float | None], log_conf: torch.Tensor, eligible: torch.Tensor,
                transfer: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Boolean [B, N]: what one step commits under ``rule``; ``log_conf`` float64, -inf where not eligible."""
    name, value = rule
    if name == "fixed":
        return commit_top_k(log_conf, transfer) & eligible
    top = commit_top_k(log_conf, torch.ones_like(transfer))
    if name == "threshold":
        return ((log_conf >= math.log(value)) | top) & eligible
    ranked, order = torch.sort(log_conf, dim=1, descending=True, stable=True)
    n = torch.arange(1, log_conf.shape[1] + 1, dtype=torch.float64, device=log_conf.device)
    bound = torch.log((1 - value / (n + 1)).clamp(min=0))  # log(0) = -inf: that rank always passes
    bound[0] = float("-inf")  # at least one commits
    passes = ranked >= bound
    passes &= torch.gather(eligible, 1, order)
    count = torch.cumprod(passes.long(), dim=1).sum(1).clamp(min=1)
    return commit_top_k(log_conf, count) & eligible


def dream_score(p: torch.Tensor, remasking: str) -> torch.Tensor:
    """[B, N] float64 score of Dream's ``sample_tokens`` from probabilities ``p`` [B, N, V]: top-1 minus top-2
    (``topk_margin``), or sum p log(p + 1e-10), the negative entropy (``entropy``)."""
    if remasking == "topk_margin":
        top = torch.topk(p, 2, dim=-1).values
        return top[..., 0] - top[..., 1]
    return (p * torch.log(p + 1e-10)).sum(-1)


@torch.no_grad()
def generate(
    model: DiffusionMLLM,
    prefix_embeds: torch.Tensor,
    prefix_valid: torch.Tensor,
    gen: GenerationConfig,
    special: SpecialTokens,
    kept: np.ndarray | None = None,
    step0_logits: torch.Tensor | None = None,
    seed: int | list[int] = 0,
    early_stop: bool = False,
    tail: int | np.ndarray = 0,
    tail_token: str = "eot",
    steps_kept: np.ndarray | None = None,
) -> Generation:
    """Denoise an answer window of ``gen.gen_length`` positions, each row truncated to ``kept[b]`` if given.

    Args:
        model: the PyTorch LLaDA-V.
        prefix_embeds: [B, P, D] prompt embeddings, left-padded.
        prefix_valid: [B, P] bool, False on left padding.
        gen: generation settings (N, steps, block_length, temperature, remasking).
        special: the model's special token ids.
        kept: [B] kept window per row (Seer's L*); None runs the full window (the padded baseline).
        step0_logits: [B, N, V] logits of a full-depth step-zero pass to use for step 0 instead of a forward
            on the truncated window (docs/DESIGN.md "Seer, exactly", Truncation).
        seed: seeds the Gumbel noise and random remasking, one generator per row (an int seeds every row the
            same way), so a row draws the same noise in a batch as alone.
        early_stop: upstream's ``stopping_criteria=['<|eot_id|>']`` (see the module docstring).
        tail: [B] (or one int) positions after each row's kept window that stay in the window, attended by every
            step but never committed: already ``<|eot_id|>`` (``tail_token`` "eot": Seer's end tail, docs/DESIGN.md
            "Seer, exactly"), ``<|endoftext|>`` ("endoftext") or masks ("mask", diagnosis only), capped at N.
        steps_kept: [B] step budget of each row instead of ``ceil(steps * L* / N)`` (diagnosis only).
    """
    batch, n = prefix_embeds.shape[0], gen.gen_length
    if kept is not None and np.shape(kept) != (batch,):
        raise ConfigError(f"kept must hold one length per row ({batch}), got shape {np.shape(kept)}")
    seeds = [seed] * batch if isinstance(seed, int) else list(seed)
    if len(seeds) != batch:
        raise ConfigError(f"seed must be an int or one seed per row ({batch}), got {len(seeds)} seeds")
    schedule = plan_schedule(gen, kept, batch)
    if steps_kept is not None:
        schedule = budget_schedule(gen, schedule, np.asarray(steps_kept))
    device = prefix_embeds.device
    kept_t = torch.as_tensor(schedule.kept, device=device)
    seen_t = torch.clamp(kept_t + torch.as_tensor(np.broadcast_to(tail, (batch,)).copy(), device=device), max=n)
    # a cut batch computes only its widest window: positions past every row's are padding (segment 0) anyway
    w = n if kept is None else int(seen_t.max())
    segment_ids, position_ids = window_layout(prefix_valid, seen_t, w)
    block_end = torch.as_tensor(schedule.block_end, device=device)  # [B, T]
    positions = torch.arange(w, device=device)[None]  # [1, W]
    rngs = [torch.Generator(device="cpu").manual_seed(s) for s in seeds]

    def noise(*shape: int) -> torch.Tensor:  # [B, *shape] float64, row b from its own generator
        return torch.stack([torch.rand(shape, generator=g, dtype=torch.float64) for g in rngs]).to(device)

    family = getattr(getattr(model, "config", None), "family", "llada-v")  # a stand-in model has no config
    banned = suppressed_ids(family, special)  # LLaDA-V's four; LaViDa's loop suppresses none
    x = torch.full((batch, w), special.mask_id, dtype=torch.long, device=device)  # [B, W]
    if tail_token != "mask":  # the tail after the kept window holds end tokens from the start
        fill = special.eot_id if tail_token == "eot" else special.endoftext_id  # "endoftext"
        in_tail = (positions >= kept_t[:, None]) & (positions < seen_t[:, None])
        x = torch.where(in_tail, torch.full_like(x, fill), x)
    stop = torch.full((batch,), w, device=device)  # [B] first committed <|eot_id|> (W: none yet)
    rule = gen.rule
    fixed = rule[0] == "fixed"
    row_steps = torch.as_tensor(schedule.steps if fixed else schedule.kept, device=device)  # [B] step budget
    used = torch.zeros(batch, dtype=torch.long, device=device)  # [B] forward passes each row took part in
    for t in range(int(row_steps.max())):
        masked = x == special.mask_id  # [B, N]
        before_stop = positions < torch.minimum(stop, kept_t)[:, None]  # [B, N] the kept window, before the stop
        live = (masked & before_stop).any(1) & (t < row_steps)  # [B]
        if not live.any():  # every row stopped early (early_stop), or has no step left
            break
        used += live.long()
        logits = (
            step0_logits[:, :w]
            if (t == 0 and step0_logits is not None)
            else model(prefix_embeds, x, segment_ids, position_ids)
        )
        logits = suppress_special(logits.float(), masked, special, banned)  # [B, N, V]
        if gen.temperature > 0:
            gumbel = (-torch.log(noise(n, logits.shape[-1])[:, :w])) ** gen.temperature  # drawn over N: same stream
            shifted = logits.double() - logits.double().amax(-1, keepdim=True)  # same argmax, no exp overflow
            x0 = torch.argmax(shifted.exp() / gumbel, dim=-1)
        else:
            x0 = torch.argmax(logits, dim=-1)  # [B, N]
        if gen.remasking == "low_confidence":
            p = torch.softmax(logits.double(), dim=-1)
            conf = torch.gather(p, -1, x0[..., None])[..., 0].log()  # [B, N] float64 log-probability
        elif gen.remasking in SCORED:  # Dream's sample_tokens: the margin of the top two, or the negative entropy
            p = torch.softmax(logits.double() / (gen.temperature or 1.0), dim=-1)
            conf = dream_score(p, gen.remasking)
        else:
            conf = noise(n)[:, :w].log()
        if fixed:
            end = block_end[:, t]
        else:  # the block of the first position still to commit
            todo = masked & before_stop
            first = torch.where(todo.any(1), todo.long().argmax(1), 0)
            end = torch.minimum(kept_t, (first // gen.block_length + 1) * gen.block_length)
        eligible = masked & (positions < end[:, None]) & before_stop & live[:, None]
        conf = torch.where(eligible, conf, torch.full_like(conf, float("-inf")))
        # Dream's schedule counts from the masks still open (one committed as the mask id stays open)
        k = schedule.count(t, (masked & before_stop).sum(1).cpu().numpy())
        commit = commit_rule(rule, conf, eligible, torch.as_tensor(k, device=device))
        x = torch.where(commit, x0, x)
        if early_stop:
            stop = torch.where(x == special.eot_id, positions, w).amin(1)
    x = torch.where(positions < kept_t[:, None], x, torch.full_like(x, special.mask_id))  # the tail is not answer
    x = torch.nn.functional.pad(x, (0, n - w), value=special.mask_id)  # [B, N]
    return Generation(tokens=x.cpu().numpy(), kept=schedule.kept, steps=used.cpu().numpy())


def budget_schedule(gen: GenerationConfig, schedule, steps: np.ndarray):
    """The fixed one-block schedule of each row's kept window spread over ``steps[b]`` steps (diagnosis only)."""
    from seer_trt.runtime.decoding import _spread
    from seer_trt.runtime.schedule import Schedule

    total = int(steps.max())
    transfer = np.zeros((len(steps), total), dtype=np.int64)
    for b, (length, k) in enumerate(zip(schedule.kept.tolist(), steps.tolist(), strict=True)):
        transfer[b, :k] = _spread(length, k)
    block_end = np.broadcast_to(schedule.kept[:, None], transfer.shape).copy()
    return Schedule(schedule.kept, steps.astype(np.int64), transfer, block_end)
