"""seer-eval and seer-bench on the fixture export: what they report is consistent (not how fast it is: speed is
measured by running seer-bench, never asserted in a test)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from seer_export.bench import Settings, bench, headline, tables
from seer_trt.dispatch import POLICIES
from seer_trt.evaluate import main as eval_main
from seer_trt.pipeline import Request, SeerPipeline


def test_seer_eval_json_plot_and_consistency(fixture_export, tmp_path):
    folder = fixture_export[0]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = eval_main(["--engines", str(folder), "--n", "8", "--gen-length", "32", "--json", str(tmp_path / "e.json"),
                        "--plot", str(tmp_path / "e.png")])  # fmt: skip
    assert rc == 0, err.getvalue()
    report = json.loads((tmp_path / "e.json").read_text())
    modes = report["modes"]
    assert set(modes) == {"baseline", "seer", "oracle"} and report["gen_length"] == 32
    for row in modes.values():
        assert 0.0 <= row["exact_match"] <= 1.0
        tasks = row["exact_by_task"]
        assert sum(t["n"] for t in tasks.values()) == 8 and all(0 <= t["exact"] <= t["n"] for t in tasks.values())
        assert sum(t["exact"] for t in tasks.values()) / 8 == pytest.approx(row["exact_match"])
    seer = modes["seer"]
    assert sum(seer["kept_minus_true"].values()) == 8
    premature = sum(c for d, c in seer["kept_minus_true"].items() if int(d) < 0) / 8
    assert seer["premature_cut_rate"] == pytest.approx(premature)
    assert modes["baseline"]["mean_kept"] == 32 and modes["baseline"]["match_baseline"] == 1.0
    assert modes["oracle"]["mean_kept"] < 32  # the oracle cut every window at the true length
    assert (tmp_path / "e.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| seer |" in out.getvalue() and "exact answers per task" in out.getvalue()


def test_seer_eval_refuses_a_bad_engines_folder(tmp_path):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert eval_main(["--engines", str(tmp_path / "none"), "--n", "2"]) == 2
    errors = [line for line in err.getvalue().splitlines() if "error" in line]
    assert len(errors) == 1 and "not an export folder" in errors[0]


def test_seer_bench_report_structure(fixture_export):
    settings = Settings(lengths=(16, 32), single_prompts=1, batch=8, batch_gen_length=32, repeats=1,
                        step_lengths=(16,), step_repeats=2)  # fmt: skip
    seen = []
    report = bench(fixture_export[0], None, settings, progress=seen.append)
    assert seen and set(report["single"]) == {"16", "32"}
    for row in report["single"].values():
        assert row["baseline"]["speedup"] == pytest.approx(1.0)
        assert row["oracle"]["mean_steps"] <= row["baseline"]["mean_steps"]
    pol = report["batched"]["policies"]
    assert set(pol) == set(POLICIES)
    assert all(r["same_tokens_as_hybrid"] for r in pol.values())  # dispatch never changes an answer
    assert pol["per_request"]["padding_waste"] == 0.0 and pol["naive_pad"]["padding_waste"] > 0.0
    assert sorted(report["batched"]["true_lengths"])[-1] >= 25  # the long tail is there
    o = report["overhead"]
    assert sum(o.values()) == pytest.approx(1.0)
    h = report["headline"]
    assert h == headline(report) and set(h) >= {"seer_over_oracle_speedup", "best_router_over_naive_pad",
                                                 "best_router_over_per_request", "overhead_fraction",
                                                 "ort_over_torch_per_step"}  # fmt: skip
    assert report["git"] is None or len(report["git"]) >= 7
    assert "## Headline" in tables(report) and report["machine"]["cpus"] >= 1


def test_oracle_window_is_validated(fixture_export):
    pipe = SeerPipeline.from_manifest(fixture_export[0])
    (bad,) = pipe.generate(Request("count to 3 .", window=0))
    assert "window 0 must lie in [1, gen_length" in bad.error
    (ok,) = pipe.generate(Request("count to 3 .", window=4))
    gen = pipe.manifest.generation
    assert ok.ok and ok.kept == 4 and ok.steps == -(-gen.steps * 4 // gen.gen_length)
