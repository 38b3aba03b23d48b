"""Stage 5, denoise: the one denoising loop, for any group of rows in any layout (docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch", "Seer, exactly", "Decoding strategies").

In:  a ``Layout`` (how the group's rows sit in the graph call), their ``Schedule`` (tokens to commit per row
     and step, block ends), the request's decoding (``seer_trt.runtime.decoding``: a ``Decoder`` that predicts
     and ranks, a ``Rule`` that commits), and optionally step 0's prediction from a full-depth step-zero pass.
Out: ``Denoised``: the answer tokens [n, L_max] (row i's first ``kept[i]`` positions are its answer window) and
     the steps each row took part in.

Per step, LLaDA-V's ``generate_with_embeds``: the decoder predicts every masked position (special ids suppressed
there, in the graph) and ranks it; positions past the row's current block are not eligible; then the rule commits
among the eligible ones (fixed, threshold:τ or factor:f: ``seer_trt.runtime.decoding``).

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
from typing import TYPE_CHECKING

import numpy as np

from seer_trt.contracts.backend import Backend
from seer_trt.contracts.graphs import step_outputs
from seer_trt.contracts.policies import EXACT, CacheConfig
from seer_trt.runtime.decoding import FIXED, Decoder, Rule, TopK
from seer_trt.runtime.kv_cache import GroupCache
from seer_trt.runtime.layout import Layout
from seer_trt.runtime.schedule import Schedule

if TYPE_CHECKING:
    from seer_trt.runtime.dispatch import CostModel


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
        decoder: predicts and ranks each step's positions (``Decoding.decoder``: Greedy, Sampled or TopK).
        mask_id: the mask token id.
        step0: ([n, >= L_max] x0, log-confidence) of a full-depth step-zero pass, used as step 0 (greedy only).
        stop_id: early stopping at this token (``<|eot_id|>``); None runs until the windows are committed.
        cache: the prompt K/V cache policy (``none``: every step computes the prompt).
        rule: commits each step's positions (``Decoding.rule``): fixed, threshold or factor.
        block_length: the block of the threshold and factor rules (None: one block per window).
        cost: the dispatch's cost model, which decides when a group is re-formed from its live rows.
        logit_shift: the manifest's ``model.logit_shift`` (1: Dream's shifted logits; the cache then keeps each
            row's last prompt position out, ``seer_trt.runtime.kv_cache``).
    """

    def __init__(self, backend: Backend, layout: Layout, schedule: Schedule, decoder: Decoder, mask_id: int,
                 step0: tuple[np.ndarray, np.ndarray] | None = None, stop_id: int | None = None,
                 cache: CacheConfig = EXACT, rule: Rule = FIXED,
                 block_length: int | None = None, cost: CostModel | None = None, logit_shift: int = 0) -> None:  # fmt: skip
        n, width = len(schedule.kept), int(schedule.kept.max())
        self.backend, self.layout, self.schedule, self.decoder = backend, layout, schedule, decoder
        self.mask_id, self.step0, self.stop_id, self.rule, self.cost = mask_id, step0, stop_id, rule, cost
        self.shape = (n, width)
        self.fixed = rule.fixed
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
        chosen = self.rule.commit(conf, eligible, self.schedule.count(t, open_.sum(1)))
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
    rule: Rule = FIXED,
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
