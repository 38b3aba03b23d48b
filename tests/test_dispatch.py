"""Dispatch plans, layouts and the loop's helpers (docs/DESIGN.md "Seer, exactly" hybrid execution), without any model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from seer_trt.contracts.errors import ConfigError
from seer_trt.contracts.policies import POLICIES
from seer_trt.contracts.profiles import LengthBuckets
from seer_trt.runtime.decoding import Sampled, commit_top_k, uniform
from seer_trt.runtime.dispatch import CostModel, plan_dispatch
from seer_trt.runtime.layout import packed_layout, padded_layout

BUCKETS = LengthBuckets(batch=(1, 2, 4, 8), prompt=(16, 32, 64), answer=(8, 16, 32, 64))


def test_hybrid_rho_rule_static_packed_and_eager():
    # bucket 16: three rows of 15-16 after prompts of 15-16 (bucket 16) -> rho = 1 - 94 / 96 -> static
    # bucket 64: rows of 33 and 60 after prompts of 5 and 60 (bucket 64) -> rho = 1 - 158 / 256 = 0.38 -> packed
    # a lone row in bucket 32 -> eager straggler; a lone 3-token row (short) -> eager
    prompts = [16, 16, 15, 5, 60, 20, 10]
    kept = [16, 15, 16, 33, 60, 30, 3]
    steps = [4, 4, 4, 9, 15, 8, 1]
    plan = plan_dispatch(prompts, kept, steps, BUCKETS, "hybrid", tau_pad=0.2, short=4)
    by_rows = {g.rows: g for g in plan.groups}
    assert by_rows[(6,)].path == "eager" and (by_rows[(6,)].prompt_len, by_rows[(6,)].gen_len) == (10, 3)
    assert by_rows[(5,)].path == "eager"
    static = by_rows[(0, 1, 2)]
    assert static.path == "static" and (static.prompt_len, static.gen_len, static.batch) == (16, 16, 3)
    assert static.rho == pytest.approx(1 - 94 / 96) and static.waste == pytest.approx(1 - (32 + 31 + 31) / 96)
    packed = by_rows[(3, 4)]
    assert packed.path == "packed" and (packed.prompt_len, packed.gen_len, packed.batch) == (65, 93, 1)
    assert packed.waste == 0 and packed.rho == pytest.approx(1 - 158 / 256) and packed.steps == 15
    assert sorted(r for g in plan.groups for r in g.rows) == list(range(7))


def test_hybrid_rho_counts_prompt_padding():
    # the answers fill their bucket exactly, but one prompt of 5 is padded to 64: 59 wasted slots per step
    plan = plan_dispatch([5, 64], [16, 16], [4, 4], BUCKETS, "hybrid", tau_pad=0.2)
    (group,) = plan.groups
    assert group.rho == pytest.approx(1 - (5 + 64 + 32) / (2 * (64 + 16))) and group.path == "packed"
    plan = plan_dispatch([60, 64], [16, 16], [4, 4], BUCKETS, "hybrid", tau_pad=0.2)
    assert plan.groups[0].path == "static"  # prompts that nearly fill the bucket: static


def test_hybrid_short_rows_run_together_not_one_call_each():
    prompts, kept, steps = [20] * 6, [2, 3, 4, 4, 7, 8], [2, 3, 4, 4, 7, 8]  # all in answer bucket 8
    plan = plan_dispatch(prompts, kept, steps, BUCKETS, "hybrid", short=4)
    assert sorted(g.rows for g in plan.groups) == [(0, 1, 2, 3), (4, 5)]  # short rows apart, but batched
    assert all(g.path != "eager" for g in plan.groups)
    merged = plan_dispatch(prompts, kept, steps, BUCKETS, "hybrid", short=0)
    assert [g.rows for g in merged.groups] == [(0, 1, 2, 3, 4, 5)]
    with pytest.raises(ConfigError, match="short must be >= 0"):
        plan_dispatch(prompts, kept, steps, BUCKETS, "hybrid", short=-1)


def test_tau_pad_moves_a_group_between_static_and_packed():
    prompts, kept, steps = [5, 60], [33, 60], [9, 15]
    assert plan_dispatch(prompts, kept, steps, BUCKETS, "hybrid", tau_pad=0.0).groups[0].path == "packed"
    assert plan_dispatch(prompts, kept, steps, BUCKETS, "hybrid", tau_pad=1.0).groups[0].path == "static"


def test_naive_pad_per_request_static_and_packed_policies():
    prompts, kept, steps = [10, 20, 30], [5, 40, 12], [2, 10, 3]
    naive = plan_dispatch(prompts, kept, steps, BUCKETS, "naive_pad")
    assert [(g.rows, g.path, g.prompt_len, g.gen_len, g.steps) for g in naive.groups] == [
        ((0, 1, 2), "static", 30, 40, 10)
    ]
    per = plan_dispatch(prompts, kept, steps, BUCKETS, "per_request")
    assert [(g.rows, g.path, g.gen_len) for g in per.groups] == [((0,), "eager", 5), ((1,), "eager", 40),
                                                                  ((2,), "eager", 12)]  # fmt: skip
    static = plan_dispatch(prompts, kept, steps, BUCKETS, "static")
    assert [(g.rows, g.gen_len) for g in static.groups] == [((0,), 8), ((2,), 16), ((1,), 64)]
    assert all(g.path == "static" for g in static.groups)
    assert all(g.path == "packed" for g in plan_dispatch(prompts, kept, steps, BUCKETS, "packed").groups)
    # waste: naive pads every row to 30 + 40 for 10 steps; per request computes only what each row needs
    assert naive.slots == 10 * 3 * 70 and naive.used == 2 * 15 + 10 * 60 + 3 * 42
    assert per.waste == 0 and naive.waste > 0.5


def test_groups_never_exceed_the_largest_batch_bucket():
    plan = plan_dispatch([16] * 19, [16] * 19, [4] * 19, BUCKETS, "static")
    assert [len(g.rows) for g in plan.groups] == [8, 8, 3]


def test_cost_model_policy_follows_the_costs():
    prompts, kept, steps = [16, 16, 16], [16, 16, 14], [4, 4, 4]
    launch_bound = CostModel(c0=1.0, c1=1e-6, c2=0.0)  # a call costs the same whatever its size: one call
    plan = plan_dispatch(prompts, kept, steps, BUCKETS, "cost_model", cost=launch_bound)
    assert len(plan.groups) == 1 and plan.groups[0].path in ("static", "packed")
    attention_bound = CostModel(c0=0.0, c1=0.0, c2=1.0)  # quadratic in the sequence: never pack, split is cheapest
    plan = plan_dispatch(prompts, kept, steps, BUCKETS, "cost_model", cost=attention_bound)
    assert {g.path for g in plan.groups} != {"packed"}
    with pytest.raises(ConfigError, match="CostModel"):
        plan_dispatch(prompts, kept, steps, BUCKETS, "cost_model")
    alone = plan_dispatch([16], [16], [4], BUCKETS, "cost_model")  # one row needs no cost model: eager
    assert [(g.rows, g.path) for g in alone.groups] == [((0,), "eager")]


def test_cost_model_batches_rows_of_equal_steps_and_keeps_long_rows_apart():
    # launch-heavy calls: batching pays, but a 2-step row must not ride along for 40 steps
    prompts, kept, steps = [20, 21, 20, 22, 20, 21], [2, 2, 2, 2, 40, 40], [2, 2, 2, 2, 40, 40]
    cost = CostModel(c0=1e-3, c1=1e-6, c2=1e-9)
    plan = plan_dispatch(prompts, kept, steps, BUCKETS, "cost_model", cost=cost)
    assert sorted(g.rows for g in plan.groups) == [(0, 1, 2, 3), (4, 5)]
    assert plan.groups[0].prompt_len == 22 and plan.groups[0].gen_len == 2  # static at the group's longest row
    assert plan.predicted_s == pytest.approx(sum(cost.group_seconds(g) for g in plan.groups))
    alone = plan_dispatch(prompts, kept, steps, BUCKETS, "per_request", cost=cost).predicted_s
    gain = alone / plan.predicted_s - 1
    assert gain > 0.1
    unsure = dataclasses.replace(cost, error=gain + 0.01)  # a model this unsure of itself keeps per-request
    plan = plan_dispatch(prompts, kept, steps, BUCKETS, "cost_model", cost=unsure)
    assert [g.path for g in plan.groups] == ["eager"] * 6 and plan.predicted_s == pytest.approx(alone)


@pytest.mark.parametrize("seed", range(20))
def test_cost_model_never_predicts_slower_than_any_fixed_policy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 30))
    prompts, kept = rng.integers(4, 64, n), rng.integers(1, 64, n)
    steps = kept.copy()
    cost = CostModel(*(10.0 ** rng.uniform([-5, -7, -10], [-2, -4, -6])))
    best = plan_dispatch(prompts, kept, steps, BUCKETS, "cost_model", cost=cost)
    assert sorted(r for g in best.groups for r in g.rows) == list(range(n))
    assert all(len(g.rows) <= BUCKETS.batch[-1] for g in best.groups)
    for policy in POLICIES:
        other = plan_dispatch(prompts, kept, steps, BUCKETS, policy, cost=cost)
        assert best.predicted_s <= other.predicted_s * (1 + 1e-12), policy


def test_cost_model_fit_recovers_its_coefficients():
    true = CostModel(2e-3, 1e-6, 3e-9)
    shapes = [(b, s) for b in (1, 4) for s in (32, 96, 288)]
    fitted = CostModel.fit(shapes, [true(b, s) for b, s in shapes])
    assert fitted.c0 == pytest.approx(true.c0, rel=1e-6) and fitted.c2 == pytest.approx(true.c2, rel=1e-6)
    assert fitted.error < 1e-9
    noisy = CostModel.fit(shapes, [true(b, s) * (1.1 if k % 2 else 0.9) for k, (b, s) in enumerate(shapes)])
    assert 0.05 < noisy.error < 0.15  # +-10 % timings: about 10 % RMS error
    # times that least squares would explain with a negative launch cost: the fit stays non-negative
    shapes = [(1, 16), (1, 32), (1, 64), (1, 128)]
    fitted = CostModel.fit(shapes, [0.9e-3, 2.1e-3, 4.2e-3, 8.6e-3])
    assert min(fitted.c0, fitted.c1, fitted.c2) >= 0 and fitted(1, 64) == pytest.approx(4.2e-3, rel=0.1)


def test_bad_policy_and_tau_pad_are_refused():
    with pytest.raises(ConfigError, match="unknown dispatch policy 'fastest'"):
        plan_dispatch([1], [1], [1], BUCKETS, "fastest")
    with pytest.raises(ConfigError, match="tau_pad"):
        plan_dispatch([1], [1], [1], BUCKETS, "hybrid", tau_pad=1.5)
    assert set(POLICIES) >= {"hybrid", "naive_pad", "per_request", "cost_model"}


def test_padded_and_packed_layouts_place_the_same_cells():
    rng = np.random.default_rng(0)
    prompts = [rng.standard_normal((p, 4)).astype(np.float32) for p in (3, 5)]
    kept = np.array([4, 2])
    x = np.array([[10, 11, 12, 13], [20, 21, 99, 99]])  # state [n, L_max]; 99 lies past row 1's window
    pad = padded_layout(prompts, kept, prompt_len=6, gen_len=8)
    assert pad.prefix_embeds.shape == (2, 6, 4) and pad.gen_ids(x, 0).tolist() == [
        [10, 11, 12, 13, 0, 0, 0, 0], [20, 21, 0, 0, 0, 0, 0, 0]]  # fmt: skip
    assert pad.segment_ids.tolist() == [[0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0],
                                         [0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0]]  # fmt: skip
    pack = packed_layout(prompts, kept)
    assert pack.gen_ids(x, 0).tolist() == [[10, 11, 12, 13, 20, 21]]
    assert pack.segment_ids.tolist() == [[1, 1, 1, 2, 2, 2, 2, 2, 1, 1, 1, 1, 2, 2]]
    assert pack.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 3, 4, 5, 6, 5, 6]]
    np.testing.assert_array_equal(pack.prefix_embeds[0], np.concatenate(prompts))
    out = np.arange(6)[None] + 100  # a graph output [1, 6] back into the state
    assert pack.gather(out, (2, 4), -1).tolist() == [[100, 101, 102, 103], [104, 105, -1, -1]]


def test_commit_top_k_per_row_with_ties_to_the_earlier_position():
    conf = np.array([[0.1, 0.9, 0.9, -np.inf], [0.5, 0.2, 0.7, 0.1]])
    assert commit_top_k(conf, np.array([2, 1])).tolist() == [[False, True, True, False], [False, False, True, False]]
    assert commit_top_k(conf, np.array([0, 4]))[0].sum() == 0


def test_uniform_noise_is_a_function_of_seed_step_and_position():
    pos = np.array([[0, 1, 2], [0, 1, 2]])
    a = uniform(np.array([7, 8]), 3, pos, 5)
    assert a.shape == (2, 3, 5) and (a > 0).all() and (a < 1).all()
    b = uniform(np.array([8]), 3, pos[:1], 5)  # row 1 alone draws what it drew in a batch
    np.testing.assert_array_equal(a[1], b[0])
    assert not np.array_equal(a[0], a[1]) and not np.array_equal(a, uniform(np.array([7, 8]), 4, pos, 5))
    big = uniform(np.array([1]), 0, np.arange(2000)[None], 50).ravel()
    assert abs(big.mean() - 0.5) < 0.01 and abs(big.std() - 12**-0.5) < 0.01


def test_packed_groups_split_to_fit_the_backend_limits():
    prompts, kept, steps = [40] * 6, [30] * 6, [8] * 6
    unlimited = plan_dispatch(prompts, kept, steps, BUCKETS, "packed")
    assert [len(g.rows) for g in unlimited.groups] == [6]
    limited = plan_dispatch(prompts, kept, steps, BUCKETS, "packed", limits={"prompt": 512, "answer": 256, "seq": 150})
    assert [g.rows for g in limited.groups] == [(0, 1), (2, 3), (4, 5)]
    assert all(g.prompt_len + g.gen_len <= 150 for g in limited.groups)


def test_sampled_decoder_draws_per_row_seed_and_step():
    layout = padded_layout([np.zeros((2, 4), np.float32)] * 3, np.array([5, 5, 5]), prompt_len=2, gen_len=5)
    out = {"logits": np.zeros((3, 5, 50), dtype=np.float32)}  # flat: the noise alone decides
    pick = Sampled(1.0, "low_confidence", np.array([1, 2, 1]))(out, layout, 0, (3, 5), -1)[0]
    assert (pick[0] == pick[2]).all() and not (pick[0] == pick[1]).all()  # same seed, same draw
    later = Sampled(1.0, "low_confidence", np.array([1, 2, 1]))(out, layout, 1, (3, 5), -1)[0]
    assert not (later == pick).all()  # a new step draws anew
    x0, conf = Sampled(0.0, "random", np.array([1, 2, 1]))(out, layout, 0, (3, 5), -1)
    assert (x0 == 0).all() and (conf[0] == conf[2]).all() and not (conf[0] == conf[1]).all()
