"""seer-build on CPU (docs/DESIGN.md "Engines and profiles", "Toolchain facts"): TensorRT-RTX parses the fixture graphs, adds profiles and builds plans
without a GPU; the manifest records the build; a failed build changes nothing; the TensorRT backend refuses
plans of another TensorRT version or GPU with the rebuild command. No test here needs a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from seer_trt.backends import open_backend
from seer_trt.backends.cuda import Device
from seer_trt.backends.tensorrt import check_build, rebuild_command
from seer_trt.build.engines import BuildOptions, parse_graph, plan_build
from seer_trt.cli.build import main
from seer_trt.contracts.errors import ConfigError, EngineError, ManifestError
from seer_trt.contracts.manifest import MANIFEST_FILE, SCHEMA_VERSION, EngineBuild, Manifest
from seer_trt.contracts.profiles import Range

BUILT = ("embed", "step_zero")  # the smallest graph and a window graph: enough for the path, quick on 2 cores
PROFILES = ("answer=16,64",)


@pytest.fixture(scope="module")
def trt():
    """TensorRT-RTX (``pip install -e .[all]`` installs tensorrt-rtx-cu12); CPU machines build with it."""
    import tensorrt_rtx

    return tensorrt_rtx


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def export_copy(fixture_export, tmp_path_factory) -> Path:
    """A private copy of the shared fixture export (a build rewrites its manifest)."""
    folder = tmp_path_factory.mktemp("build") / "export"
    shutil.copytree(fixture_export[0], folder)
    return folder


@pytest.fixture(scope="module")
def rtx_build(export_copy) -> tuple[Path, str, bytes]:
    """The fixture's embed and step_zero graphs built by seer-build with TensorRT-RTX: (folder, stdout, the
    manifest before the build)."""
    before = (export_copy / MANIFEST_FILE).read_bytes()
    rc, out, err = cli("--engines", str(export_copy), "--builder", "tensorrt-rtx", "--graphs", *BUILT,
                       "--profiles", *PROFILES, "--opt-level", "0")  # fmt: skip
    assert rc == 0, err
    return export_copy, out, before


@pytest.mark.slow
def test_every_fixture_graph_parses_with_the_manifests_inputs(trt, export_copy):
    manifest = Manifest.read(export_copy)
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    for name, entry in manifest.graphs.items():
        network, _ = parse_graph(trt, builder, logger, entry, export_copy / entry.file)
        assert network.num_inputs == len(entry.spec.inputs)
        for i, t in enumerate(entry.spec.inputs):  # dynamic axes stay dynamic (-1), model axes are fixed
            shape = tuple(network.get_input(i).shape)
            assert shape == tuple(-1 if isinstance(a, str) else a for a in t.shape), (name, t.name, shape)


@pytest.mark.slow
def test_rtx_build_writes_plans_with_their_profiles_and_records_them(trt, rtx_build):
    folder, out, _ = rtx_build
    manifest = Manifest.read(folder)
    prompt = manifest.buckets.prompt  # the fixture's: one range 1 .. largest, opt at the middle bucket
    prompt_range = Range(1, prompt[(len(prompt) - 1) // 2], prompt[-1])
    assert manifest.schema_version == SCHEMA_VERSION
    build = manifest.builds["tensorrt-rtx"]
    assert (build.builder, build.version) == ("tensorrt-rtx", trt.__version__)
    assert (build.device, build.compute_capability) == ("", "")  # ahead of time, no GPU: portable plans
    assert set(build.engines) == set(BUILT)
    assert manifest.engines["tensorrt-rtx"] == {g: f"tensorrt-rtx/{g}.plan" for g in BUILT}
    step_zero = build.engines["step_zero"]
    assert [p.range("answer") for p in step_zero.profiles] == [Range(1, 16, 16), Range(17, 64, 64)]
    assert [p.range("prompt") for p in step_zero.profiles] == [prompt_range] * 2
    runtime = trt.Runtime(trt.Logger(trt.Logger.INTERNAL_ERROR))
    bad = int(trt.EngineInvalidityDiagnostics.MALFORMED_ENGINE) | int(trt.EngineInvalidityDiagnostics.VERSION_MISMATCH)
    for graph, engine in build.engines.items():
        plan = (folder / engine.file).read_bytes()
        assert engine.size_bytes == len(plan) > 0
        _, diagnostics = runtime.get_engine_validity(plan[: runtime.engine_header_size])
        assert diagnostics & bad == 0, (graph, diagnostics)  # a well-formed plan of this TensorRT-RTX
        source = (folder / f"{graph}.onnx").read_bytes() + (folder / manifest.weights.file).read_bytes()
        assert engine.onnx_sha256 == hashlib.sha256(source).hexdigest()  # the graph and the weights it reads
    assert "built tensorrt-rtx/step_zero.plan: 2 profile(s)" in out
    assert "plans hold" in out and "of weights" in out  # what a serving GPU holds
    assert f"[1] batch 1..16 (opt 4), prompt 1..{prompt[-1]} (opt {prompt_range.opt}), answer 17..64 (opt 64)" in out


@pytest.mark.slow
def test_build_changes_nothing_else_in_the_manifest(rtx_build):
    folder, _, before = rtx_build
    old = Manifest.from_dict(json.loads(before))
    new = Manifest.read(folder)
    assert dataclasses.replace(new, schema_version=old.schema_version, builds={}, engines=old.engines) == old
    assert not list(folder.glob(".tensorrt-rtx.*"))  # no staging or old folders left behind


@pytest.mark.slow
def test_a_failed_build_leaves_the_previous_plans_and_manifest(rtx_build):
    folder, _, _ = rtx_build
    original_manifest = (folder / MANIFEST_FILE).read_bytes()
    plans = {p.name: p.read_bytes() for p in (folder / "tensorrt-rtx").iterdir()}
    onnx = folder / "step_zero.onnx"
    original = onnx.read_bytes()
    broken = b"not an onnx graph"
    manifest = Manifest.read(folder)  # its checksum made to match, so the build gets as far as TensorRT's parser
    sums = {**manifest.checksums, "step_zero.onnx": hashlib.sha256(broken).hexdigest()}
    dataclasses.replace(manifest, checksums=sums).write(folder)
    manifest_bytes = (folder / MANIFEST_FILE).read_bytes()
    try:
        onnx.write_bytes(broken)
        rc, out, err = cli("--engines", str(folder), "--builder", "tensorrt-rtx", "--graphs", *BUILT,
                           "--profiles", *PROFILES, "--opt-level", "0")  # fmt: skip
        assert rc == 2 and "cannot parse" in err and "step_zero" in err and err.count("\n") == 1
        assert "built tensorrt-rtx/embed.plan" in out  # it got that far before failing
        assert (folder / MANIFEST_FILE).read_bytes() == manifest_bytes
        assert {p.name: p.read_bytes() for p in (folder / "tensorrt-rtx").iterdir()} == plans
        assert not list(folder.glob(".tensorrt-rtx.*"))
    finally:
        onnx.write_bytes(original)
        (folder / MANIFEST_FILE).write_bytes(original_manifest)


@pytest.mark.slow
def test_dry_run_prints_the_plan_and_builds_nothing(export_copy):
    before = (export_copy / MANIFEST_FILE).read_bytes()
    rc, out, err = cli("--engines", str(export_copy), "--dry-run", "--profiles", "answer=16,32,64", "split=answer")
    assert rc == 0, err
    denoise = out.split("denoise: 6 profile(s)")[1]  # each answer range computing the prompt, then a cached step
    assert "answer 33..64 (opt 64)" in out and "[6]" not in denoise
    assert "[2] batch 1..16 (opt 4), prompt 1..512 (opt 128), answer 33..64 (opt 64), past 0..0 (opt 0)" in denoise
    assert "[5] batch 1..16 (opt 4), prompt 0..0 (opt 0), answer 33..64 (opt 64), past 1..512 (opt 128), " in denoise
    assert "vision: 1 profile(s)" in out and "tiles 1..16 (opt 1)" in out
    assert (export_copy / MANIFEST_FILE).read_bytes() == before
    assert not (export_copy / "tensorrt").exists()


@pytest.mark.slow
def test_plan_build_uses_the_manifest_buckets(export_copy):
    manifest = Manifest.read(export_copy)
    plan = plan_build(manifest, BuildOptions(export_copy))
    assert set(plan.graphs) == set(manifest.graphs)
    answers = list(manifest.buckets.answer)  # computing the prompt, then cached steps over the cached length
    assert [p.range("answer").max for p in plan.profiles("denoise")] == answers + answers
    assert [p.range("past").max for p in plan.profiles("denoise")] == [0] * len(answers) + [
        manifest.buckets.prompt[-1]] * len(answers)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv, match",
    [
        (("--engines", "{missing}"), "not an export folder"),
        (("--engines", "{export}", "--profiles", "answer=64,16"), "increasing"),
        (("--engines", "{export}", "--graphs", "denoise", "decoder"), "no 'decoder' graph"),
        (("--engines", "{export}", "--opt-level", "9"), "outside 0-5"),
        (("--engines", "{export}", "--builder", "tensorrt"), "tensorrt"),  # not installed, or no GPU here
    ],
)
def test_bad_input_is_one_line_and_exit_2(export_copy, tmp_path, argv, match):
    args = [a.format(missing=tmp_path / "nothing", export=export_copy) for a in argv]
    rc, out, err = cli(*args)
    assert rc == 2 and match in err and err.count("\n") == 1 and err.startswith("seer-build: error:")
    assert not (export_copy / "tensorrt").exists()


def test_unknown_flag_values_are_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--engines", "x", "--builder", "onnx"])
    assert exit_.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_help_imports_nothing_heavy():
    code = (
        "import sys\nfrom seer_trt.cli.build import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "heavy = [m for m in ('tensorrt', 'tensorrt_rtx', 'onnxruntime', 'torch') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("[]") and "--timing-cache" in out.stdout


# --- the TensorRT backend's refusals, from the manifest's record (no GPU needed) ---------------------------------

RECORD = EngineBuild("tensorrt", "11.1.0", "NVIDIA H200", "9.0", "tensorrt/timing.cache", "2026-11-30T00:00:00+00:00",
                     {})  # fmt: skip
H200 = Device("NVIDIA H200", "9.0")


def test_matching_version_and_gpu_are_accepted():
    check_build(RECORD, "tensorrt", "11.1.0", H200, "engines/x")
    rtx = dataclasses.replace(RECORD, builder="tensorrt-rtx", device="", compute_capability="")
    check_build(rtx, "tensorrt-rtx", "11.1.0", Device("NVIDIA RTX 4090", "8.9"), "engines/x")  # portable plans


@pytest.mark.parametrize(
    "record, version, device, found",
    [
        (None, "11.1.0", H200, "has no tensorrt engines"),
        (RECORD, "11.2.0", H200, "built by tensorrt 11.1.0, this machine has 11.2.0"),
        (RECORD, "11.1.0", Device("NVIDIA H100 80GB HBM3", "9.0"), "built for NVIDIA H200 (compute capability 9.0)"),
        (RECORD, "10.9.0", Device("NVIDIA A100-SXM4-80GB", "8.0"), "11.1.0, this machine has 10.9.0 and were built"),
    ],
)
def test_other_version_or_gpu_is_refused_with_the_rebuild_command(record, version, device, found):
    with pytest.raises(EngineError) as err:
        check_build(record, "tensorrt", version, device, "engines/x")
    message = str(err.value)
    assert found in message and "`seer-build --engines engines/x`" in message and "\n" not in message


def test_no_gpu_is_refused_before_any_plan_is_read():
    with pytest.raises(EngineError, match="need a CUDA GPU and this machine has none"):
        check_build(RECORD, "tensorrt", "11.1.0", None, "engines/x")


def test_rebuild_command_names_the_flavour():
    assert rebuild_command("e", "tensorrt") == "seer-build --engines e"
    assert rebuild_command("e", "tensorrt-rtx") == "seer-build --engines e --builder tensorrt-rtx"


@pytest.mark.slow
def test_open_backend_tensorrt_without_a_build_names_seer_build(export_copy):
    manifest = dataclasses.replace(Manifest.read(export_copy), builds={})
    with pytest.raises(EngineError, match=f"build them with `seer-build --engines {export_copy}`"):
        open_backend(export_copy, manifest, "tensorrt")
    with pytest.raises(ConfigError, match="'tensorrt' or 'tensorrt-rtx'"):
        open_backend(export_copy, manifest, "tensorflow")


@pytest.mark.slow
def test_a_malformed_build_record_is_a_manifest_error(rtx_build, tmp_path):
    data = json.loads((rtx_build[0] / MANIFEST_FILE).read_text())
    data["builds"]["tensorrt-rtx"]["engines"]["step_zero"]["profiles"][0]["answer"] = [16, 1, 16]
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="min <= opt <= max"):
        Manifest.read(tmp_path)
