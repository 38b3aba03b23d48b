"""Block layout and step budget of the denoising loop, before and after Seer truncation (docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch", "Seer, exactly").

In:  generation settings (gen_length N, steps, block_length) and the kept window L* per row.
Out: a ``Schedule``: how many tokens each row commits at each step and which positions are eligible.

Truncation keeps the tokens-per-step ratio: a row kept to L* positions gets ``ceil(steps * L* / N)`` steps. How a
row's commits are laid out over those steps is the request's ``Counts`` (``seer_trt.runtime.decoding``, chosen once
with its decoding): LLaDA-V's ``Spread`` (``steps // num_blocks`` steps per block, a block's masks spread evenly
over its steps, the remainder to the earliest; the block layout recomputed on L*, a final partial block getting its
share rounded up) or Dream's ``Timesteps`` (one block; step i commits ``int(m * (1 - t[i + 1] / t[i]))`` of the m
masks still open, the last step all that are left).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from seer_trt.contracts.config import GenerationConfig
from seer_trt.contracts.errors import ConfigError
from seer_trt.runtime.decoding import COUNTS, Counts


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Per-row commit plan; rows that finish early commit nothing in later steps."""

    kept: np.ndarray  # [B] int64: answer positions each row keeps (L*, or N untruncated)
    steps: np.ndarray  # [B] int64: denoising steps each row uses
    transfer: np.ndarray  # [B, T] int64: tokens committed by row b at step t (T = max steps)
    block_end: np.ndarray  # [B, T] int64: at step t only answer positions < block_end[b, t] may commit
    # Dream's Timesteps: [B, T] float32 1 - t[i + 1] / t[i] of the row's timesteps, inf at its last step (all that
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


def plan_schedule(gen: GenerationConfig, kept: np.ndarray | None = None, batch: int = 1,
                  counts: Counts | None = None) -> Schedule:  # fmt: skip
    """The commit plan for a batch whose row b keeps ``kept[b]`` answer positions (all N when None).

    Args:
        gen: generation settings; ``gen.gen_length`` is N, the untruncated window.
        kept: [B] kept lengths L* (from ``seer_trt.runtime.boundary``), or None for the padded baseline.
        batch: rows when ``kept`` is None.
        counts: how the commits are laid out over a row's steps (``Decoding.counts``, chosen once with the request's
            decoding); None: the one ``gen.schedule`` names.

    Returns:
        The Schedule; its step count is the largest row's.
    """
    counts = COUNTS[gen.schedule] if counts is None else counts
    n = gen.gen_length
    kept_arr = np.full(batch, n, dtype=np.int64) if kept is None else np.asarray(kept)
    row_steps = truncated_steps(gen.steps, kept_arr, n)  # validates kept
    kept_arr = kept_arr.astype(np.int64).reshape(-1)
    planned = [
        counts.plan(length, steps, gen.block_length, gen.steps // gen.num_blocks)
        for length, steps in zip(kept_arr.tolist(), row_steps.tolist(), strict=True)
    ]  # once per request
    total = int(row_steps.max()) if len(row_steps) else 0
    transfer_arr = np.zeros((len(kept_arr), total), dtype=np.int64)
    block_end_arr = np.zeros((len(kept_arr), total), dtype=np.int64)
    fraction = None if all(f is None for _, _, f in planned) else np.zeros((len(kept_arr), total), dtype=np.float32)
    for b, (transfer, block_end, frac) in enumerate(planned):
        assert len(transfer) == row_steps[b], (len(transfer), row_steps[b])
        transfer_arr[b, : len(transfer)] = transfer
        block_end_arr[b, : len(block_end)] = block_end
        block_end_arr[b, len(block_end) :] = kept_arr[b]
        if frac is not None:
            fraction[b, : len(frac)] = frac
    return Schedule(kept=kept_arr, steps=row_steps, transfer=transfer_arr, block_end=block_end_arr, fraction=fraction)
