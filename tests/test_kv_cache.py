"""The prompt K/V cache (docs/DESIGN.md "Prompt K/V cache"): the ResilPhase forecast weights, the refresh schedule, the window
graph's cached call against its uncached one, and the cache policies through the pipeline on the fixture export."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from cli_capture import cli

from seer_trt.backends.base import HostMemory, host_view
from seer_trt.contracts.backend import Transfers
from seer_trt.contracts.errors import ConfigError, InputError
from seer_trt.contracts.graphs import GraphSpec, graph_specs, past_names, present_names
from seer_trt.contracts.policies import DEFAULT_CACHE, EXACT, CacheConfig
from seer_trt.contracts.profiles import LengthBuckets
from seer_trt.eval.tasks import make_samples
from seer_trt.runtime.kv_cache import (
    CallBuffers,
    KVPool,
    RowCache,
    cache_bytes,
    forecast_weights,
    lagrange_weights,
    no_cache,
    phase,
)
from seer_trt.runtime.layout import padded_layout
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request

DIMS = {"hidden": 16, "vocab": 11, "layers": 2, "kv_heads": 2, "head_dim": 8, "image_size": 8, "tile_tokens": 4}
SAMPLES = make_samples(23, 12)  # held-out: the trainer draws from seeds >= 1_000_000


def test_lagrange_weights_sum_to_one_and_reproduce_polynomials_of_their_order():
    rng = np.random.default_rng(0)
    for m in (1, 2, 3):
        nodes = np.sort(rng.uniform(-1, 1, m))
        for x in (-1.3, 0.1, 0.97, 2.0):
            w = lagrange_weights(nodes, x)
            assert w.sum() == pytest.approx(1.0, abs=1e-12)
            coef = rng.standard_normal(m)  # a polynomial of degree m - 1 is forecast exactly
            assert w @ np.polyval(coef, nodes) == pytest.approx(np.polyval(coef, x), abs=1e-9)
    assert lagrange_weights(np.array([0.0, 0.5]), 0.5).tolist() == [0.0, 1.0]  # at a node: that node only


def test_phase_map_is_bounded_so_an_order_one_forecast_never_weighs_the_newest_snapshot_above_one_and_a_half():
    nodes, x = phase(np.array([0, 4]), 4, 0.55)
    assert nodes.tolist() == pytest.approx([-np.tanh(0.55), np.tanh(0.55)]) and x == pytest.approx(np.tanh(0.55))
    newest = [forecast_weights(np.array([0, 4]), t, 0.55)[1] for t in range(5, 1000)]
    assert all(1.0 < w <= 1.5 for w in newest) and newest == sorted(newest)  # grows with t, bounded by the tanh
    assert forecast_weights(np.array([3]), 9, 0.55).tolist() == [1.0]  # one snapshot: reuse
    plain = lagrange_weights(np.array([0.0, 4.0]), 100.0)[1]  # without the map: linear extrapolation runs away
    assert plain == pytest.approx(25.0)


def test_cache_config_validates_and_round_trips():
    cfg = CacheConfig("forecast", 8, 2, 0.4, 0.05)
    assert CacheConfig.from_dict(cfg.to_dict()) == cfg and cfg.snapshots == 3 and CacheConfig("reuse").snapshots == 1
    assert cfg.label == "forecast R=8 (order 2, gate 0.05)"
    for bad, match in [({"mode": "fast"}, "none, reuse or forecast"), ({"refresh": 0}, "whole number of steps"),
                       ({"order": 3}, "order"), ({"alpha": 0}, "alpha"), ({"drift": -1.0}, "drift")]:  # fmt: skip
        with pytest.raises(ConfigError, match=match):
            CacheConfig(**bad)
    with pytest.raises(ConfigError, match="unknown key"):
        CacheConfig.from_dict({"mode": "reuse", "interval": 4})


def test_llada_v_sized_cache_is_what_32_layers_of_4096_wide_keys_and_values_take():
    assert cache_bytes(32, 4096, 3700, 2) == 2 * 32 * 4096 * 3700 * 2 == 1_939_865_600  # 1.81 GiB, fp16, one snapshot


def _spec() -> GraphSpec:
    return graph_specs(DIMS, "float32", ("denoise",))["denoise"]


def _pool(budget: int = 2**20) -> tuple[KVPool, Transfers]:
    transfers = Transfers()
    return KVPool(HostMemory(transfers), _spec(), budget), transfers


def _present(buffers: CallBuffers, value: float, prompt: int = 5) -> dict:
    """A refresh call's present buffers (one row) filled with ``value``, as the graph would write them."""
    present = buffers.present_into(1, prompt)
    for array in present.values():
        host_view(array)[...] = value
    return present


