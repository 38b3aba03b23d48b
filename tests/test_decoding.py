"""Decoding strategies of the one denoising loop (docs/DESIGN.md "Decoding strategies"): the commit rules, their
spelling, the reference sampler's rules equal to the runtime's, dynamic blocks, re-forming a group from its live
rows, and a log-confidence that ranks like a float64 softmax."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from test_manifest import make_manifest

from export.onnx.modules import greedy
from export.reference.sampler import commit_rule
from seer_trt.backends.base import HostMemory, host_view
from seer_trt.contracts.backend import DeviceArray, Transfers
from seer_trt.contracts.config import GenerationConfig, SpecialTokens, canonical_decoding, parse_decoding
from seer_trt.contracts.errors import ConfigError, InputError
from seer_trt.contracts.policies import CacheConfig
from seer_trt.contracts.profiles import LengthBuckets
from seer_trt.runtime.decoding import Rule, choose, factor_bounds
from seer_trt.runtime.denoise import Loop, LoopSettings, current_block_end, denoise, make_rows
from seer_trt.runtime.dispatch import CostModel
from seer_trt.runtime.kv_cache import KVPool
from seer_trt.runtime.request import Request
from seer_trt.runtime.schedule import plan_schedule

LOG = np.log


def test_decoding_spellings_are_checked_and_made_canonical():
    assert parse_decoding("fixed") == ("fixed", None)
    assert parse_decoding("threshold:0.9") == ("threshold", 0.9)
    assert canonical_decoding("factor:1.0") == "factor:1" == GenerationConfig(decoding=" factor:1 ").decoding
    assert GenerationConfig(decoding="threshold:0.90") == GenerationConfig(decoding="threshold:0.9")  # one group
    for bad in ("fast", "threshold", "threshold:1.5", "threshold:0", "factor:-1", "factor:x", "fixed:2", 3, None):
        with pytest.raises(ConfigError, match="fixed"):
            parse_decoding(bad)
    with pytest.raises(InputError, match="threshold:TAU"):
        Request("count to 3 .", decoding="greedy")
    assert Request("count to 3 .", decoding="factor:2").decoding == "factor:2"
    assert GenerationConfig.from_dict({"gen_length": 64, "steps": 64, "block_length": 64}).decoding == "fixed"


def conf(rows: list[list[float]]) -> np.ndarray:
    """Probabilities -> the loop's float64 log-confidences (0 -> -inf: not eligible)."""
    with np.errstate(divide="ignore"):
        return LOG(np.array(rows, dtype=np.float64))


def test_threshold_commits_every_confident_position_and_at_least_the_best():
    c = conf([[0.95, 0.5, 0.91, 0.0], [0.3, 0.6, 0.6, 0.2]])
    eligible = np.isfinite(c)
    got = Rule.of("threshold", 0.9).commit(c, eligible, np.ones(2, dtype=np.int64))
    assert got.tolist() == [[True, False, True, False], [False, True, False, False]]  # tie: the earlier one


def test_factor_commits_the_run_that_meets_its_bounds():
    # f = 1: rank 1 always, rank 2 needs >= 1 - 1/3, rank 3 >= 1 - 1/4, rank 4 >= 0.8
    bounds = np.exp(factor_bounds(4, 1.0))
    assert bounds[0] == 0 and np.allclose(bounds[1:], [2 / 3, 3 / 4, 4 / 5])
    c = conf([[0.7, 0.99, 0.76, 0.5], [0.99, 0.99, 0.99, 0.99], [0.1, 0.0, 0.0, 0.0], [0.7, 0.6, 0.99, 0.98]])
    eligible = np.isfinite(c)
    got = Rule.of("factor", 1.0).commit(c, eligible, np.ones(4, dtype=np.int64))
    assert got.tolist() == [
        [False, True, True, False],  # 0.99 (rank 1), 0.76 >= 2/3 (rank 2), then 0.7 < 3/4 stops the run
        [True, True, True, True],  # 0.99 meets every bound
        [True, False, False, False],  # the only eligible one commits however unsure
        [False, False, True, True],  # 0.99, 0.98 >= 2/3, then 0.7 < 3/4
    ]
    # a large factor lowers every bound to nothing: all eligible commit (1 - f / (n + 1) <= 0)
    assert Rule.of("factor", 10.0).commit(c, eligible, np.ones(4, dtype=np.int64)).sum() == eligible.sum()


def test_fixed_is_the_scheduled_top_k():
    c = conf([[0.2, 0.9, 0.5, 0.9]])
    assert Rule.of("fixed").commit(c, np.isfinite(c), np.array([2])).tolist() == [[False, True, False, True]]


