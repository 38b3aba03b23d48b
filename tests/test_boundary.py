"""Boundary rules of docs/DESIGN.md "Seer, exactly": the SNR criterion on a sparsity profile and the end-token probability rule.

Expected kept lengths are worked out by hand from the rule's text, never copied from the implementation.
"""

from __future__ import annotations

import numpy as np
import pytest

from seer_trt.contracts.config import SeerConfig
from seer_trt.contracts.errors import ConfigError
from seer_trt.runtime.boundary import detect, find_boundaries, find_end_by_probability


def one(row, **kwargs) -> int:
    """L* of a single profile row."""
    out = find_boundaries(np.asarray([row], dtype=np.float64), **kwargs)
    assert out.shape == (1,) and out.dtype == np.int64
    return int(out[0])


def one_p(row, **kwargs) -> int:
    out = find_end_by_probability(np.asarray([row], dtype=np.float64), **kwargs)
    assert out.shape == (1,) and out.dtype == np.int64
    return int(out[0])


# --- the SNR criterion --------------------------------------------------------------------------------------


def test_clean_jump_keeps_jump_position_plus_margin():
    s = [0.2] * 5 + [0.4] * 7  # N = 12, jump at i = 5 (the predicted <|eot_id|>)
    assert one(s) == 7  # positions 0..6: 0..5 plus one token of margin


@pytest.mark.parametrize(("margin", "expected"), [(0, 6), (1, 7), (2, 8)])
def test_margin(margin, expected):
    s = [0.2] * 5 + [0.4] * 7
    assert one(s, margin=margin) == expected


def test_no_jump_keeps_everything():
    rng = np.random.default_rng(0)
    s = 0.3 + 0.001 * rng.random(16)  # wiggles far below tau_jump
    assert one(s) == 16


def test_all_equal_keeps_everything():
    assert one([0.5] * 10) == 10


def test_gradual_rise_below_tau_is_not_a_boundary():
    s = 0.1 + 0.02 * np.arange(20)  # every step 0.02 < tau_jump 0.03, total rise 0.38
    assert one(s) == 20


def test_steep_ramp_is_rejected_by_the_noise_bound():
    # each step 0.05 >= tau_jump, but the window spans 0.10 > gamma * 0.05
    s = 0.1 + 0.05 * np.arange(12)
    assert one(s) == 12


def test_noisy_plateau_rejected_then_later_clean_jump_found():
    #    i: 0    1    2    3    4     5     6     7     8    9    10   11
    s = [0.1, 0.1, 0.1, 0.3, 0.15, 0.35, 0.15, 0.15, 0.5, 0.5, 0.5, 0.5]
    # i = 3: W = (0.3, 0.15, 0.35), jump 0.05 >= 0.03 but noise 0.2 > 0.6 * 0.05 -> rejected.
    # i = 4..7: jump <= 0. i = 8: W = (0.5, 0.5, 0.5), jump 0.35, noise 0 -> boundary, L* = 10.
    assert one(s) == 10
    # without the later clean jump, nothing is found
    assert one(s[:8] + [0.15] * 4) == 12


def test_jump_at_first_possible_index():
    s = [0.0] + [1.0] * 7  # i = 1 is the first index the rule looks at
    assert one(s) == 3
    assert one(s, margin=0) == 2


def test_jump_at_last_possible_index_and_clamp_to_n():
    n, window = 8, 3
    s = [0.0] * (n - window) + [1.0] * window  # i = N - window = 5
    assert one(s) == 7
    assert one(s, margin=2) == 8
    assert one(s, margin=5) == 8  # min(N, i + 1 + margin)


