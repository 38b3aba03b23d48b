"""Stage 2, step zero: the Seer signal of every answer position while the whole window is still masked (§4).

In:  left-padded prompt embeddings [B, P, D], their validity [B, P], the window N, the calibration.
Out: ``StepZeroOut``: the profile [B, N] the boundary rule reads, and for a full-depth pass step 0's greedy
     ``x0`` / ``confidence`` [B, N], which the denoising loop reuses as its own step 0.

``step_zero`` is the early exit (layers 0..k, the paper's setting); ``step_zero_full`` runs every layer and is
needed by the ``end_token_prob`` signal or a last-layer probe (``SeerConfig.needs_full_depth``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from seer_trt.backend import Backend
from seer_trt.config import SeerConfig
from seer_trt.layout import window_layout


@dataclasses.dataclass(frozen=True)
class StepZeroOut:
    profile: np.ndarray  # [B, N] float32: the signal the calibration names (sparsity at layer k, or p_end)
    x0: np.ndarray | None  # [B, N] int64: step 0's greedy prediction (full depth only)
    confidence: np.ndarray | None  # [B, N] float32: its probability (full depth only)


def step_zero_graph(seer: SeerConfig, num_layers: int) -> str:
    """The graph a calibration needs at step zero."""
    return "step_zero_full" if seer.needs_full_depth(num_layers) else "step_zero"


def run_step_zero(backend: Backend, prefix: np.ndarray, valid: np.ndarray, n: int, seer: SeerConfig) -> StepZeroOut:
    """One step-zero pass over an all-mask window of ``n`` positions.

    Args:
        backend: holds the step-zero graph the manifest was exported with.
        prefix: [B, P, D] left-padded prompt embeddings.
        valid: [B, P] bool, False on left padding.
        n: the untruncated answer window N.
        seer: the calibration (signal, probe layer).
    """
    manifest = backend.manifest
    batch = prefix.shape[0]
    segment_ids, position_ids = window_layout(valid, np.full(batch, n), n)
    feeds = {
        "prefix_embeds": prefix,
        "gen_ids": np.full((batch, n), manifest.special_tokens.mask_id, dtype=np.int64),
        "segment_ids": segment_ids,
        "position_ids": position_ids,
    }
    graph = step_zero_graph(seer, manifest.model.num_layers)
    out = backend.run(graph, feeds)
    if graph == "step_zero":
        return StepZeroOut(out["sparsity"].copy(), None, None)
    profile = out["p_end"] if seer.signal == "end_token_prob" else out["sparsity_layers"][:, seer.probe_layer]
    return StepZeroOut(profile.copy(), out["x0"].copy(), out["confidence"].copy())
