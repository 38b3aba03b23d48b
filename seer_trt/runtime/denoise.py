"""Stage 5, denoise: the one denoising loop, over every live row at once (docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch", "Seer, exactly", "Decoding strategies", "Serving and embedding").

In:  ``Row``s: each request's state across steps (its answer window, step, block, kept window, decoding, sampling
     seed, schedule, prompt K/V cache and its slot), added whenever they are admitted; ``LoopSettings``: the backend,
     its K/V pool, the mask id, the buckets and the dispatch policy.
Out: each row's answer tokens, the steps it took part in and the refreshes of its prompt, as it steps.

Per step, LLaDA-V's ``generate_with_embeds`` for every live row: the row's decoder predicts every masked position
(special ids suppressed there, in the graph) and ranks it; positions past the row's current block are not eligible;
then its rule commits among the eligible ones (``seer_trt.runtime.decoding``: fixed, threshold:τ or factor:f). Under
``fixed`` the block a step works in comes from the row's schedule; under the other two a row moves to its next block
once the current one has no masked position left, and takes at most ``kept`` steps. With ``stop_id`` (LLaDA-V's
``stopping_criteria=['<|eot_id|>']``) a row that has committed it may commit only before its first one, and is done
when no position before it is masked.

Rows, not cohorts, step together: whatever step, settings, rule, temperature, seed, window, block or refresh
schedule each row has, a step forms its graph calls from all live rows:

    live rows ─► step 0 predicted at full depth (no call)
              ─► prompt rows  (cache none, or a refresh: the prompt computed)  ─┐ per window graph, split by the
              ─► cached rows  (the prompt K/V read, by snapshot weights)       ─┘ dispatch policy (plan_dispatch,
                                                                                  plan_cached) ─► one graph call each
              ─► each row's decoder over its call's outputs ─► each rule's commit over its rows ─► tokens, steps

Prompt rows and cached rows go in separate calls: one call's rows share its axes, and a refresh row computes its
whole prompt while a cached row computes only its answer against a past; in one call each would pay the other's
positions. A refresh writes its rows' K/V on the device (``seer_trt.runtime.kv_cache``); a cached call reads them
there. The math of a step is vectorised over the live rows; what stays per row is gathering its state into the
step's arrays and back (a few array copies per row, no per-row arithmetic), and its cache policy's bookkeeping.
A row computes the same values whatever shares its call, up to float rounding (docs/DESIGN.md "Serving and
embedding").
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from seer_trt.contracts.backend import Backend
from seer_trt.contracts.errors import ConfigError
from seer_trt.contracts.graphs import PAST_WEIGHTS
from seer_trt.contracts.policies import EXACT, CacheConfig
from seer_trt.contracts.profiles import LengthBuckets
from seer_trt.runtime.decoding import Decoding
from seer_trt.runtime.dispatch import Group, plan_cached, plan_dispatch
from seer_trt.runtime.kv_cache import CallBuffers, KVPool, RowCache, no_cache
from seer_trt.runtime.layout import Layout, rows_cached, rows_packed, rows_padded, with_tails

if TYPE_CHECKING:
    from seer_trt.runtime.dispatch import CostModel


def failed_rows(err: BaseException) -> frozenset[int] | None:
    """The keys of the rows whose graph calls raised ``err`` in ``Loop.step``; None: not known (all of them)."""
    return getattr(err, "seer_call_rows", None)


def current_block_end(open_: np.ndarray, kept: np.ndarray, block_length: np.ndarray | int) -> np.ndarray:
    """[n] end of each row's current block when blocks advance as they fill: the block of the row's first
    position still to commit, cut to its window (blocks of ``block_length`` over the kept window)."""
    first = np.where(open_.any(1), open_.argmax(1), 0)
    return np.minimum(kept, (first // block_length + 1) * block_length)


@dataclasses.dataclass(frozen=True, eq=False)
class RowSettings:
    """How one row decodes, chosen once when its request is prepared: the loop's settings object of a row."""

    decoding: Decoding  # its window graph, decoder, rule and counts (seer_trt.runtime.decoding.choose)
    seed: int  # sampling noise (temperature > 0, random remasking)
    top_p: float  # nucleus mass of sampling
    stop_id: int | None  # early stopping at this id (<|eot_id|>); None: until the window is committed
    cache: CacheConfig  # the prompt K/V cache policy
    block_length: int  # the blocks of threshold and factor (its window, when one block)


