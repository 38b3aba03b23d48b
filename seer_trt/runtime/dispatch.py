"""Stage 4, dispatch: group a batch's rows by their truncated length and choose how each group runs
(docs/DESIGN.md "Seer, exactly", hybrid execution).

In:  per row the prompt length P_i and the kept window L_i (after Seer), and its step count; the length
     buckets; a policy, and for ``cost_model`` the backend's fitted ``CostModel``.
Out: ``DispatchPlan``: groups of rows, each with its path and the shape of its graph calls.

Paths (``seer_trt.runtime.layout``): **static** pads a group's rows to one shape, one row per batch entry (the
bucket: the shape an engine profile or a CUDA graph is built for; or the group's longest row);
**packed** concatenates the rows into one sequence (segment ids keep attention inside each row), no padding,
but one attention over the whole sequence; **eager** runs one row at its exact shape. A group runs its
longest row's steps; its shorter rows ride along. Policies:

- ``cost_model`` (the default): the plan its ``CostModel`` predicts fastest. It searches, for two orders of
  the rows (by steps, by prompt), every split into runs of consecutive rows, each run on its cheapest path
  (static at the run's longest shape, packed, or eager for one row), and also prices every other policy's
  plan; it picks the cheapest of all, so it never picks a plan it predicts slower than any fixed policy,
  per-request execution included. It keeps per-request execution unless the predicted gain exceeds the cost
  model's own error (the fit's RMS relative error on its measurements).
- ``hybrid`` (the paper's rule): rows grouped by answer bucket B, rows with L_i <= ``short`` in groups of
  their own; per group the padding share of the static call rho = 1 - sum(P_i + L_i) / (n * (P_B + B)), prompt
  padding included (these graphs recompute the prompt at every step, so a padded prompt slot costs what a
  padded answer slot does); static when rho <= ``tau_pad`` (0.2), packed otherwise; a group of one row (a
  straggler) runs eager.
- for comparison: ``naive_pad`` (rows in arrival order, a batch bucket's worth per call, each call padded to
  its longest prompt and window), ``static`` and ``packed`` (every bucket group on that path), ``per_request``
  (every row alone, eager).

Whatever the plan, each row computes the same values: only the time changes.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np

from seer_trt.contracts.errors import ConfigError
from seer_trt.contracts.policies import DEFAULT_POLICY, POLICIES, check_dispatch
from seer_trt.contracts.profiles import LengthBuckets

Path = Literal["static", "packed", "eager"]


@dataclasses.dataclass(frozen=True)
class Group:
    """Rows denoised together in one graph call per step."""

    rows: tuple[int, ...]  # indices into the batch
    path: Path
    prompt_len: int  # p of the call's prefix_embeds: the bucket (static), the longest (eager, naive), the sum (packed)
    gen_len: int  # g of the call's gen_ids, the same way
    batch: int  # b of the call: len(rows), or 1 when packed
    steps: int  # denoising steps: the group's longest row's
    waste: float  # share of the call's token slots (prompt and answer) that are padding (0 when packed)
    rho: float  # padding share of the group's static call at its buckets, prompt included (the hybrid rule's)
    past_len: int = 0  # a cached step's past axis: its rows' prompt K/V, right-aligned (0: the call computes them)


@dataclasses.dataclass(frozen=True)
class DispatchPlan:
    policy: str  # one of POLICIES
    groups: tuple[Group, ...]
    tau_pad: float  # the hybrid threshold on rho
    slots: int  # token slots computed over all steps of all groups, padding included
    used: int  # of which each row needs: sum_i steps_i * (P_i + L_i)
    predicted_s: float | None = None  # denoising seconds the cost model predicts for this plan (cost_model only)

    @property
    def waste(self) -> float:
        """Share of computed token slots that no row needed (padding, and rows idle after their last step)."""
        return 1.0 - self.used / self.slots if self.slots else 0.0


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Seconds of one denoising step over a call of b rows x s tokens: c0 + c1 * b * s + c2 * b * s^2.

    c0: the call's fixed cost (launch, the loop's host work); c1: per token slot (projections, MLP); c2: per
    pair of slots in a row's dense attention, which a packed call pays over its whole sequence. Padding slots
    cost what real ones do, which is how the model sees prompt and answer padding.
    """

    c0: float
    c1: float
    c2: float
    error: float = 0.0  # RMS relative error of the fit on its own measurements: how far a prediction may be off

    def __call__(self, batch: int, seq: int, keys: int | None = None) -> float:
        """Seconds of a call of ``batch`` rows computing ``seq`` positions each, attending to ``keys`` (``seq``
        unless a cached step also reads a past)."""
        return self.c0 + self.c1 * batch * seq + self.c2 * batch * seq * (seq if keys is None else keys)

    def group_seconds(self, group: Group) -> float:
        """Predicted seconds of a group: its steps times one call of its shape."""
        seq = group.prompt_len + group.gen_len
        return group.steps * self(group.batch, seq, seq + group.past_len)

    @classmethod
    def fit(cls, shapes: Sequence[tuple[int, int]], seconds: Sequence[float]) -> CostModel:
        """Non-negative least squares of the relative error over measured steps (b, s) -> seconds.

        Relative, so a 2 ms call weighs as much as a 200 ms one (absolute errors would fit only the large
        shapes); non-negative by trying every subset of the three terms and keeping the best feasible fit.
        """
        t = np.asarray(seconds, dtype=np.float64)
        feats = np.array([[1.0, b * s, b * s * s] for b, s in shapes]) / t[:, None]  # rows scaled by 1 / t
        best, best_err = (0.0, 0.0, 0.0), np.inf
        for subset in itertools.chain.from_iterable(itertools.combinations(range(3), k) for k in (1, 2, 3)):
            coef, *_ = np.linalg.lstsq(feats[:, subset], np.ones(len(t)), rcond=None)
            if (coef < 0).any():
                continue
            full = np.zeros(3)
            full[list(subset)] = coef
            err = float(((feats @ full - 1.0) ** 2).sum())
            if err < best_err:
                best, best_err = tuple(float(c) for c in full), err
        return cls(*best, error=float(np.sqrt(best_err / len(t))))

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def bucket(value: int, sizes: Sequence[int]) -> int:
    """The smallest size >= value; the value itself past the largest (the caller checked what is allowed)."""
    return next((s for s in sizes if s >= value), value)


