"""seer-triton (docs/DESIGN.md "Serving and embedding"): repositories generated strictly and checked against the manifest, and the CPU flavour
served by a real ``tritonserver`` (the binary bundled in nvidia-pytriton) on 127.0.0.1, answering over HTTP and
gRPC exactly as ``seer-run`` does, under concurrent load and after malformed requests."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from cli_capture import cli
from PIL import Image

from seer_trt.cli.run import main as run_main
from seer_trt.cli.triton import main as triton_main
from seer_trt.contracts.config import SeerConfig
from seer_trt.contracts.errors import ConfigError
from seer_trt.contracts.graphs import top_k
from seer_trt.contracts.manifest import Manifest
from seer_trt.eval.tasks import make_samples
from seer_trt.runtime.step_zero import step_zero_graph
from seer_trt.serving.triton import pbtxt
from seer_trt.serving.triton.local import LocalServer, ServerInstall
from seer_trt.serving.triton.repository import check_repository, plan_repository, served_graphs, write_repository

CONCURRENT = 24  # requests in flight at once: half over HTTP, half over gRPC
TIMEOUT_S = 600  # per request on a busy 2-core machine


@pytest.fixture(scope="module")
def cpu_repo(fixture_export, tmp_path_factory) -> Path:
    folder, _, _ = fixture_export
    repo = tmp_path_factory.mktemp("triton") / "repo"
    rc, out, err = cli(triton_main, ["--engines", str(folder), "--out", str(repo), "--flavour", "cpu",
                                     "--orchestration", "bls"])  # fmt: skip  # the default: test_triton_stream.py
    assert rc == 0, err
    assert out.splitlines()[0] == "seer: python" and "wrote" in err
    return repo


def configs(repo: Path) -> dict[str, object]:
    return {p.parent.name: pbtxt.parse(p.read_text(), str(p)) for p in sorted(repo.glob("*/config.pbtxt"))}


def io_of(config, which: str) -> list[tuple[str, str, list[int]]]:
    return [(t.name, t.data_type, list(t.dims)) for t in pbtxt.tensors(config, which)]


@pytest.mark.slow
def test_cpu_repository_configs_parse_and_match_the_manifest(cpu_repo, fixture_export):
    _, manifest, _ = fixture_export
    found = configs(cpu_repo)
    assert step_zero_graph(manifest.seer) == "step_zero"  # the fixture's calibration: a probe, the early exit
    graphs = ["embed", "vision", "step_zero", "denoise", "denoise_logits"]
    assert sorted(found) == sorted(["seer"] + [f"seer_{g}" for g in graphs])
    assert check_repository(cpu_repo) == sorted(found)
    seer = found["seer"]
    assert seer.backend == "python" and seer.max_batch_size == manifest.buckets.batch[-1]
    assert [t[0] for t in io_of(seer, "input")] == [
        "prompt",
        "image",
        "gen_length",
        "steps",
        "seer",
        "decoding",
        "early_stop",
        "remasking",
        "temperature",
        "seed",
        "top_p",
        "stop",
        "cache",
        "refresh_interval",
        "window",
        "system",
        "history",
        "stream",
    ]
    assert [t[0] for t in io_of(seer, "output")] == ["text", "token_ids", "kept", "denoise_steps"]
    assert json.loads(pbtxt.parameters(seer)["components"]) == {g: f"seer_{g}" for g in graphs}
    hidden = manifest.model.hidden_size
    denoise = found["seer_denoise"]
    layers, heads = manifest.model.num_layers, manifest.model.num_heads
    head_dim = hidden // heads
    past = [
        (f"past_key_values.{i}.{kv}", "TYPE_FP32", [-1, -1, heads, -1, head_dim])
        for i in range(layers)
        for kv in ("key", "value")
    ]  # [history, batch, heads, past, head_dim]
    assert io_of(denoise, "input") == [("prefix_embeds", "TYPE_FP32", [-1, -1, hidden]),
                                       ("gen_ids", "TYPE_INT64", [-1, -1]), ("segment_ids", "TYPE_INT32", [-1, -1]),
                                       ("position_ids", "TYPE_INT64", [-1, -1]), ("past_weights", "TYPE_FP32", [-1]),
                                       *past]  # fmt: skip
    present = [
        (f"present.{i}.{kv}", "TYPE_FP32", [-1, heads, -1, head_dim]) for i in range(layers) for kv in ("key", "value")
    ]  # [batch, heads, prompt, head_dim]
    k = top_k(manifest.model.vocab_size)  # the most probable ids the host samples from
    assert io_of(denoise, "output") == [("x0", "TYPE_INT64", [-1, -1]), ("log_confidence", "TYPE_FP32", [-1, -1]),
                                        ("p_end", "TYPE_FP32", [-1, -1]), ("top_logits", "TYPE_FP32", [-1, -1, k]),
                                        ("top_ids", "TYPE_INT64", [-1, -1, k]), *present]  # fmt: skip
    assert json.loads(pbtxt.parameters(seer)["cache"])["mode"] == "none"
    assert io_of(found["seer_vision"], "input") == [("pixel_values", "TYPE_FP32", [-1, 3, 32, 32])]
    assert denoise.backend == "python" and pbtxt.parameters(denoise)["model_file"] == "denoise.onnx"
    assert (cpu_repo / "seer_denoise" / "1" / "denoise.onnx").is_file()
    shared = [(cpu_repo / f"seer_{g}" / "1" / "weights.data").stat() for g in graphs]  # each component reads it,
    assert len({(s.st_dev, s.st_ino) for s in shared}) == 1  # one file on disk: hard links, not copies
    assert (cpu_repo / "seer" / "1" / "export" / "tokenizer" / "tokenizer.json").is_file()
    assert Manifest.read(cpu_repo / "seer" / "1" / "export") == manifest


@pytest.mark.slow
def test_relative_and_linked_engines_paths_write_the_repository(fixture_export, tmp_path, monkeypatch):
    """``--engines`` as typed: relative (with ``..``) and through a link, from another folder (issue 42: the
    tokenizer's resolved path was compared with the folder as given, a traceback); the repository names the export
    resolved once, so it means the same from wherever the server starts."""
    import os

    folder = fixture_export[0]
    monkeypatch.chdir(tmp_path)
    Path("exports").symlink_to(folder.parent)
    for n, engines in enumerate([os.path.relpath(folder, tmp_path), f"exports/{folder.name}"]):
        rc, out, err = cli(triton_main, ["--engines", engines, "--out", f"repo{n}", "--flavour", "cpu"])
        assert rc == 0 and "Traceback" not in err, err
        assert json.loads(Path(f"repo{n}/.seer-triton.json").read_text())["source"] == str(folder.resolve())
        assert check_repository(f"repo{n}") == sorted(p.name for p in Path(f"repo{n}").iterdir() if p.is_dir())
    # where the models import seer_trt from, whatever folder the server starts in (not only this checkout's root)
    code = pbtxt.parameters(configs(Path("repo0"))["seer"])["seer_trt_path"]
    assert (Path(code) / "seer_trt" / "__init__.py").is_file(), code


@pytest.mark.slow
def test_the_orchestrator_carries_the_cache_policy_it_was_given(fixture_export):
    from seer_trt.contracts.policies import CacheConfig
    from seer_trt.serving.triton.repository import plan_repository

    folder, _, _ = fixture_export
    (orchestrator,) = [m for m in plan_repository(folder, "cpu", orchestration="bls").models if m.name == "seer"]
    assert json.loads(dict(orchestrator.parameters)["cache"]) == CacheConfig("none").to_dict()  # the default there
    cached = plan_repository(folder, "cpu", cache=CacheConfig("forecast", 3, 2))
    (orchestrator,) = [m for m in cached.models if m.name == "seer"]
    assert CacheConfig.from_dict(json.loads(dict(orchestrator.parameters)["cache"])) == CacheConfig("forecast", 3, 2)


@pytest.mark.slow
def test_served_graphs_follow_the_calibration(fixture_export):
    """The early exit where the signal lives below the head; only the window graph for the end-token fallback;
    denoise_logits where the export has it (--sampling)."""
    _, manifest, _ = fixture_export
    assert served_graphs(manifest) == ["embed", "vision", "step_zero", "denoise", "denoise_logits"]
    end_token = dataclasses.replace(manifest, seer=SeerConfig(signal="end_token_prob"))
    assert served_graphs(end_token) == ["embed", "vision", "denoise", "denoise_logits"]
    greedy_only = dataclasses.replace(
        manifest, graphs={g: e for g, e in manifest.graphs.items() if g != "denoise_logits"}
    )
    assert served_graphs(greedy_only) == ["embed", "vision", "step_zero", "denoise"]


@pytest.mark.slow
def test_gpu_flavour_uses_tensorrt_plans_and_onnxruntime_without_them(fixture_export, tmp_path):
    folder, manifest, _ = fixture_export
    export = tmp_path / "export"
    shutil.copytree(folder, export)
    rc, out, err = cli(triton_main, ["--engines", str(export), "--out", str(tmp_path / "ort"), "--name", "llada",
                                   "--orchestration", "bls"])  # fmt: skip
    assert rc == 0, err
    found = configs(tmp_path / "ort")
    assert set(found) >= {"llada", "llada_denoise"}
    denoise = found["llada_denoise"]
    assert denoise.platform == "onnxruntime_onnx" and denoise.default_model_filename == "denoise.onnx"
    accelerator = denoise.optimization.execution_accelerators.gpu_execution_accelerator[0]
    assert accelerator.name == "tensorrt" and accelerator.parameters["precision_mode"] == "FP32"
    kinds = pbtxt.schema().ModelInstanceGroup.Kind
    assert [kinds.Name(g.kind) for g in denoise.instance_group] == ["KIND_GPU"]
    # seer-build's record: a plan with two optimization profiles for denoise, a bare file name for embed
    (export / "denoise.plan").write_bytes(b"plan")
    (export / "embed.plan").write_bytes(b"plan")
    engines = {"tensorrt": {"denoise": {"file": "denoise.plan", "profiles": [{}, {}]}, "embed": "embed.plan"}}
    dataclasses.replace(manifest, engines=engines).write(export)
    rc, _, err = cli(triton_main, ["--engines", str(export), "--out", str(tmp_path / "trt"), "--orchestration", "bls"])
    assert rc == 0, err
    found = configs(tmp_path / "trt")
    assert found["seer_denoise"].platform == "tensorrt_plan"
    assert [list(g.profile) for g in found["seer_denoise"].instance_group] == [["0", "1"]]
    assert [list(g.profile) for g in found["seer_embed"].instance_group] == [["0"]]
    assert found["seer_vision"].platform == "onnxruntime_onnx"
    assert (tmp_path / "trt" / "seer_denoise" / "1" / "denoise.plan").read_bytes() == b"plan"
    assert io_of(found["seer_denoise"], "input") == io_of(configs(tmp_path / "ort")["llada_denoise"], "input")


@pytest.mark.slow
def test_gpu_flavour_reads_the_profiles_seer_build_recorded(fixture_export, tmp_path):
    from seer_trt.contracts.manifest import EngineBuild, EngineFile
    from seer_trt.contracts.profiles import plan_profiles

    folder, manifest, _ = fixture_export
    export = tmp_path / "export"
    shutil.copytree(folder, export)
    spec = manifest.graph("denoise").spec
    profiles = plan_profiles({"denoise": [(t.name, t.shape) for t in spec.inputs]}, manifest.buckets).graphs["denoise"]
    assert len(profiles) == 2 * len(manifest.buckets.answer) > 2  # per answer bucket: computing the prompt, cached
    (export / "denoise.plan").write_bytes(b"plan")
    plan = EngineFile("denoise.plan", "0" * 64, profiles, 4, 1.0)
    builds = {b: EngineBuild(b, "11.0", "", "", None, "2026-11-30T00:00:00Z", {"denoise": plan})
              for b in ("tensorrt", "tensorrt-rtx")}  # fmt: skip
    dataclasses.replace(manifest, builds=builds).write(export)
    found = configs(write_repository(plan_repository(export, "gpu", orchestration="bls"), tmp_path / "repo"))
    assert found["seer_denoise"].platform == "tensorrt_plan"
    assert [list(g.profile) for g in found["seer_denoise"].instance_group] == [[str(i) for i in range(len(profiles))]]
    del builds["tensorrt"]  # TensorRT-RTX plans alone: not for Triton's TensorRT backend, ONNX Runtime serves
    dataclasses.replace(manifest, builds=builds).write(export)
    found = configs(
        write_repository(plan_repository(export, "gpu", orchestration="bls"), tmp_path / "repo", force=True)
    )
    assert found["seer_denoise"].platform == "onnxruntime_onnx"


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (old, path)
    path.write_text(text.replace(old, new, 1))


@pytest.mark.slow
@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda r: _edit(r / "seer_embed" / "config.pbtxt", 'name: "seer_embed"', 'name: "embed"'),
         "differs from its folder"),
        (lambda r: _edit(r / "seer_denoise" / "config.pbtxt", "dims: [ -1, -1, 128 ]", "dims: [ -1, -1, 64 ]"),
         "differ from the manifest's 'denoise' graph"),
        (lambda r: _edit(r / "seer_denoise" / "config.pbtxt", "TYPE_FP32", "TYPE_FP16"),
         "differ from the manifest's 'denoise' graph"),
        (lambda r: (r / "seer_denoise" / "1" / "denoise.onnx").unlink(), "seer_denoise: 1/denoise.onnx is missing"),
        (lambda r: shutil.rmtree(r / "seer_vision"), "no such model"),
        (lambda r: _edit(r / "seer_embed" / "config.pbtxt", "kind: KIND_CPU", 'kind: KIND_CPU\n  profile: [ "0" ]'),
         "name profiles ['0'] but it is no TensorRT plan"),
        (lambda r: _edit(r / "seer" / "config.pbtxt", "max_batch_size", "max_batch_sise"), "not a valid Triton"),
    ],
)  # fmt: skip
def test_checks_name_what_is_wrong(cpu_repo, tmp_path, damage, words):
    repo = tmp_path / "repo"
    shutil.copytree(cpu_repo, repo)
    damage(repo)
    with pytest.raises(ConfigError) as err:
        check_repository(repo)
    assert words in str(err.value)


@pytest.mark.slow
def test_tensorrt_profile_indices_must_exist(fixture_export, tmp_path):
    folder, manifest, _ = fixture_export
    export = tmp_path / "export"
    shutil.copytree(folder, export)
    (export / "denoise.plan").write_bytes(b"plan")
    dataclasses.replace(manifest, engines={"tensorrt": {"denoise": {"file": "denoise.plan", "profiles": 2}}}).write(
        export
    )
    repo = write_repository(plan_repository(export, "gpu", orchestration="bls"), tmp_path / "repo")
    _edit(repo / "seer_denoise" / "config.pbtxt", 'profile: [ "0", "1" ]', 'profile: [ "0", "2" ]')
    with pytest.raises(ConfigError, match=r"seer_denoise: profile indices \['2'\] do not exist \(the plan records 2"):
        check_repository(repo)


@pytest.mark.slow
def test_templates_are_strict_and_checked_by_parsing(fixture_export):
    plan = plan_repository(fixture_export[0], "cpu", orchestration="bls")
    model = plan.models[1]
    lacking = types.SimpleNamespace(**{k: v for k, v in vars(model).items() if k != "accelerator"})
    with pytest.raises(ConfigError, match="the config template needs a value the plan lacks"):
        pbtxt.render(lacking, "test")
    with pytest.raises(ConfigError, match="not a valid Triton model configuration"):
        pbtxt.render(dataclasses.replace(model, max_batch_size="many"), "test")
    with pytest.raises(ConfigError, match="data type 'TYPE_FLOAT'"):
        pbtxt.TensorConfig("x", "TYPE_FLOAT", (1,))


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv, words",
    [
        (["--engines", "{tmp}/none", "--out", "{tmp}/repo"], "not an export folder"),
        (["--engines", "{export}", "--out", "{repo}"], "already holds a model repository; pass --force"),
        (["--engines", "{export}", "--out", "{tmp}/repo", "--flavour", "tpu"], "invalid choice"),
        (["--engines", "{export}", "--out", "{tmp}/repo", "--name", "a/b"], "must be letters, digits"),
        (["--engines", "{export}", "--out", "{tmp}/repo", "--instances", "0"], "expected >= 1"),
        (["--out", "{tmp}/repo"], "the following arguments are required: --engines"),
    ],
)
def test_seer_triton_errors_are_one_line_exit_2(fixture_export, cpu_repo, tmp_path, argv, words):
    argv = [a.format(tmp=tmp_path, export=fixture_export[0], repo=cpu_repo) for a in argv]
    rc, out, err = cli(triton_main, argv)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and words in err, err
    assert not list(tmp_path.glob(".repo.partial-*"))  # nothing half-written is left


@pytest.mark.slow
def test_force_replaces_a_repository_and_help_is_light(fixture_export, cpu_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(cpu_repo, repo)
    (repo / "stale").mkdir()  # not seer-triton's: --force refuses, and keeps it
    argv = ["--engines", str(fixture_export[0]), "--out", str(repo), "--flavour", "cpu", "--force"]
    rc, _, err = cli(triton_main, argv)
    assert rc == 2 and "did not write (stale/)" in err and (repo / "stale").is_dir()
    (repo / "stale").rmdir()
    rc, _, err = cli(triton_main, argv)
    assert rc == 0, err
    assert check_repository(repo)
    code = (
        "import sys\nfrom seer_trt.cli.triton import main\ntry:\n    main(['--help'])\nexcept SystemExit as e:\n"
        "    assert e.code == 0\nheavy = {'onnxruntime', 'jinja2', 'tritonclient', 'tokenizers', 'PIL', 'torch'}\n"
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


# ---- client errors and limits, without a server ----------------------------------------------------------------


class WireTensor:
    def __init__(self, value) -> None:
        self.value = np.asarray(value, dtype=np.object_ if isinstance(value[0][0], bytes) else None)

    def as_numpy(self):
        return self.value


class WireError:
    INTERNAL, INVALID_ARG = "INTERNAL", "INVALID_ARG"  # the Python backend's TritonError codes

    def __init__(self, message: str, code: str = "INTERNAL") -> None:
        self.text, self.code = message, code


class WireResponse:
    def __init__(self, output_tensors=(), error=None) -> None:
        self.outputs, self.error = {t.name: t for t in output_tensors}, error


class WireTritonTensor:
    def __init__(self, name: str, value) -> None:
        self.name, self.value = name, value


def wire_pb(error=WireError) -> types.SimpleNamespace:
    """The little of ``triton_python_backend_utils`` that ``read_request`` and ``Model.execute`` use."""
    return types.SimpleNamespace(get_input_tensor_by_name=lambda request, name: request.get(name), TritonError=error,
                                 InferenceResponse=WireResponse, Tensor=WireTritonTensor)  # fmt: skip


def wire_request(prompt, image: bytes | None = None) -> dict:
    request = {"prompt": WireTensor([[prompt]])}
    if image is not None:
        request["image"] = WireTensor([[image]])
    return request


def test_read_request_measures_prompt_and_image_bytes_before_decoding():
    from seer_trt.contracts.errors import InputError
    from seer_trt.serving.triton.orchestrator import ByteLimits, read_request

    pb, limits = wire_pb(), ByteLimits(prompt_chars=10, image_bytes=100)
    assert limits.prompt_bytes == 40  # UTF-8: at most 4 bytes a character
    (request,) = read_request(pb, wire_request("é".encode() * 20, b"x" * 100), limits)  # 40 bytes, 20 characters
    assert request.prompt == "é" * 20 and request.image == b"x" * 100
    # invalid UTF-8 past the limit: refused for its size, so it was never decoded
    with pytest.raises(InputError) as err:
        read_request(pb, wire_request(b"\xff" * 41), limits)
    assert (
        str(err.value)
        == "prompt is 41 bytes, more than the 40 accepted (4 per character of the 10 max_prompt_chars); shorten it"
    )
    with pytest.raises(InputError, match=r"^image is 101 bytes, more than the 100 accepted \(max_image_bytes\)"):
        read_request(pb, wire_request(b"count", b"x" * 101), limits)
    with pytest.raises(InputError, match="not UTF-8"):  # within the limit: decoded, and refused for what it holds
        read_request(pb, wire_request(b"\xff" * 40), limits)
    assert len(read_request(pb, wire_request(b"a" * 10**6))) == 1  # no limits given: none applied here


class FakePipeline:
    """``Model.execute``'s view of ``SeerPipeline``: its limits."""

    def __init__(self) -> None:
        self.prompts = types.SimpleNamespace(max_chars=10)
        self.image_limits = types.SimpleNamespace(bytes=100)


class FakeEngine:
    """The orchestrator's view of ``Engine``, answering by prompt: a request fails ("bad", "broken", "crash": a
    failed call whose rows the engine retried alone, ``Engine._retry_or_fail``), or the engine closed under it."""

    limits = types.SimpleNamespace(max_answer_chars=100)

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def submit(self, request):
        from concurrent.futures import Future

        return types.SimpleNamespace(request=request, future=Future())

    def run_until(self, tickets) -> None:
        from seer_trt.runtime.engine import Cancelled, why
        from seer_trt.runtime.request import Result

        prompts = [t.request.prompt for t in tickets]
        self.batches.append(prompts)
        for t, p in zip(tickets, prompts, strict=True):
            if p == "gone":  # the engine closed under it: its ticket raises
                t.future.set_exception(Cancelled("the server is shutting down"))
                continue
            t.future.set_result(Result.failed(why(RuntimeError("the denoise component is gone")), "internal")
                                if p == "crash"
                                else Result.failed("bad gen_length", "input") if p == "bad"
                                else Result.failed("a component failed", "internal") if p == "broken"
                                else Result("ok", (1,), (1,), 1, 1, 1, {}))  # fmt: skip


def test_client_errors_answer_invalid_arg_and_other_failures_internal():
    from seer_trt.serving.triton.orchestrator import Model

    model = Model.__new__(Model)  # what Model.__init__ builds inside the server, without the server
    model.pb, model.pipeline, model.engine = wire_pb(), FakePipeline(), FakeEngine()
    prompts = [b"ok", b"\xff", b"a" * 41, 7, b"bad", b"broken", b"crash", b"gone", b"ok"]
    responses = model.execute([wire_request(p) for p in prompts])
    # one batch of the readable rows: a failed call's retry is the engine's (tests/test_engine.py), not the model's
    assert model.engine.batches == [["ok", "bad", "broken", "crash", "gone", "ok"]]
    codes = [r.error.code if r.error else None for r in responses]
    assert codes == [None, "INVALID_ARG", "INVALID_ARG", "INVALID_ARG", "INVALID_ARG", "INTERNAL", "INTERNAL",
                     "INTERNAL", None]  # fmt: skip
    assert responses[7].error.text == "the server is shutting down"
    assert "not UTF-8" in responses[1].error.text and "41 bytes, more than the 40" in responses[2].error.text
    assert responses[6].error.text == "RuntimeError: the denoise component is gone"
    assert responses[8].outputs["text"].value.tolist() == [[b"ok"]]  # the others are answered

    class OldError:  # a Python backend before error codes: TritonError(message) only
        def __init__(self, message: str) -> None:
            self.text, self.code = message, "INTERNAL"

    model.pb = wire_pb(OldError)
    responses = model.execute([wire_request(b"\xff"), wire_request(b"ok")])
    assert responses[0].error.code == "INTERNAL" and "not UTF-8" in responses[0].error.text
    assert responses[1].error is None


SERVER_LOG = (
    """W1201 16:29:01.427477 18412 pinned_memory_manager.cc:273] "Unable to allocate pinned system memory"
E1201 16:29:01.427758 18412 server.cc:241] "CudaDriverHelper has not been initialized."
E1201 16:29:01.429300 18412 model_lifecycle.cc:654] "failed to load 'seer' version 1: Internal: RuntimeError: """
    + "x" * 500
    + """"
E1201 16:29:01.429301 18412 model_lifecycle.cc:654] "a later error"
+----------------------------------+----------+
| server_version                   | 2.51.0   |
+----------------------------------+----------+
error: creating server: Internal - failed to load all models
"""
)


def test_first_error_quotes_the_cause_not_the_log():
    from seer_trt.serving.triton.local import CAUSE_CHARS, first_error

    cause = first_error(SERVER_LOG)
    first, exit_line = cause.split("; ")
    assert first.startswith("failed to load 'seer' version 1: Internal: RuntimeError: xxx") and first.endswith("...")
    assert len(first) == CAUSE_CHARS and exit_line == "creating server: Internal - failed to load all models"
    assert first_error("I1201 16:29:01.1 1 server.cc:1] starting\nno errors here\n") == "no errors here"
    assert first_error("") == "the log is empty"


@pytest.fixture
def fake_install(tmp_path) -> Path:
    """A complete-looking install whose tritonserver only records that it was started."""
    home = tmp_path / "home"
    install = ServerInstall(home)
    for folder in (install.binary.parent, install.libs, install.python.parent):
        folder.mkdir(parents=True)
    install.binary.write_text(f"#!/bin/sh\ntouch {tmp_path / 'started'}\n")
    install.binary.chmod(0o755)
    install.python.symlink_to(sys.executable)
    install.stamp.write_text("fake\n")
    return home


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda tmp: tmp / "missing", "does not exist; write one with seer-triton"),
        (lambda tmp: tmp, "is not a model repository seer-triton wrote (it has no .seer-triton.json)"),
    ],
)
def test_serve_refuses_a_folder_that_is_no_repository_before_starting(fake_install, tmp_path, make, words):
    import os
    import time

    env = {**os.environ, "SEER_TRITON_HOME": str(fake_install)}
    cmd = [sys.executable, "-m", "seer_trt.serving.triton.local", "serve", "--repo", str(make(tmp_path))]
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    print(f"{' '.join(cmd[1:])}: exit {out.returncode} in {time.monotonic() - start:.2f} s: {out.stderr.strip()}")
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.splitlines()) == 1 and words in out.stderr, out.stderr
    assert out.stderr.startswith("seer-triton local: error: ")
    assert not (tmp_path / "started").exists()  # the server was never started


