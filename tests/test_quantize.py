"""seer-quantize (export/quantize.py): int8 / int4 window graphs through ONNX Runtime's quantizers, run by the
unchanged runtime; the source's step zero kept, so Seer's cut is the same."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys

import onnx
import pytest
from ort_sessions import prepacks

from seer_export.onnx.shared_weights import CONSTANT_PREFIX
from seer_export.quantize import main
from seer_trt.build.engines import BuildError, BuildOptions, run_build
from seer_trt.contracts.manifest import Manifest
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request

pytestmark = pytest.mark.slow


def quantize(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def quantized(fixture_export, tmp_path_factory) -> dict[str, object]:
    # a source whose shared weights have a second hard link, as a Triton repository of it makes: onnx.load refuses
    # such external data ("potential hardlink attack"), so seer-quantize must read the weights itself
    src = tmp_path_factory.mktemp("linked") / "src"
    shutil.copytree(fixture_export[0], src)
    os.link(src / "weights.data", src.parent / "linked.data")
    out = {}
    for scheme in ("int8", "int4"):
        dst = tmp_path_factory.mktemp(scheme) / "q"
        rc, stdout, stderr = quantize("--engines", str(src), "--scheme", scheme, "--out", str(dst), "--check", "8")
        assert rc == 0, stderr
        assert stdout.strip() == str(dst.resolve()) and "check: " in stderr
        out[scheme] = dst
    return out


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_a_quantized_export_records_its_scheme_and_runs_unchanged(fixture_export, quantized, scheme):
    src, dst = fixture_export[0], quantized[scheme]
    before, after = Manifest.read(src), Manifest.read(dst)
    q = after.graph("denoise").quantization
    assert q["scheme"] == scheme and q["runtime"] == "onnxruntime-cpu" and q["tool"].startswith("onnxruntime")
    assert all(after.graph(g).quantization is None for g in ("step_zero", "embed", "vision"))  # what Seer reads stays
    assert after.graph("step_zero").to_dict() == before.graph("step_zero").to_dict()
    # the check: Seer's cut is the source's on every prompt (step zero is unchanged), most answers too
    assert q["check"]["prompts"] == 8 and q["check"]["same_kept"] == 8 and q["check"]["same_answers"] >= 6
    graph = onnx.load(str(dst / after.graph("denoise").file), load_external_data=False).graph
    rotations = [n for n in graph.node if n.input[1:2] and n.input[1].startswith(CONSTANT_PREFIX)]
    assert rotations and all(n.op_type == "MatMul" for n in rotations)  # RoPE's exact +-1 rotation stays float
    shrink = {"int8": 3.0, "int4": 5.0}[scheme]  # fp32 -> 1 byte, or 4 bits plus a scale per 32
    assert after.graph("denoise").size_bytes * shrink < before.graph("denoise").size_bytes
    pipe = SeerPipeline.from_manifest(dst, threads=1)  # checksums verified: the record matches the files
    result = pipe.generate([Request("count to 5 .", cache="none")])[0]
    assert result.ok and result.text == "1 2 3 4 5"
    # its own weights, prepacked (the shared-weights sessions turn prepacking off; MatMulNBits then runs 5x slower)
    assert prepacks(pipe.backend, "denoise") and not prepacks(pipe.backend, "step_zero")
    pipe.close()


def test_what_seer_quantize_refuses_is_one_line_and_writes_nothing(fixture_export, quantized, tmp_path):
    src = fixture_export[0]
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("keep")
    cases = [
        (["--engines", str(quantized["int8"]), "--scheme", "int4", "--out", str(tmp_path / "a")], "quantized already"),
        (["--engines", str(src), "--scheme", "int8", "--out", str(src)], "is the export being quantized"),
        (["--engines", str(src), "--scheme", "int8", "--out", str(user)], str(user)),
        (["--engines", str(src), "--scheme", "int8", "--check", "-1"], "--check -1 must be at least 0"),
        (["--engines", str(tmp_path / "none"), "--scheme", "int8"], "not an export folder"),
    ]
    for argv, words in cases:
        rc, _, err = quantize(*argv)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and words in err, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"] and (user / "notes.txt").read_text() == "keep"
    r = subprocess.run([sys.executable, "-m", "seer_export.quantize", "--engines", str(src), "--scheme", "fp8"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and "invalid choice: 'fp8'" in r.stderr


def test_seer_build_lists_a_quantized_exports_profiles_and_refuses_to_build_it(quantized):
    lines: list[str] = []
    plan = run_build(BuildOptions(engines=quantized["int8"], dry_run=True), log=lines.append)
    assert "denoise" in plan.graphs and plan.profiles("denoise")
    assert any("denoise: quantized int8 for ONNX Runtime's CPU provider" in line for line in lines)
    with pytest.raises(BuildError, match="quantized for ONNX Runtime's CPU provider"):
        run_build(BuildOptions(engines=quantized["int8"]), log=lines.append)
    manifest = json.loads((quantized["int8"] / "manifest.json").read_text())
    assert manifest["builds"] == {} and manifest["engines"] == {}  # nothing built, nothing half-recorded
