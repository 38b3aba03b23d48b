"""Stage 5, denoise: the one denoising loop, for any group of rows in any layout (docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch", "Seer, exactly").

In:  a ``Layout`` (how the group's rows sit in the graph call), their ``Schedule`` (tokens to commit per row
     and step, block ends), a ``Decoder`` (greedy through the ``denoise`` graph, or sampled from
     ``denoise_logits``), and optionally step 0's prediction from a full-depth step-zero pass.
Out: ``Denoised``: the answer tokens [n, L_max] (row i's first ``kept[i]`` positions are its answer window) and
     the steps each row took part in.

Per step, LLaDA-V's ``generate_with_embeds``: predict every masked position (special ids suppressed there, in
the graph), confidence = probability of the prediction (``low_confidence``) or a uniform draw (``random``);
positions past the row's current block are not eligible; each row commits its ``transfer[t]`` most confident
eligible positions (ties to the earlier position). Everything is vectorised over rows: the step loop has no
per-row Python loop and allocates only its small [n, L_max] state arrays.

With ``stop_id`` (LLaDA-V's ``stopping_criteria=['<|eot_id|>']``, the official demo's and evaluation's setting,
docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch"), a row that has committed ``stop_id`` may commit only before its first one, and is done when
no position before it is masked; the loop ends when every row is done. A done row still rides along in its
group's calls (its values do not change), so early stopping saves calls only once a whole group is done.

With a prompt K/V cache (``seer_trt.runtime.kv_cache``, docs/DESIGN.md "Prompt K/V cache"), a step either computes the prompt (a
refresh; under ``--cache none`` every step) or only the answer positions against the cached prompt K/V; the
policy decides per step, the loop itself is the same.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np

from seer_trt.contracts.backend import Backend
from seer_trt.contracts.policies import EXACT, CacheConfig
from seer_trt.runtime.kv_cache import GroupCache
from seer_trt.runtime.layout import Layout
from seer_trt.runtime.schedule import Schedule

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
    """Predictions and confidences of one step, in the loop's state shape [n, L_max]."""

    graph: str  # the graph it calls

    def __call__(self, out: dict[str, np.ndarray], layout: Layout, step: int, shape: tuple[int, int],
                 mask_id: int) -> tuple[np.ndarray, np.ndarray]: ...  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Greedy:
    """Temperature 0, ``low_confidence``: the ``denoise`` graph's own argmax and probability."""

    graph: str = "denoise"

    def __call__(self, out, layout, step, shape, mask_id):
        return layout.gather(out["x0"], shape, mask_id), layout.gather(out["confidence"], shape, -np.inf)


@dataclasses.dataclass(frozen=True)
class Sampled:
    """Gumbel-max over ``denoise_logits`` in float64 (LLaDA's ``add_gumbel_noise``), or random remasking."""

    temperature: float
    remasking: str  # "low_confidence" | "random"
    seeds: np.ndarray  # [n] one seed per row
    graph: str = "denoise_logits"

    def __call__(self, out, layout, step, shape, mask_id):
        logits = layout.gather(out["logits"], (*shape, out["logits"].shape[-1]), 0.0).astype(np.float64)
        positions = np.broadcast_to(np.arange(shape[1])[None], shape)
        shifted = logits - logits.max(-1, keepdims=True)  # same argmax, no overflow in exp
        if self.temperature > 0:
            gumbel = (-np.log(uniform(self.seeds, 2 * step, positions, logits.shape[-1]))) ** self.temperature
            x0 = np.argmax(np.exp(shifted) / gumbel, axis=-1)
        else:
            x0 = np.argmax(logits, axis=-1)
        if self.remasking == "random":
            return x0, uniform(self.seeds, 2 * step + 1, positions, 1)[..., 0]
        p = np.exp(shifted)
        conf = np.take_along_axis(p, x0[..., None], -1)[..., 0] / p.sum(-1)
        return x0, conf