@pytest.mark.parametrize("rule", [("threshold", 0.8), ("factor", 1.0), ("factor", 3.0), ("fixed", None)])
def test_the_reference_sampler_commits_what_the_runtime_commits(rule):
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = np.where(rng.random((6, 20)) < 0.3, 0.0, 1 - rng.random((6, 20)) ** 3)  # many near 1, some ineligible
        c = conf(p.tolist())
        eligible = np.isfinite(c)
        k = rng.integers(1, 5, 6)
        want = Rule.of(*rule).commit(c, eligible, k)
        got = commit_rule(rule, torch.from_numpy(c), torch.from_numpy(eligible), torch.from_numpy(k)).numpy()
        assert np.array_equal(got, want & eligible)


def test_blocks_advance_as_they_fill():
    open_ = np.zeros((3, 12), dtype=bool)
    open_[0, 2:] = True  # first open position 2: block 0
    open_[1, 5:9] = True  # 5: block 1
    open_[2, 11] = True  # 11: block 2, cut to the kept window 11 + 1
    assert current_block_end(open_, np.array([12, 12, 12]), 4).tolist() == [4, 8, 12]
    assert current_block_end(open_, np.array([12, 7, 12]), 4).tolist() == [4, 7, 12]


# ---- the loop on a fake backend ---------------------------------------------------------------------------------

MANIFEST = make_manifest("float32")
MASK = 0


def fake_model(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per position, a prediction and a confidence that depend on the row's own inputs only (its prompt length and
    answer position, and how much of its answer is committed), as a real model's do under segment ids, whatever
    layout the row sits in."""
    g = feeds["gen_ids"].shape[1]
    seg, pos = feeds["segment_ids"][:, -g:], feeds["position_ids"][:, -g:]
    prompt_seg = feeds["segment_ids"][:, :-g]
    key = np.zeros(seg.shape)  # the row's prompt length, at each of its answer positions
    committed = np.zeros(seg.shape)  # the share of the row's answer committed
    for b in range(seg.shape[0]):
        for s in np.unique(seg[b][seg[b] > 0]):
            mine = seg[b] == s
            key[b, mine] = (prompt_seg[b] == s).sum()
            committed[b, mine] = (feeds["gen_ids"][b, mine] != MASK).mean()
    x0 = 1 + (pos * 3 + key) % 40
    p = 0.5 + 0.49 * np.abs(np.sin(pos * 1.7 + key * 0.3)) * (0.6 + 0.4 * committed)
    out = {"x0": x0.astype(np.int64), "log_confidence": np.log(p).astype(np.float32)}
    b, pl = feeds["prefix_embeds"].shape[:2]
    for name in (n for n in feeds if n.startswith("past_key_values.")):
        _, _, heads, _, head_dim = feeds[name].shape
        out[name.replace("past_key_values", "present")] = np.full((b, heads, pl, head_dim), pl, dtype=np.float32)
    return out


class Counting:
    """A backend over ``fake_model`` that records the batch of every call, in host memory."""

    def __init__(self) -> None:
        self.manifest = MANIFEST
        self.transfers = Transfers()
        self.memory = HostMemory(self.transfers)
        self.batches: list[int] = []
        self.fetched: list = []  # the outputs each call asked back (None: all)
        self.into: list = []  # the outputs each call wrote into device arrays

    def spec(self, graph):
        return MANIFEST.graph(graph).spec

    def max_shape(self, graph):
        return None

    def run(self, graph, feeds, outputs=None, into=None):
        feeds = {k: host_view(v) if isinstance(v, DeviceArray) else v for k, v in feeds.items()}
        self.batches.append(feeds["gen_ids"].shape[0])
        self.fetched.append(outputs)
        self.into.append(sorted(into or ()))
        out = fake_model(feeds)
        for name, target in (into or {}).items():
            np.copyto(host_view(target), out[name])
        return out if outputs is None else {k: v for k, v in out.items() if k in outputs}  # only what was asked


def prompts(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((p, MANIFEST.model.hidden_size)).astype(np.float32) for p in lengths]


def loop_settings(backend, policy, cost=None):
    pool = KVPool(backend.memory, backend.spec("denoise"), 2**30)
    return LoopSettings(backend, MASK, BUCKETS, policy, cost=cost, pool=pool)


BUCKETS = LengthBuckets(batch=(1, 2, 4), prompt=(32,), answer=(16,))


@pytest.mark.parametrize("decoding", ["fixed", "threshold:0.7", "factor:1"])
@pytest.mark.parametrize("cache", ["none", "reuse"])
def test_a_row_denoises_alike_alone_and_in_every_split_of_its_steps(decoding, cache):
    """The same tokens and steps for each row alone and for the four rows together under every split of a step's
    rows into calls (padded at the buckets, packed, one a call, in order), as they finish at different steps."""
    kept = np.array([16, 3, 9, 2])
    rows = prompts((12, 30, 7, 20))
    gen = GenerationConfig(gen_length=16, steps=16, block_length=8, decoding=decoding)
    decoding_ = dataclasses.replace(choose(gen, MANIFEST), rule=Rule.parse(decoding))
    policy = CacheConfig(cache, 4)

    def run(indices, backend, dispatch):
        schedule = plan_schedule(gen, kept[indices])
        made = make_rows([rows[i] for i in indices], schedule, decoding_, MASK, True, cache=policy,
                         block_length=gen.block_length)  # fmt: skip
        return denoise(loop_settings(backend, dispatch), made)

    together = {p: run([0, 1, 2, 3], Counting(), p) for p in ("static", "packed", "per_request", "naive_pad")}
    alone = [run([i], Counting(), "per_request") for i in range(4)]
    for i in range(4):
        for got in together.values():
            assert got.tokens[i, : kept[i]].tolist() == alone[i].tokens[0, : kept[i]].tolist()
            assert got.steps[i] == alone[i].steps[0]
    padded = together["static"]
    assert (padded.tokens[np.arange(16)[None] < kept[:, None]] != MASK).all()  # every kept position committed
    if decoding != "fixed":
        assert padded.steps.max() < kept.max()  # several tokens a step somewhere


def test_each_row_steps_in_one_call_a_step_and_no_k_v_comes_back_to_the_host():
    """Every live row sits in exactly one call of a step, finished rows in none; a refresh writes its K/V into the
    loop's device buffers (``into``), never back to the host; under cache none nothing is written at all."""
    kept = np.array([16, 3, 9, 2])
    rows = prompts((12, 30, 7, 20))
    gen = GenerationConfig(gen_length=16, steps=16, block_length=16, decoding="fixed")
    for cache in ("none", "reuse"):
        backend = Counting()
        made = make_rows(rows, plan_schedule(gen, kept), choose(gen, MANIFEST), MASK, True,
                         cache=CacheConfig(cache, 4))  # fmt: skip
        loop = Loop(loop_settings(backend, "naive_pad"))
        assert loop.add(made) == 4
        live = []
        while True:
            live.append(len(loop.live()))
            before = len(backend.batches)
            if not loop.step():
                break
            assert sum(backend.batches[before:]) == live[-1]  # naive_pad: each live row once, no padding rows
        loop.close()
        assert live[0] == 4 and live[-1] == 0 and all(a >= b for a, b in zip(live, live[1:], strict=False))
        assert all(f is None or not any(n.startswith("present.") for n in f) for f in backend.fetched)
        wrote = [bool(i) for i in backend.into]
        if cache == "none":
            assert not any(wrote)
        else:  # the refreshes wrote their K/V on the device; the cached steps between read it there
            assert any(wrote) and not all(wrote)
        assert backend.transfers.to_host["kv"] == 0 and backend.transfers.to_device["kv"] == 0