def test_no_cache_feeds_an_empty_past_with_weight_one():
    feeds = no_cache(_spec(), 3)
    assert feeds["past_weights"].tolist() == [1.0]
    assert feeds["past_key_values.1.value"].shape == (1, 3, 2, 0, 8) and len(feeds) == 1 + 2 * DIMS["layers"]
    assert no_cache(graph_specs(DIMS, "float32", ("step_zero",))["step_zero"], 3) == {}
    assert not graph_specs(DIMS, "float32", ("denoise",), cache=False)["denoise"].inputs[-1].name.startswith("past")


@pytest.mark.parametrize("mode", ["reuse", "forecast"])
def test_refreshes_come_every_r_steps_and_at_block_starts(mode):
    """A row's refresh schedule and what its cached steps read: the newest snapshot (reuse) or the forecast's two,
    right-aligned in the call's past from its slot, copied on the device only when the slot changed."""
    pool, transfers = _pool()
    cache = RowCache(CacheConfig(mode, 3), cached=True)
    cache.slot = pool.reserve(5, cache.config.snapshots)
    buffers = CallBuffers(pool, 4)
    refreshes, fed, copies = [], {}, {}
    for t in range(10):
        weights = cache.plan(t, boundary=t == 7)
        if weights is None:
            refreshes.append(t)
            index = cache.target()
            pool.store(cache.slot, index, _present(buffers, float(t)), 0, 0)
            cache.stored(t, index)
        else:
            before = transfers.device_copies
            buffers.begin_step()
            handle, _ = buffers.past_call([1], len(weights), 8)
            past = buffers.past_feeds(handle, [(1, cache.slot, cache.fed(weights))])
            fed[t] = (weights, {k: host_view(v).copy() for k, v in past.items()})
            copies[t] = transfers.device_copies - before
    assert refreshes == [0, 3, 6, 7]  # step 7 starts a block
    assert copies[1] > 0 and copies[2] == 0 and copies[8] > 0 and copies[9] == 0  # copied once per refresh
    weights, past = fed[1]
    assert weights.tolist() == [1.0] and past["past_key_values.0.key"].shape == (1, 1, 2, 8, 8)  # one snapshot
    assert (past["past_key_values.0.key"][..., 3:, :] == 0.0).all() and (
        past["past_key_values.0.key"][..., :3, :] == 0
    ).all()
    if mode == "reuse":
        assert all(w.tolist() == [1.0] and (f["past_key_values.1.key"][0, 0, :, 3:] == 7.0).all()
                   for t, (w, f) in fed.items() if t > 7)  # fmt: skip
    else:  # two snapshots (steps 6 and 7) extrapolated to step 9: the feed's combination is past 7
        w, f = fed[9]
        assert len(w) == 2 and w.sum() == pytest.approx(1.0) and w[1] > 1.0
        combined = np.tensordot(w, f["past_key_values.0.key"], axes=1)[0, :, 3:]
        assert (7.0 < combined).all() and (combined <= 7.5).all()
    assert (fed[2][1]["past_key_values.0.key"][0, 0, :, 3:] == 0.0).all()  # step 0's snapshot, right-aligned
    pool.release(cache.slot)
    buffers.close()
    assert pool.used == 0 and pool.slots == 0