def commit_top_k(confidence: np.ndarray, k: np.ndarray) -> np.ndarray:
    """[n, L] bool: each row's ``k[i]`` most confident positions; ties go to the earlier position."""
    order = np.argsort(-confidence, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(order.shape[1]), order.shape), axis=1)
    return rank < np.asarray(k)[:, None]


@dataclasses.dataclass(frozen=True)
class Denoised:
    tokens: np.ndarray  # [n, L_max] int64; mask_id past each row's window
    steps: np.ndarray  # [n] int64: steps in which the row still had a position to commit (<= its schedule's)
    refreshes: np.ndarray  # [n] int64: of those, the graph calls that computed the row's prompt
    kv_errors: tuple[tuple[float, float | None], ...] = ()  # the cache's drift gate: (reuse, forecast) per refresh


def denoise(
    backend: Backend,
    layout: Layout,
    schedule: Schedule,
    decoder: Decoder,
    mask_id: int,
    step0: tuple[np.ndarray, np.ndarray] | None = None,
    stop_id: int | None = None,
    cache: CacheConfig = EXACT,
) -> Denoised:
    """Denoise a group's answer windows.

    Args:
        backend: runs ``decoder.graph``.
        layout: the group's graph inputs and state <-> gen_ids index.
        schedule: per-row commits ([n, T] transfer, block_end) for the group's kept windows.
        decoder: ``Greedy()`` or ``Sampled(...)``.
        mask_id: the mask token id.
        step0: ([n, >= L_max] x0, confidence) of a full-depth step-zero pass, used as step 0 (greedy only).
        stop_id: early stopping at this token (``<|eot_id|>``); None runs every scheduled step.
        cache: the prompt K/V cache policy (``none``: every step computes the prompt).
    """
    n, width = len(schedule.kept), int(schedule.kept.max())
    shape = (n, width)
    x = np.full(shape, mask_id, dtype=np.int64)  # [n, L_max]
    positions = np.arange(width)[None]  # [1, L_max]
    feeds = {"prefix_embeds": layout.prefix_embeds, "gen_ids": None, "segment_ids": layout.segment_ids,
             "position_ids": layout.position_ids}  # fmt: skip
    window = positions < schedule.kept[:, None]  # [n, L_max]
    stop = np.full(n, width)  # [n] first committed stop_id (width: none)
    used = np.zeros(n, dtype=np.int64)
    refreshes = np.zeros(n, dtype=np.int64)
    kv = GroupCache(cache, backend.spec(decoder.graph), layout)
    for t in range(schedule.num_steps):
        masked = x == mask_id
        open_ = masked & window & (positions < stop[:, None])  # positions this row may still commit
        live = open_.any(1) & (t < schedule.steps)  # [n]
        if not live.any():
            break
        used += live
        # the full-depth step zero already predicted step 0 (docs/DESIGN.md "Seer, exactly")
        if t == 0 and step0 is not None:
            x0 = np.where(window, step0[0][:, :width], mask_id)
            conf = np.where(window, step0[1][:, :width], -np.inf)
        else:
            feeds["gen_ids"] = layout.gen_ids(x, mask_id)
            boundary = t > 0 and bool((schedule.block_end[live, t] != schedule.block_end[live, t - 1]).any())
            past, refresh = kv.plan(t, boundary)
            out = backend.run(decoder.graph, {**feeds, **past})
            if refresh:
                kv.store(t, out)
                refreshes += live
            x0, conf = decoder(out, layout, t, shape, mask_id)
        eligible = open_ & live[:, None] & (positions < schedule.block_end[:, t, None])
        conf = np.where(eligible, conf.astype(np.float64), -np.inf)
        commit = commit_top_k(conf, schedule.transfer[:, t]) & eligible
        x = np.where(commit, x0, x)
        if stop_id is not None:
            stop = np.where(x == stop_id, positions, width).min(1)
    return Denoised(x, used, refreshes, tuple(kv.errors))
