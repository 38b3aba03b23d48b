"""Prompt K/V cache policies of the denoising loop: when to compute the prompt, what to feed between (docs/DESIGN.md "Prompt K/V cache").

In:  per row a ``CacheConfig`` (policy, refresh interval R, forecast order, phase map, drift gate); the window
     graph's contract; the backend's device memory (``seer_trt.contracts.backend.DeviceMemory``) and a byte budget.
Out: ``RowCache``: per row and step, whether the step computes the row's prompt (a refresh) or which snapshots it
     reads with which weights. ``KVPool``: each row's snapshots in a slot of the device's memory, within the budget
     (a request is admitted when its slot fits). ``CallBuffers``: a loop's device buffers for its calls: a refresh's
     ``present.*`` are written there by the graph and copied into the rows' slots on the device; a cached step's
     ``past_key_values.*`` are the rows' slots copied into the call's entries on the device, and only entries whose
     row or snapshot changed since the buffer's last call are copied. No K/V byte crosses to the host.

    none      every step computes the prompt (zero-length cache): the exact loop
    reuse     refresh at step 0, every R steps and at every block boundary; in between feed the last snapshot
    forecast  the same refreshes; in between feed the ResilPhase extrapolation of the last order + 1 snapshots

A refresh step is a full step: its prompt positions are computed with no cache and its answer is committed as
in the exact loop; a cached step computes only the answer positions against the cached prompt K/V (LLaDA's
attention is bidirectional, so the prompt's K/V drift as the answer fills in: the cache is an approximation).

Forecast (ResilPhase, arXiv 2606.26769): the refresh steps t_j of the snapshots are mapped onto a bounded phase
axis ``s = tanh(alpha (t - mean) / max|t_j - mean|)`` (mean and spread of the snapshots' steps), and the K/V at
the current step t are the barycentric Lagrange extrapolation of the snapshots to s(t): weights w_j(t) that
sum to 1, so reuse is the forecast with one snapshot and weight 1. The tanh bounds how far a forecast reaches:
order 1 with alpha 0.55 never weighs the newest snapshot above 1.5. The combination is computed where the K/V
are, inside the window graph (``past_weights``), never here: per step only the M weights cross to the device. The
graph takes one weight vector per call, so a call's rows share their weights: every reuse row ([1]), and forecast
rows whose refresh histories give equal weights.

Where the K/V live (docs/DESIGN.md "Prompt K/V cache"):

    refresh call ─► present.* into the loop's present buffer [B, H_kv, P, hd] (device) ─► each row's columns copied
                    into its slot [snapshots, layers, 2, H_kv, C_i, hd] (device)
    cached call  ◄─ past_key_values.* from the loop's past buffer [M, cap, H_kv, past, hd] (device): entry b holds
                    a row's snapshot right-aligned, copied from its slot only when the entry's row or snapshot changed

Shifted logits (Dream, manifest ``model.logit_shift`` 1): a row's first answer position is predicted from the
hidden state of its last prompt position, which no cache holds. A cached step then computes each row's last prompt
position with the answer (``prefix_embeds`` holds those positions; the call's ``segment_ids`` / ``position_ids`` put
the cached positions first, then them, then the answer), and the cache holds the other prompt positions.

Drift gate (``drift``, off by default): at every refresh after the first, the row's fresh K/V are compared with
what the policy would have fed at that step (relative Frobenius error over every layer, keys and values). A forecast
whose error is above plain reuse's falls back to reuse until the next refresh; an error above ``drift`` brings the
next refresh forward to R // 2 steps (at least 1). The gate reads the K/V on the host (counted as K/V sent there).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
from collections import OrderedDict

import numpy as np

from seer_trt.contracts.backend import DeviceArray, DeviceMemory
from seer_trt.contracts.errors import ConfigError
from seer_trt.contracts.graphs import PAST_WEIGHTS, GraphSpec, has_cache, past_names, present_names
from seer_trt.contracts.policies import CacheConfig


def phase(steps: np.ndarray, t: float, alpha: float) -> tuple[np.ndarray, float]:
    """The snapshots' steps and the current step on the tanh phase axis (ResilPhase's bounded step map)."""
    steps = np.asarray(steps, dtype=np.float64)
    mean = steps.mean()
    spread = np.abs(steps - mean).max()
    if spread == 0:  # one snapshot: nothing to extrapolate along
        return np.zeros_like(steps), 0.0
    return np.tanh(alpha * (steps - mean) / spread), float(np.tanh(alpha * (t - mean) / spread))


def lagrange_weights(nodes: np.ndarray, x: float) -> np.ndarray:
    """Weights w_j with p(x) = sum_j w_j f_j for the polynomial through (nodes_j, f_j): barycentric form (second
    kind), so they sum to 1 exactly and a constant history is forecast as itself."""
    nodes = np.asarray(nodes, dtype=np.float64)
    if len(nodes) == 1:
        return np.ones(1)
    hit = np.isclose(x, nodes, rtol=0.0, atol=1e-12)
    if hit.any():
        return hit.astype(np.float64) / hit.sum()
    lam = np.array([1.0 / np.prod([nodes[j] - nodes[k] for k in range(len(nodes)) if k != j])
                    for j in range(len(nodes))])  # fmt: skip
    terms = lam / (x - nodes)
    return terms / terms.sum()


def forecast_weights(steps: np.ndarray, t: int, alpha: float) -> np.ndarray:
    """[M] float32 weights of the snapshots taken at ``steps`` for the K/V at step ``t``."""
    nodes, x = phase(steps, t, alpha)
    return lagrange_weights(nodes, x).astype(np.float32)


def cache_bytes(layers: int, hidden_kv: int, prompt: int, itemsize: int, snapshots: int = 1) -> int:
    """Bytes of one request's prompt K/V cache: keys and values of every layer, ``snapshots`` copies."""
    return 2 * layers * hidden_kv * prompt * itemsize * snapshots


