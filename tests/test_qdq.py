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
                                      "--calibrate", "6", "--check", "6")  # fmt: skip
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
    assert q["calibration"]["prompts"] == 6 and q["calibration"]["calls"] > 6  # every denoise call recorded
    assert after.graph("step_zero").to_dict() == before.graph("step_zero").to_dict()  # what Seer reads stays
    source = onnx.load(str(src / before.graph("denoise").file), load_external_data=False).graph
    weights = {t.name for t in source.initializer} - {n for n in {t.name for t in source.initializer}
                                                        if n.startswith("const.")}  # fmt: skip
    by_weight = [n.name for n in source.node if n.op_type == "MatMul" and n.input[1] in weights]
    graph = onnx.load(str(dst / after.graph("denoise").file), load_external_data=False).graph
    fed, plain = dequantized_weights(graph)
    # every checkpoint MatMul (q/k/v/o, the MLP, the LM head) reads a weight stored in the scheme's type ...
    assert sorted(fed) == sorted(by_weight) and set(fed.values()) == {SCHEMES[scheme]}
    # ... and attention's products and RoPE's rotation stay float, their inputs not quantized
    assert plain and all(graph_input_not_quantized(graph, n) for n in plain)
    shrink = 5.0 if scheme == "trt-int4" else 3.0
    assert after.graph("denoise").size_bytes * shrink < before.graph("denoise").size_bytes
    assert q["check"]["prompts"] == 6 and q["check"]["same_kept"] == 6 and q["check"]["same_answers"] >= 5
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


@pytest.mark.slow
def test_without_modelopt_or_calibration_prompts_it_is_one_line(fixture_export, modelopt_install, tmp_path,
                                                                 monkeypatch):  # fmt: skip
    src = str(fixture_export[0])
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    monkeypatch.setenv(qdq.HOME_ENV, str(tmp_path / "none"))
    cases = [
        (["--engines", src, "--scheme", "trt-int8", "--out", str(tmp_path / "a")], "python -m seer_export.qdq setup")
    ]
    for argv, words in cases:
        rc, _, err = quantize(*argv)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and words in err, err
    monkeypatch.setenv(qdq.HOME_ENV, str(modelopt_install.home))
    for argv, words in [(["--calibration-prompts", str(empty)], "holds no prompt"),
                        (["--calibration-prompts", str(tmp_path / "missing.txt")], "cannot be read"),
                        (["--calibrate", "0"], "--calibrate 0 must be at least 1")]:  # fmt: skip
        rc, _, err = quantize("--engines", src, "--scheme", "trt-fp8", "--out", str(tmp_path / "b"), *argv)
        assert rc == 2 and words in err.strip().splitlines()[-1], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt"]  # nothing written, nothing half-written


def test_calibration_calls_are_spread_and_of_one_shape_where_the_calibrator_needs_it():
    calls = [{"x": np.zeros((1, n))} for n in (4, 8, 8, 4, 8, 8, 8, 2)]
    assert [c["x"].shape[1] for c in qdq.choose_calls(calls, one_shape=True)] == [8] * 5
    spread = qdq.choose_calls([{"i": np.array(i)} for i in range(100)], one_shape=False, keep=5)
    assert [int(c["i"]) for c in spread] == [0, 25, 50, 74, 99]  # the first and last calls, evenly between
    assert len(qdq.choose_calls(calls, one_shape=False)) == len(calls)
