"""Prompt K/V cache policies of the denoising loop: when to compute the prompt, what to feed between (docs/DESIGN.md "Prompt K/V cache").

In:  a ``CacheConfig`` (policy, refresh interval R, forecast order, phase map, drift gate), the window graph's
     contract and one group's ``Layout``.
Out: ``GroupCache``: per step the cache inputs of the window graph and whether the step is a refresh; after a
     refresh it keeps that step's prompt K/V (the graph's ``present.*`` outputs) as a snapshot.

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
are, inside the window graph (``past_weights``), never here: per step only the M weights cross to the device.

Shifted logits (Dream, manifest ``model.logit_shift`` 1): a row's first answer position is predicted from the
hidden state of its last prompt position, which no cache holds. A cached step then computes each row's last prompt
position with the answer (``prefix_embeds`` holds those positions; the call's ``segment_ids`` / ``position_ids`` put
the cached positions first, then them, then the answer), and the cache holds the other prompt positions.

Drift gate (``drift``): at every refresh after the first, the fresh K/V are compared with what the policy would
have fed at that step (relative Frobenius error over every layer, keys and values). A forecast whose error is
above plain reuse's falls back to reuse until the next refresh; an error above ``drift`` brings the next
refresh forward to R // 2 steps (at least 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from seer_trt.contracts.errors import ConfigError
from seer_trt.contracts.graphs import PAST_WEIGHTS, GraphSpec, has_cache, past_names, present_names
from seer_trt.contracts.policies import CacheConfig
from seer_trt.runtime.layout import Layout


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


def no_cache(spec: GraphSpec, batch: int) -> dict[str, np.ndarray]:
    """The cache inputs of a call without a cache (``history`` 1, ``past`` 0, weight 1): the graph then computes
    exactly what the uncached graph did. {} for a graph without cache inputs. Read-only arrays."""
    if not has_cache(spec):
        return {}
    feeds = {PAST_WEIGHTS.name: _frozen(np.ones(1, dtype=np.float32))}
    for t in spec.inputs:
        if t.name.startswith("past_key_values."):
            feeds[t.name] = _frozen(np.zeros((1, batch, t.shape[2], 0, t.shape[4]), dtype=t.dtype))
    return feeds


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


class GroupCache:
    """One group's cache over one run of the denoising loop (state: the snapshots and the next refresh)."""

    def __init__(self, config: CacheConfig, spec: GraphSpec, layout: Layout, logit_shift: int = 0) -> None:
        """
        Args:
            logit_shift: 1 for a shifted model (Dream): a cached step computes each row's last prompt position.

        Raises:
            ConfigError: a cache policy other than none for a graph exported without the cache (schema 2.0).
        """
        self.config = config
        self.spec = spec
        self.cached = has_cache(spec)
        if config.mode != "none" and not self.cached:
            raise ConfigError(f"the {spec.name!r} graph of this export takes no prompt K/V cache (exported before "
                              f"schema 2.1); re-export with seer-export, or pass --cache none")  # fmt: skip
        self.refreshes = 0  # refresh calls so far
        self.steps: list[int] = []  # refresh step of each kept snapshot
        self.snapshots: list[dict[str, np.ndarray]] = []  # past input name -> [b, H_kv, C, hd], newest last
        self.history: dict[str, np.ndarray] = {}  # past input name -> the snapshots stacked [M, b, H_kv, C, hd]
        self.newest: dict[str, np.ndarray] = {}  # past input name -> the newest snapshot [1, b, H_kv, C, hd]
        self.next_refresh = 0
        self.fallback = False  # forecast: feed reuse weights until the next refresh (the gate saw it lose)
        self.errors: list[tuple[float, float | None]] = []  # (reuse error, forecast error) at each gated refresh
        self.empty = no_cache(spec, layout.gen_shape[0])  # the feeds of a step that computes the prompt
        self.shifted = bool(logit_shift)
        if not self.cached:
            return
        layers = sum(t.name.startswith("past_key_values.") for t in spec.inputs) // 2
        # per layer: (past key, past value) inputs and the (present key, present value) outputs that refill them
        self.names = [(past_names(i), present_names(i)) for i in range(layers)]
        self._prompt_feeds(layout)

    def _prompt_feeds(self, layout: Layout) -> None:
        """What a cached step feeds in place of the prompt: nothing, or (shifted) the rows' last prompt positions
        with the call's segment and position ids reordered to cached positions, those, then the answer."""
        b, p = layout.gen_shape[0], layout.prefix_embeds.shape[1]
        self.layout_feeds: dict[str, np.ndarray] = {}
        self.kept_cols = None  # the prompt columns a snapshot keeps (None: all)
        if not self.shifted:
            self.no_prompt = _frozen(np.zeros((b, 0, layout.prefix_embeds.shape[2]), dtype=layout.prefix_embeds.dtype))
            return
        live = last_prompt_columns(layout.segment_ids, p)
        self.kept_cols = np.flatnonzero(~live)
        order = np.concatenate([self.kept_cols, np.flatnonzero(live), np.arange(p, layout.segment_ids.shape[1])])
        self.no_prompt = _frozen(np.ascontiguousarray(layout.prefix_embeds[:, live]))
        self.layout_feeds = {"segment_ids": _frozen(np.ascontiguousarray(layout.segment_ids[:, order])),
                             "position_ids": _frozen(np.ascontiguousarray(layout.position_ids[:, order]))}  # fmt: skip

    def select(self, entries: np.ndarray, layout: Layout) -> None:
        """Keep only batch entries ``entries`` of every snapshot: the group was re-formed to ``layout``."""
        if not self.cached:
            return
        # the weight [1] is batch-free: the same array, so a backend that keeps it on the device does not resend it
        self.empty = {**no_cache(self.spec, len(entries)), PAST_WEIGHTS.name: self.empty[PAST_WEIGHTS.name]}
        self.snapshots = [{k: v[entries] for k, v in snap.items()} for snap in self.snapshots]
        self.history = {k: _frozen(v[:, entries]) for k, v in self.history.items()}
        self.newest = self.history if len(self.snapshots) == 1 else {k: _frozen(v[:, entries])
                                                                     for k, v in self.newest.items()}  # fmt: skip
        self._prompt_feeds(layout)

    @property
    def stores(self) -> bool:
        """Whether a step that computes the prompt keeps its K/V (``store``): every policy but none."""
        return self.cached and self.config.mode != "none"

    def plan(self, t: int, boundary: bool) -> tuple[dict[str, np.ndarray], bool]:
        """The cache feeds of step ``t`` (``boundary``: a block starts) and whether it computes the prompt."""
        if self.config.mode == "none" or not self.snapshots or boundary or t >= self.next_refresh:
            return self.empty, True
        if self.config.mode == "forecast" and len(self.steps) > 1 and not self.fallback:
            feeds = {**self.history, PAST_WEIGHTS.name: forecast_weights(np.array(self.steps), t, self.config.alpha)}
        else:  # reuse: the newest snapshot alone, weight 1
            feeds = {**self.newest, PAST_WEIGHTS.name: self.empty[PAST_WEIGHTS.name]}
        feeds["prefix_embeds"] = self.no_prompt
        return {**feeds, **self.layout_feeds}, False

    def store(self, t: int, out: Mapping[str, np.ndarray]) -> None:
        """After a refresh at step ``t``: keep its prompt K/V as the newest snapshot."""
        self.refreshes += 1
        if self.config.mode == "none":
            return
        cols = self.kept_cols
        fresh = {p: np.array(out[o]) if cols is None else np.ascontiguousarray(out[o][:, :, cols])
                 for past, present in self.names for p, o in zip(past, present, strict=True)}  # fmt: skip
        interval = self.config.refresh
        if self.config.drift is not None and self.snapshots:
            interval = self._gate(t, fresh)
        self.steps.append(t)
        self.snapshots.append(fresh)
        keep = self.config.snapshots
        self.steps, self.snapshots = self.steps[-keep:], self.snapshots[-keep:]
        self.history = {k: _frozen(np.stack([s[k] for s in self.snapshots])) for k in fresh}
        self.newest = self.history if len(self.snapshots) == 1 else {k: _frozen(fresh[k][None]) for k in fresh}
        self.next_refresh = t + interval

    def _gate(self, t: int, fresh: dict[str, np.ndarray]) -> int:
        """The drift gate at a refresh (see the module's docstring); returns the steps to the next refresh."""
        norm = math.sqrt(sum(float(np.vdot(a, a)) for a in fresh.values()))
        reuse = math.sqrt(sum(float(np.sum((fresh[k] - self.snapshots[-1][k]) ** 2)) for k in fresh)) / norm
        forecast = None
        if self.config.mode == "forecast" and len(self.steps) > 1:
            w = forecast_weights(np.array(self.steps), t, self.config.alpha)
            forecast = math.sqrt(sum(float(np.sum((fresh[k] - sum(wj * s[k] for wj, s in zip(w, self.snapshots,
                                 strict=True))) ** 2)) for k in fresh)) / norm  # fmt: skip
        self.errors.append((reuse, forecast))
        self.fallback = forecast is not None and forecast > reuse
        error = reuse if forecast is None else min(reuse, forecast)
        return self.config.refresh if error <= self.config.drift else max(1, self.config.refresh // 2)