ONE = np.ones(1, dtype=np.float32)  # reuse's weight, and a call without a cache's: the newest snapshot alone
ONE.setflags(write=False)


def no_cache(spec: GraphSpec, batch: int) -> dict[str, np.ndarray]:
    """The cache inputs of a call without a cache (``history`` 1, ``past`` 0, weight 1): the graph then computes
    exactly what the uncached graph did. {} for a graph without cache inputs. Read-only arrays, the same objects
    for the same batch (a device backend keeps them where they are)."""
    if not has_cache(spec):
        return {}
    key = (id(spec), batch)
    feeds = _EMPTY.get(key)
    if feeds is None:
        feeds = {PAST_WEIGHTS.name: ONE}
        for t in spec.inputs:
            if t.name.startswith("past_key_values."):
                feeds[t.name] = _frozen(np.zeros((1, batch, t.shape[2], 0, t.shape[4]), dtype=t.dtype))
        _EMPTY[key] = (spec, feeds)  # the spec kept alive with its id
        return feeds
    return feeds[1]


_EMPTY: dict[tuple[int, int], tuple[GraphSpec, dict[str, np.ndarray]]] = {}


def last_prompt_columns(segment_ids: np.ndarray, prompt_len: int) -> np.ndarray:
    """[P] bool: the prompt columns that hold some row's last prompt position (a non-padding position whose next
    column is the answer or another segment): one column for left-padded rows, one per row when packed."""
    seg = segment_ids[:, :prompt_len]
    nxt = np.concatenate([seg[:, 1:], np.full((seg.shape[0], 1), -1, dtype=seg.dtype)], axis=1)
    return ((seg != 0) & (seg != nxt)).any(0)


def _frozen(array: np.ndarray) -> np.ndarray:
    """Read-only, with the array it views: a backend may keep it on its device for as long as the same object is
    fed (``seer_trt.backends.tensorrt.frozen``), so a cached step sends only its weights, not the cache."""
    base = array
    while isinstance(base, np.ndarray):
        base.setflags(write=False)
        base = base.base
    return array


