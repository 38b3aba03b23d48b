"""Block layout and step budget of the denoising loop, before and after Seer truncation (docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch", "Seer, exactly").

In:  generation settings (gen_length N, steps, block_length) and the kept window L* per row.
Out: a ``Schedule``: how many tokens each row commits at each step and which positions are eligible.

LLaDA-V ``generate_with_embeds``: ``steps // num_blocks`` steps per block; within a block the block's masks
are spread evenly over its steps, the remainder going to the earliest steps. Truncation keeps the
tokens-per-step ratio: a row kept to L* positions gets ``ceil(steps * L* / N)`` steps over a block layout
recomputed on L* (full blocks keep their steps, a final partial block gets its share, rounded up).

Dream's ``diffusion_generate`` (``schedule`` "dream"): one block; timesteps ``linspace(1, eps, steps + 1)`` in
float32 (eps 1e-3); step i commits ``int(m * (1 - t[i + 1] / t[i]))`` of the m masks still open, the last step all
that are left. A row kept to L* runs that rule over its L* masks and its ``ceil(steps * L* / N)`` steps.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from seer_trt.contracts.config import GenerationConfig
from seer_trt.contracts.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Per-row commit plan; rows that finish early commit nothing in later steps."""

    kept: np.ndarray  # [B] int64: answer positions each row keeps (L*, or N untruncated)
    steps: np.ndarray  # [B] int64: denoising steps each row uses
    transfer: np.ndarray  # [B, T] int64: tokens committed by row b at step t (T = max steps)
    block_end: np.ndarray  # [B, T] int64: at step t only answer positions < block_end[b, t] may commit
    # schedule "dream": [B, T] float32 1 - t[i + 1] / t[i] of the row's timesteps, inf at its last step (all that
    # are left), 0 past it; the count is taken from the masks still open (``count``), as diffusion_generate does
    fraction: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        return int(self.transfer.shape[1])

    def count(self, t: int, open_masks: np.ndarray) -> np.ndarray:
        """[B] tokens each row commits at step ``t``: the planned ``transfer``, or under Dream's schedule
        int(m * (1 - t[i + 1] / t[i])) of the m masks the row still has open (float32, as Dream's tensors), all of
        them at its last step. The two agree unless a step commits a mask id (a prediction of the mask itself), which
        leaves that position masked for a later step."""
        i = min(t, self.num_steps - 1)
        if self.fraction is None:
            return self.transfer[:, i]
        f = self.fraction[:, i]
        m = np.asarray(open_masks, dtype=np.int64)
        with np.errstate(invalid="ignore"):
            share = (m.astype(np.float32) * np.where(np.isinf(f), 0, f)).astype(np.int64)
        return np.where(np.isinf(f), m, share)

    def rows(self, rows: np.ndarray | list[int]) -> Schedule:
        """The schedule of a subset of rows, its step axis cut to their longest."""
        rows = np.asarray(rows, dtype=np.int64)
        steps = self.steps[rows]
        total = int(steps.max()) if len(rows) else 0
        fraction = None if self.fraction is None else self.fraction[rows, :total]
        return Schedule(self.kept[rows], steps, self.transfer[rows, :total], self.block_end[rows, :total], fraction)


