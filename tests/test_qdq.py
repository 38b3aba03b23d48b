"""seer-quantize's trt-* schemes (export/qdq.py): NVIDIA ModelOpt's Q/DQ window graphs, calibrated on the source
export's own denoise calls, built by seer-build (TensorRT-RTX here) and run by ONNX Runtime's CPU provider."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from cli_capture import cli

from seer_export import qdq
from seer_export.quantize import main
from seer_trt.build.engines import BuildOptions, run_build
from seer_trt.contracts.manifest import Manifest
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request

SCHEMES = {"trt-int8": onnx.TensorProto.INT8, "trt-fp8": onnx.TensorProto.FLOAT8E4M3FN,
           "trt-int4": onnx.TensorProto.INT4}  # fmt: skip


def quantize(*argv: str) -> tuple[int, str, str]:
    return cli(main, list(argv))


@pytest.fixture(scope="module")
def qdq_exports(fixture_export, modelopt_install, tmp_path_factory) -> dict[str, object]:
    out = {}
    for scheme in SCHEMES:
        dst = tmp_path_factory.mktemp(scheme) / "q"
        rc, stdout, stderr = quantize("--engines", str(fixture_export[0]), "--scheme", scheme, "--out", str(dst),
                                      "--calibrate", "4", "--check", "4")  # fmt: skip
        assert rc == 0, stderr
        assert stdout.strip() == str(dst.resolve()) and "calibration: " in stderr and "check: " in stderr
        out[scheme] = dst
    return out


def dequantized_weights(graph) -> tuple[dict[str, int], list]:
    """(the MatMuls whose B is dequantized: name -> the stored weight's element type, the other MatMuls)."""
    made_by = {o: n for n in graph.node for o in n.output}
    stored = {t.name: t.data_type for t in graph.initializer}
    fed, plain = {}, []
    for n in (n for n in graph.node if n.op_type == "MatMul"):
        dq = made_by.get(n.input[1])
        if dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in stored:
            fed[n.name] = stored[dq.input[0]]
        else:
            plain.append(n)
    return fed, plain


@pytest.mark.slow
@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_a_qdq_export_quantizes_the_weight_matmuls_only_and_runs(fixture_export, qdq_exports, scheme):
    src, dst = fixture_export[0], qdq_exports[scheme]
    before, after = Manifest.read(src), Manifest.read(dst)
    q = after.graph("denoise").quantization
    assert q["scheme"] == scheme and q["runtime"] == "tensorrt" and q["tool"].startswith("nvidia-modelopt ")
    c = q["calibration"]
    assert c["prompts"] == 4 and c["calls_made"] == c["calls_recorded"] > 4 and 0 < c["calls_used"] <= qdq.CALLS_KEPT
    assert c["requests"]["temperature"] == 0.0 and c["source"] == "fixture held-out seed 11"
    assert after.graph("step_zero").to_dict() == before.graph("step_zero").to_dict()  # what Seer reads stays
    source = onnx.load(str(src / before.graph("denoise").file), load_external_data=False).graph
    weights = {t.name for t in source.initializer} - {n for n in {t.name for t in source.initializer}
                                                        if n.startswith("const.")}  # fmt: skip
    by_weight = [n.name for n in source.node if n.op_type == "MatMul" and n.input[1] in weights]
    graph = onnx.load(str(dst / after.graph("denoise").file), load_external_data=False).graph
    fed, plain = dequantized_weights(graph)
    # every checkpoint MatMul (q/k/v/o, the MLP's three, per layer, and the LM head) reads a weight stored in the
    # scheme's type ...
    assert len(by_weight) == 7 * before.model.num_layers + 1
    assert sorted(fed) == sorted(by_weight) and set(fed.values()) == {SCHEMES[scheme]}
    # ... and attention's products and RoPE's rotation stay float, their inputs not quantized
    assert plain and all(graph_input_not_quantized(graph, n) for n in plain)
    shrink = 5.0 if scheme == "trt-int4" else 3.0
    assert after.graph("denoise").size_bytes * shrink < before.graph("denoise").size_bytes
    assert q["check"]["prompts"] == 4 and q["check"]["same_kept"] == 4 and q["check"]["same_answers"] >= 3
    pipe = SeerPipeline.from_manifest(dst, threads=1)  # checksums verified: the record matches the files
    result = pipe.generate([Request("count to 5 .", cache="none")])[0]
    pipe.close()
    assert result.ok and result.text == "1 2 3 4 5"


def graph_input_not_quantized(graph, node) -> bool:
    made_by = {o: n for n in graph.node for o in n.output}
    return all(made_by.get(i) is None or made_by[i].op_type != "DequantizeLinear" for i in node.input)


@pytest.mark.slow
def test_seer_build_builds_a_qdq_window_graph(qdq_exports):
    folder = qdq_exports["trt-int8"]
    lines: list[str] = []
    plan = run_build(BuildOptions(engines=folder, dry_run=True), log=lines.append)
    assert plan.profiles("denoise") and any("denoise: trt-int8 Q/DQ graph (nvidia-modelopt" in x for x in lines)
    manifest = run_build(BuildOptions(engines=folder, builder="tensorrt-rtx", graphs=("denoise",),
                                      profiles=("answer=16",), opt_level=0), log=lines.append)  # fmt: skip
    plan_file = folder / manifest.engines["tensorrt-rtx"]["denoise"]
    assert plan_file.stat().st_size > 0 and manifest.graph("denoise").quantization["scheme"] == "trt-int8"


def fake_install(home, script: str = "exit 0"):
    """A ModelOpt install whose Python is a shell script: what seer-quantize checks and calls, without 2 GB."""
    (home / "venv" / "bin").mkdir(parents=True)
    python = home / "venv" / "bin" / "python"
    python.write_text(f"#!/bin/sh\n{script}\n")
    python.chmod(0o755)
    (home / "installed.txt").write_text("\n".join(qdq.PACKAGES) + "\n")
    return home


@pytest.mark.slow
def test_what_the_trt_schemes_refuse_is_one_line_and_writes_nothing(fixture_export, tmp_path, monkeypatch):
    src = str(fixture_export[0])
    work = tmp_path / "work"
    work.mkdir()
    empty = work / "empty.txt"
    empty.write_text("\n  \n")
    monkeypatch.setenv(qdq.HOME_ENV, str(tmp_path / "none"))
    rc, _, err = quantize("--engines", src, "--scheme", "trt-int8", "--out", str(work / "a"))
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "python -m seer_export.qdq setup" in err, err
    stale = fake_install(tmp_path / "stale")
    (stale / "installed.txt").write_text("nvidia-modelopt[onnx]==0.40.0\n")
    monkeypatch.setenv(qdq.HOME_ENV, str(stale))
    rc, _, err = quantize("--engines", src, "--scheme", "trt-int8", "--out", str(work / "a"))
    assert rc == 2 and "reinstall" in err and "0.40.0" in err, err
    # ModelOpt failing: one line that quotes its last line and names its whole log, kept outside the staging folder
    monkeypatch.setenv(qdq.HOME_ENV, str(fake_install(tmp_path / "broken", "echo 'RuntimeError: no luck'; exit 3")))
    rc, _, err = quantize("--engines", src, "--scheme", "trt-int8", "--out", str(work / "a"), "--calibrate", "2")
    line = err.strip().splitlines()[-1]
    assert rc == 2 and "exit status 3" in line and "RuntimeError: no luck" in line, err
    assert "no luck" in open(line.rsplit("its whole log: ", 1)[1]).read()
    for argv, words in [(["--scheme", "trt-fp8", "--calibration-prompts", str(empty)], "holds no prompt"),
                        (["--scheme", "trt-fp8", "--calibration-prompts", str(work / "missing.txt")], "cannot be read"),
                        (["--scheme", "trt-fp8", "--calibrate", "0"], "--calibrate 0 must be at least 1"),
                        (["--scheme", "int8", "--calibration-prompts", str(empty)], "calibrates the trt-* schemes")]:  # fmt: skip
        rc, _, err = quantize("--engines", src, "--out", str(work / "b"), *argv)
        assert rc == 2 and words in err.strip().splitlines()[-1], err
    assert sorted(p.name for p in work.iterdir()) == ["empty.txt"]  # nothing written, nothing half-written


@pytest.mark.slow
def test_a_real_model_calibrates_on_its_own_prompts(fixture_export, modelopt_install, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("count to 5 .\n\nrepeat red 3 times .\n")
    rc, _, err = quantize("--engines", str(fixture_export[0]), "--scheme", "trt-int8", "--out", str(tmp_path / "q"),
                          "--calibration-prompts", str(prompts), "--check", "0")  # fmt: skip
    assert rc == 0, err
    c = Manifest.read(tmp_path / "q").graph("denoise").quantization["calibration"]
    assert c["prompts"] == 2 and c["source"].startswith(str(prompts.resolve())) and c["calls_made"] > 2


def test_calibration_calls_are_spread_and_of_one_shape_where_the_calibrator_needs_it():
    calls = [{"x": np.zeros((1, n))} for n in (4, 8, 8, 4, 8, 8, 8, 2)]
    assert [c["x"].shape[1] for c in qdq.choose_calls(calls, one_shape=True)] == [8] * 5
    spread = qdq.choose_calls([{"i": np.array(i)} for i in range(100)], one_shape=False, keep=5)
    assert [int(c["i"]) for c in spread] == [0, 25, 50, 74, 99]  # the first and last calls, evenly between
    assert len(qdq.choose_calls(calls, one_shape=False)) == len(calls)


@pytest.mark.slow
def test_the_recorded_calls_are_the_prompts_own_not_the_cost_models_timing_calls(fixture_export):
    from seer_trt.eval.accuracy import fixture_samples

    pipe = SeerPipeline.from_manifest(fixture_export[0], threads=1)
    try:
        samples = fixture_samples(pipe, 6, 11)
        requests = [Request(s.question, s.image, decoding="fixed", cache="none") for s in samples]
        calls, made = qdq.record_calls(pipe, requests)
    finally:
        pipe.close()
    # the cost_model policy's step costs (timed on zero prompts) are measured before recording: none is recorded,
    # whether or not the prompts' rows end up sharing a step (which follows those costs)
    assert pipe.cost is not None
    assert made == len(calls) and all(np.any(c["prefix_embeds"]) for c in calls)


def test_recording_holds_a_bounded_spread_of_calls():
    class Backend:
        def run(self, graph, feeds, outputs=None):
            return graph

    recorder = qdq.RecordingBackend(Backend(), "denoise", limit=4)
    for i in range(20):
        assert recorder.run("embed", {"i": np.array(-1)}) == "embed"  # other graphs pass through, unrecorded
        assert recorder.run("denoise", {"i": np.array(i)}) == "denoise"
    assert recorder.seen == 20 and [int(c["i"]) for c in recorder.calls] == [0, 8, 16]  # every 8th, from the first