def _group(rows: list[int], path: Path, prompts: np.ndarray, kept: np.ndarray, steps: np.ndarray,
           buckets: LengthBuckets | None) -> Group:  # fmt: skip
    p, g = prompts[rows], kept[rows]
    if path == "packed":
        shape = (int(p.sum()), int(g.sum()), 1)
    elif path == "static" and buckets is not None:
        shape = (bucket(int(p.max()), buckets.prompt), bucket(int(g.max()), buckets.answer), len(rows))
    else:  # eager (one row) or naive pad: the longest prompt and window, exactly
        shape = (int(p.max()), int(g.max()), len(rows))
    slots = shape[2] * (shape[0] + shape[1])
    waste = 1.0 - float((p + g).sum()) / slots
    if buckets is not None:
        static_slots = len(rows) * (bucket(int(p.max()), buckets.prompt) + bucket(int(g.max()), buckets.answer))
    else:
        static_slots = len(rows) * int(p.max() + g.max())
    rho = 1.0 - float((p + g).sum()) / static_slots
    return Group(tuple(rows), path, shape[0], shape[1], shape[2], int(steps[rows].max()), waste, rho)


def _by_bucket(kept: np.ndarray, buckets: LengthBuckets, max_batch: int) -> list[list[int]]:
    """Rows grouped by answer bucket (shortest first), each group at most ``max_batch`` rows, in row order."""
    keys = np.array([bucket(int(k), buckets.answer) for k in kept])
    groups = []
    for key in sorted(set(keys.tolist())):
        rows = np.flatnonzero(keys == key).tolist()
        groups += [rows[i : i + max_batch] for i in range(0, len(rows), max_batch)]
    return groups


