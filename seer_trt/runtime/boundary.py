"""Answer-boundary detection at step zero (docs/DESIGN.md "Seer, exactly", the paper's SNR criterion).

In:  a step-zero profile [B, N] over the N answer positions (the probe layer's MLP statistic, a linear probe's
     probability, or the probability of an end token), and the detector's parameters.
Out: kept lengths L* [B] int64, N where no boundary is found (no truncation).

Pure numpy and vectorised over the batch: no per-row Python loop.
"""

from __future__ import annotations

import numpy as np

from seer_trt.contracts.config import SeerConfig
from seer_trt.contracts.errors import ConfigError


def _as_profile(values: np.ndarray, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 2:
        raise ConfigError(f"{name} must have shape [B, N], got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ConfigError(f"{name} holds NaN or inf; the step-zero graph or its inputs are broken")
    return arr


def find_boundaries(
    sparsity: np.ndarray,
    tau_jump: float = 0.03,
    gamma: float = 0.6,
    window: int = 3,
    direction: str = "up",
    margin: int = 1,
) -> np.ndarray:
    """Kept lengths L* from a step-zero sparsity profile by the SNR criterion.

    For i = 1 .. N - window (0-based), with W = s[i : i + window]: ``jump = min(W) - s[i-1]`` and
    ``noise = max(W) - min(W)``; the boundary is the first i with ``jump >= tau_jump`` and
    ``noise <= gamma * jump``. Position i is the predicted ``<|eot_id|>``; ``L* = min(N, i + 1 + margin)``.
    With the default margin 1 this is the paper's ``L* = i* + 1`` for its 1-based i*.

    Args:
        sparsity: [B, N] statistic per answer position at step zero.
        tau_jump: minimum jump of the window over the previous position.
        gamma: maximum spread of the window, as a fraction of the jump (the "noise" bound).
        window: number of positions that must all sit past the jump (3 in the paper).
        direction: "up" (the paper: the statistic jumps up at the end) or "down" (it falls).
        margin: positions kept after the predicted end token.

    Returns:
        int64 [B]: L* per row, N where no position satisfies the rule.
    """
    s = _as_profile(sparsity, "sparsity")
    if direction not in ("up", "down"):
        raise ConfigError(f"direction must be 'up' or 'down', got {direction!r}")
    if window < 1 or margin < 0:
        raise ConfigError(f"window must be >= 1 and margin >= 0, got window={window}, margin={margin}")
    if not tau_jump > 0 or not gamma >= 0:
        raise ConfigError(f"tau_jump must be > 0 and gamma >= 0, got tau_jump={tau_jump}, gamma={gamma}")
    if direction == "down":
        s = -s
    batch, n = s.shape
    kept = np.full(batch, n, dtype=np.int64)
    if n < window + 1:  # no i in 1 .. N - window
        return kept
    windows = np.lib.stride_tricks.sliding_window_view(s, window, axis=1)[:, 1:]  # [B, N - window, window]
    low, high = windows.min(axis=2), windows.max(axis=2)  # [B, N - window]
    jump = low - s[:, : n - window]  # window at i against s[i - 1]
    hit = (jump >= tau_jump) & (high - low <= gamma * jump)  # [B, N - window]
    found = hit.any(axis=1)
    first = hit.argmax(axis=1) + 1  # i of the first hit
    kept[found] = np.minimum(n, first[found] + 1 + margin)
    return kept


def find_end_by_probability(p_end: np.ndarray, threshold: float = 0.5, margin: int = 1) -> np.ndarray:
    """Kept lengths from a step-zero probability of being at or past the end (the ``threshold`` detector).

    The predicted end is the smallest position i after which every probability (i included) exceeds
    ``threshold``: the answer's ``<|eot_id|>`` followed by ``<|endoftext|>`` padding. ``L* = min(N, i + 1 +
    margin)``; N when even the last position stays below the threshold.

    Args:
        p_end: [B, N] probability per answer position at step zero: of ``<|eot_id|>`` or ``<|endoftext|>``
            (end_token_prob), or a probe's probability of being at or past the end.
        threshold: probability every position from the end on must exceed.
        margin: positions kept after the predicted end token.

    Returns:
        int64 [B]: L* per row.
    """
    p = _as_profile(p_end, "p_end")
    if margin < 0:
        raise ConfigError(f"margin must be >= 0, got {margin}")
    batch, n = p.shape
    suffix_min = np.minimum.accumulate(p[:, ::-1], axis=1)[:, ::-1]  # [B, N] min over positions >= i
    above = suffix_min > threshold  # monotone: False ... False True ... True
    kept = np.full(batch, n, dtype=np.int64)
    if n == 0:  # an empty window has nothing to cut (and argmax of an empty row raises)
        return kept
    found = above[:, -1]
    first = above.argmax(axis=1)
    kept[found] = np.minimum(n, first[found] + 1 + margin)
    return kept


def detect(profile: np.ndarray, seer: SeerConfig) -> np.ndarray:
    """L* [B] from the profile of the signal ``seer`` names, with ``seer``'s detector and parameters."""
    if seer.detector == "threshold":
        return find_end_by_probability(profile, seer.threshold, seer.margin)
    return find_boundaries(profile, seer.tau_jump, seer.gamma, seer.window, seer.direction, seer.margin)
