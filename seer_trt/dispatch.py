"""Stage 4, dispatch: group a batch's rows by their truncated length and choose how each group runs (§4).

In:  per row the prompt length P_i and the kept window L_i (after Seer), and its step count; the length
     buckets; a policy.
Out: ``DispatchPlan``: groups of rows, each with its path and the shape of its graph calls.

Paths (``seer_trt.layout``): **static** pads a group's rows to its (prompt, answer) bucket, one row per batch
entry, the shape an engine profile or a CUDA graph is built for; **packed** concatenates the rows into one
sequence (segment ids keep attention inside each row), no padding at all; **eager** runs one row at its exact
shape. Policies:

- ``hybrid`` (the paper's rho rule): rows grouped by answer bucket B; per group the padding-waste ratio
  rho = 1 - sum(L_i) / (n * B); static when rho <= ``tau_pad`` (0.2), packed otherwise; a group of one row (a
  straggler) and very short rows (L_i <= ``short``) run eager;
- ``cost_model``: the same groups, each on the path whose predicted time (``CostModel``, fitted to measured
  calls of the backend) is lowest;
- for comparison: ``naive_pad`` (every row in one call padded to the batch's longest prompt and window),
  ``static`` and ``packed`` (every group on that path), ``per_request`` (every row alone, eager).

Whatever the plan, each row computes the same values: only the time changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np

from seer_trt.errors import ConfigError
from seer_trt.graphs import LengthBuckets

Path = Literal["static", "packed", "eager"]
POLICIES = ("hybrid", "cost_model", "naive_pad", "static", "packed", "per_request")


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
    rho: float  # the paper's padding-waste ratio of the answer windows: 1 - sum(L_i) / (n * answer bucket)


@dataclasses.dataclass(frozen=True)
class DispatchPlan:
    policy: str  # one of POLICIES
    groups: tuple[Group, ...]
    tau_pad: float  # the hybrid threshold on rho
    slots: int  # token slots computed over all steps of all groups, padding included
    used: int  # of which each row needs: sum_i steps_i * (P_i + L_i)

    @property
    def waste(self) -> float:
        """Share of computed token slots that no row needed (padding, and rows idle after their last step)."""
        return 1.0 - self.used / self.slots if self.slots else 0.0


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Seconds of one denoising call of b rows x s tokens: c0 + c1 * b * s + c2 * b * s^2 (launch, linear, attention)."""

    c0: float
    c1: float
    c2: float

    def __call__(self, batch: int, seq: int) -> float:
        return self.c0 + self.c1 * batch * seq + self.c2 * batch * seq * seq

    @classmethod
    def fit(cls, shapes: Sequence[tuple[int, int]], seconds: Sequence[float]) -> CostModel:
        """Least squares over measured calls (b, s) -> seconds, coefficients clipped at 0."""
        a = np.array([[1.0, b * s, b * s * s] for b, s in shapes])
        coef, *_ = np.linalg.lstsq(a, np.asarray(seconds, dtype=np.float64), rcond=None)
        return cls(*(max(0.0, float(c)) for c in coef))

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
    rho = 1.0 - float(g.sum()) / (len(rows) * (bucket(int(g.max()), buckets.answer) if buckets else int(g.max())))
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
    policy: str = "hybrid",
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
        short: hybrid: rows with L* <= short run eager.
        cost: cost_model: the fitted per-call cost of the backend.
        limits: the backend's largest size per axis (``Backend.max_shape``, engine profiles); packed groups are
            split to fit. None: any size (ONNX Runtime).
    """
    if policy not in POLICIES:
        raise ConfigError(f"unknown dispatch policy {policy!r}; choose from {POLICIES}")
    if policy == "cost_model" and cost is None:
        raise ConfigError("the cost_model policy needs a CostModel; SeerPipeline.calibrate_costs() measures one")
    if not 0.0 <= tau_pad <= 1.0:
        raise ConfigError(f"tau_pad must lie in [0, 1], got {tau_pad}")
    prompts = np.asarray(prompt_lens, dtype=np.int64)
    kept_arr = np.asarray(kept, dtype=np.int64)
    steps_arr = np.asarray(steps, dtype=np.int64)
    if not (len(prompts) == len(kept_arr) == len(steps_arr)):
        raise ConfigError(f"one prompt length, kept length and step count per row; got {len(prompts)}, "
                          f"{len(kept_arr)}, {len(steps_arr)}")  # fmt: skip
    rows = list(range(len(kept_arr)))
    max_batch = buckets.batch[-1]
    groups: list[Group] = []

    def make(rows: list[int], path: Path) -> Group:
        return _group(rows, path, prompts, kept_arr, steps_arr, buckets)

    def packed(rows: list[int]) -> list[Group]:
        return [make(run, "packed") for run in _split_packed(rows, prompts, kept_arr, limits)]

    if policy == "naive_pad":
        groups = [_group(rows, "static", prompts, kept_arr, steps_arr, None)] if rows else []
    elif policy == "per_request":
        groups = [make([r], "eager") for r in rows]
    elif policy == "static":
        groups = [make(g, "static") for g in _by_bucket(kept_arr, buckets, max_batch)]
    elif policy == "packed":
        groups = [p for g in _by_bucket(kept_arr, buckets, max_batch) for p in packed(g)]
    elif policy == "hybrid":
        eager = [r for r in rows if kept_arr[r] <= short]
        rest = [r for r in rows if kept_arr[r] > short]
        groups = [make([r], "eager") for r in eager]
        for g in _by_bucket(kept_arr[rest], buckets, max_batch):
            members = [rest[i] for i in g]
            if len(members) == 1:
                groups.append(make(members, "eager"))
                continue
            static = make(members, "static")
            groups += [static] if static.rho <= tau_pad else packed(members)
    else:  # cost_model

        def seconds(option: list[Group]) -> float:
            return sum(cost(o.batch, o.prompt_len + o.gen_len) * o.steps for o in option)

        for g in _by_bucket(kept_arr, buckets, max_batch):
            options = [[make(g, "static")], packed(g), [make([r], "eager") for r in g]]
            groups += min(options, key=seconds)
    slots = sum(g.steps * g.batch * (g.prompt_len + g.gen_len) for g in groups)
    used = int((steps_arr * (prompts + kept_arr)).sum())
    return DispatchPlan(policy, tuple(groups), tau_pad, slots, used)