def test_the_cost_model_chooses_how_a_steps_rows_are_split():
    """A call that costs the same whatever it holds: one call a step for all live rows. A cost per slot and no
    fixed cost: one row a call (padding would only add slots)."""
    kept = np.array([16, 2, 2, 2])
    rows = prompts((12, 30, 7, 20))
    gen = GenerationConfig(gen_length=16, steps=16, block_length=16)
    free = CostModel(1e-3, 0.0, 0.0)
    per_slot = CostModel(0.0, 1e-6, 0.0, error=0.1)
    for cost, want in ((free, {4, 1}), (per_slot, {1})):
        backend = Counting()
        made = make_rows(rows, plan_schedule(gen, kept), choose(gen, MANIFEST), MASK, True)
        denoise(loop_settings(backend, "cost_model", cost), made)
        assert set(backend.batches) == want


# ---- the graph's log-confidence -----------------------------------------------------------------------------------


def test_log_confidence_ranks_like_a_float64_softmax_near_one():
    """Two positions whose fp32 probabilities tie at 0.99993229 are ordered by the graph's log-confidence as a
    float64 softmax orders them, and its value is within fp32's relative resolution of the float64 one."""
    special = SpecialTokens(mask_id=0, endoftext_id=1, startoftext_id=2, eot_id=3, start_header_id=4, end_header_id=5)
    rng = np.random.default_rng(3)
    vocab = 64
    logits = rng.standard_normal((1, 400, vocab)).astype(np.float32)
    logits[..., 10] += np.linspace(15.0, 17.0, 400, dtype=np.float32)[None]  # top-1 p within 1e-5 of 1
    gen_ids = torch.zeros((1, 400), dtype=torch.long)  # every position masked
    x0, log_conf, _ = greedy(torch.from_numpy(logits), gen_ids, special)
    sup = logits.astype(np.float64)
    sup[..., list(special.suppressed_ids)] = -np.inf
    want = sup[..., 10] - np.log(np.exp(sup).sum(-1))  # float64 log softmax of the top id
    got = log_conf.numpy().astype(np.float64)
    assert (x0.numpy() == 10).all()
    assert np.max(np.abs(got - want) / np.abs(want)) < 1e-5  # the complement keeps its precision
    p32 = np.exp(got.astype(np.float32))  # what the probability itself resolves in fp32
    assert len(np.unique(p32)) < len(np.unique(got)) == 400  # ties the fp32 probability cannot break
    assert np.array_equal(np.argsort(-got, kind="stable"), np.argsort(-want, kind="stable"))