_keys = itertools.count(1)


@dataclasses.dataclass(eq=False)
class Row:
    """One request's state across steps, the record the loop moves between calls."""

    settings: RowSettings
    prefix: np.ndarray  # [C, D] what a refresh computes: Seer's end tail, then the prompt's embeddings
    prefix_pos: np.ndarray  # [C] int64 their position ids
    prompt_len: int  # P: the prompt's length (answer position j sits at P + j)
    transfer: np.ndarray  # [T] tokens the fixed rule commits at each of the row's steps
    block_end: np.ndarray  # [T] the fixed rule's block end at each step
    fraction: np.ndarray | None  # [T] Dream's timestep fractions (Timesteps counts), else None
    x: np.ndarray  # [kept] int64 the answer window as it stands
    cache: RowCache
    step0: tuple[np.ndarray, np.ndarray] | None = None  # ([kept] x0, log-confidence) of a full-depth step zero
    t: int = 0  # steps taken
    used: int = 0  # steps it still had a position to commit in (Result.steps)
    refreshes: int = 0  # of those, the calls that computed its prompt
    stop: int = -1  # first committed stop id (kept: none); set on construction
    end: int = 0  # its block end at the previous step
    dropped: bool = False  # taken out before it finished (a client that left)
    error: str | None = None  # why it never stepped (its prompt K/V can never fit the pool)
    alone: bool = False  # in graph calls of its own (a retry after a step that held it failed: Engine)
    key: int = dataclasses.field(default_factory=lambda: next(_keys))

    def __post_init__(self) -> None:
        if self.stop < 0:
            self.stop = self.kept

    @property
    def kept(self) -> int:
        return len(self.x)

    @property
    def cap(self) -> int:
        """Steps it may take: its schedule's under the fixed rule, else its window (each step commits one)."""
        return len(self.transfer) if self.settings.decoding.rule.fixed else self.kept

    def live(self, mask_id: int) -> bool:
        """It has a position to commit, steps left, and was not dropped."""
        if self.dropped or self.t >= self.cap:
            return False
        return bool((self.x[: self.stop] == mask_id).any())

    def count(self, open_masks: int) -> int:
        """Tokens the fixed rule commits at this step: the planned count, or under Dream's timesteps
        int(m * (1 - t[i + 1] / t[i])) of the m masks still open (float32), all of them at its last step."""
        i = min(self.t, len(self.transfer) - 1)
        if self.fraction is None:
            return int(self.transfer[i])
        f = self.fraction[i]
        return open_masks if np.isinf(f) else int(np.float32(open_masks) * f)


@dataclasses.dataclass(frozen=True)
class LoopSettings:
    """What the loop needs besides its rows (one object, not a dozen arguments)."""

    backend: Backend
    mask_id: int
    buckets: LengthBuckets  # the shapes calls are padded to, and the most rows one call holds
    policy: str = "cost_model"  # how a step's rows are split into calls (seer_trt.runtime.dispatch)
    tau_pad: float = 0.2  # hybrid: padding share past which a group is packed
    short: int = 4  # hybrid: rows this short form groups of their own
    cost: CostModel | None = None  # cost_model: the backend's step costs
    pool: KVPool | None = None  # the rows' prompt K/V slots (None: no row caches its prompt)
    logit_shift: int = 0  # 1: Dream's shifted logits (a cached step computes each row's last prompt position)


@dataclasses.dataclass(frozen=True)
class LoopStats:
    """How a loop's rows stepped (``Loop.stats``)."""

    steps: int  # loop steps
    calls: int  # window-graph calls
    rows_per_call: float  # rows a call served, on average