def truncated_steps(steps: int, kept: np.ndarray | int, gen_length: int) -> np.ndarray:
    """``ceil(steps * L* / N)``, at least 1: the step budget of a window kept to L* of N positions."""
    raw = np.asarray(kept)
    if raw.ndim > 1 or not (np.issubdtype(raw.dtype, np.integer) or np.array_equal(raw, np.round(raw))):
        raise ConfigError(f"kept lengths must be whole numbers, one per row; got {raw.tolist()}")
    kept_arr = raw.astype(np.int64)
    if (kept_arr < 1).any() or (kept_arr > gen_length).any():
        raise ConfigError(f"kept lengths must lie in [1, {gen_length}], got {kept_arr.tolist()}")
    return np.maximum(1, -((-steps * kept_arr) // gen_length))


def _spread(count: int, steps: int) -> list[int]:
    """``count`` masks over ``steps`` steps, remainder to the earliest steps (``get_num_transfer_tokens``)."""
    base, rest = divmod(count, steps)
    return [base + 1 if i < rest else base for i in range(steps)]


DREAM_EPS = 1e-3  # DreamGenerationConfig's eps


def linspace32(start: float, end: float, count: int) -> np.ndarray:
    """``torch.linspace(start, end, count)`` in float32 as PyTorch's CPU kernel computes it (so Dream's counts match):
    a float32 step, then ``start + step * i`` for the first half and ``end - step * (count - 1 - i)`` for the rest,
    each a fused multiply-add (one rounding; float32 products are exact in float64)."""
    if count == 1:
        return np.array([start], dtype=np.float32)
    first, last = np.float32(start), np.float32(end)
    step = np.float32((last - first) / np.float32(count - 1))
    i = np.arange(count, dtype=np.float64)
    half = count // 2
    low = np.float64(first) + np.float64(step) * i[:half]
    high = np.float64(last) - np.float64(step) * (count - 1 - i[half:])
    return np.concatenate([low, high]).astype(np.float32)


def dream_fractions(steps: int, eps: float = DREAM_EPS) -> np.ndarray:
    """[steps] float32 1 - t[i + 1] / t[i] of Dream's timesteps ``linspace(1, eps, steps + 1)``; inf at the last step
    (its loop commits every mask left there)."""
    t = linspace32(1.0, eps, steps + 1)
    out = (np.float32(1) - t[1:] / t[:-1]).astype(np.float32)
    out[-1] = np.inf
    return out


def dream_transfer(masks: int, steps: int, eps: float = DREAM_EPS) -> list[int]:
    """Tokens Dream's loop commits at each of ``steps`` steps over ``masks`` masked positions (sums to ``masks``),
    when every step commits what it chose (no prediction of the mask id itself)."""
    out, left = [], masks
    for f in dream_fractions(steps, eps):
        k = left if np.isinf(f) else int(np.float32(left) * f)
        out.append(k)
        left -= k
    return out


def plan_schedule(gen: GenerationConfig, kept: np.ndarray | None = None, batch: int = 1) -> Schedule:
    """The commit plan for a batch whose row b keeps ``kept[b]`` answer positions (all N when None).

    Args:
        gen: generation settings; ``gen.gen_length`` is N, the untruncated window.
        kept: [B] kept lengths L* (from ``seer_trt.runtime.boundary``), or None for the padded baseline.
        batch: rows when ``kept`` is None.

    Returns:
        The Schedule; its step count is the largest row's.
    """
    n = gen.gen_length
    kept_arr = np.full(batch, n, dtype=np.int64) if kept is None else np.asarray(kept)
    row_steps = truncated_steps(gen.steps, kept_arr, n)  # validates kept
    kept_arr = kept_arr.astype(np.int64).reshape(-1)
    steps_per_block = gen.steps // gen.num_blocks
    rows_transfer: list[list[int]] = []
    rows_block_end: list[list[int]] = []
    rows_fraction: list[np.ndarray] = []
    for length, steps in zip(kept_arr.tolist(), row_steps.tolist(), strict=True):  # planning, once per request
        if gen.schedule == "dream":  # one block: the whole kept window
            rows_transfer.append(dream_transfer(length, steps))
            rows_block_end.append([length] * steps)
            rows_fraction.append(dream_fractions(steps))
            continue
        transfer: list[int] = []
        block_end: list[int] = []
        for start in range(0, length, gen.block_length):
            size = min(gen.block_length, length - start)
            block_steps = (
                steps_per_block if size == gen.block_length else math.ceil(size * steps_per_block / gen.block_length)
            )
            transfer += _spread(size, block_steps)
            block_end += [start + size] * block_steps
        rows_transfer.append(transfer)
        rows_block_end.append(block_end)
    total = int(row_steps.max()) if len(row_steps) else 0
    transfer_arr = np.zeros((len(kept_arr), total), dtype=np.int64)
    block_end_arr = np.zeros((len(kept_arr), total), dtype=np.int64)
    for b, (transfer, block_end) in enumerate(zip(rows_transfer, rows_block_end, strict=True)):
        assert len(transfer) == row_steps[b], (len(transfer), row_steps[b])
        transfer_arr[b, : len(transfer)] = transfer
        block_end_arr[b, : len(block_end)] = block_end
        block_end_arr[b, len(block_end) :] = kept_arr[b]
    fraction = None
    if gen.schedule == "dream":
        fraction = np.zeros((len(kept_arr), total), dtype=np.float32)
        for b, f in enumerate(rows_fraction):
            fraction[b, : len(f)] = f
    return Schedule(kept=kept_arr, steps=row_steps, transfer=transfer_arr, block_end=block_end_arr, fraction=fraction)