def test_a_2_1_exports_confidence_is_read_as_its_log():
    from seer_trt.contracts.graphs import log_confidence

    assert np.allclose(log_confidence({"confidence": np.array([1.0, 0.5])}), [0.0, np.log(0.5)])
    assert log_confidence({"log_confidence": np.array([-0.1])}).tolist() == [-0.1]
    assert log_confidence({"confidence": np.array([0.0])})[0] == -np.inf


def test_top_p_draws_only_from_the_nucleus():
    """A nucleus of mass 1e-9 holds the most probable id alone, so sampling at any temperature is the argmax; top_p 1
    draws as without it; the confidence is the full softmax's either way."""
    from seer_trt.runtime.decoding import Sampled, nucleus
    from seer_trt.runtime.layout import padded_layout

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 11)).astype(np.float32) * 3
    layout = padded_layout([np.zeros((3, 4), np.float32)] * 2, np.array([5, 5]), 3, 5)
    out = {"logits": logits}
    seeds = np.array([1, 2])
    tight = Sampled(1.5, "low_confidence", seeds, top_p=np.array([1e-9, 1e-9]))
    x0, conf = tight(out, layout, 3, (2, 5), 99)
    assert (x0 == logits.argmax(-1)).all()
    free = Sampled(1.5, "low_confidence", seeds)
    x1, conf1 = free(out, layout, 3, (2, 5), 99)
    x2, conf2 = Sampled(1.5, "low_confidence", seeds, top_p=np.array([1.0, 1.0]))(out, layout, 3, (2, 5), 99)
    assert (x1 == x2).all() and np.array_equal(conf1, conf2) and (x1 != x0).any()  # sampling did sample
    assert np.allclose(conf, np.take_along_axis(logits - np.log(np.exp(logits).sum(-1, keepdims=True)),
                                                x0[..., None], -1)[..., 0])  # fmt: skip
    keep = nucleus(np.log(np.array([[[0.5, 0.3, 0.2]]])), np.array([0.6]))
    assert keep.tolist() == [[[True, True, False]]]  # 0.5 < 0.6: the next id joins; 0.8 >= 0.6: none after it


def test_top_k_sampling_draws_among_the_top_ids_with_the_full_softmax_confidence():
    """TopK (the default export's sampler): every draw is one of the graph's top ids, seeded draws repeat, a nucleus
    of mass 1e-9 is the argmax, and the confidence of a drawn id is its log-probability under the whole vocabulary
    (from the graph's log_confidence of the argmax and the top logits)."""
    from seer_trt.runtime.decoding import TopK
    from seer_trt.runtime.layout import padded_layout

    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 5, 40)) * 2
    k = 8
    ids = np.argsort(-logits, -1, kind="stable")[..., :k]
    top = np.take_along_axis(logits, ids, -1)
    lse = np.log(np.exp(logits).sum(-1))
    out = {
        "top_logits": top.astype(np.float32),
        "top_ids": ids,
        "log_confidence": (top[..., 0] - lse).astype(np.float32),
    }
    layout = padded_layout([np.zeros((3, 4), np.float32)] * 2, np.array([5, 5]), 3, 5)
    seeds = np.array([3, 4])
    x0, conf = TopK(1.0, "low_confidence", seeds)(out, layout, 2, (2, 5), 99)
    again, _ = TopK(1.0, "low_confidence", seeds)(out, layout, 2, (2, 5), 99)
    assert (x0 == again).all() and all(x0[i, j] in ids[i, j] for i in range(2) for j in range(5))
    assert (x0 != ids[..., 0]).any()  # it samples
    want = np.take_along_axis(logits, x0[..., None], -1)[..., 0] - lse
    assert np.allclose(conf, want, atol=1e-5)
    tight, _ = TopK(1.0, "low_confidence", seeds, top_p=np.array([1e-9, 1e-9]))(out, layout, 2, (2, 5), 99)
    assert (tight == ids[..., 0]).all()
