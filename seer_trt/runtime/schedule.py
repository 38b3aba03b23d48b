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

    @property
    def num_steps(self) -> int:
        return int(self.transfer.shape[1])

    def rows(self, rows: np.ndarray | list[int]) -> Schedule:
        """The schedule of a subset of rows, its step axis cut to their longest."""
        rows = np.asarray(rows, dtype=np.int64)
        steps = self.steps[rows]
        total = int(steps.max()) if len(rows) else 0
        return Schedule(self.kept[rows], steps, self.transfer[rows, :total], self.block_end[rows, :total])


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


def dream_transfer(masks: int, steps: int, eps: float = DREAM_EPS) -> list[int]:
    """Tokens Dream's loop commits at each of ``steps`` steps over ``masks`` masked positions (sums to ``masks``)."""
    t = linspace32(1.0, eps, steps + 1)
    out, left = [], masks
    for i in range(steps):
        k = left if i == steps - 1 else int(np.float32(left) * (np.float32(1) - t[i + 1] / t[i]))
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
    for length, steps in zip(kept_arr.tolist(), row_steps.tolist(), strict=True):  # planning, once per request
        if gen.schedule == "dream":  # one block: the whole kept window
            rows_transfer.append(dream_transfer(length, steps))
            rows_block_end.append([length] * steps)
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
    return Schedule(kept=kept_arr, steps=row_steps, transfer=transfer_arr, block_end=block_end_arr)