@dataclasses.dataclass(frozen=True)
class CallRecord:
    """One window-graph call of a step, as ``Loop.on_call`` reports it."""

    graph: str
    kind: str  # "prompt" (computes its rows' prompts: a refresh, or cache none) | "cached" (reads their K/V)
    rows: int  # rows it served
    batch: int  # b of the call (1 when packed)
    prompt: int  # prompt positions computed per batch entry (the call's prefix axis)
    answer: int  # answer positions per batch entry
    past: int  # cached prompt positions read per batch entry
    history: int  # snapshots read (M)
    stored: int  # rows whose K/V it stored


class Loop:
    """The one loop's state over its rows: ``add`` rows at any step boundary, ``step`` advances every live row once,
    ``remove`` takes a row out (its slot freed). ``generate`` adds its rows at once and steps to the end; the engine
    adds rows as they are admitted and steps side by side with them (``seer_trt.runtime.engine``)."""

    SPLITS_KEPT = 256  # splits of a class's rows into calls, memoised by the rows (a step's rarely change)
    LAYOUT_BYTES = 64 * 2**20  # call layouts memoised by their rows, least recently used out past this many bytes

    def __init__(self, settings: LoopSettings, buffers: CallBuffers | None = None) -> None:
        """
        Args:
            buffers: the call buffers to use (a pipeline keeps one set per thread across its ``generate`` calls, so
                a call allocates none); None: a set of its own, given back at ``close``.
        """
        self.s = settings
        self.rows: list[Row] = []
        pool = settings.pool
        self._own_buffers = buffers is None
        self.buffers = buffers if buffers is not None or pool is None else CallBuffers(pool, settings.buckets.batch[-1])
        self._splits: OrderedDict[tuple, list[Group]] = OrderedDict()
        self._layouts: OrderedDict[tuple, Layout] = OrderedDict()
        self._layout_bytes = 0
        self.steps = 0  # steps taken (with at least one live row)
        self.calls = 0  # window-graph calls made
        self.rows_served = 0  # rows those calls served
        self.on_call: Callable[[CallRecord], None] | None = None  # told of every window-graph call (metrics, bench)
        self.step_calls: list[int] = []  # window-graph calls of each of the latest steps (a bounded window)
        self.step_rows: list[int] = []  # live rows of each of the latest steps

    # --- rows --------------------------------------------------------------------------------------------------

    def add(self, rows: Iterable[Row]) -> int:
        """Add ``rows`` in order while each one's prompt K/V slot fits the pool (admission by memory); returns how
        many were added: the rest wait for a later call, when finished rows have given their slots back."""
        added = 0
        for row in rows:
            if not self.reserve(row):
                break
            self.rows.append(row)
            added += 1
        return added

    def reserve(self, row: Row) -> bool:
        """Reserve ``row``'s slot in the pool (its snapshots of its prefix, less the last position under shifted
        logits); True when it has one or needs none."""
        pool = self.s.pool
        if row.cache.slot is not None or not row.cache.stores or pool is None:
            return True
        row.cache.slot = pool.reserve(self.slot_positions(row), row.cache.config.snapshots)
        return row.cache.slot is not None

    def slot_positions(self, row: Row) -> int:
        """Prompt positions a row's snapshot holds: its prefix, less its last position under shifted logits (a
        cached step computes that one live)."""
        return len(row.prefix) - int(bool(self.s.logit_shift))

    def remove(self, row: Row) -> None:
        """Take ``row`` out of the loop for good: its slot back to the pool, its call-buffer entries freed."""
        self.rows = [r for r in self.rows if r is not row]
        if row.cache.slot is not None and self.s.pool is not None:
            self.s.pool.release(row.cache.slot)
            row.cache.slot = None
        if self.buffers is not None:
            self.buffers.forget(row.key)

    def live(self) -> list[Row]:
        return [r for r in self.rows if r.live(self.s.mask_id)]

    def retire(self) -> list[Row]:
        """Remove the rows with no step left (finished or dropped), their slots back to the pool; returns them."""
        done = [r for r in self.rows if not r.live(self.s.mask_id)]
        for row in done:
            self.remove(row)
        return done

    def close(self) -> None:
        """Remove every row and give its own call buffers back."""
        for row in list(self.rows):
            self.remove(row)
        if self.buffers is not None and self._own_buffers:
            self.buffers.close()

    # --- a step ------------------------------------------------------------------------------------------------

    def step(self) -> bool:
        """Advance every live row once. False, doing nothing, when no row is live."""
        rows = self.live()
        if not rows:
            return False
        mask = self.s.mask_id
        n, width = len(rows), max(r.kept for r in rows)
        x = np.full((n, width), mask, dtype=np.int64)  # [n, L_max]
        for i, r in enumerate(rows):  # gather the rows' state (copies only)
            x[i, : r.kept] = r.x
        kept = np.array([r.kept for r in rows], dtype=np.int64)
        t = np.array([r.t for r in rows], dtype=np.int64)
        positions = np.arange(width)[None]  # [1, L_max]
        stop = np.array([r.stop for r in rows], dtype=np.int64)
        open_ = (x == mask) & (positions < kept[:, None]) & (positions < stop[:, None])  # [n, L_max]
        fixed = np.array([r.settings.decoding.rule.fixed for r in rows])
        planned = np.array([r.block_end[min(r.t, len(r.block_end) - 1)] for r in rows], dtype=np.int64)
        blocks = np.array([r.settings.block_length for r in rows], dtype=np.int64)
        block_end = np.where(fixed, planned, current_block_end(open_, kept, blocks))  # [n]
        boundary = (t > 0) & (block_end != np.array([r.end for r in rows]))  # a row's block changes at t
        x0 = np.full((n, width), mask, dtype=np.int64)
        conf = np.full((n, width), -np.inf)
        refreshed = np.zeros(n, dtype=bool)
        if self.buffers is not None:
            self.buffers.begin_step()
        classes: dict[tuple, list[tuple[int, np.ndarray | None]]] = {}
        for i, r in enumerate(rows):
            if r.t == 0 and r.step0 is not None:  # the full-depth step zero already predicted step 0
                x0[i, : r.kept], conf[i, : r.kept] = r.step0
                continue
            weights = r.cache.plan(r.t, bool(boundary[i]))
            kind = ("prompt",) if weights is None else ("cached", weights.tobytes())
            own = r.key if r.alone else None  # a row retried alone shares no call
            classes.setdefault((r.settings.decoding.graph, *kind, own), []).append((i, weights))
        calls = 0
        saved = [r.cache.checkpoint() for r in rows]  # a failed call leaves every row as it was before the step
        for (graph, kind, *_), members in classes.items():
            idx = np.array([i for i, _ in members])
            try:
                if kind == "prompt":
                    calls += self._prompt_calls(graph, [rows[i] for i in idx], idx, t, x, x0, conf, width)
                    refreshed[idx] = True
                else:
                    calls += self._cached_calls(graph, [rows[i] for i in idx], idx, members[0][1], t, x, x0, conf,
                                                width)  # fmt: skip
            except Exception as err:
                for r, state in zip(rows, saved, strict=True):
                    r.cache.restore(state)
                with contextlib.suppress(AttributeError):  # the rows it held, for the engine's retry
                    err.seer_call_rows = frozenset(rows[i].key for i in idx)  # type: ignore[attr-defined]
                raise
        eligible = open_ & (positions < block_end[:, None])
        conf = np.where(eligible, conf.astype(np.float64), -np.inf)
        counts = np.array([r.count(int(m)) for r, m in zip(rows, open_.sum(1), strict=True)], dtype=np.int64)
        chosen = np.zeros((n, width), dtype=bool)
        for rule, members in _by(rows, lambda r: r.settings.decoding.rule).items():
            chosen[members] = rule.commit(conf[members], eligible[members], counts[members])
        x = np.where(chosen, x0, x)
        for i, r in enumerate(rows):  # scatter back
            r.x = x[i, : r.kept].copy()
            stop_id = r.settings.stop_id
            if stop_id is not None:
                hits = np.flatnonzero(r.x == stop_id)
                r.stop = int(hits[0]) if len(hits) else r.kept
            r.t += 1
            r.used += 1
            r.refreshes += int(refreshed[i])
            r.end = int(block_end[i])
        self.steps += 1
        self.step_calls = [*self.step_calls[-999:], calls]
        self.step_rows = [*self.step_rows[-999:], n]
        return True

    def _decode(self, rows: list[Row], out: Mapping[str, np.ndarray], layout: Layout, t: np.ndarray,
                width: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """[n, width] x0 and log-confidence of a call's ``rows`` (in its order): each row's own decoder."""
        n = len(rows)
        x0 = np.full((n, width), self.s.mask_id, dtype=np.int64)
        conf = np.full((n, width), -np.inf)
        for decoding, members in _by(rows, lambda r: r.settings.decoding).items():
            seeds = np.array([r.settings.seed for r in rows], dtype=np.int64)
            top_p = np.array([r.settings.top_p for r in rows], dtype=np.float64)
            decoder = decoding.decoder(seeds, top_p)
            got_x, got_c = decoder(dict(out), layout, t, (n, width), self.s.mask_id)
            x0[members], conf[members] = got_x[members], got_c[members]
        return x0, conf

    def _reads(self, graph: str, rows: list[Row]) -> tuple[str, ...]:
        """The outputs a call's rows' decoders read, in the graph's order."""
        spec = self.s.backend.spec(graph)
        names = frozenset(t.name for t in spec.outputs)
        wanted = {name for d in {r.settings.decoding for r in rows} for name in d.decoder(np.zeros(1)).reads(names)}
        return tuple(t.name for t in spec.outputs if t.name in wanted)

    def _split(self, key: tuple, make: Callable[[], list[Group]]) -> list[Group]:
        """The split of a class's rows into calls, made once for the same rows."""
        if key in self._splits:
            self._splits.move_to_end(key)
            return self._splits[key]
        value = self._splits[key] = make()
        while len(self._splits) > self.SPLITS_KEPT:
            self._splits.popitem(last=False)
        return value

    def _layout(self, key: tuple, make: Callable[[], Layout]) -> Layout:
        """A call's layout, made once for the same rows: the same read-only arrays while a call's rows do not change,
        so a device backend keeps them where they are (``seer_trt.backends.tensorrt.frozen``)."""
        if key in self._layouts:
            self._layouts.move_to_end(key)
            return self._layouts[key]
        layout = self._layouts[key] = make()
        self._layout_bytes += _nbytes(layout)
        while self._layout_bytes > self.LAYOUT_BYTES and len(self._layouts) > 1:
            _, dropped = self._layouts.popitem(last=False)
            self._layout_bytes -= _nbytes(dropped)
        return layout

    def stats(self) -> LoopStats:
        return LoopStats(self.steps, self.calls, self.rows_served / self.calls if self.calls else 0.0)

    def _record(self, graph: str, kind: str, layout: Layout, rows: int, past: int, history: int,
                stored: int) -> None:  # fmt: skip
        self.calls += 1
        self.rows_served += rows
        if self.on_call is not None:
            b, g = layout.gen_shape
            self.on_call(CallRecord(graph, kind, rows, b, int(layout.prefix_embeds.shape[1]), g, past, history,
                                    stored))  # fmt: skip

    def _prompt_calls(self, graph: str, rows: list[Row], idx: np.ndarray, t: np.ndarray, x: np.ndarray,
                      x0: np.ndarray, conf: np.ndarray, width: int) -> int:  # fmt: skip
        """The calls of the rows that compute their prompt this step (split by the policy), their K/V stored."""
        s = self.s
        shape = tuple((r.key, len(r.prefix), r.kept) for r in rows)
        groups = self._split((graph, "prompt", shape), lambda: list(plan_dispatch(
            [len(r.prefix) for r in rows], [r.kept for r in rows], np.ones(len(rows), dtype=np.int64), s.buckets,
            s.policy, s.tau_pad, s.short, s.cost, s.backend.max_shape(graph)).groups))  # fmt: skip
        spec = s.backend.spec(graph)
        for group in groups:
            members = [rows[i] for i in group.rows]
            key = (group.path, group.prompt_len, group.gen_len, tuple(r.key for r in members))
            layout = self._layout(key, lambda m=members, g=group: self._prompt_layout(m, g))
            at = idx[list(group.rows)]
            feeds = {"prefix_embeds": layout.prefix_embeds, "gen_ids": layout.gen_ids(x[at], s.mask_id),
                     "segment_ids": layout.segment_ids, "position_ids": layout.position_ids,
                     **no_cache(spec, layout.gen_shape[0])}  # fmt: skip
            storing = [k for k, r in enumerate(members) if r.cache.slot is not None]
            into = None
            if storing and self.buffers is not None:
                into = self.buffers.present_into(layout.gen_shape[0], int(layout.prefix_embeds.shape[1]))
            out = s.backend.run(graph, feeds, self._reads(graph, members), into)
            for k in storing:
                self._store(members[k], into, int(layout.prefix_at[0][k]), int(layout.prefix_at[1][k]))
            self._record(graph, "prompt", layout, len(members), 0, 1, len(storing))
            x0[at], conf[at] = self._decode(members, out, layout, t[at], width)
        return len(groups)

    def _prompt_layout(self, rows: list[Row], group: Group) -> Layout:
        prefixes, pos = [r.prefix for r in rows], [r.prefix_pos for r in rows]
        lengths, kept = [r.prompt_len for r in rows], [r.kept for r in rows]
        if group.path == "packed":
            return rows_packed(prefixes, pos, lengths, kept)
        return rows_padded(prefixes, pos, lengths, kept, group.prompt_len, group.gen_len)

    def _store(self, row: Row, present: Mapping, entry: int, column: int) -> None:
        """A refresh of ``row``: its prompt K/V from the call's present buffer into its slot (on the device)."""
        pool, cache, t = self.s.pool, row.cache, row.t
        index = cache.target()
        gated = cache.config.drift is not None and bool(cache.steps)
        history = [pool.read(cache.slot, h) for h in cache.held] if gated else []
        pool.store(cache.slot, index, present, entry, column)
        interval = cache.gate(t, pool.read(cache.slot, index), history) if gated else None
        cache.stored(t, index, interval)

    def _cached_calls(self, graph: str, rows: list[Row], idx: np.ndarray, weights: np.ndarray, t: np.ndarray,
                      x: np.ndarray, x0: np.ndarray, conf: np.ndarray, width: int) -> int:  # fmt: skip
        """The calls of the rows that read their prompt K/V this step with ``weights`` (split by the policy)."""
        s, live = self.s, int(bool(self.s.logit_shift))
        shape = tuple((r.key, r.cache.slot.positions, r.kept) for r in rows)
        groups = self._split((graph, "cached", shape), lambda: plan_cached(
            [r.cache.slot.positions for r in rows], [r.kept for r in rows], live, s.buckets, s.policy, s.cost))  # fmt: skip
        for group in groups:
            members = [rows[i] for i in group.rows]
            handle, order = self.buffers.past_call([r.key for r in members], len(weights), group.past_len)
            members = [members[i] for i in order]
            at = idx[[group.rows[i] for i in order]]
            key = ("cached", group.past_len, group.gen_len, tuple(r.key for r in members))
            layout = self._layout(key, lambda m=members, g=group: rows_cached(
                [r.prefix for r in m], [r.prefix_pos for r in m], [r.prompt_len for r in m], [r.kept for r in m],
                g.past_len, g.gen_len, bool(live)))  # fmt: skip
            past = self.buffers.past_feeds(handle, [(r.key, r.cache.slot, r.cache.fed(weights)) for r in members])
            s.pool.memory.synchronize()
            feeds = {"prefix_embeds": layout.prefix_embeds, "gen_ids": layout.gen_ids(x[at], s.mask_id),
                     "segment_ids": layout.segment_ids, "position_ids": layout.position_ids,
                     PAST_WEIGHTS.name: weights, **past}  # fmt: skip
            out = s.backend.run(graph, feeds, self._reads(graph, members))
            self._record(graph, "cached", layout, len(members), group.past_len, len(weights), 0)
            x0[at], conf[at] = self._decode(members, out, layout, t[at], width)
        return len(groups)


@dataclasses.dataclass(frozen=True)
class Denoised:
    """Rows run to the end (``denoise``), as arrays."""

    tokens: np.ndarray  # [n, L_max] int64; mask_id past each row's window
    steps: np.ndarray  # [n] int64: steps in which the row still had a position to commit (<= its schedule's)
    refreshes: np.ndarray  # [n] int64: of those, the graph calls that computed the row's prompt
    kv_errors: tuple[tuple[float, float | None], ...] = ()  # the cache's drift gate: (reuse, forecast) per refresh


def make_rows(prompts: list[np.ndarray], schedule, decoding: Decoding, mask_id: int, cached: bool,
              stop_id: int | None = None, cache: CacheConfig = EXACT, block_length: int | None = None,
              seeds: np.ndarray | None = None, top_p: np.ndarray | None = None,
              step0: tuple[np.ndarray, np.ndarray] | None = None, tails: np.ndarray | None = None,
              tail_embed: np.ndarray | None = None) -> list[Row]:  # fmt: skip
    """The rows of a group of prompts [P_i, D] with their ``Schedule`` (``plan_schedule``) and one decoding, each
    prefix the row's end tail (``tails``: ``tails[i]`` x ``tail_embed``) ahead of its prompt (``layout.with_tails``).

    Args:
        cached: the decoding's window graph takes the prompt K/V cache.
        block_length: the blocks of the threshold and factor rules (None: each row's whole window).
        step0: ([R, >= L*] x0, log-confidence) of a full-depth step zero, its step 0's prediction.
    """
    n = len(prompts)
    seeds = np.zeros(n, dtype=np.int64) if seeds is None else seeds
    top_p = np.ones(n) if top_p is None else top_p
    prefixes, positions, lengths = with_tails(prompts, schedule.kept, tails, tail_embed)
    rows = []
    for i in range(n):  # once per request
        k, steps = int(schedule.kept[i]), int(schedule.steps[i])
        settings = RowSettings(decoding, int(seeds[i]), float(top_p[i]), stop_id, cache,
                               k if block_length is None else block_length)  # fmt: skip
        fraction = None if schedule.fraction is None else schedule.fraction[i, :steps]
        rows.append(Row(settings, prefixes[i], positions[i], int(lengths[i]), schedule.transfer[i, :steps],
                        schedule.block_end[i, :steps], fraction, np.full(k, mask_id, dtype=np.int64),
                        RowCache(cache, cached), None if step0 is None else (step0[0][i, :k], step0[1][i, :k])))  # fmt: skip
    return rows


def denoise(settings: LoopSettings, rows: list[Row]) -> Denoised:
    """Step ``rows`` in one loop to the end, each joining as its K/V slot fits ``settings.pool``."""
    loop = Loop(settings)
    waiting = list(rows)
    try:
        while waiting or loop.rows:
            added = loop.add(waiting)
            if not added and not loop.rows:
                raise ConfigError(f"a row's prompt K/V ({loop.slot_positions(waiting[0])} positions) does not fit "
                                  f"the K/V pool's budget of {settings.pool.budget} bytes; raise the budget")  # fmt: skip
            waiting = waiting[added:]
            loop.step()
            loop.retire()
    finally:
        loop.close()
    width = max(r.kept for r in rows)
    tokens = np.full((len(rows), width), settings.mask_id, dtype=np.int64)
    for i, r in enumerate(rows):
        tokens[i, : r.kept] = r.x
    return Denoised(tokens, np.array([r.used for r in rows], dtype=np.int64),
                    np.array([r.refreshes for r in rows], dtype=np.int64),
                    tuple(e for r in rows for e in r.cache.errors))  # fmt: skip


def _nbytes(layout: Layout) -> int:
    return layout.prefix_embeds.nbytes + layout.segment_ids.nbytes + layout.position_ids.nbytes


def _by(rows: list[Row], key: Callable[[Row], object]) -> dict[object, np.ndarray]:
    """Row indices grouped by ``key`` (in first-seen order)."""
    groups: dict[object, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(key(r), []).append(i)
    return {k: np.array(v) for k, v in groups.items()}