def _fits(rows: list[int], prompts: np.ndarray, kept: np.ndarray, limits: Mapping[str, int]) -> bool:
    """Whether ``rows`` packed into one sequence stay within the backend's largest shape."""
    p, g = int(prompts[rows].sum()), int(kept[rows].sum())
    return p <= limits.get("prompt", p) and g <= limits.get("answer", g) and p + g <= limits.get("seq", p + g)


def _split_packed(rows: list[int], prompts: np.ndarray, kept: np.ndarray, limits: Mapping[str, int] | None):
    """``rows`` in order, cut into runs that each fit one packed call."""
    if limits is None:
        return [rows]
    runs: list[list[int]] = [[]]
    for r in rows:
        if runs[-1] and not _fits([*runs[-1], r], prompts, kept, limits):
            runs.append([])
        runs[-1].append(r)
    return runs


def plan_dispatch(
    prompt_lens: Sequence[int],
    kept: Sequence[int],
    steps: Sequence[int],
    buckets: LengthBuckets,
    policy: str = DEFAULT_POLICY,
    tau_pad: float = 0.2,
    short: int = 4,
    cost: CostModel | None = None,
    limits: Mapping[str, int] | None = None,
) -> DispatchPlan:
    """Group rows and choose each group's path.

    Args:
        prompt_lens: [B] prompt embeddings per row (images included).
        kept: [B] answer positions per row after Seer (L*), or N.
        steps: [B] denoising steps per row.
        buckets: the export's length buckets (static shapes, and the batch cap of one call).
        policy: one of POLICIES.
        tau_pad: hybrid: a group whose padding share rho exceeds this is packed.
        short: hybrid: rows with L* <= short are grouped apart from longer rows of their bucket, so they do not
            ride along for the longer rows' steps (0: no such groups).
        cost: cost_model: the fitted per-step cost of the backend (not needed for a batch of one row).
        limits: the backend's largest size per axis (``Backend.max_shape``, engine profiles); packed groups are
            split to fit. None: any size (ONNX Runtime).
    """
    check_dispatch(policy, tau_pad, short)
    prompts = np.asarray(prompt_lens, dtype=np.int64)
    kept_arr = np.asarray(kept, dtype=np.int64)
    steps_arr = np.asarray(steps, dtype=np.int64)
    if not (len(prompts) == len(kept_arr) == len(steps_arr)):
        raise ConfigError(f"one prompt length, kept length and step count per row; got {len(prompts)}, "
                          f"{len(kept_arr)}, {len(steps_arr)}")  # fmt: skip
    if policy == "cost_model" and cost is None and len(kept_arr) > 1:
        raise ConfigError("the cost_model policy needs a CostModel; SeerPipeline.calibrate_costs() measures one")
    rows = list(range(len(kept_arr)))
    ctx = _Rows(prompts, kept_arr, steps_arr, buckets, limits)
    predicted = None
    if policy == "cost_model":
        if len(rows) <= 1:
            groups = fixed_groups("per_request", ctx, tau_pad, short)
        else:
            plans = [search_groups(order, ctx, cost) for order in _orders(ctx)]
            plans += [fixed_groups(p, ctx, tau_pad, short) for p in POLICIES if p != "cost_model"]
            groups = min(plans, key=lambda gs: sum(cost.group_seconds(g) for g in gs))
            alone = fixed_groups("per_request", ctx, tau_pad, short)
            seconds = sum(cost.group_seconds(g) for g in alone)
            if seconds <= (1 + cost.error) * sum(cost.group_seconds(g) for g in groups):
                groups = alone  # a predicted gain within the model's own error is no gain: keep it simple
            predicted = sum(cost.group_seconds(g) for g in groups)
    else:
        groups = fixed_groups(policy, ctx, tau_pad, short)
        if cost is not None:
            predicted = sum(cost.group_seconds(g) for g in groups)
    slots = sum(g.steps * g.batch * (g.prompt_len + g.gen_len) for g in groups)
    used = int((steps_arr * (prompts + kept_arr)).sum())
    return DispatchPlan(policy, tuple(groups), tau_pad, slots, used, predicted)