def test_jump_past_last_window_is_not_seen():
    s = [0.0] * 6 + [1.0] * 2  # only two positions after the jump: no full window of 3
    assert one(s) == 8
    assert one(s, window=2) == 8  # window 2 at i = 6: min(8, 6 + 2) = 8 as well
    assert one([0.0] * 5 + [1.0] * 3, window=2) == 7  # i = 5 with a window of 2


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_profile_shorter_than_window_plus_one(n):
    s = np.zeros((2, n))
    s[:, n // 2 :] = 1.0
    assert find_boundaries(s).tolist() == [n, n]


def test_shortest_profile_with_one_candidate():
    assert one([0.0, 1.0, 1.0, 1.0]) == 3  # N = window + 1: only i = 1
    assert one([1.0, 1.0, 1.0, 1.0]) == 4


def test_first_hit_wins():
    s = [0.0] * 3 + [0.1] * 3 + [0.5] * 4  # jumps at i = 3 (0.1) and i = 6 (0.4)
    assert one(s) == 5


def test_thresholds_are_inclusive():
    # binary-exact values, so the comparisons are at equality exactly
    assert one([0.0, 0.25, 0.25, 0.25, 0.25], tau_jump=0.25) == 3  # jump == tau_jump is a hit
    assert one([0.0, 0.25, 0.25, 0.25, 0.25], tau_jump=0.2500001) == 5
    w = [0.0, 0.5, 0.75, 0.5, 0.5]  # i = 1: jump 0.5, noise 0.25 == 0.5 * 0.5
    assert one(w, gamma=0.5) == 3
    assert one(w, gamma=0.49) == 5


def test_direction_down():
    s = [0.8] * 4 + [0.5] * 4
    assert one(s) == 8  # the statistic falls: no upward jump
    assert one(s, direction="down") == 6  # i = 4
    assert one([1 - v for v in s], direction="up") == 6  # mirror image


def test_window_parameter():
    s = [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert one(s, window=2) == 4  # i = 2: W = (1, 1)
    assert one(s, window=3) == 8  # W = (1, 1, 0): jump 0 -> no hit anywhere


def test_rows_are_independent_and_vectorised():
    rows = [
        [0.2] * 5 + [0.4] * 7,
        [0.5] * 12,
        [0.0] * 3 + [0.1] * 3 + [0.5] * 6,
        [0.0] + [1.0] * 11,
        [0.8] * 6 + [0.1] * 6,
        list(0.1 + 0.02 * np.arange(12)),
    ]
    batch = find_boundaries(np.asarray(rows))
    assert batch.shape == (len(rows),) and batch.dtype == np.int64
    assert batch.tolist() == [one(r) for r in rows] == [7, 12, 5, 3, 12, 12]


def test_input_is_not_modified_and_lists_are_accepted():
    s = np.asarray([[0.8] * 4 + [0.5] * 4])
    before = s.copy()
    find_boundaries(s, direction="down")
    np.testing.assert_array_equal(s, before)
    assert find_boundaries([[0.0, 1.0, 1.0, 1.0]]).tolist() == [3]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_raises(bad):
    s = np.zeros((2, 8))
    s[1, 3] = bad
    with pytest.raises(ConfigError):
        find_boundaries(s)
    with pytest.raises(ConfigError):
        find_end_by_probability(s)


@pytest.mark.parametrize("shape", [(8,), (1, 2, 8), ()])
def test_wrong_ndim_raises(shape):
    with pytest.raises(ConfigError):
        find_boundaries(np.zeros(shape))
    with pytest.raises(ConfigError):
        find_end_by_probability(np.zeros(shape))


def test_bad_parameters_raise():
    s = np.zeros((1, 8))
    with pytest.raises(ConfigError):
        find_boundaries(s, direction="sideways")
    with pytest.raises(ConfigError):
        find_boundaries(s, window=0)
    with pytest.raises(ConfigError):
        find_boundaries(s, margin=-1)
    with pytest.raises(ConfigError):
        find_end_by_probability(s, margin=-1)


# --- randomized comparison against a slow reference written from the spec ------------------------------------


def reference_snr(row, tau_jump=0.03, gamma=0.6, window=3, direction="up", margin=1) -> int:
    """docs/DESIGN.md "Seer, exactly" read literally, one row, plain Python floats."""
    s = [float(v) for v in row]
    if direction == "down":
        s = [-v for v in s]
    n = len(s)
    for i in range(1, n - window + 1):
        w = s[i : i + window]
        jump = min(w) - s[i - 1]
        noise = max(w) - min(w)
        if jump >= tau_jump and noise <= gamma * jump:
            return min(n, i + 1 + margin)
    return n


def reference_end(row, threshold=0.5, margin=1) -> int:
    p = [float(v) for v in row]
    n = len(p)
    for i in range(n):
        if all(v > threshold for v in p[i:]):
            return min(n, i + 1 + margin)
    return n


def random_profiles(rng: np.random.Generator, rows: int, n: int) -> np.ndarray:
    """Steps, ramps, spikes and noise; half the rows on a coarse binary grid so ties happen exactly."""
    out = np.empty((rows, n))
    for b in range(rows):
        base = rng.uniform(0, 0.5)
        s = base + rng.normal(0, rng.choice([0.0, 0.005, 0.02, 0.08]), n)
        if rng.random() < 0.7:  # one or two steps
            for _ in range(rng.integers(1, 3)):
                s[rng.integers(0, n) :] += rng.choice([-1, 1]) * rng.uniform(0, 0.3)
        if rng.random() < 0.3:  # a ramp
            s += rng.uniform(0, 0.06) * np.arange(n)
        if b % 2:
            s = np.round(s * 16) / 16  # multiples of 1/16: jumps and noise land exactly on thresholds
        out[b] = s
    return out


@pytest.mark.parametrize("n", [1, 4, 5, 16, 33])
def test_find_boundaries_matches_reference_randomized(n):
    rng = np.random.default_rng(n)
    s = random_profiles(rng, 300, n)
    for tau_jump, gamma, window, direction, margin in [
        (0.03, 0.6, 3, "up", 1),
        (0.0625, 0.5, 3, "down", 0),
        (0.125, 1.0, 2, "up", 2),
        (0.01, 0.0, 1, "down", 3),
        (0.2, 0.25, 4, "up", 1),
    ]:
        kw = dict(tau_jump=tau_jump, gamma=gamma, window=window, direction=direction, margin=margin)
        got = find_boundaries(s, **kw)
        want = [reference_snr(row, **kw) for row in s]
        assert got.tolist() == want, kw
    # the generator must produce both outcomes, or the comparison proves little
    want = [reference_snr(row) for row in s]
    if n >= 5:
        assert min(want) < n and max(want) == n


@pytest.mark.parametrize("n", [1, 2, 7, 32])
def test_find_end_by_probability_matches_reference_randomized(n):
    rng = np.random.default_rng(100 + n)
    rows = []
    for b in range(300):
        p = rng.uniform(0, 1, n) * rng.uniform(0.2, 1)
        cut = rng.integers(0, n + 1)
        p[cut:] = rng.uniform(0.4, 1.0, n - cut)  # mostly above, sometimes dips below
        if b % 3 == 0:
            p = np.round(p * 8) / 8  # exact ties with the threshold 0.5
        rows.append(p)
    p = np.asarray(rows)
    for threshold, margin in [(0.5, 1), (0.75, 0), (0.25, 2)]:
        got = find_end_by_probability(p, threshold, margin)
        assert got.tolist() == [reference_end(row, threshold, margin) for row in p]


# --- the end-token probability rule -------------------------------------------------------------------------


def test_end_probability_clean_step():
    p = [0.1, 0.2, 0.1, 0.9, 0.95, 0.99]  # end token at i = 3
    assert one_p(p) == 5
    assert one_p(p, margin=0) == 4
    assert one_p(p, margin=4) == 6  # clamped to N


def test_end_probability_dip_moves_the_end_later():
    p = [0.1, 0.9, 0.9, 0.3, 0.9, 0.9, 0.9, 0.9]  # above from 1, dips at 3, above from 4 on
    assert one_p(p) == 6


def test_end_probability_never_above():
    assert one_p([0.1] * 6) == 6
    assert one_p([0.9, 0.9, 0.9, 0.1]) == 4  # the last position is not above: no end


def test_end_probability_threshold_is_strict():
    assert one_p([0.1, 0.5, 0.5, 0.5], threshold=0.5) == 4  # equal is not above
    assert one_p([0.1, 0.5, 0.625, 0.625], threshold=0.5) == 4  # i = 2
    assert one_p([0.1, 0.5, 0.625, 0.625], threshold=0.4) == 3  # i = 1


def test_end_probability_everything_above():
    assert one_p([0.9] * 6) == 2  # end at i = 0: keep it and the margin
    assert one_p([0.9]) == 1


def test_end_probability_rows():
    rows = [[0.1, 0.2, 0.1, 0.9, 0.95, 0.99], [0.1] * 6, [0.9] * 6, [0.6, 0.1, 0.6, 0.6, 0.2, 0.7]]
    got = find_end_by_probability(np.asarray(rows))
    assert got.tolist() == [one_p(r) for r in rows] == [5, 6, 2, 6]


def test_end_probability_empty_window():
    assert find_end_by_probability(np.zeros((2, 0))).tolist() == [0, 0]


# --- detect ---------------------------------------------------------------------------------------------------


def test_detect_dispatches_by_detector():
    # SNR: jump at i = 2 (0.8, noise 0) -> 4; probability > 0.95 only from i = 5 on -> 7
    profile = np.asarray([[0.1, 0.1, 0.9, 0.9, 0.9, 0.96, 0.96, 0.96]])
    assert detect(profile, SeerConfig()).tolist() == [4]
    assert detect(profile, SeerConfig(signal="end_token_prob", threshold=0.95)).tolist() == [7]
    assert detect(profile, SeerConfig(signal="end_token_prob", threshold=0.5)).tolist() == [4]
    probe = SeerConfig(signal="probe", probe_weights=(1.0,))  # a probe's probability: threshold by default
    assert detect(profile, probe.replace(threshold=0.95)).tolist() == [7]
    assert detect(profile, probe.replace(detector="jump", tau_jump=0.5)).tolist() == [4]


def test_detect_uses_every_parameter_of_the_config():
    s = np.asarray([[0.8] * 4 + [0.5] * 8])  # falls by 0.3 at i = 4
    assert detect(s, SeerConfig()).tolist() == [12]
    assert detect(s, SeerConfig(direction="down")).tolist() == [6]
    assert detect(s, SeerConfig(direction="down", margin=3)).tolist() == [8]
    assert detect(s, SeerConfig(direction="down", tau_jump=0.31)).tolist() == [12]
    noisy = np.asarray([[0.0, 0.0, 0.5, 0.7, 0.5, 0.5, 0.5, 0.5]])  # i = 2: jump 0.5, noise 0.2
    assert detect(noisy, SeerConfig(gamma=0.5)).tolist() == [4]
    assert detect(noisy, SeerConfig(gamma=0.3)).tolist() == [8]
    assert detect(noisy, SeerConfig(window=1)).tolist() == [4]
    p = np.asarray([[0.1, 0.6, 0.6, 0.6]])
    assert detect(p, SeerConfig(signal="end_token_prob", margin=0)).tolist() == [2]