class RowCache:
    """One row's cache policy over its steps: when it refreshes, which snapshots it holds (their steps and where they
    lie in its slot), the drift gate's state."""

    def __init__(self, config: CacheConfig, cached: bool) -> None:
        """
        Args:
            cached: the window graph takes a prompt K/V cache (schema 2.1 on).

        Raises:
            ConfigError: a cache policy other than none for a graph exported without the cache (schema 2.0).
        """
        if config.mode != "none" and not cached:
            raise ConfigError("this export's window graph takes no prompt K/V cache (exported before schema 2.1); "
                              "re-export with seer-export, or pass --cache none")  # fmt: skip
        self.config = config
        self.slot: Slot | None = None  # its snapshots in the pool (none under policy none)
        self.steps: list[int] = []  # refresh step of each snapshot held, oldest first
        self.held: list[int] = []  # the slot's snapshot index of each, oldest first
        self.next_refresh = 0
        self.fallback = False  # forecast: feed reuse weights until the next refresh (the gate saw it lose)
        self.errors: list[tuple[float, float | None]] = []  # (reuse error, forecast error) at each gated refresh

    def checkpoint(self) -> tuple:
        """The bookkeeping a step changes, for ``restore`` when the step fails (the snapshot a failed step wrote is
        written again: the restored state plans that step's refresh again)."""
        return list(self.steps), list(self.held), self.next_refresh, self.fallback, len(self.errors)

    def restore(self, state: tuple) -> None:
        steps, held, self.next_refresh, self.fallback, errors = state
        self.steps, self.held, self.errors = list(steps), list(held), self.errors[:errors]

    @property
    def stores(self) -> bool:
        """Whether a step that computes the prompt keeps its K/V: every policy but none."""
        return self.config.mode != "none"

    def plan(self, t: int, boundary: bool) -> np.ndarray | None:
        """None when step ``t`` computes the row's prompt (``boundary``: its block changes), else the weights [M] of
        the snapshots it reads (``fed``), oldest first."""
        if self.config.mode == "none" or not self.steps or boundary or t >= self.next_refresh:
            return None
        if self.config.mode == "forecast" and len(self.steps) > 1 and not self.fallback:
            return forecast_weights(np.array(self.steps), t, self.config.alpha)
        return ONE

    def fed(self, weights: np.ndarray) -> tuple[int, ...]:
        """The slot's snapshot indices a cached step with ``weights`` reads, in the weights' order."""
        return tuple(self.held[-len(weights) :])

    def target(self) -> int:
        """The slot's snapshot index the next refresh writes: a free one, else the oldest held."""
        free = [i for i in range(self.config.snapshots) if i not in self.held]
        return free[0] if free else self.held[0]

    def stored(self, t: int, index: int, interval: int | None = None) -> None:
        """After a refresh at step ``t`` wrote snapshot ``index``: it is the newest; the next refresh comes after
        ``interval`` steps (the policy's R unless the drift gate moved it)."""
        if index in self.held:
            k = self.held.index(index)
            del self.held[k], self.steps[k]
        self.held.append(index)
        self.steps.append(t)
        keep = self.config.snapshots
        self.held, self.steps = self.held[-keep:], self.steps[-keep:]
        self.next_refresh = t + (self.config.refresh if interval is None else interval)

    def gate(self, t: int, fresh: np.ndarray, history: list[np.ndarray]) -> int:
        """The drift gate at a refresh (see the module's docstring): ``fresh`` the row's new K/V, ``history`` the
        snapshots held before it (oldest first), on the host; returns the steps to the next refresh."""
        norm = math.sqrt(float(np.vdot(fresh, fresh)))
        reuse = float(np.linalg.norm(fresh - history[-1])) / norm
        forecast = None
        if self.config.mode == "forecast" and len(history) > 1:
            w = forecast_weights(np.array(self.steps), t, self.config.alpha)
            forecast = float(np.linalg.norm(fresh - sum(wj * s for wj, s in zip(w, history, strict=True)))) / norm
        self.errors.append((reuse, forecast))
        self.fallback = forecast is not None and forecast > reuse
        error = reuse if forecast is None else min(reuse, forecast)
        return self.config.refresh if error <= self.config.drift else max(1, self.config.refresh // 2)


@dataclasses.dataclass(eq=False)
class Slot:
    """One row's snapshots in the pool: [snapshots, layers, 2 (key, value), H_kv, positions, head_dim] on the device."""

    array: DeviceArray
    positions: int  # prompt positions it holds (the row's prefix, less its last position when logits are shifted)
    nbytes: int
    id: int
    versions: list[int]  # per snapshot, bumped at each store: what a call buffer's entry is compared with
    views: list[list[DeviceArray]] = dataclasses.field(default_factory=list)  # [snapshot][2 layer + j]: [H_kv, C, hd]

    def __post_init__(self) -> None:
        snapshots, layers = self.array.shape[:2]
        self.views = [[self.array.block(s, i, j) for i in range(layers) for j in range(2)] for s in range(snapshots)]


@dataclasses.dataclass(frozen=True)
class KVLayout:
    """The window graph's K/V geometry, from its contract."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: np.dtype

    @classmethod
    def of(cls, spec: GraphSpec) -> KVLayout:
        key = spec.input(past_names(0)[0])  # [history, batch, kv_heads, past, head_dim]
        layers = sum(t.name.startswith("past_key_values.") for t in spec.inputs) // 2
        return cls(layers, int(key.shape[2]), int(key.shape[4]), np.dtype(key.dtype))

    @property
    def position_bytes(self) -> int:
        """Bytes of one prompt position's keys and values over every layer (one snapshot)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype.itemsize


class KVPool:
    """Rows' prompt K/V snapshots in slots of a backend's device memory, within a byte budget; thread-safe (the loops
    of several ``generate`` calls and the engine share one pool). The loops' call buffers are counted apart
    (``buffer_bytes``): a loop holds a bounded few (per call shape of a step: the largest batch x the past bucket)."""

    def __init__(self, memory: DeviceMemory, spec: GraphSpec, budget: int) -> None:
        """
        Args:
            memory: the backend's (``Backend.memory``).
            spec: a window graph's contract with the cache (``has_cache``).
            budget: bytes the slots may hold together.
        """
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise ConfigError(f"K/V budget {budget!r}: expected a whole number of bytes >= 0")
        self.memory, self.geometry, self.budget = memory, KVLayout.of(spec), budget
        self.names = [n for i in range(self.geometry.layers) for n in present_names(i)]  # present.* in a slot's order
        self.used = 0  # bytes the slots hold
        self.slots = 0  # slots held
        self.buffer_bytes = 0  # bytes the loops' call buffers hold
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def slot_bytes(self, positions: int, snapshots: int) -> int:
        return positions * snapshots * self.geometry.position_bytes

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit the budget now."""
        with self._lock:
            return self.used + nbytes <= self.budget

    def reserve(self, positions: int, snapshots: int) -> Slot | None:
        """A slot of ``snapshots`` x ``positions`` positions, or None when it does not fit the budget now."""
        nbytes = self.slot_bytes(positions, snapshots)
        with self._lock:
            if self.used + nbytes > self.budget:
                return None
            self.used += nbytes
            self.slots += 1
        g = self.geometry
        try:
            array = self.memory.zeros((snapshots, g.layers, 2, g.kv_heads, positions, g.head_dim), g.dtype)
        except BaseException:
            self.release_bytes(nbytes, slots=1)
            raise
        return Slot(array, positions, nbytes, next(self._ids), [0] * snapshots)

    def release(self, slot: Slot) -> None:
        self.memory.free(slot.array)
        self.release_bytes(slot.nbytes, slots=1)

    def claim(self, nbytes: int) -> None:
        """A call buffer's bytes (counted apart from the budget, never refused: a loop holds a bounded few)."""
        with self._lock:
            self.buffer_bytes += nbytes

    def unclaim(self, nbytes: int) -> None:
        with self._lock:
            self.buffer_bytes -= nbytes

    def release_bytes(self, nbytes: int, slots: int = 0) -> None:
        with self._lock:
            self.used -= nbytes
            self.slots -= slots

    def store(self, slot: Slot, index: int, present: dict[str, DeviceArray], entry: int, column: int) -> None:
        """Snapshot ``index`` of ``slot`` from a refresh's ``present.*`` (in a call buffer): batch entry ``entry``,
        ``slot.positions`` columns from ``column``, copied on the device."""
        for target, name in zip(slot.views[index], self.names, strict=True):
            self.memory.copy_columns(target, 0, present[name].block(entry), column, slot.positions)
        slot.versions[index] += 1

    def read(self, slot: Slot, index: int) -> np.ndarray:
        """Snapshot ``index`` on the host [layers, 2, H_kv, C, hd] (the drift gate; counted as K/V sent there)."""
        out = self.memory.to_host(slot.array.block(index))
        transfers = getattr(self.memory, "transfers", None)
        if transfers is not None:
            transfers.fetched("kv", out.nbytes)
        return out


@dataclasses.dataclass(eq=False)
class _PastBuffer:
    """A cached call's K/V inputs: [layers, 2, M, capacity, H_kv, past, hd]; entry b holds ``rows[b]``'s snapshots."""

    array: DeviceArray
    rows: list[int | None]  # the row key each entry holds
    tags: dict[tuple[int, int], tuple[int, int, int]]  # (m, entry) -> (slot id, snapshot, version) copied there
    views: list[DeviceArray] = dataclasses.field(default_factory=list)  # [2 layer + j]: [M, entries, H_kv, past, hd]
    feeds: dict[int, dict[str, DeviceArray]] = dataclasses.field(default_factory=dict)  # a call's of B rows, by B

    def __post_init__(self) -> None:
        layers = self.array.shape[0]
        self.views = [self.array.block(i, j) for i in range(layers) for j in range(2)]


class CallBuffers:
    """One loop's device buffers for its calls (``KVPool`` counts their bytes): the past K/V of cached calls, by
    history M and past length, and the present K/V a refresh writes, by batch and prompt length."""

    PRESENT_KEPT = 4  # present buffers kept, least recently used out: a loop's refresh calls take few shapes

    def __init__(self, pool: KVPool, capacity: int) -> None:
        """
        Args:
            capacity: the most rows one cached call holds (the largest batch bucket): a reuse call's buffer has that
                many entries and a call binds its first B, so rows keep their entries as others come and go.
        """
        self.pool, self.capacity = pool, capacity
        # (history, past, entries, k) -> the k-th buffer of that shape; reuse (M = 1) binds the first B entries of a
        # buffer of ``capacity``, a forecast call's [M, B] must be contiguous, so it has a buffer of its own batch
        self.past: dict[tuple[int, int, int, int], _PastBuffer] = {}
        self._taken: dict[tuple[int, int, int], int] = {}
        self.present: OrderedDict[tuple[int, int], DeviceArray] = OrderedDict()
        self._present_views: dict[int, tuple[DeviceArray, dict[str, DeviceArray]]] = {}  # each buffer's outputs

    def _alloc(self, shape: tuple[int, ...]) -> DeviceArray:
        array = self.pool.memory.zeros(shape, self.pool.geometry.dtype)
        self.pool.claim(array.nbytes)
        return array

    def present_into(self, batch: int, prompt: int) -> dict[str, DeviceArray]:
        """Where a refresh call of ``batch`` rows x ``prompt`` columns writes its ``present.*`` (on the device)."""
        key = (batch, prompt)
        if key in self.present:
            self.present.move_to_end(key)
        else:
            g = self.pool.geometry
            self.present[key] = self._alloc((g.layers, 2, batch, g.kv_heads, prompt, g.head_dim))
            while len(self.present) > self.PRESENT_KEPT:
                _, dropped = self.present.popitem(last=False)
                self._present_views.pop(id(dropped), None)
                self.pool.unclaim(dropped.nbytes)
        array = self.present[key]
        views = self._present_views.get(id(array))
        if views is None or views[0] is not array:
            views = self._present_views[id(array)] = (array, {name: array.block(i, j)
                                                              for i in range(self.pool.geometry.layers)
                                                              for j, name in enumerate(present_names(i))})  # fmt: skip
        return views[1]

    def begin_step(self) -> None:
        """A new step: its cached calls take the past buffers again from the first of each shape."""
        self._taken: dict[tuple[int, int, int], int] = {}

    def past_call(self, keys: list[int], history: int, past: int) -> tuple[tuple[int, ...], list[int]]:
        """The buffer a cached call of rows ``keys`` (``history`` snapshots, ``past`` columns) reads, and the order its
        rows take its entries in (indices into ``keys``): rows already in the buffer keep their entry where it lies
        among the first ``len(keys)``, the others fill the free entries, so a row joining or leaving moves at most one
        other row. The k-th call of a step with this shape takes the k-th buffer of the shape, so the calls of a step
        whose split does not change keep their buffers from step to step."""
        b = len(keys)
        shape = (history, past, self.capacity if history == 1 else b)
        k = self._taken.get(shape, 0)
        self._taken[shape] = k + 1
        handle = (*shape, k)
        buffer = self.past.get(handle)
        if buffer is None:
            return handle, list(range(b))
        wanted, entries, placed = set(keys), [], set()
        for row in buffer.rows[:b]:  # an entry past a smaller call's rows may still name a row placed since
            keep = row in wanted and row not in placed
            entries.append(row if keep else None)
            if keep:
                placed.add(row)
        waiting = [row for row in keys if row not in placed]
        entries = [waiting.pop(0) if row is None else row for row in entries]
        position = {row: i for i, row in enumerate(keys)}
        return handle, [position[row] for row in entries]

    def past_feeds(
        self, handle: tuple[int, ...], rows: list[tuple[int, Slot, tuple[int, ...]]]
    ) -> dict[str, DeviceArray]:
        """The ``past_key_values.*`` feeds of the cached call ``handle`` (``past_call``) whose entries hold ``rows`` in
        order: (row key, its slot, the snapshot indices it reads, oldest first); copies only the entries whose content
        changed."""
        g, b = self.pool.geometry, len(rows)
        history, past, entries = handle[0], handle[1], handle[2]
        buffer = self.past.get(handle)
        if buffer is None:
            array = self._alloc((g.layers, 2, history, entries, g.kv_heads, past, g.head_dim))
            buffer = self.past[handle] = _PastBuffer(array, [None] * entries, {})
        for e, (row, slot, fed) in enumerate(rows):
            buffer.rows[e] = row
            for m, index in enumerate(fed):
                tag = (slot.id, index, slot.versions[index])
                if buffer.tags.get((m, e)) == tag:
                    continue
                for target, source in zip(buffer.views, slot.views[index], strict=True):
                    self.pool.memory.copy_columns(target.block(m, e), past - slot.positions, source, 0, slot.positions)
                buffer.tags[(m, e)] = tag
        for e in range(b, entries):  # entries past this call's rows name no row of it
            if buffer.rows[e] is not None and buffer.rows[e] in {row for row, _, _ in rows}:
                buffer.rows[e] = None
                for m in range(history):
                    buffer.tags.pop((m, e), None)
        feeds = buffer.feeds.get(b)
        if feeds is None:
            feeds = buffer.feeds[b] = {}
            for view, name in zip(buffer.views, (n for i in range(g.layers) for n in past_names(i)), strict=True):
                feeds[name] = view.block(0).first(b).reshape(1, b, *view.shape[2:]) if history == 1 else view
        return feeds

    def forget(self, row: int) -> None:
        """A row left the loop: its entries are free (their content stays, masked, until another row's is copied)."""
        for buffer in self.past.values():
            for e, k in enumerate(buffer.rows):
                if k == row:
                    buffer.rows[e] = None
                    for m in range(buffer.array.shape[2]):
                        buffer.tags.pop((m, e), None)

    def close(self) -> None:
        """Give every buffer's bytes back to the pool."""
        self._present_views.clear()
        for buffer in self.past.values():
            self.pool.unclaim(buffer.array.nbytes)
        for array in self.present.values():
            self.pool.unclaim(array.nbytes)
        self.past.clear()
        self.present.clear()


HOST_KV_SHARE = (
    0.25  # of the machine's memory, the host pool's default budget (the weights and the rest live there too)
)
DEVICE_KV_SHARE = 0.5  # of the GPU's free memory when the pool is made (after the sessions load their weights)


def default_kv_budget(memory: DeviceMemory) -> int:
    """The K/V pool's budget when none is given: ``HOST_KV_SHARE`` of the machine's memory for host memory,
    ``DEVICE_KV_SHARE`` of the GPU's free memory under CUDA."""
    share = HOST_KV_SHARE if memory.device == "cpu" else DEVICE_KV_SHARE
    return int(share * memory.free_bytes())


def cache_layout(spec: GraphSpec) -> KVLayout | None:
    """The K/V geometry of a window graph with the cache, else None (an export before schema 2.1)."""
    return KVLayout.of(spec) if has_cache(spec) else None
