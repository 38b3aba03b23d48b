"""seer-calibrate's choice (docs/DESIGN.md "Seer, exactly", "Step-zero probes"): probes fitted per layer, the shallowest layer that meets
the bar, and an honest fallback when none does. Synthetic step-zero profiles with a known answer end, no model."""

from __future__ import annotations

import numpy as np
import pytest

from seer_export.calibrate import Profiles, calibrate, evaluate, fit_probe, probe_probability
from seer_trt.contracts.config import SeerConfig

LAYERS, DIM = 3, 6


def profiles(seed: int, n: int, window: int, clean_from: int | None) -> Profiles:
    """n samples whose answers end at random positions; the residual stream carries the end (feature 0 = +-6, noise 1)
    from layer ``clean_from`` on (None: nowhere); the MLP statistics and p_end are noise."""
    rng = np.random.default_rng(seed)
    end = rng.integers(1, window - 4, n)
    past = np.arange(window)[None] >= end[:, None]  # [n, N]
    residual = rng.normal(size=(n, LAYERS, window, DIM)).astype(np.float32)
    if clean_from is not None:
        residual[:, clean_from:, :, 0] += np.where(past, 6.0, -6.0)[:, None]
    noise = rng.uniform(0.3, 0.7, (n, LAYERS, window)).astype(np.float32)
    return Profiles(noise, noise.copy(), residual, rng.uniform(0, 1, (n, window)).astype(np.float32), end)


def splits(clean_from: int | None, windows=(24, 40)):
    return [{w: profiles(seed * 100 + w, 120, w, clean_from) for w in windows} for seed in (1, 2, 3)]


def test_a_fitted_probe_separates_the_end_and_applies_as_the_graph_does():
    fit, _, report = splits(clean_from=1)
    weights, bias = fit_probe(fit, layer=1)
    seer = SeerConfig(signal="probe", probe_layer=1, probe_weights=weights, probe_bias=bias, threshold=0.5)
    p = probe_probability(report[24].residual[:, 1], seer)  # [n, N]
    past = np.arange(24)[None] >= report[24].end[:, None]
    assert p[past].min() > 0.5 > p[~past].max()
    quality = evaluate(report[24], seer, 24)
    assert quality["premature_cut_rate"] == 0.0 and quality["exact"] == 1.0
    assert quality["mean_kept_over_true_plus_1"] == pytest.approx(1.0)


def test_the_choice_is_the_shallowest_layer_that_meets_the_bar():
    fit, choose, _ = splits(clean_from=1)
    rows, chosen, ok = calibrate(fit, choose, LAYERS, 1e-3, max_premature=0.01, max_kept=1.25)
    assert ok and chosen.family == "probe" and chosen.layer == 1  # layer 2 is as clean, but deeper
    assert chosen.seer.signal == "probe" and len(chosen.seer.probe_weights) == DIM
    assert [r.meets for r in rows if r.family == "probe"] == [False, True, True]
    assert len(rows) == 3 * LAYERS + 1 and rows[-1].family == "end_token_prob" and rows[-1].layer is None


def test_no_layer_meeting_the_bar_is_said_and_the_best_honest_choice_returned():
    fit, choose, _ = splits(clean_from=None)
    rows, chosen, ok = calibrate(fit, choose, LAYERS, 1e-3, max_premature=0.01, max_kept=1.25)
    assert not ok and not any(r.meets for r in rows)
    assert chosen in rows