@dataclasses.dataclass(frozen=True)
class _Rows:
    """One batch's per-row sizes and the limits the planners share."""

    prompts: np.ndarray  # [B] P_i
    kept: np.ndarray  # [B] L_i
    steps: np.ndarray  # [B]
    buckets: LengthBuckets
    limits: Mapping[str, int] | None

    def group(self, rows: list[int], path: Path, bucketed: bool = True) -> Group:
        return _group(rows, path, self.prompts, self.kept, self.steps, self.buckets if bucketed else None)

    def packed(self, rows: list[int]) -> list[Group]:
        return [self.group(run, "packed") for run in _split_packed(rows, self.prompts, self.kept, self.limits)]


def fixed_groups(policy: str, ctx: _Rows, tau_pad: float, short: int) -> list[Group]:
    """The groups of a fixed policy (every policy but cost_model)."""
    rows = list(range(len(ctx.kept)))
    max_batch = ctx.buckets.batch[-1]
    if policy == "naive_pad":  # in order, as many rows per call as the largest batch bucket allows
        return [ctx.group(rows[i : i + max_batch], "static", bucketed=False) for i in range(0, len(rows), max_batch)]
    if policy == "per_request":
        return [ctx.group([r], "eager") for r in rows]
    if policy == "static":
        return [ctx.group(g, "static") for g in _by_bucket(ctx.kept, ctx.buckets, max_batch)]
    if policy == "packed":
        return [p for g in _by_bucket(ctx.kept, ctx.buckets, max_batch) for p in ctx.packed(g)]
    assert policy == "hybrid", policy
    groups: list[Group] = []
    for part in ([r for r in rows if ctx.kept[r] <= short], [r for r in rows if ctx.kept[r] > short]):
        for g in _by_bucket(ctx.kept[part], ctx.buckets, max_batch):
            members = [part[i] for i in g]
            if len(members) == 1:
                groups.append(ctx.group(members, "eager"))
                continue
            static = ctx.group(members, "static")
            groups += [static] if static.rho <= tau_pad else ctx.packed(members)
    return groups


def _orders(ctx: _Rows) -> list[list[int]]:
    """Row orders the search splits into runs: by steps (then prompt), and by prompt (then steps)."""
    idx = np.arange(len(ctx.kept))
    by_steps = np.lexsort((idx, ctx.prompts, ctx.kept, ctx.steps))
    by_prompt = np.lexsort((idx, ctx.kept, ctx.steps, ctx.prompts))
    return [by_steps.tolist(), by_prompt.tolist()]


def search_groups(order: list[int], ctx: _Rows, cost: CostModel) -> list[Group]:
    """The split of ``order`` into runs of consecutive rows (at most a batch bucket each) whose predicted time,
    each run on its cheapest path, is least: dynamic programming over the split points, O(B * max batch)."""
    n, cap = len(order), ctx.buckets.batch[-1]
    limits = ctx.limits or {}
    best = [0.0] + [np.inf] * n  # best[j]: least seconds for order[:j]
    choice: list[tuple[int, Path]] = [(0, "eager")] * (n + 1)  # choice[j]: where the last run starts, its path
    for j in range(1, n + 1):
        max_p = max_g = max_t = sum_p = sum_g = 0
        for i in range(j - 1, max(-1, j - 1 - cap), -1):  # the run order[i:j], grown leftwards
            r = order[i]
            p, g, t = int(ctx.prompts[r]), int(ctx.kept[r]), int(ctx.steps[r])
            max_p, max_g, max_t, sum_p, sum_g = max(max_p, p), max(max_g, g), max(max_t, t), sum_p + p, sum_g + g
            size = j - i
            options: list[tuple[Path, float]] = [
                ("eager" if size == 1 else "static", max_t * cost(size, max_p + max_g))
            ]
            fits = (sum_p <= limits.get("prompt", sum_p) and sum_g <= limits.get("answer", sum_g)
                    and sum_p + sum_g <= limits.get("seq", sum_p + sum_g))  # fmt: skip
            if size > 1 and fits:
                options.append(("packed", max_t * cost(1, sum_p + sum_g)))
            path, seconds = min(options, key=lambda o: o[1])
            if best[i] + seconds < best[j]:
                best[j], choice[j] = best[i] + seconds, (i, path)
    groups: list[Group] = []
    j = n
    while j > 0:
        i, path = choice[j]
        groups.append(ctx.group(sorted(order[i:j]), path, bucketed=False))
        j = i
    return groups[::-1]


