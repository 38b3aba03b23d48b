"""seer-eval and seer-bench on the fixture export: what they report is consistent (not how fast it is: speed is
measured by running seer-bench, never asserted in a test)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from seer_export.bench.fixture import Settings, bench, headline, plot, tables
from seer_export.bench.rounds import ratio
from seer_trt.cli.eval import main as eval_main
from seer_trt.contracts.policies import POLICIES
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request


@pytest.mark.slow
def test_seer_eval_json_plot_and_consistency(fixture_export, tmp_path):
    folder = fixture_export[0]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = eval_main(["--engines", str(folder), "--n", "8", "--gen-length", "32", "--json", str(tmp_path / "e.json"),
                        "--plot", str(tmp_path / "e.png")])  # fmt: skip
    assert rc == 0, err.getvalue()
    report = json.loads((tmp_path / "e.json").read_text())
    modes = report["modes"]
    assert set(modes) == {"padded", "early_stop", "seer", "oracle"} and report["gen_length"] == 32
    assert report["command"].startswith("seer-eval --engines ")
    for row in modes.values():
        assert 0.0 <= row["exact_match"] <= 1.0
        tasks = row["exact_by_task"]
        assert sum(t["n"] for t in tasks.values()) == 8 and all(0 <= t["exact"] <= t["n"] for t in tasks.values())
        assert sum(t["exact"] for t in tasks.values()) / 8 == pytest.approx(row["exact_match"])
    seer = modes["seer"]
    assert sum(seer["kept_minus_true"].values()) == 8
    premature = sum(c for d, c in seer["kept_minus_true"].items() if int(d) < 0) / 8
    assert seer["premature_cut_rate"] == pytest.approx(premature)
    assert modes["padded"]["mean_kept"] == 32 and modes["padded"]["match_padded"] == 1.0
    assert modes["oracle"]["mean_kept"] < 32  # the oracle cut every window at the true length
    assert modes["early_stop"]["mean_kept"] == 32 and modes["early_stop"]["mean_steps"] < modes["padded"]["mean_steps"]
    assert (tmp_path / "e.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| seer |" in out.getvalue() and "exact answers per task" in out.getvalue()
    lines = [line for line in err.getvalue().splitlines() if "seer-eval" in line]
    assert len(lines) == 1 + 4 and "early_stop: 8/8 prompts" in err.getvalue()  # a progress line per mode and chunk


def test_seer_eval_refuses_a_bad_engines_folder(tmp_path):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert eval_main(["--engines", str(tmp_path / "none"), "--n", "2"]) == 2
    errors = [line for line in err.getvalue().splitlines() if "error" in line]
    assert len(errors) == 1 and "not an export folder" in errors[0]


@pytest.mark.slow
def test_seer_bench_report_structure(fixture_export, tmp_path):
    settings = Settings(lengths=(16, 32), single_prompts=1, single_rounds=2, batch=8, batch_gen_length=32,
                        long_batch=4, long_prompt=(60, 90), batch_rounds=2, step_lengths=(16,), step_rounds=2,
                        step_calls=2)  # fmt: skip
    seen = []
    report = bench(fixture_export[0], None, settings, progress=seen.append, command="seer-bench --test")
    assert seen and set(report["single"]) == {"16", "32"} and report["command"] == "seer-bench --test"
    for row in report["single"].values():
        assert set(row) == {"padded", "early_stop", "seer", "oracle"}
        assert row["padded"]["speedup_vs_padded"] == {"value": 1.0, "min": 1.0, "max": 1.0, "rounds": 2}
        assert row["early_stop"]["speedup_vs_early_stop"]["value"] == 1.0
        for r in row.values():
            s = r["speedup_vs_padded"]
            assert s["min"] <= s["max"] and s["rounds"] == 2
        assert row["oracle"]["mean_steps"] <= row["padded"]["mean_steps"]
        assert row["early_stop"]["mean_steps"] <= row["padded"]["mean_steps"]
    for name in ("long_tail", "long_prompt"):
        b = report[name]
        pol = b["policies"]
        assert set(pol) == set(POLICIES)
        assert all(r["same_tokens"] for r in pol.values())  # dispatch never changes an answer
        # every policy steps the same rows the same number of steps; one row a call is the most calls, a batch
        # bucket's worth a call in order the fewest
        assert len({r["steps"] for r in pol.values()}) == 1
        assert pol["per_request"]["rows_per_call"] == 1.0 and pol["naive_pad"]["rows_per_call"] > 1.0
        assert all(pol["per_request"]["calls"] >= r["calls"] >= pol["naive_pad"]["calls"] for r in pol.values())
        assert pol["cost_model"]["rounds"] == 2 and b["best_fixed"] in POLICIES and b["best_fixed"] != "cost_model"
    assert sorted(report["long_tail"]["true_lengths"])[-1] >= 25  # the long tail is there
    assert min(report["long_prompt"]["prompt_lengths"]) >= 60 and report["long_prompt"]["windows"].startswith("oracle")
    o = report["overhead"]
    assert sum(o.values()) == pytest.approx(1.0)
    h = report["headline"]
    assert h == headline(report) and set(h) >= {"seer_over_padded", "seer_over_early_stop", "seer_over_oracle",
                                                 "long_tail_default_over_best_fixed",
                                                 "long_prompt_default_over_best_fixed", "ort_over_torch_per_step"}  # fmt: skip
    assert 0 <= o["detection"] + o["routing"] < 0.5
    assert all(set(v) == {"value", "min", "max", "rounds"} for v in h.values() if isinstance(v, dict))
    m = report["machine"]
    assert m["threads"] == m["ort_intra_op_threads"] == m["torch_threads"] == 1  # both backends, same threads
    assert report["git"] is None or len(report["git"]) >= 7
    assert "## Headline" in tables(report) and m["cpus"] >= 1
    w = report["window_graph"]  # the exported RMSNorm is in the form ONNX Runtime fuses (docs/DESIGN.md)
    assert w["ops_onnxruntime"].get("SimplifiedLayerNormalization", 0) >= 2 * 8 + 1 and "Reciprocal" not in w["ops"]
    assert w["nodes_onnxruntime"] < w["nodes"] == sum(w["ops"].values()) and "Window graph: " in tables(report)
    plot(report, tmp_path / "b.png")
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ratio_is_a_ratio_of_medians_with_the_per_round_spread():
    r = ratio([10.0, 12.0, 30.0], [5.0, 4.0, 6.0])
    assert r == {"value": 12.0 / 5.0, "min": 2.0, "max": 5.0, "rounds": 3}


@pytest.mark.slow
def test_oracle_window_is_validated(fixture_export):
    pipe = SeerPipeline.from_manifest(fixture_export[0])
    (bad,) = pipe.generate(Request("count to 3 .", window=0))
    assert "window 0 must lie in [1, gen_length" in bad.error
    (ok,) = pipe.generate(Request("count to 3 .", window=4, decoding="fixed"))  # the schedule's step count
    gen = pipe.manifest.generation
    assert ok.ok and ok.kept == 4 and ok.steps == -(-gen.steps * 4 // gen.gen_length)


@pytest.mark.slow
def test_seer_eval_cache_table_compares_policies_at_equal_refreshes(fixture_export, tmp_path):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = eval_main(["--engines", str(fixture_export[0]), "--n", "8", "--gen-length", "32", "--cache",
                        "reuse,forecast", "--refresh-interval", "1,4", "--drift-gate", "0.05", "--json",
                        str(tmp_path / "c.json")])  # fmt: skip
    assert rc == 0, err.getvalue()
    rows = {r["policy"]: r for r in json.loads((tmp_path / "c.json").read_text())["rows"]}
    assert list(rows)[:5] == ["none", "reuse R=1", "reuse R=4", "forecast R=1 (order 1)", "forecast R=4 (order 1)"]
    exact = rows["none"]
    assert exact["refreshes_per_request"] == exact["steps_per_request"] and exact["exact_match_minus_exact"] == 0
    for mode in ("reuse R=1", "forecast R=1 (order 1)"):  # a refresh at every step is the exact loop
        assert rows[mode]["same_answer_as_exact"] == rows[mode]["token_agreement"] == 1.0
        assert rows[mode]["refreshes_per_request"] == exact["refreshes_per_request"]
    reuse, forecast = rows["reuse R=4"], rows["forecast R=4 (order 1)"]
    assert reuse["refreshes_per_request"] == forecast["refreshes_per_request"] < exact["refreshes_per_request"]
    gated = rows["forecast R=4 (order 1, gate 0.05)"]
    assert gated["gate_checks"] > 0 and gated["kv_error_reuse"] > 0 and gated["kv_error_forecast"] > 0
    assert gated["refreshes_per_request"] >= forecast["refreshes_per_request"]  # a gate only adds refreshes
    assert "| forecast R=4 (order 1) |" in out.getvalue()


@pytest.mark.slow
def test_llada_v_shaped_bench_report_structure(fixture_export):
    from seer_export.bench.cache import LLADA_V, MODES, bench_cache
    from seer_export.bench.cache import Settings as CacheSettings
    from seer_export.bench.cache import tables as cache_tables

    settings = CacheSettings(image_tokens=(60,), text_tokens=20, gen_lengths=(32,), answers=(2, 5), rounds=1,
                             step_rounds=1, step_calls=1, baseline_cells=((60, 32),), refresh=4)  # fmt: skip
    report = bench_cache(fixture_export[0], settings, command="seer-bench --workload llada-v-shaped --test")
    assert list(report)[:2] == ["cache_step_speedup", "seer_cache_over_seer"]  # the headline keys come first
    (step,) = report["step_times"].values()
    assert step["window"] == 16 and step["uncached_ms"] > 0 and step["reuse_ms"] > 0
    (cell,) = report["end_to_end"].values()
    assert list(cell["modes"]) == list(MODES) and not cell["modes"]["baseline"]["estimated"]
    modes = cell["modes"]
    assert modes["baseline"]["mean_steps"] == 32 and modes["baseline"]["mean_refreshes"] == 32
    assert modes["baseline+cache"]["mean_steps"] == 32 > modes["baseline+cache"]["mean_refreshes"]  # R = 4
    assert modes["seer"]["mean_refreshes"] == modes["seer"]["mean_steps"]  # Seer alone: the exact loop
    for m in ("seer+reuse", "seer+forecast"):
        assert modes[m]["mean_steps"] == modes["seer"]["mean_steps"] > modes[m]["mean_refreshes"]
    assert modes["oracle+cache"]["mean_steps"] < modes["seer"]["mean_steps"]  # no safety margin
    assert report["memory"]["reuse_bytes"] == 2 * LLADA_V["layers"] * 4096 * 3700 * 2
    assert "## Headline" in cache_tables(report)


@pytest.mark.serving
def test_seer_bench_triton_rounds_both_servers_on_the_same_prompts(fixture_export, triton_install, tmp_path):
    """seer-bench --workload triton: every level has a rate of each server in each round, the ratios are of those
    rounds, and Triton's engine answers every prompt (pictures included) as seer-serve does."""
    from seer_export.bench import triton
    from seer_export.bench.cli import main as bench_main

    seen: list[str] = []
    settings = triton.Settings(concurrency=(1, 3), requests=5, rounds=2)
    report = triton.bench(str(fixture_export[0]), settings, 7, seen.append, "seer-bench --test", threads=1)
    assert any(p.image is not None for p in triton.prompts(5, 7))  # the pictures go to both servers
    assert report["answers_equal"] == report["answers"] == 5
    for level in report["levels"]:
        rounds = level["answers_per_s"]
        assert set(rounds) == set(triton.SERVERS) and all(len(v) == 2 and min(v) > 0 for v in rounds.values())
        r = level["triton_over_seer_serve"]
        assert r["rounds"] == 2 and r["min"] <= r["value"] <= r["max"]
        assert r["value"] == pytest.approx(level["median"]["triton"] / level["median"]["seer-serve"])
    assert all(len(v) == 2 and min(v) > 0 for v in report["long_seconds"].values())
    assert sum("answers/s" in line for line in seen) == 2 * 2 * 2  # a progress line per round, level and server
    assert "| 3 |" in triton.table(report)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):  # a folder that is no export: one line, before any server starts
        assert bench_main(["--workload", "triton", "--engines", str(tmp_path / "none")]) == 2
    assert "not an export folder" in err.getvalue() and "Traceback" not in err.getvalue()