def test_drift_gate_brings_the_refresh_forward_and_drops_a_losing_forecast():
    cache = RowCache(CacheConfig("forecast", 4, drift=0.01), cached=True)
    history: list[np.ndarray] = []
    for t, value in ((0, 1.0), (4, 2.0), (8, 1.0)):  # the K/V turn back: the forecast (3.0) loses to reuse (2.0)
        assert cache.plan(t, False) is None
        fresh = np.full((2, 2, 2, 5, 8), value, dtype=np.float32)
        interval = cache.gate(t, fresh, history[-2:]) if history else None
        cache.stored(t, cache.target(), interval)
        history.append(fresh)
    reuse, forecast = cache.errors[-1]
    assert forecast > reuse > 0.01 and cache.fallback
    assert cache.plan(9, False).tolist() == [1.0]  # reuse: the newest snapshot
    assert cache.fed(np.ones(1)) == (cache.held[-1],)
    assert cache.plan(10, False) is None  # the gate brought the refresh forward to R // 2


def test_a_cache_on_an_uncached_graph_is_refused():
    assert RowCache(EXACT, cached=False).plan(0, False) is None
    with pytest.raises(ConfigError, match="--cache none"):
        RowCache(CacheConfig("reuse"), cached=False)


def test_rows_keep_their_call_buffer_entries_as_others_come_and_go():
    """A cached call's rows take the entries they held (at most one row moves when one leaves), every row exactly
    once, and an entry is copied only when its row or snapshot changed; two calls of one step take two buffers."""
    pool, transfers = _pool(budget=2**22)
    slots = {k: pool.reserve(5, 1) for k in "ABCDE"}
    for k, slot in slots.items():
        pool.store(slot, 0, _present(CallBuffers(pool, 1), float(ord(k))), 0, 0)
    buffers = CallBuffers(pool, 4)

    def call(keys: str, copies: int | None = None) -> str:
        buffers.begin_step()
        before = transfers.device_copies
        handle, order = buffers.past_call(list(keys), 1, 8)
        rows = [keys[i] for i in order]
        feeds = buffers.past_feeds(handle, [(k, slots[k], (0,)) for k in rows])
        key = host_view(feeds["past_key_values.0.key"])
        assert [chr(int(key[0, e, 0, 3, 0])) for e in range(len(rows))] == rows  # each entry holds its row's K/V
        moved = (transfers.device_copies - before) // (2 * 2 * 2 * 5 * 8 * 4)  # rows copied (layers x K/V each)
        assert copies is None or moved == copies, (keys, rows, moved)
        return "".join(rows)

    assert call("ABCD", 4) == "ABCD"
    assert call("ABCD", 0) == "ABCD"  # nothing changed: nothing copied
    assert sorted(call("DB", 1)) == ["B", "D"]  # B keeps entry 1; D moves into entry 0
    assert sorted(call("ABCD")) == list("ABCD")  # every row once, though a smaller call left D in two entries
    assert sorted(call("ABCE", 1)) == list("ABCE")  # E takes D's entry
    buffers.begin_step()
    first, _ = buffers.past_call(list("AB"), 1, 8)
    second, _ = buffers.past_call(list("CE"), 1, 8)
    assert first != second  # two calls of one step: two buffers
    buffers.close()


def test_the_pool_admits_what_fits_its_budget_and_counts_every_byte():
    pool, _ = _pool(budget=3 * 5 * 2 * 2 * 2 * 8 * 4)  # three slots of 5 positions, one snapshot
    slots = [pool.reserve(5, 1) for _ in range(3)]
    assert all(slots) and pool.reserve(5, 1) is None and pool.slots == 3
    pool.release(slots[0])
    assert pool.reserve(5, 1) is not None and pool.used == pool.budget


# --- on the fixture export ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pipe(fixture_export) -> SeerPipeline:
    return SeerPipeline.from_manifest(fixture_export[0])


