"""Stage 2, step zero: the Seer signal of every answer position while the whole window is still masked (DESIGN "Seer, exactly").

In:  left-padded prompt embeddings [B, P, D], their validity [B, P], the window N, the calibration.
Out: ``StepZeroOut``: the profile [B, N] the boundary rule reads, and for a full-depth pass step 0's greedy
     ``x0`` / ``confidence`` (its log-probability) [B, N], which the denoising loop reuses as its own step 0.

An MLP statistic or a probe at layer k runs the early-exit ``step_zero`` graph (embeddings + layers 0..k); the
denoising loop then runs step 0 on the truncated window. The end-token signal (``SeerConfig.full_depth``, the
labelled fallback) runs the one window graph ``denoise`` over the all-mask window: its ``p_end`` is the profile
and its ``x0`` / ``confidence`` over the kept positions are step 0's, so that pass is not paid twice.
``check_seer`` says whether an export's step-zero graph computes the signal a detector reads.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from seer_trt.contracts.backend import Backend
from seer_trt.contracts.config import SeerConfig
from seer_trt.contracts.errors import ConfigError
from seer_trt.contracts.graphs import log_confidence, step_outputs
from seer_trt.contracts.manifest import Manifest
from seer_trt.runtime.kv_cache import no_cache
from seer_trt.runtime.layout import left_pad, window_layout


@dataclasses.dataclass(frozen=True)
class StepZeroOut:
    profile: np.ndarray  # [B, N] float32: the signal the calibration names (sparsity or probe at layer k, or p_end)
    x0: np.ndarray | None  # [B, N] int64: step 0's greedy prediction (full depth only)
    confidence: np.ndarray | None  # [B, N] float32: its log-probability (full depth only)


def step_zero_graph(seer: SeerConfig) -> str:
    """The graph a calibration runs at step zero: the early exit, or the full-depth window graph."""
    return "denoise" if seer.full_depth else "step_zero"


def run_step_zero(backend: Backend, prefix: np.ndarray, valid: np.ndarray, n: int, seer: SeerConfig) -> StepZeroOut:
    """One step-zero pass over an all-mask window of ``n`` positions.

    Args:
        backend: holds the graphs the manifest was exported with.
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
    graph = step_zero_graph(seer)
    spec = backend.spec(graph)
    out = backend.run(graph, {**feeds, **no_cache(spec, batch)}, step_outputs(spec))  # full depth, no cache
    if seer.full_depth:
        return StepZeroOut(out["p_end"].copy(), out["x0"].copy(), np.array(log_confidence(out), dtype=np.float32))
    profile = out["probe_score"] if seer.signal == "probe" else out["sparsity"]
    return StepZeroOut(profile.copy(), None, None)


def step_zero_rows(backend: Backend, embeds: list[np.ndarray], n: int, seer: SeerConfig, max_batch: int) -> StepZeroOut:
    """Step zero for every row of ``embeds`` (each [P_i, D]), left-padded, in calls of at most ``max_batch`` rows."""
    parts = []
    for start in range(0, len(embeds), max_batch):
        prefix, valid = left_pad(embeds[start : start + max_batch])
        parts.append(run_step_zero(backend, prefix, valid, n, seer))
    join = lambda xs: None if xs[0] is None else np.concatenate(xs)  # noqa: E731
    return StepZeroOut(*(join([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(StepZeroOut)))


def check_seer(seer: SeerConfig, manifest: Manifest) -> SeerConfig:
    """``seer`` if the export can run it: the end-token signal always (``denoise`` returns ``p_end``); an MLP
    statistic or a probe only as the export's ``step_zero`` graph computes it (the layer, statistic and probe
    are baked into the graph; the detector's settings are not).

    Raises:
        ConfigError: the signal differs from what the export's step_zero graph computes.
    """
    if seer.full_depth:
        return seer
    baked = manifest.seer
    fields = ["probe_layer", "statistic", "tau_abs"]
    if seer.signal == "probe":
        fields += ["signal", "probe_weights", "probe_bias"]
    differ = [f for f in fields if getattr(seer, f) != getattr(baked, f)]
    if "step_zero" not in manifest.graphs or differ:
        computes = f"the {baked.statistic} statistic at layer {baked.probe_layer}"
        computes += " and its probe" if baked.signal == "probe" else ""
        raise ConfigError(
            f"this export's step_zero graph computes {computes}; the detector {seer.name} differs in "
            f"{differ or ['graphs: no step_zero']}: use the end-token signal (any export), or re-export with that "
            f"calibration"
        )
    return seer