# ---- the real server -------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    prompt: str
    image: bytes | None = None  # PNG
    gen_length: int | None = None
    seer: bool = True
    decoding: str | None = None  # None: the export's default
    early_stop: bool = False


def png(image: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


CASES = [Case(s.question, png(s.image) if s.image is not None else None) for s in make_samples(11, 8)] + [
    Case("count to 5 .", gen_length=32),
    Case("repeat cat 3 times .", seer=False),
    Case("count to 12 .", decoding="factor:1", early_stop=True),
    Case("repeat dog 7 times .", decoding="threshold:0.9", seer=False),
    Case("count to 9 .", decoding="fixed", early_stop=True),
]


@pytest.fixture(scope="module")
def expected(fixture_export, tmp_path_factory) -> list[dict]:
    """seer-run's answers to CASES (one JSONL file, images as files)."""
    folder = tmp_path_factory.mktemp("seer-run")
    lines = []
    for i, case in enumerate(CASES):
        request = {"prompt": case.prompt, "seer": case.seer, "early_stop": case.early_stop}
        if case.decoding is not None:
            request["decoding"] = case.decoding
        if case.image is not None:
            (folder / f"{i}.png").write_bytes(case.image)
            request["image"] = str(folder / f"{i}.png")
        if case.gen_length is not None:
            request["gen_length"] = case.gen_length
        lines.append(json.dumps(request))
    (folder / "in.jsonl").write_text("\n".join(lines) + "\n")
    rc, _, err = cli(
        run_main,
        [
            "--engines",
            str(fixture_export[0]),
            "--input",
            str(folder / "in.jsonl"),
            "--output",
            str(folder / "out.jsonl"),
            "--cache",
            "none",
        ],
    )  # the repository's cache
    # fmt: skip
    assert rc == 0 and f"{len(CASES)} answered, 0 failed" in err, err
    return [json.loads(line) for line in (folder / "out.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def server(cpu_repo, triton_install):
    install = ServerInstall.find(triton_install.home)  # complete, or the install was not
    with LocalServer(cpu_repo, install, start_timeout=600) as running:
        print(f"tritonserver ready in {running.started_in:.1f} s (HTTP {running.http_url}, gRPC {running.grpc_url})")
        yield running
    assert running.process.returncode is not None  # stopped


def inputs(module, case: Case, prompt_dtype: str = "BYTES") -> list:
    """The orchestrator's inputs for one case, built with tritonclient.http or tritonclient.grpc."""
    tensors = []

    def add(name: str, dtype: str, value: np.ndarray) -> None:
        t = module.InferInput(name, list(value.shape), dtype)
        t.set_data_from_numpy(value)
        tensors.append(t)

    if prompt_dtype == "BYTES":
        add("prompt", "BYTES", np.array([[case.prompt.encode()]], dtype=np.object_))
    else:
        add("prompt", prompt_dtype, np.array([[1]], dtype=np.int32))
    if case.image is not None:
        add("image", "BYTES", np.array([[case.image]], dtype=np.object_))
    if case.gen_length is not None:
        add("gen_length", "INT32", np.array([[case.gen_length]], dtype=np.int32))
    add("seer", "BOOL", np.array([[case.seer]], dtype=bool))
    if case.decoding is not None:
        add("decoding", "BYTES", np.array([[case.decoding.encode()]], dtype=np.object_))
    if case.early_stop:
        add("early_stop", "BOOL", np.array([[True]], dtype=bool))
    return tensors


def answer(result) -> dict:
    ids = result.as_numpy("token_ids")[0]
    return {
        "text": result.as_numpy("text")[0, 0].decode(),
        "token_ids": [int(i) for i in ids if i != -1],
        "kept": int(result.as_numpy("kept")[0, 0]),
        "steps": int(result.as_numpy("denoise_steps")[0, 0]),
    }


def wanted(result: dict) -> dict:
    return {k: result[k] for k in ("text", "token_ids", "kept", "steps")}


@pytest.fixture(scope="module")
def clients(server):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    http = httpclient.InferenceServerClient(server.http_url, concurrency=CONCURRENT, network_timeout=TIMEOUT_S,
                                            connection_timeout=TIMEOUT_S)  # fmt: skip
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    yield types.SimpleNamespace(http=http, grpc=grpc, httpclient=httpclient, grpcclient=grpcclient)
    http.close()
    grpc.close()


@pytest.mark.serving
def test_served_answers_equal_seer_run_over_http_and_grpc(clients, expected):
    assert clients.http.is_model_ready("seer") and clients.grpc.is_model_ready("seer")
    for case, want in zip(CASES, expected, strict=True):
        got_http = answer(clients.http.infer("seer", inputs(clients.httpclient, case)))
        got_grpc = answer(clients.grpc.infer("seer", inputs(clients.grpcclient, case), client_timeout=TIMEOUT_S))
        assert got_http == wanted(want), case.prompt
        assert got_grpc == wanted(want), case.prompt
    assert any(c.image for c in CASES) and any(w["kept"] < w["gen_length"] for w in expected)  # images, truncation


@pytest.mark.serving
def test_a_request_may_carry_several_rows(clients, expected):
    module = clients.httpclient
    prompts = module.InferInput("prompt", [2, 1], "BYTES")
    prompts.set_data_from_numpy(np.array([[CASES[1].prompt.encode()], [CASES[2].prompt.encode()]], dtype=np.object_))
    result = clients.http.infer("seer", [prompts])
    ids = result.as_numpy("token_ids")
    assert [t.decode() for t in result.as_numpy("text")[:, 0]] == [expected[1]["text"], expected[2]["text"]]
    assert [[int(i) for i in row if i != -1] for row in ids] == [expected[1]["token_ids"], expected[2]["token_ids"]]
    assert result.as_numpy("kept")[:, 0].tolist() == [expected[1]["kept"], expected[2]["kept"]]
    prompts.set_data_from_numpy(np.array([[CASES[1].prompt.encode()], [b" "]], dtype=np.object_))
    with pytest.raises(Exception, match="row 1: the prompt is empty"):
        clients.http.infer("seer", [prompts])


@pytest.mark.serving
def test_concurrent_requests_are_all_answered(clients, expected):
    import queue

    picks = [i % len(CASES) for i in range(CONCURRENT)]
    pending_http = [(i, clients.http.async_infer("seer", inputs(clients.httpclient, CASES[i])))
                    for i in picks[: CONCURRENT // 2]]  # fmt: skip
    done: queue.Queue = queue.Queue()
    for i in picks[CONCURRENT // 2 :]:
        clients.grpc.async_infer("seer", inputs(clients.grpcclient, CASES[i]),
                                 callback=lambda result, error, i=i: done.put((i, result, error)),
                                 client_timeout=TIMEOUT_S)  # fmt: skip
    answered = 0
    for i, request in pending_http:
        assert answer(request.get_result()) == wanted(expected[i])
        answered += 1
    for _ in picks[CONCURRENT // 2 :]:
        i, result, error = done.get(timeout=TIMEOUT_S)
        assert error is None, error
        assert answer(result) == wanted(expected[i])
        answered += 1
    print(f"{answered} of {CONCURRENT} concurrent requests answered ({CONCURRENT // 2} HTTP, {CONCURRENT // 2} gRPC)")
    assert answered == CONCURRENT
    stats = clients.http.get_inference_statistics("seer")["model_stats"][0]
    print(f"the orchestrator has run {stats['inference_count']} requests in {stats['execution_count']} executions")
    assert stats["inference_count"] >= CONCURRENT and stats["execution_count"] <= stats["inference_count"]


def raw_prompt(module, prompt: bytes) -> list:
    tensor = module.InferInput("prompt", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[prompt]], dtype=np.object_))
    return [tensor]


@pytest.fixture(scope="module")
def max_chars(fixture_export) -> int:
    """The most characters of prompt the served pipeline accepts (the orchestrator's PromptFormat.max_chars)."""
    from seer_trt.runtime.prompt import PromptFormat

    folder, manifest, _ = fixture_export
    return PromptFormat(folder, manifest).max_chars


STATUS = {"grpc": {"input": "StatusCode.INVALID_ARGUMENT", "internal": "StatusCode.INTERNAL"},
          "http": {"input": "400", "internal": "500"}}  # fmt: skip


@pytest.mark.serving
@pytest.mark.parametrize(
    "build, words",
    [
        (lambda m, n: inputs(m, Case(""))[:1], "the prompt is empty"),
        (lambda m, n: inputs(m, Case("count to 3 .", image=b"not a png")), "not a readable image"),
        (lambda m, n: inputs(m, Case("count to 3 .", gen_length=100000)), "exceeds the largest answer bucket"),
        (lambda m, n: inputs(m, Case("count to 3 ."))[1:], "prompt"),  # the required input left out
        (lambda m, n: inputs(m, Case("count to 3 ."), prompt_dtype="INT32"), "prompt"),  # wrong data type
        (lambda m, n: raw_prompt(m, b"count to \xff ."), "prompt is not UTF-8"),
        (lambda m, n: raw_prompt(m, b"a" * (n + 1)), "characters, more than the"),  # refused before tokenizing
        (lambda m, n: raw_prompt(m, b"a" * (4 * n + 1)), "bytes, more than the"),  # refused before decoding
    ],
)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_malformed_request_gets_an_error_and_the_server_keeps_serving(clients, expected, max_chars, protocol, build,
                                                                      words):  # fmt: skip
    client = getattr(clients, protocol)
    module = getattr(clients, f"{protocol}client")
    with pytest.raises(Exception) as err:  # noqa: B017 - the client's own exception type, checked by name below
        client.infer("seer", build(module, max_chars))
    assert type(err.value).__name__ == "InferenceServerException"
    assert words in str(err.value), str(err.value)
    assert err.value.status() == STATUS[protocol]["input"], str(err.value)  # a client error, not the server's
    assert client.is_server_live() and client.is_model_ready("seer")
    assert answer(client.infer("seer", inputs(module, CASES[0]))) == wanted(expected[0])


@pytest.mark.serving
def test_a_server_failure_stays_internal(cpu_repo, triton_install, tmp_path):
    """The orchestrator without its denoising components: a well-formed request fails in the server, INTERNAL /
    500, while a client's error there is still INVALID_ARGUMENT / 400."""
    import re

    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy2(cpu_repo / ".seer-triton.json", repo)
    for model in ("seer", "seer_embed", "seer_vision"):  # the prompt is embedded, the denoising graphs are missing
        shutil.copytree(cpu_repo / model, repo / model)
    with LocalServer(repo, ServerInstall.find(triton_install.home), start_timeout=600) as running:
        for protocol, module, url in (("http", httpclient, running.http_url), ("grpc", grpcclient, running.grpc_url)):
            client = module.InferenceServerClient(url)
            with pytest.raises(Exception) as err:  # noqa: B017 - the client's own exception type, checked below
                client.infer("seer", inputs(module, Case("count to 3 .")))
            assert type(err.value).__name__ == "InferenceServerException"
            assert re.search(r"^model 'seer_(step_zero|denoise)' \(\w+\) failed: ", err.value.message()), str(err.value)
            assert err.value.status() == STATUS[protocol]["internal"], str(err.value)
            with pytest.raises(Exception) as err:  # noqa: B017 - and a client's error there is still the client's
                client.infer("seer", raw_prompt(module, b" "))
            assert err.value.status() == STATUS[protocol]["input"] and "the prompt is empty" in err.value.message()
            client.close()


@pytest.mark.serving
def test_a_component_called_directly_answers_a_bad_value_with_400(clients):
    ids = clients.httpclient.InferInput("input_ids", [1, 1], "INT64")
    ids.set_data_from_numpy(np.array([[10**9]], dtype=np.int64))  # no such token: ONNX Runtime's InvalidArgument
    with pytest.raises(Exception) as err:  # noqa: B017 - the client's own exception type, checked below
        clients.http.infer("seer_embed", [ids])
    assert err.value.status() == "400" and "model 'seer_embed': " in err.value.message(), str(err.value)
    assert "out of data bounds" in err.value.message()


@pytest.mark.serving
def test_serve_names_the_first_error_tritonserver_logged(triton_install, tmp_path):
    """A repository tritonserver cannot load: one line, the cause first (not the server's 3,000-character log)."""
    import os
    import time

    repo = tmp_path / "repo"
    (repo / "bad" / "1").mkdir(parents=True)
    (repo / ".seer-triton.json").write_text("{}\n")
    (repo / "bad" / "config.pbtxt").write_text('name: "bad"\nbackend: "python"\nmax_batch_size: many\n')
    env = {**os.environ, "SEER_TRITON_HOME": str(triton_install.home)}
    cmd = [sys.executable, "-m", "seer_trt.serving.triton.local", "serve", "--repo", str(repo)]
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    print(f"{' '.join(cmd[1:])}: exit {out.returncode} in {time.monotonic() - start:.2f} s: {out.stderr.strip()}")
    assert out.returncode == 2 and out.stdout == "" and len(out.stderr.splitlines()) == 1, out.stderr
    cause = f"seer-triton local: error: tritonserver could not start: Poll failed for model directory 'bad': " \
            f"failed to read text proto from {repo / 'bad' / 'config.pbtxt'}; creating server: "  # fmt: skip
    assert out.stderr.startswith(cause) and len(out.stderr) < 600, out.stderr
    log = Path(out.stderr.rsplit("whole log: ", 1)[1].rstrip(")\n"))
    assert "Expected integer, got: many" in log.read_text()  # the whole log is kept, for the details
    log.unlink()


def server_memory(server: LocalServer) -> dict[int, tuple[int, int]]:
    """(VmRSS, RssShmem) bytes of each process in the server's process group: tritonserver and its Python-backend
    stubs, read from /proc."""
    import re

    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pgrp = int(stat.read_text().rsplit(")", 1)[1].split()[2])  # after "pid (comm)": state, ppid, pgrp
            if pgrp == server.process.pid:
                status = (stat.parent / "status").read_text()
                found[int(stat.parent.name)] = tuple(int(re.search(rf"{k}:\s+(\d+) kB", status)[1]) * 1024
                                                     for k in ("VmRSS", "RssShmem"))  # fmt: skip
        except (OSError, TypeError):  # a process that ended meanwhile
            continue
    return found


def resident(server: LocalServer, memory: dict[int, tuple[int, int]]) -> int:
    """Bytes the server holds: every VmRSS, a stub's shared memory (its region, which tritonserver maps and
    counts too) once."""
    return sum(rss if pid == server.process.pid else rss - shmem for pid, (rss, shmem) in memory.items())


def finished(client) -> tuple[int, int]:
    """Requests the orchestrator has finished and the server's nanoseconds on them (Triton's statistics)."""
    stats = client.get_inference_statistics("seer")["model_stats"][0]["inference_stats"]
    return sum(stats[k]["count"] for k in ("success", "fail")), sum(stats[k]["ns"] for k in ("success", "fail"))


BIG_PROMPT = 50 * 2**20  # bytes: the 5.2 MB prompt took 18 s, and 6.8 GB of the server's memory, to refuse


@pytest.mark.serving
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_50_mb_prompt_is_refused_before_it_is_read(server, clients, expected, protocol):
    """Refused for its size before it is decoded, templated or tokenized: INVALID_ARGUMENT / 400, the server's time
    on it a few seconds at most (mostly copying 50 MB into the backend's shared memory; 1.02 s once on a loaded
    2-core CI machine, so the bound is 5 s, against the minutes tokenizing it took), its memory grown by about what receiving the request takes (the message, and its
    copy into the Python backend's shared memory)."""
    import time

    client, module = getattr(clients, protocol), getattr(clients, f"{protocol}client")
    prompt = raw_prompt(module, b"count to 3 . " * (BIG_PROMPT // 13))
    before, (count, ns) = server_memory(server), finished(clients.http)
    start = time.monotonic()
    with pytest.raises(Exception) as err:  # noqa: B017 - the client's own exception type, checked by name below
        client.infer("seer", prompt)
    seconds = time.monotonic() - start
    after = server_memory(server)
    while finished(clients.http)[0] == count and time.monotonic() - start < 30:  # statistics follow the response
        time.sleep(0.1)
    served = (finished(clients.http)[1] - ns) / 1e9
    growth = resident(server, after) - resident(server, before)
    raw = sum(rss for rss, _ in after.values()) - sum(rss for rss, _ in before.values())
    print(f"{protocol}: refused in {seconds:.2f} s ({served:.2f} s in the server), {err.value.status()}: "
          f"{err.value.message()}; server memory +{growth / 2**20:.0f} MiB (VmRSS summed over {len(after)} "
          f"processes +{raw / 2**20:.0f} MiB)")  # fmt: skip
    assert type(err.value).__name__ == "InferenceServerException"
    assert err.value.status() == STATUS[protocol]["input"]
    assert f"prompt is {BIG_PROMPT // 13 * 13} bytes, more than the" in err.value.message()
    assert len(err.value.message()) < 300  # one line naming the limit, not the prompt
    assert set(after) == set(before) and len(after) >= 2  # tritonserver and its stubs, none restarted
    assert growth < 200 * 2**20, f"the server grew by {growth / 2**20:.0f} MiB"
    assert 0 < served < 5.0 and seconds < 20  # unchecked, tokenizing alone took minutes and gigabytes
    assert answer(client.infer("seer", inputs(module, CASES[0]))) == wanted(expected[0])


@pytest.fixture(scope="module")
def mmada_server(tmp_path_factory, triton_install):
    """A random MMaDA export (its image_tokens graph, ids embedded by embed, the image before the question) served from
    a CPU repository, and the Python pipeline on the same export."""
    import torch
    from tiny_models import tiny_magvit, tiny_mmada_config

    from seer_export.cli import main as export_main
    from seer_export.models.random_checkpoint import write_random_checkpoint
    from seer_trt.runtime.pipeline import SeerPipeline

    root = tmp_path_factory.mktemp("mmada-triton")
    write_random_checkpoint(root / "ckpt", tiny_mmada_config(), dtype=torch.float32, gain=3.0,
                            image_tokenizer=tiny_magvit())  # fmt: skip
    assert export_main(["--model", "mmada", "--checkpoint", str(root / "ckpt"), "--out", str(root / "engines"),
                        "--no-validate"]) == 0  # fmt: skip
    repo = write_repository(plan_repository(root / "engines", flavour="cpu", instances=1, orchestration="bls"),
                            root / "repo")  # fmt: skip
    pipe = SeerPipeline.from_manifest(root / "engines")
    with LocalServer(repo, ServerInstall.find(triton_install.home), start_timeout=600) as running:
        yield running, pipe
    pipe.close()


@pytest.mark.serving
def test_an_mmada_export_answers_as_the_pipeline_does(mmada_server):
    import tritonclient.http as httpclient

    from seer_trt.runtime.request import Request

    server, pipe = mmada_server
    rng = np.random.default_rng(4)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((12, 40), (33, 20))]
    cases = [Case("count the shapes one by one .", png(im), gen_length=16) for im in images]
    cases.append(Case("count to 5 .", gen_length=16))
    want = pipe.generate([Request(c.prompt, c.image, gen_length=16, cache="none") for c in cases])  # PNG bytes too
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=TIMEOUT_S, connection_timeout=TIMEOUT_S)
    try:
        for case, w in zip(cases, want, strict=True):
            got = answer(client.infer("seer", inputs(httpclient, case)))
            assert got == {"text": w.text, "token_ids": list(w.token_ids), "kept": w.kept, "steps": w.steps}
    finally:
        client.close()


@pytest.mark.slow
def test_components_can_be_placed_on_named_gpus(fixture_export, tmp_path):
    """--gpus 0,1 --component-instances 2: every component's instance group names both GPUs, two instances on each
    (Triton spreads calls over them: data-parallel on one machine); the cpu flavour refuses the flags."""
    folder, _, _ = fixture_export
    rc, _, err = cli(triton_main, ["--engines", str(folder), "--out", str(tmp_path / "r"), "--gpus", "0,1",
                                   "--component-instances", "2", "--orchestration", "bls"])  # fmt: skip
    assert rc == 0, err
    found = configs(tmp_path / "r")
    for name, config in found.items():
        groups = [(g.count, list(g.gpus)) for g in config.instance_group]
        assert groups == ([(2, [])] if name == "seer" else [(2, [0, 1])]), (name, groups)
    rc, _, err = cli(triton_main, ["--engines", str(folder), "--out", str(tmp_path / "c"), "--flavour", "cpu",
                                   "--gpus", "0"])  # fmt: skip
    assert rc == 2 and "for --flavour gpu" in err


@pytest.mark.serving
@pytest.mark.parametrize("kind", ["traversal", "tokenizer outside", "fifo manifest", "fifo tokenizer"])
def test_the_orchestrator_refuses_a_hostile_export_in_its_repository(cpu_repo, triton_install, tmp_path, kind):
    """A repository whose orchestrator's copy of the export was tampered with after seer-triton wrote it: the
    orchestrator's Manifest.read (and tokenizer read) inside tritonserver refuses it, naming the entry, and the server
    fails its start at once rather than reading outside the folder or waiting on the FIFO
    (seer-triton itself: tests/test_confined.py)."""
    import time

    from test_confined import HOSTILE

    from seer_trt.contracts.errors import SeerError

    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy2(cpu_repo / ".seer-triton.json", repo)
    shutil.copytree(
        cpu_repo / "seer", repo / "seer"
    )  # the orchestrator alone: it calls its components only per request
    change, line = HOSTILE[kind]
    change(repo / "seer" / "1" / "export")
    start = time.monotonic()
    with pytest.raises(SeerError) as err:
        LocalServer(repo, ServerInstall.find(triton_install.home), start_timeout=300).start()
    seconds = time.monotonic() - start
    print(f"{kind}: refused in {seconds:.1f} s: {err.value}")
    assert str(err.value).startswith("tritonserver could not start: ") and line in str(err.value), str(err.value)
    assert "\n" not in str(err.value) and seconds < 120  # the server's start-up included; a FIFO would hang to 300
    Path(str(err.value).rsplit("whole log: ", 1)[1].rstrip(")")).unlink()