@pytest.mark.slow
def test_a_cached_step_on_the_current_prompt_kv_is_the_uncached_step(pipe):
    """The graph's cached path: fed the K/V of the very answer state it computes (any weights summing to 1 over
    identical snapshots), a step without the prompt gives the uncached step's x0 and confidence."""
    rows = [pipe.encode(s.question, s.image).embeds for s in SAMPLES[:3]]
    p = max(len(r) for r in rows)
    layout = padded_layout(rows, np.array([9, 5, 7]), p, 9)  # left-padded rows of different windows
    spec = pipe.backend.spec("denoise")
    mask = pipe.manifest.special_tokens.mask_id
    gen = np.random.default_rng(1).integers(0, 40, (3, 9))
    gen[:, ::2] = mask
    feeds = {"prefix_embeds": layout.prefix_embeds, "gen_ids": gen, "segment_ids": layout.segment_ids,
             "position_ids": layout.position_ids}  # fmt: skip
    full = {k: np.array(v) for k, v in pipe.backend.run("denoise", {**feeds, **no_cache(spec, 3)}).items()}
    assert full["present.0.key"].shape == (3, spec.inputs[5].shape[2], p, spec.inputs[5].shape[4])
    past = {"past_weights": np.array([-0.5, 1.5], dtype=np.float32)}
    for i in range(pipe.manifest.model.num_layers):
        for name, out in zip(past_names(i), present_names(i), strict=True):
            past[name] = np.stack([full[out], full[out]])
    empty = layout.prefix_embeds[:, :0]
    cached = pipe.backend.run("denoise", {**feeds, **past, "prefix_embeds": empty})
    valid = layout.segment_ids[:, p:] > 0
    np.testing.assert_array_equal(cached["x0"][valid], full["x0"][valid])
    np.testing.assert_allclose(cached["log_confidence"][valid], full["log_confidence"][valid], atol=1e-5)
    assert cached["present.0.key"].shape[2] == 0  # it computed no prompt position
    stale = {k: (v * 0.5 if k.startswith("past_key") else v) for k, v in past.items()}  # wrong K/V: other values
    moved = pipe.backend.run("denoise", {**feeds, **stale, "prefix_embeds": empty})
    assert not np.allclose(moved["log_confidence"][valid], full["log_confidence"][valid], atol=1e-3)


def _windows(results) -> list[tuple[int, ...]]:
    assert all(r.ok for r in results), [r.error for r in results]
    return [r.window for r in results]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["static", "packed"])
def test_refreshing_every_step_is_the_exact_loop(pipe, policy):
    exact = pipe.generate_batch([Request(s.question, s.image, cache="none") for s in SAMPLES], policy=policy).results
    for mode in ("reuse", "forecast"):
        every = pipe.generate_batch([Request(s.question, s.image, cache=mode, refresh_interval=1) for s in SAMPLES],
                                    policy=policy).results  # fmt: skip
        assert _windows(every) == _windows(exact)
        assert [r.refreshes for r in every] == [r.steps for r in every] == [r.refreshes for r in exact]


