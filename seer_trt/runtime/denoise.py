"""Stage 5, denoise: the one denoising loop, for any group of rows in any layout (docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch", "Seer, exactly", "Decoding strategies").

In:  a ``Layout`` (how the group's rows sit in the graph call), their ``Schedule`` (tokens to commit per row
     and step, block ends), a ``Decoder`` (greedy through the ``denoise`` graph, or sampled from
     ``denoise_logits``), the decoding rule, and optionally step 0's prediction from a full-depth step-zero pass.
Out: ``Denoised``: the answer tokens [n, L_max] (row i's first ``kept[i]`` positions are its answer window) and
     the steps each row took part in.

Per step, LLaDA-V's ``generate_with_embeds``: predict every masked position (special ids suppressed there, in
the graph), confidence = log-probability of the prediction (``low_confidence``) or the log of a uniform draw
(``random``); positions past the row's current block are not eligible; then the decoding rule commits:

    fixed        the row's ``transfer[t]`` most confident eligible positions (ties to the earlier position)
    threshold:τ  every eligible position with probability >= τ, at least the most confident (Fast-dLLM)
    factor:f     the n most confident while the n-th has probability >= 1 - f / (n + 1), at least one
                 (the rule of LLaDA-V's Fast-dLLM hook)

Under ``fixed`` the block a step works in comes from the schedule; under the other two a row moves to its next
block once the current one has no masked position left, and the loop runs until every row is done (each step
commits at least one token, so at most ``kept`` steps). Everything is vectorised over rows: the step loop has
no per-row Python loop and allocates only its small [n, L_max] state arrays.

With ``stop_id`` (LLaDA-V's ``stopping_criteria=['<|eot_id|>']``, the official demo's and evaluation's setting,
docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch"), a row that has committed ``stop_id`` may commit only
before its first one, and is done when no position before it is masked; the loop ends when every row is done.

Rows finish at different steps. A finished row's values no longer change; the group is re-formed from the live
rows' batch entries (``Layout.select``, the cache's snapshots cut alike) when that pays: when the cost model
predicts the smaller call cheaper by more than its own error, or, without one, once at most half the entries
are live. A row computes the same values whatever shares its call, so re-forming changes no token.

With a prompt K/V cache (``seer_trt.runtime.kv_cache``, docs/DESIGN.md "Prompt K/V cache"), a step either
computes the prompt (a refresh; under ``--cache none`` every step) or only the answer positions against the
cached prompt K/V; the policy decides per step, the loop itself is the same.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Protocol

import numpy as np

from seer_trt.contracts.backend import Backend
from seer_trt.contracts.config import SCORED
from seer_trt.contracts.graphs import log_confidence, step_outputs
from seer_trt.contracts.policies import EXACT, CacheConfig
from seer_trt.runtime.kv_cache import GroupCache
from seer_trt.runtime.layout import Layout
from seer_trt.runtime.schedule import Schedule

if TYPE_CHECKING:
    from seer_trt.runtime.dispatch import CostModel

_M1, _M2, _M3 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def uniform(seeds: np.ndarray, step: int, positions: np.ndarray, width: int) -> np.ndarray:
    """[n, L, width] float64 uniforms in (0, 1), a pure function of (row seed, step, answer position, column).

    A counter-based generator (splitmix64's finaliser over the mixed counters), so a row draws the same numbers
    whichever rows share its call and in whatever layout: sampled decoding stays independent of dispatch.
    """
    with np.errstate(over="ignore"):
        z = (np.asarray(seeds, dtype=np.uint64)[:, None, None] * _M1
             + np.uint64(step) * _M2
             + positions.astype(np.uint64)[..., None] * _M3
             + np.arange(width, dtype=np.uint64)[None, None])  # fmt: skip
        z ^= z >> np.uint64(30)
        z *= _M2
        z ^= z >> np.uint64(27)
        z *= _M3
        z ^= z >> np.uint64(31)
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


class Decoder(Protocol):
    """Predictions and their log-confidences of one step, in the loop's state shape [n, L_max]."""

    graph: str  # the graph it calls

    def __call__(self, out: dict[str, np.ndarray], layout: Layout, step: int, shape: tuple[int, int],
                 mask_id: int) -> tuple[np.ndarray, np.ndarray]: ...  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Greedy:
    """Temperature 0: the ``denoise`` graph's own argmax, ranked by its log-probability (``low_confidence``) or by
    one of Dream's scores the graph returns (``score``: ``log_margin`` for topk_margin, ``neg_entropy`` for entropy;
    ``seer_trt.contracts.graphs.SCORE_OUTPUTS``)."""

    score: str | None = None
    graph: str = "denoise"

    def __call__(self, out, layout, step, shape, mask_id):
        conf = log_confidence(out) if self.score is None else out[self.score]
        return layout.gather(out["x0"], shape, mask_id), layout.gather(conf, shape, -np.inf)


@dataclasses.dataclass(frozen=True)
class Sampled:
    """Gumbel-max over ``denoise_logits`` in float64 (LLaDA's ``add_gumbel_noise``; argmax at temperature 0), ranked
    by the prediction's log-probability, uniform noise (random remasking) or Dream's margin or negative entropy.
    With ``top_p`` below 1 a row draws only among its nucleus: the most probable ids (at the temperature) whose
    mass reaches ``top_p`` (OpenAI's and Hugging Face's ``top_p``); the confidence stays the full softmax's."""

    temperature: float
    remasking: str  # "low_confidence" | "random"
    seeds: np.ndarray  # [n] one seed per row
    graph: str = "denoise_logits"
    top_p: np.ndarray | None = None  # [n] nucleus mass per row; None: 1 for every row

    def __call__(self, out, layout, step, shape, mask_id):
        logits = layout.gather(out["logits"], (*shape, out["logits"].shape[-1]), 0.0).astype(np.float64)
        positions = np.broadcast_to(np.arange(shape[1])[None], shape)
        shifted = logits - logits.max(-1, keepdims=True)  # same argmax, no overflow in exp
        if self.temperature > 0:
            gumbel = (-np.log(uniform(self.seeds, 2 * step, positions, logits.shape[-1]))) ** self.temperature
            drawn = np.exp(shifted)
            if self.top_p is not None and (np.asarray(self.top_p) < 1).any():
                drawn = drawn * nucleus(shifted / self.temperature, np.asarray(self.top_p, dtype=np.float64))
            x0 = np.argmax(drawn / gumbel, axis=-1)
        else:
            x0 = np.argmax(logits, axis=-1)
        if self.remasking == "random":
            return x0, np.log(uniform(self.seeds, 2 * step + 1, positions, 1)[..., 0])
        if self.remasking in SCORED:  # Dream's scores, from the (temperature-scaled) softmax
            scaled = shifted / (self.temperature or 1.0)
            p = np.exp(scaled - scaled.max(-1, keepdims=True))
            return x0, dream_score(p / p.sum(-1, keepdims=True), self.remasking)
        picked = np.take_along_axis(shifted, x0[..., None], -1)[..., 0]
        with np.errstate(divide="ignore"):
            return x0, picked - np.log(np.exp(shifted).sum(-1))  # log softmax of x0, float64


@dataclasses.dataclass(frozen=True)
class TopK:
    """Sampling from the ``denoise`` graph's ``top_logits`` / ``top_ids`` (the most probable ids per position, what an
    export without ``denoise_logits`` returns): Gumbel-max over those ids in float64 at the temperature, within the
    row's ``top_p`` nucleus of them. It differs from LLaDA-V's Gumbel over the whole vocabulary (``Sampled``) by the
    mass outside the top ids, which it never draws, and by its draws (one uniform per kept id, not per vocabulary
    id). The confidence is the full softmax's log-probability of the drawn id (``low_confidence``), from the graph's
    ``log_confidence`` of its argmax, or a uniform draw (``random``)."""

    temperature: float
    remasking: str  # "low_confidence" | "random"
    seeds: np.ndarray  # [n]
    top_p: np.ndarray | None = None  # [n]
    graph: str = "denoise"

    def __call__(self, out, layout, step, shape, mask_id):
        k = out["top_logits"].shape[-1]
        logits = layout.gather(out["top_logits"], (*shape, k), 0.0).astype(np.float64)  # [n, L, k] descending
        ids = layout.gather(out["top_ids"], (*shape, k), mask_id)
        positions = np.broadcast_to(np.arange(shape[1])[None], shape)
        shifted = logits - logits[..., :1]  # the argmax at 0
        drawn = np.exp(shifted)
        if self.temperature > 0 and self.top_p is not None and (np.asarray(self.top_p) < 1).any():
            drawn = drawn * nucleus(shifted / self.temperature, np.asarray(self.top_p, dtype=np.float64))
        gumbel = (-np.log(uniform(self.seeds, 2 * step, positions, k))) ** self.temperature
        pick = np.argmax(drawn / gumbel, axis=-1)[..., None]  # [n, L, 1]
        x0 = np.take_along_axis(ids, pick, -1)[..., 0]
        if self.remasking == "random":
            return x0, np.log(uniform(self.seeds, 2 * step + 1, positions, 1)[..., 0])
        best = layout.gather(log_confidence(out), shape, -np.inf).astype(np.float64)  # log p of the argmax
        return x0, best + np.take_along_axis(shifted, pick, -1)[..., 0]


def nucleus(scaled: np.ndarray, top_p: np.ndarray) -> np.ndarray:
    """[n, L, V] bool: per row and position the smallest set of most probable ids under softmax(``scaled``) whose
    mass reaches the row's ``top_p`` [n] (the most probable id always; ties to the lower id)."""
    p = np.exp(scaled - scaled.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    order = np.argsort(-p, axis=-1, kind="stable")
    ranked = np.take_along_axis(p, order, -1)
    before = np.cumsum(ranked, -1) - ranked  # the mass of the ids ranked above each
    keep = np.empty(p.shape, dtype=bool)
    np.put_along_axis(keep, order, before < top_p[:, None, None], -1)
    return keep


def dream_score(p: np.ndarray, remasking: str) -> np.ndarray:
    """[n, L] float64 score of Dream's ``sample_tokens`` from probabilities ``p`` [n, L, V]: top-1 minus top-2
    probability (``topk_margin``), or sum p log(p + 1e-10), the negative entropy (``entropy``)."""
    if remasking == "topk_margin":
        top = np.partition(p, p.shape[-1] - 2, axis=-1)[..., -2:]
        return top[..., 1] - top[..., 0]
    return (p * np.log(p + 1e-10)).sum(-1)


def commit_top_k(confidence: np.ndarray, k: np.ndarray) -> np.ndarray:
    """[n, L] bool: each row's ``k[i]`` most confident positions; ties go to the earlier position."""
    order = np.argsort(-confidence, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(order.shape[1]), order.shape), axis=1)
    return rank < np.asarray(k)[:, None]


def commit_threshold(confidence: np.ndarray, eligible: np.ndarray, tau: float) -> np.ndarray:
    """[n, L] bool: every eligible position whose probability is >= ``tau``, and each row's most confident one."""
    top = commit_top_k(confidence, np.ones(len(confidence), dtype=np.int64))
    return ((confidence >= math.log(tau)) | top) & eligible


def factor_bounds(width: int, factor: float) -> np.ndarray:
    """[width] float64: the log-probability the n-th most confident position needs under ``factor:f``,
    log(1 - f / (n + 1)) for n = 1..width, -inf where that bound is <= 0 and for n = 1 (one always commits)."""
    n = np.arange(1, width + 1, dtype=np.float64)
    bound = 1.0 - factor / (n + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(bound > 0, np.log(np.maximum(bound, 1e-300)), -np.inf)
    out[0] = -np.inf
    return out


def commit_factor(confidence: np.ndarray, eligible: np.ndarray, factor: float) -> np.ndarray:
    """[n, L] bool: per row the n most confident eligible positions, n the longest run from the top whose k-th
    position (k <= n) has probability >= 1 - f / (k + 1); at least one."""
    order = np.argsort(-confidence, axis=1, kind="stable")
    ranked = np.take_along_axis(confidence, order, 1)  # [n, L] descending
    ok = (ranked >= factor_bounds(confidence.shape[1], factor)[None]) & np.take_along_axis(eligible, order, 1)
    count = np.cumprod(ok, axis=1).sum(1)  # [n] the run of passing positions from the top
    return commit_top_k(confidence, np.maximum(count, 1)) & eligible


def commit(rule: tuple[str, float | None], confidence: np.ndarray, eligible: np.ndarray,
           transfer: np.ndarray) -> np.ndarray:  # fmt: skip
    """The positions a step commits under ``rule`` (``GenerationConfig.rule``); ``confidence`` is -inf where
    not ``eligible``; ``transfer`` [n] is the fixed schedule's count."""
    name, value = rule
    if name == "threshold":
        return commit_threshold(confidence, eligible, value)
    if name == "factor":
        return commit_factor(confidence, eligible, value)
    return commit_top_k(confidence, transfer) & eligible


def current_block_end(open_: np.ndarray, kept: np.ndarray, block_length: int) -> np.ndarray:
    """[n] end of each row's current block when blocks advance as they fill: the block of the row's first
    position still to commit, cut to its window (blocks of ``block_length`` over the kept window)."""
    first = np.where(open_.any(1), open_.argmax(1), 0)
    return np.minimum(kept, (first // block_length + 1) * block_length)


@dataclasses.dataclass(frozen=True)
class Denoised:
    tokens: np.ndarray  # [n, L_max] int64; mask_id past each row's window
    steps: np.ndarray  # [n] int64: steps in which the row still had a position to commit (<= its schedule's)
    refreshes: np.ndarray  # [n] int64: of those, the graph calls that computed the row's prompt
    kv_errors: tuple[tuple[float, float | None], ...] = ()  # the cache's drift gate: (reuse, forecast) per refresh


class Loop:
    """The one loop's state over a group's rows and its step: ``denoise`` is ``while loop.step(): pass``; the engine
    (``seer_trt.runtime.engine``) steps many loops side by side and reads each row's tokens between steps.

    Args:
        backend: runs ``decoder.graph``.
        layout: the group's graph inputs and state <-> gen_ids index.
        schedule: per-row commits ([n, T] transfer, block_end) for the group's kept windows.
        decoder: ``Greedy()`` or ``Sampled(...)``.
        mask_id: the mask token id.
        step0: ([n, >= L_max] x0, log-confidence) of a full-depth step-zero pass, used as step 0 (greedy only).
        stop_id: early stopping at this token (``<|eot_id|>``); None runs until the windows are committed.
        cache: the prompt K/V cache policy (``none``: every step computes the prompt).
        rule: the decoding rule (``GenerationConfig.rule``): fixed, threshold or factor.
        block_length: the block of the threshold and factor rules (None: one block per window).
        cost: the dispatch's cost model, which decides when a group is re-formed from its live rows.
        logit_shift: the manifest's ``model.logit_shift`` (1: Dream's shifted logits; the cache then keeps each
            row's last prompt position out, ``seer_trt.runtime.kv_cache``).
    """

    def __init__(self, backend: Backend, layout: Layout, schedule: Schedule, decoder: Decoder, mask_id: int,
                 step0: tuple[np.ndarray, np.ndarray] | None = None, stop_id: int | None = None,
                 cache: CacheConfig = EXACT, rule: tuple[str, float | None] = ("fixed", None),
                 block_length: int | None = None, cost: CostModel | None = None, logit_shift: int = 0) -> None:  # fmt: skip
        n, width = len(schedule.kept), int(schedule.kept.max())
        self.backend, self.layout, self.schedule, self.decoder = backend, layout, schedule, decoder
        self.mask_id, self.step0, self.stop_id, self.rule, self.cost = mask_id, step0, stop_id, rule, cost
        self.shape = (n, width)
        self.fixed = rule[0] == "fixed"
        self.block = width if block_length is None else block_length
        self.x = np.full(self.shape, mask_id, dtype=np.int64)  # [n, L_max]
        self.positions = np.arange(width)[None]  # [1, L_max]
        self.window = self.positions < schedule.kept[:, None]  # [n, L_max]
        self.stop = np.full(n, width)  # [n] first committed stop_id (width: none)
        self.used = np.zeros(n, dtype=np.int64)
        self.refreshes = np.zeros(n, dtype=np.int64)
        self.dropped = np.zeros(n, dtype=bool)  # rows taken out before they finished (a client that left)
        self.cap = schedule.steps if self.fixed else schedule.kept  # steps a row may take (a dynamic step commits one)
        self.kv = GroupCache(cache, backend.spec(decoder.graph), layout, logit_shift)
        # what a step that stores no cache fetches (the top ids only for the decoder that samples from them)
        self.reads = tuple(n for n in step_outputs(backend.spec(decoder.graph))
                           if isinstance(decoder, TopK) or not n.startswith("top_"))  # fmt: skip
        self.ends = np.zeros(n, dtype=np.int64)  # [n] each row's block end at the previous step
        self.t = 0  # steps taken

    def open(self) -> np.ndarray:
        """[n, L_max] positions each row may still commit."""
        return (self.x == self.mask_id) & self.window & (self.positions < self.stop[:, None])

    @property
    def live(self) -> np.ndarray:
        """[n] rows the next step advances: a position still to commit, steps left, not dropped."""
        return self.open().any(1) & (self.t < self.cap) & ~self.dropped

    def drop(self, rows: np.ndarray) -> None:
        """Take ``rows`` out of every later step (their tokens stay as they are)."""
        self.dropped[rows] = True

    def step(self) -> bool:
        """Advance every live row once: one graph call (or step zero's prediction at step 0), then each row commits
        by the rule. False, doing nothing, when no row is live."""
        open_ = self.open()
        live = open_.any(1) & (self.t < self.cap) & ~self.dropped  # [n]
        if not live.any():
            return False
        t, shape, mask_id = self.t, self.shape, self.mask_id
        self.used += live
        block_end = self.schedule.block_end[:, t] if self.fixed else current_block_end(open_, self.schedule.kept,
                                                                                       self.block)  # fmt: skip
        boundary = t > 0 and bool((block_end[live] != self.ends[live]).any())  # a live row's block changes at t
        self.ends = block_end
        # the full-depth step zero already predicted step 0 (docs/DESIGN.md "Seer, exactly")
        if t == 0 and self.step0 is not None:
            x0 = np.where(self.window, self.step0[0][:, : shape[1]], mask_id)
            conf = np.where(self.window, self.step0[1][:, : shape[1]], -np.inf)
        else:
            self.layout = layout = _reform(self.layout, live, self.kv, self.cost)
            feeds = {"prefix_embeds": layout.prefix_embeds, "gen_ids": layout.gen_ids(self.x, mask_id),
                     "segment_ids": layout.segment_ids, "position_ids": layout.position_ids}  # fmt: skip
            past, refresh = self.kv.plan(t, boundary)
            out = self.backend.run(self.decoder.graph, {**feeds, **past},
                                   None if refresh and self.kv.stores else self.reads)  # fmt: skip
            if refresh:
                self.kv.store(t, out)
                self.refreshes += live
            x0, conf = self.decoder(out, layout, t, shape, mask_id)
        eligible = open_ & live[:, None] & (self.positions < block_end[:, None])
        conf = np.where(eligible, conf.astype(np.float64), -np.inf)
        chosen = commit(self.rule, conf, eligible, self.schedule.count(t, open_.sum(1)))
        self.x = np.where(chosen, x0, self.x)
        if self.stop_id is not None:
            self.stop = np.where(self.x == self.stop_id, self.positions, shape[1]).min(1)
        self.t += 1
        return True

    def result(self) -> Denoised:
        return Denoised(self.x, self.used, self.refreshes, tuple(self.kv.errors))


def denoise(
    backend: Backend,
    layout: Layout,
    schedule: Schedule,
    decoder: Decoder,
    mask_id: int,
    step0: tuple[np.ndarray, np.ndarray] | None = None,
    stop_id: int | None = None,
    cache: CacheConfig = EXACT,
    rule: tuple[str, float | None] = ("fixed", None),
    block_length: int | None = None,
    cost: CostModel | None = None,
    logit_shift: int = 0,
) -> Denoised:
    """Denoise a group's answer windows: ``Loop``'s steps until no row is live (its arguments)."""
    loop = Loop(backend, layout, schedule, decoder, mask_id, step0, stop_id, cache, rule, block_length, cost,
                logit_shift)  # fmt: skip
    while loop.step():
        pass
    return loop.result()


def _reform(layout: Layout, live: np.ndarray, kv: GroupCache, cost: CostModel | None) -> Layout:
    """The layout of the call to make: the current one, or its live batch entries alone when that pays."""
    b = layout.gen_shape[0]
    if b == 1:
        return layout
    keep = np.unique(layout.slot[0][live[layout.state[0]]])  # the current call's entries holding a live row
    k = len(keep)
    if k == b:
        return layout
    seq = layout.segment_ids.shape[1]
    pays = k <= b // 2 if cost is None else cost(k, seq) < cost(b, seq) * (1 - cost.error)
    if not pays:
        return layout
    selected = layout.select(keep)
    kv.select(keep, selected)
    return selected