def plan_cached(past: Sequence[int], kept: Sequence[int], live: int, buckets: LengthBuckets,
                policy: str = DEFAULT_POLICY, cost: CostModel | None = None) -> list[Group]:  # fmt: skip
    """One engine step's cached calls over rows reading their prompt K/V (docs/DESIGN.md "Serving and embedding").

    A cached call computes each row's answer (and ``live`` = 1 prompt position of a shifted model) against its rows'
    K/V, right-aligned in a past axis padded to the prompt bucket of its longest row: a bucket, so that the call's
    K/V buffer keeps its shape while rows come and go (``seer_trt.runtime.kv_cache.CallBuffers``). Never packed.
    The policy splits the rows: ``per_request`` one a call; ``naive_pad`` a batch bucket's worth a call in order,
    padded to the longest answer; ``static``, ``packed`` and ``hybrid`` by answer bucket; ``cost_model`` the split
    into runs of rows sorted by answer that its model predicts fastest, against every fixed split, keeping one row a
    call unless the gain exceeds the model's own error.

    Args:
        past: [n] prompt positions each row's K/V holds.
        kept: [n] each row's answer window.
        live: prompt positions each row computes live (1 under shifted logits, else 0).
    """
    past_arr, kept_arr = np.asarray(past, dtype=np.int64), np.asarray(kept, dtype=np.int64)
    max_batch = buckets.batch[-1]

    def call(rows: list[int], bucketed: bool) -> Group:
        g = int(kept_arr[rows].max())
        g = bucket(g, buckets.answer) if bucketed else g
        c = bucket(int(past_arr[rows].max()), buckets.prompt)
        used = float((kept_arr[rows] + live).sum())
        return Group(tuple(rows), "eager" if len(rows) == 1 else "static", live, g, len(rows), 1,
                     1.0 - used / (len(rows) * (g + live)), 0.0, c)  # fmt: skip

    rows = list(range(len(kept_arr)))
    alone = [call([r], False) for r in rows]
    if policy == "per_request" or len(rows) <= 1:
        return alone
    naive = [call(rows[i : i + max_batch], False) for i in range(0, len(rows), max_batch)]
    if policy == "naive_pad":
        return naive
    by_bucket = [call(g, True) for g in _by_bucket(kept_arr, buckets, max_batch)]
    if policy != "cost_model":
        return by_bucket
    if cost is None:
        raise ConfigError("the cost_model policy needs a CostModel; SeerPipeline.calibrate_costs() measures one")

    def seconds(groups: list[Group]) -> float:
        return sum(cost.group_seconds(g) for g in groups)

    order = np.lexsort((np.arange(len(rows)), past_arr, kept_arr)).tolist()
    best = [0.0] + [np.inf] * len(order)  # best[j]: least seconds for order[:j]
    start = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        for i in range(j - 1, max(-1, j - 1 - max_batch), -1):
            run = order[i:j]
            t = best[i] + cost.group_seconds(call(run, False))
            if t < best[j]:
                best[j], start[j] = t, i
    searched, j = [], len(order)
    while j > 0:
        searched.append(call(sorted(order[start[j] : j]), False))
        j = start[j]
    plan = min([searched[::-1], naive, by_bucket], key=seconds)
    return alone if seconds(alone) <= (1 + cost.error) * seconds(plan) else plan