@pytest.mark.slow
def test_cached_policies_refresh_less_and_count_it(pipe):
    exact = pipe.generate(
        [Request(s.question, s.image, gen_length=64, cache="none", decoding="fixed") for s in SAMPLES]
    )
    steps = [r.steps for r in exact]
    assert [r.refreshes for r in exact] == steps
    for mode in ("reuse", "forecast"):
        out = pipe.generate([Request(s.question, s.image, gen_length=64, cache=mode, refresh_interval=4,
                                     decoding="fixed") for s in SAMPLES])  # fmt: skip
        assert all(r.ok for r in out)
        # step 0 is the full-depth pass or a refresh; then one every 4 steps (block starts may add some)
        assert all(-(-r.steps // 4) <= r.refreshes < r.steps for r in out if r.steps > 4), mode
    policy = CacheConfig("forecast", 2, 2)
    (r,) = pipe.generate([Request(SAMPLES[0].question, SAMPLES[0].image, cache=policy, decoding="fixed")])
    assert r.ok and r.refreshes < r.steps


@pytest.mark.slow
def test_the_default_cache_gives_the_same_tokens_under_every_dispatch_policy(pipe):
    """The cache is computed in each plan's own layout (padded, packed, alone); a row's answer does not depend on it."""
    from seer_trt.contracts.policies import POLICIES

    assert pipe.cache == DEFAULT_CACHE and DEFAULT_CACHE.mode != "none"
    requests = [Request(s.question, s.image) for s in SAMPLES]
    out = {p: pipe.generate_batch(requests, policy=p).results for p in POLICIES}
    first = _windows(out["per_request"])
    assert all(_windows(r) == first for r in out.values())
    assert all(r.refreshes < r.steps for r in out["per_request"] if r.steps > DEFAULT_CACHE.refresh)


@pytest.mark.slow
def test_bad_cache_requests_fail_alone(pipe):
    out = pipe.generate([Request(SAMPLES[0].question, refresh_interval=0, cache="reuse"), Request(SAMPLES[0].question)])
    assert "refresh interval 0" in out[0].error and out[1].ok
    with pytest.raises(InputError, match="cache is 'fast'"):
        Request("q", cache="fast")


def test_profiles_select_the_cached_profile_for_a_cached_call():
    from seer_trt.contracts.profiles import plan_profiles, select_profile

    spec = _spec()
    plan = plan_profiles({"denoise": [(t.name, t.shape) for t in spec.inputs]}, LengthBuckets())
    profiles = plan.profiles("denoise")
    computing = select_profile(profiles, {"batch": 1, "prompt": 40, "past": 0, "history": 1, "answer": 9}, "denoise")
    cached = select_profile(profiles, {"batch": 1, "prompt": 0, "past": 40, "history": 2, "answer": 9}, "denoise")
    assert profiles[computing].range("past").max == 0 and profiles[cached].range("prompt").max == 0
    assert dataclasses.replace(CacheConfig("forecast", 4, 2)).snapshots <= profiles[cached].range("history").max


def _run_cli(argv: list[str]) -> tuple[int, str, str]:
    from seer_trt.cli.run import main

    return cli(main, argv)


@pytest.mark.slow
def test_seer_run_cache_flags_and_jsonl_cache_fields(fixture_export, tmp_path):
    import json

    folder = str(fixture_export[0])
    prompt = "repeat cat 6 times ."
    runs = {}
    for flags in (["--cache", "none"], ["--cache", "reuse", "--refresh-interval", "3"],
                  ["--cache", "forecast", "--refresh-interval", "3", "--forecast-order", "2"]):  # fmt: skip
        rc, out, err = _run_cli(["--engines", folder, "--prompt", prompt, "--json", "--decoding", "fixed", *flags])
        assert rc == 0, err
        runs[flags[1]] = json.loads(out)
    steps = runs["none"]["steps"]
    assert steps > 3 and runs["none"]["refreshes"] == steps
    assert runs["reuse"]["steps"] == runs["forecast"]["steps"] == steps
    assert runs["reuse"]["refreshes"] == runs["forecast"]["refreshes"] == -(-steps // 3)  # steps 0, 3, 6, ...
    (tmp_path / "in.jsonl").write_text(json.dumps({"prompt": prompt, "cache": "none"}) + "\n"
                                       + json.dumps({"prompt": prompt, "cache": "reuse", "refresh_interval": 0}) + "\n")  # fmt: skip
    rc, _, err = _run_cli(["--engines", folder, "--input", str(tmp_path / "in.jsonl"), "--output",
                           str(tmp_path / "out.jsonl"), "--cache", "reuse", "--decoding", "fixed"])  # fmt: skip
    got = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert rc == 1 and got[0]["refreshes"] == steps and "refresh interval 0" in got[1]["error"]
    rc, out, err = _run_cli(["--engines", folder, "--prompt", prompt, "--cache", "fast"])
    assert rc == 2 and "invalid choice" in err and len(err.strip().splitlines()) == 1
