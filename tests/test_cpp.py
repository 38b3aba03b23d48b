"""The C++ runtime (cpp/, docs/DESIGN.md "C++ runtime") against the Python one: built from this checkout with the README's
commands (into a cache folder, never the working tree; configuring runs tools/ort_sdk.sh), then the same answer ids,
L* and steps as ``SeerPipeline`` on 40 held-out fixture prompts (text and image), batch 1 and batched under every
dispatch policy, for every signal and detector a manifest can name, with and without Seer and early stopping;
every decoding rule (fixed, threshold, factor; a request's or the manifest's), and a 2.1 export's confidence; anyres
images (a random export: the merge of tile features, crops and bilinear shrinking), LaViDa-LLaDA's pooled ones and
MMaDA's image ids; seer-prompt-ids ->
seer_run equal to seer-run; bad inputs an error, never a crash; four threads on one pipeline.

Both runtimes load the same ONNX Runtime library (the installed wheel's), so the graphs compute the same bits."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from ort_sessions import telemetry_env
from test_manifest import BOUNDS

from seer_trt.contracts.config import SeerConfig, canonical_decoding
from seer_trt.contracts.errors import InputError, ManifestError
from seer_trt.contracts.policies import POLICIES
from seer_trt.contracts.profiles import tiles_per_image
from seer_trt.eval.tasks import make_samples
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request
from seer_trt.serving.cpp import CppPipeline, CppRequests, load_library
from seer_trt.serving.cpp import wheel_library as ort_library

pytestmark = pytest.mark.cpp  # every test builds (once per version of cpp/) or runs the C++ runtime
ROOT = Path(__file__).resolve().parents[1]
SAMPLES = make_samples(23, 40)  # held-out (the trainer draws from seeds >= 1_000_000); 13 of them with an image
CACHE = Path(os.environ.get("SEER_CPP_CACHE", Path.home() / ".cache" / "seer-trt" / "cpp"))


def sources_digest() -> str:
    h = hashlib.sha256()
    files = [p for p in (ROOT / "cpp").rglob("*") if p.is_file() and "build" not in p.relative_to(ROOT / "cpp").parts]
    for path in sorted([*files, ROOT / "tools" / "ort_sdk.sh"]):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def cpp_build() -> Path:
    """cpp/ built with the README's commands (ONNX Runtime's headers fetched by tools/ort_sdk.sh at configure time)
    into $SEER_CPP_CACHE or ~/.cache/seer-trt/cpp, once per version of the sources. A failed fetch or build fails."""
    build = CACHE / f"build-{sources_digest()}"
    done = build / "BUILT"
    if not done.is_file():
        for stale in CACHE.glob("build-*"):  # builds of other versions of the sources
            shutil.rmtree(stale, ignore_errors=True)
        env = {**os.environ, "PYTHON": sys.executable}
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        for cmd in (["cmake", "-S", str(ROOT / "cpp"), "-B", str(build), *generator],
                    ["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2)]):  # fmt: skip
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
            if out.returncode:
                pytest.fail(f"{' '.join(cmd)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        done.write_text("ok\n")
    return build


@pytest.fixture(scope="module")
def folder(fixture_export) -> Path:
    return fixture_export[0]


@pytest.fixture(scope="module")
def cpp_requests(folder, tmp_path_factory) -> list[dict]:
    """SAMPLES as C++ requests: prompt ids through the runtime's own encoder, images as .npy pixel tiles."""
    tiles = tmp_path_factory.mktemp("tiles")
    conv = CppRequests(folder)
    return [conv.convert({"prompt": s.question, "image": s.image}, tiles / f"{i}.npy") for i, s in enumerate(SAMPLES)]


@pytest.fixture(scope="module")
def lib(cpp_build):
    return load_library(cpp_build / "libseer.so")


@pytest.fixture(scope="module")
def cpp(lib, folder):
    with CppPipeline(lib, folder, ort_library=ort_library()) as pipe:
        yield pipe


@pytest.fixture(scope="module")
def py(folder):
    pipe = SeerPipeline.from_manifest(folder)
    yield pipe
    pipe.close()


def py_requests(**mode) -> list[Request]:
    return [Request(s.question, s.image, **mode) for s in SAMPLES]


def assert_same(python, cpp_results) -> None:
    """Every row: answer ids, kept window, L*, steps, N, text and prompt computations (refreshes) equal."""
    assert all(r.ok for r in python), [r.error for r in python if not r.ok]
    assert [r["error"] for r in cpp_results] == [None] * len(python)
    for i, (a, b) in enumerate(zip(python, cpp_results, strict=True)):
        found = (b["token_ids"], b["window"], b["kept"], b["steps"], b["gen_length"], b["text"], b["refreshes"])
        want = (list(a.token_ids), list(a.window), a.kept, a.steps, a.gen_length, a.text, a.refreshes)
        assert found == want, f"row {i}"


@pytest.fixture(scope="module")
def python_seer(py):
    return py.generate(py_requests())


@pytest.mark.parametrize("policy", POLICIES)
def test_batched_tokens_equal_python_under_every_policy(cpp, cpp_requests, python_seer, policy):
    assert_same(python_seer, cpp.generate(cpp_requests, policy=policy))
    assert any(r.kept < r.gen_length for r in python_seer)  # Seer did cut windows


def test_batch_of_one_tokens_equal_python(cpp, py, cpp_requests):
    python = [py.generate(r)[0] for r in py_requests()]
    assert_same(python, [cpp.generate([r])[0] for r in cpp_requests])


MODES = {  # name: request fields (the padded baseline at a shorter window, to keep the test short)
    "padded": {"seer": False, "gen_length": 32},
    "early_stop": {"seer": False, "early_stop": True},
    "seer_early_stop": {"early_stop": True},
    "oracle_window": {"window": 9},
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_modes_equal_python(cpp, py, cpp_requests, mode):
    fields = MODES[mode]
    assert_same(py.generate(py_requests(**fields)), cpp.generate([{**r, **fields} for r in cpp_requests]))


SAMPLED = {  # name: (the export: the fixture's, or its copy without denoise_logits; request fields besides the draw's)
    "denoise_logits": ("logits", {}),
    "denoise_logits, random remasking, threshold": ("logits", {"remasking": "random", "decoding": "threshold:0.9"}),
    "top ids": ("top", {}),
    "top ids, random remasking, early stop": ("top", {"remasking": "random", "early_stop": True}),
}


def sampled_fields(seed: int = 1000) -> list[dict]:
    """Issue 44's sampled requests: temperature 0.8, top_p 0.9, a seed per row (distinct, so rows draw apart)."""
    return [{"temperature": 0.8, "top_p": 0.9, "seed": seed + i} for i in range(len(SAMPLES))]


@pytest.fixture(scope="module")
def top_ids_export(folder, tmp_path_factory) -> Path:
    """The fixture without denoise_logits: sampling draws from denoise's top ids (TopK) in both runtimes."""
    graphs = json.loads((folder / "manifest.json").read_text())["graphs"]
    assert "denoise_logits" in graphs and "top_ids" in json.dumps(graphs["denoise"])
    kept = {k: v for k, v in graphs.items() if k != "denoise_logits"}
    return calibrated_copy(folder, tmp_path_factory.mktemp("top-ids") / "engines", graphs=kept)


@pytest.mark.parametrize("case", list(SAMPLED))
def test_sampled_requests_equal_python(lib, folder, top_ids_export, cpp_requests, python_seer, case):
    """Sampled requests with seeds (temperature 0.8, top_p 0.9) answer as the Python runtime answers, through
    denoise_logits (Sampled: Gumbel over the vocabulary) or denoise's top ids (TopK), batched: the counter-based
    draws, the nucleus and the ranks of seer_trt.runtime.decoding in C++. experiments/cpp_sampling_agreement.py runs 200."""
    which, extra = SAMPLED[case]
    export = folder if which == "logits" else top_ids_export
    fields = [{**f, **extra} for f in sampled_fields()]
    py = SeerPipeline.from_manifest(export)
    try:
        python = py.generate([Request(s.question, s.image, **f) for s, f in zip(SAMPLES, fields, strict=True)])
        other_seeds = py.generate([Request(s.question, s.image, **{**f, **extra})
                                   for s, f in zip(SAMPLES, sampled_fields(5000), strict=True)])  # fmt: skip
    finally:
        py.close()
    with CppPipeline(lib, export, ort_library=ort_library()) as cpp:
        assert_same(python, cpp.generate([{**r, **f} for r, f in zip(cpp_requests, fields, strict=True)]))
    # the draws decided something: other seeds, or greedy decoding, answer otherwise on some rows
    assert [r.window for r in python] != [r.window for r in other_seeds]
    assert [r.window for r in python] != [r.window for r in python_seer]


def test_stop_sequences_cut_the_text_as_seer_serve_does(cpp, cpp_requests, python_seer):
    """stop: the answer text ends before the sequence that ends first (the longest at the same character), as
    seer_trt.serving.stops.cut_at_stop cuts seer-serve's; token_ids stay whole."""
    from seer_trt.serving.stops import cut_at_stop

    texts = [r.text for r in python_seer[:8]]
    words = [t.split() for t in texts]
    stops = [[w[len(w) // 2]] if w else ["x"] for w in words]  # a word of the answer, or none of it
    stops[0] = [texts[0][2:4], texts[0][1:4], "zz"] if len(texts[0]) > 4 else ["zz"]  # ends tie: the longer wins
    got = cpp.generate([{**r, "stop": q} for r, q in zip(cpp_requests[:8], stops, strict=True)])
    assert [g["text"] for g in got] == [cut_at_stop(t, q)[0] for t, q in zip(texts, stops, strict=True)]
    assert [g["token_ids"] for g in got] == [list(r.token_ids) for r in python_seer[:8]]
    assert any(g["text"] != t for g, t in zip(got, texts, strict=True))  # some were cut


CACHES = {  # name: (request fields, dispatch policy); the C++ pipeline's forecast order is an option
    "reuse R=2": ({"cache": "reuse", "refresh_interval": 2}, "cost_model"),
    "reuse R=4 packed": ({"cache": "reuse", "refresh_interval": 4}, "packed"),
    "forecast R=2": ({"cache": "forecast", "refresh_interval": 2}, "cost_model"),
    "forecast R=4 static": ({"cache": "forecast", "refresh_interval": 4}, "static"),
    "forecast R=3 naive_pad": ({"cache": "forecast", "refresh_interval": 3}, "naive_pad"),
    "forecast R=2 early_stop": ({"cache": "forecast", "refresh_interval": 2, "early_stop": True}, "hybrid"),
}


@pytest.mark.parametrize("case", list(CACHES))
def test_prompt_kv_cache_equals_python(cpp, py, cpp_requests, case):
    """The prompt K/V cache (manifest 2.1): refreshes at the same steps, the same snapshots and forecast weights fed
    between them, so the same tokens, under several dispatch layouts (padded, left-padded, packed)."""
    fields, policy = CACHES[case]
    python = py.generate(py_requests(**fields), policy=policy)
    assert_same(python, cpp.generate([{**r, **fields} for r in cpp_requests], policy=policy))
    assert 0 < sum(r.refreshes for r in python) < sum(r.steps for r in python)  # cached steps ran


def test_forecast_of_order_two_and_batch_of_one_equal_python(lib, folder, cpp_requests):
    """Three snapshots (forecast order 2, a pipeline option on both sides), one request at a time."""
    from seer_trt.contracts.policies import CacheConfig

    py = SeerPipeline.from_manifest(folder, cache=CacheConfig(mode="forecast", refresh=2, order=2))
    python = [py.generate(r)[0] for r in py_requests(decoding="fixed")[:20]]  # one token a step: many refreshes
    py.close()
    with CppPipeline(lib, folder, ort_library=ort_library(), cache="forecast", refresh_interval=2,
                     forecast_order=2) as cpp:  # fmt: skip
        assert_same(python, [cpp.generate([{**r, "decoding": "fixed"}])[0] for r in cpp_requests[:20]])
    assert any(r.steps >= 6 for r in python)  # a third snapshot was taken and forecast from


def link_into(path: Path, dst: Path) -> None:
    """``path`` into the export folder ``dst``: a file hard-linked (a symbolic link out of the folder is refused, as
    an export must be: seer_trt/contracts/confined.py), a folder copied."""
    if path.is_dir():
        shutil.copytree(path, dst / path.name)
    else:
        try:
            os.link(path, dst / path.name)
        except OSError:  # another file system
            shutil.copyfile(path, dst / path.name)


def calibrated_copy(src: Path, dst: Path, seer: SeerConfig | None = None, **changes) -> Path:
    """The export with another calibration (or other top-level manifest ``changes``) in its manifest (graph and
    weight files linked, not copied)."""
    dst.mkdir()
    for path in src.iterdir():
        if path.name != "manifest.json":
            link_into(path, dst)
    data = json.loads((src / "manifest.json").read_text())
    data.update({"seer": seer.to_dict()} if seer else {}, **changes)
    (dst / "manifest.json").write_text(json.dumps(data))
    return dst


WINDOW_RULES = {  # manifest "lengths" -> (a request's gen_length, what both runtimes must say; None: it runs)
    "split in 4": ({"blocks": "split", "count": 4}, 16, None),
    "split in 3": ({"blocks": "split", "count": 3}, 16, "this model's loop splits the window into 3 blocks"),
    "capped at 8": ({"blocks": "cap", "size": 8}, 12, "gen_length 12 is not a multiple of block_length 8"),
    "whole": ({"blocks": "whole"}, 12, None),
}


@pytest.mark.parametrize("case", sorted(WINDOW_RULES))
def test_both_runtimes_shape_a_window_by_the_manifests_rule(lib, folder, cpp_requests, tmp_path, case):
    """The manifest's "lengths" (schema 2.6), written once by seer-export, decides a request's blocks in both
    runtimes (issue 36): the fixture's own rule is one block, under which gen_length 12 runs; capped at 8 it is
    refused in both, split in 3 refuses 16 in both, and split in 4 runs 16 as four blocks of 4, equal in both: under
    the fixture's factor:1 rule a step commits within one block, so the four blocks take at least four steps where the
    one block takes one, and the steps are among what both runtimes must agree on."""
    assert json.loads((folder / "manifest.json").read_text())["lengths"] == {"blocks": "whole"}
    rule, n, error = WINDOW_RULES[case]
    d = calibrated_copy(folder, tmp_path / "rule", lengths=rule)
    py = SeerPipeline.from_manifest(d)
    fields = {"gen_length": n, "seer": False}
    python = py.generate([Request(s.question, s.image, **fields) for s in SAMPLES[:3]], policy="naive_pad")
    with CppPipeline(lib, d, ort_library=ort_library()) as cpp:
        cpp_results = cpp.generate([{**r, **fields} for r in cpp_requests[:3]], policy="naive_pad")
    py.close()
    if error is None:
        assert_same(python, cpp_results)
        assert py.settings(gen_length=n).block_length == (4 if rule["blocks"] == "split" else n)
        assert min(r.steps for r in python) >= (4 if rule["blocks"] == "split" else 1)
    else:
        assert all(error in r.error for r in python), [r.error for r in python]
        assert all(error in r["error"] for r in cpp_results), [r["error"] for r in cpp_results]


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("lengths", {"blocks": "cap"}, "needs size"),
        ("lengths", {"blocks": "split", "count": 0}, "count must be a whole number >= 1"),
        ("cost_calibration", {"shapes": [[1, 0, 4]], "repeats": 5}, "one or more \\[rows, prompt, answer\\]"),
        ("cost_calibration", {"shapes": [[1, 16, 4]], "repeats": 0}, "repeats must be a whole number in \\[1, 20\\]"),
    ],
)
def test_both_runtimes_refuse_a_bad_window_rule_or_calibration(lib, folder, tmp_path, key, value, match):
    """The C++ runtime reads "lengths" and "cost_calibration" itself, and refuses what Python refuses."""
    d = calibrated_copy(folder, tmp_path / "bad", **{key: value})
    with pytest.raises(ManifestError, match=match):
        SeerPipeline.from_manifest(d)
    with pytest.raises(ManifestError, match=match):
        CppPipeline(lib, d, ort_library=ort_library())


@pytest.mark.parametrize("case", list(BOUNDS))
def test_both_runtimes_refuse_what_a_manifest_says_past_its_own_model(cpp_build, lib, folder, tmp_path, case):
    """Special ids and image marker ids inside the vocabulary, the probe layer inside the model, the dims >= 1, the cost
    model's calibration inside its ceilings (issue 42): tests/test_manifest.py's cases, refused with the same words by
    SeerPipeline, the C ABI and cpp/build/seer_run (exit 2, one line) before anything is allocated or timed."""
    from test_manifest import edited

    path, value, message = BOUNDS[case]
    d = calibrated_copy(folder, tmp_path / "bad")
    (d / "manifest.json").write_text(json.dumps(edited(json.loads((d / "manifest.json").read_text()), path, value)))
    with pytest.raises(ManifestError, match=re.escape(message)):
        SeerPipeline.from_manifest(d)
    with pytest.raises(ManifestError, match=re.escape(message)):
        CppPipeline(lib, d, ort_library=ort_library())
    (tmp_path / "r.jsonl").write_text('{"prompt_ids": [1, 2]}\n')
    out = run_cli([cpp_build / "seer_run", "--engines", d, "--input", tmp_path / "r.jsonl", "--ort-library",
                   ort_library()], timeout=60)  # fmt: skip
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_model_that_answers_mask_ids_fails_those_requests(cpp_build, lib, folder, py, cpp_requests, tmp_path):
    """An export whose model answers the mask id (one NaN weight, as seer-export --no-validate wrote before issue 42):
    each such request fails in the C++ runtime with the words of Python's detokenize stage for the same ids (the
    Python runtime computes them: tests/test_mask_answers.py), and seer_run exits 1; a healthy request beside them in
    another export is answered."""
    from test_mask_answers import nan_export

    from seer_trt.runtime.detokenize import mask_in_answer

    d = nan_export(folder, tmp_path / "broken")
    broken = SeerPipeline.from_manifest(d)
    python = broken.generate(py_requests()[:4])
    broken.close()
    mask = py.manifest.special_tokens.mask_id
    with CppPipeline(lib, d, ort_library=ort_library()) as cpp:
        results = cpp.generate(cpp_requests[:4])
    for p, c in zip(python, results, strict=True):
        ids = list(p.token_ids) if p.ok else None  # before the Python pipeline fails the row itself
        assert c["error"] and c["error"].startswith(f"the model produced the mask token (id {mask}) as an answer")
        assert ids is None or c["error"] == mask_in_answer(ids, mask)
        assert c["token_ids"] == [] and c["text"] in ("", None)
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(r) for r in cpp_requests[:4]) + "\n")
    out = run_cli([cpp_build / "seer_run", "--engines", d, "--input", tmp_path / "r.jsonl", "--ort-library",
                   ort_library()])  # fmt: skip
    assert out.returncode == 1 and "0 answered, 4 failed" in out.stderr, out.stderr
    out = run_cli([cpp_build / "seer_run", "--engines", folder, "--input", tmp_path / "r.jsonl", "--ort-library",
                   ort_library()])  # fmt: skip
    assert out.returncode == 0 and "4 answered, 0 failed" in out.stderr, out.stderr


def test_a_2_5_manifest_reads_the_same_rule_and_calibration_in_both_runtimes(lib, folder, cpp_requests, tmp_path):
    """Without "lengths" and "cost_calibration" (schema 2.5) both runtimes open the export and answer alike, batched
    under cost_model (which calibrates, each runtime from its legacy shapes) with a new gen_length under the rule the
    defaults imply (one block). That the C++ legacy shapes are Python's is tests/test_manifest.py's check."""
    data = json.loads((folder / "manifest.json").read_text())
    del data["lengths"], data["cost_calibration"]
    d = calibrated_copy(folder, tmp_path / "old")
    (d / "manifest.json").write_text(json.dumps({**data, "schema_version": "2.5"}))
    py = SeerPipeline.from_manifest(d)
    fields = {"gen_length": 32, "seer": False}
    python = py.generate([Request(s.question, s.image, **fields) for s in SAMPLES], policy="cost_model")
    assert py.cost is not None and py.manifest.lengths.blocks == "whole"
    with CppPipeline(lib, d, ort_library=ort_library()) as cpp:
        assert_same(python, cpp.generate([{**r, **fields} for r in cpp_requests], policy="cost_model"))
    py.close()


SIGNALS = {  # every signal and detector a manifest can name; the fixture's own is the probe with a threshold
    "end_token_full_depth": SeerConfig(signal="end_token_prob", label="end-token"),
    "sparsity_jump_up": SeerConfig(tau_jump=0.005, gamma=2.0, label="jump up"),
    "sparsity_jump_down": SeerConfig(direction="down", tau_jump=0.005, gamma=2.0, window=2, margin=2, label="down"),
}


@pytest.mark.parametrize("signal", sorted(SIGNALS))
def test_every_signal_and_detector_equals_python(lib, folder, cpp_requests, tmp_path, signal):
    base = json.loads((folder / "manifest.json").read_text())["seer"]
    seer = SIGNALS[signal]
    if not seer.full_depth:  # the step_zero graph computes the fixture's statistic at its layer
        seer = dataclasses.replace(seer, probe_layer=base["probe_layer"], statistic=base["statistic"])
    copy = calibrated_copy(folder, tmp_path / "export", seer)
    py = SeerPipeline.from_manifest(copy)
    python = py.generate(py_requests())
    with CppPipeline(lib, copy, ort_library=ort_library()) as cpp:
        assert_same(python, cpp.generate(cpp_requests))
    py.close()
    assert any(r.kept < r.gen_length for r in python)  # the detector cut windows


FEW = 6  # a handful of the held-out prompts (three with an image) for the decoding rules' tables of settings
RULES = ("fixed", "threshold:0.9", "factor:1")
STEPWISE = (  # rules that commit about one position a step here (the fixture is confident: threshold:0.9 and
    # factor:1 finish most answers in a step or two), over blocks of 8 or 16: a row's block changes as it fills, the
    # cache refreshes there, and a group is re-formed from its live rows as they finish
    {"decoding": "threshold:1"},
    {"decoding": "factor:0.0001", "block_length": 8, "early_stop": True},
    {"decoding": "threshold:0.9", "block_length": 8, "seer": False},
    {"decoding": "factor:1.0", "cache": "reuse", "refresh_interval": 3},  # another spelling of factor:1: one group
    {"decoding": "threshold:1", "block_length": 16, "seer": False, "early_stop": True, "cache": "forecast",
     "refresh_interval": 2},
)  # fmt: skip
DECODING_SETTINGS = [
    {"decoding": rule, "early_stop": stop, "seer": seer, "cache": cache} | ({"refresh_interval": 2} if cache != "none" else {})
    for rule in RULES for stop in (False, True) for seer in (True, False) for cache in ("none", "reuse")
] + list(STEPWISE)  # fmt: skip


def both_runtimes(py, cpp, cpp_requests, settings, policy=None, rows=FEW):
    """Python's and C++'s results of the first ``rows`` held-out prompts under every setting, in one call each."""
    python = py.generate([Request(s.question, s.image, **f) for f in settings for s in SAMPLES[:rows]], policy=policy)
    return python, cpp.generate([{**r, **f} for f in settings for r in cpp_requests[:rows]], policy=policy)


@pytest.mark.parametrize("policy", ["cost_model", "hybrid", "naive_pad"])
def test_decoding_rules_equal_python(cpp, py, cpp_requests, policy):
    """Every rule, with and without early stop, with Seer and without, under cache none and reuse, all in one call (so
    requests group by rule), and the stepwise rules: the same answer ids, L*, steps and refreshes as Python.

    Not the stepwise rules of several blocks under cost_model: its plan comes from each runtime's own timings, and
    with a cache the refresh at one row's block change is its whole group's, so refreshes follow the plan."""
    settings = [f for f in DECODING_SETTINGS if policy != "cost_model" or "block_length" not in f]
    python, found = both_runtimes(py, cpp, cpp_requests, settings, policy)
    assert_same(python, found)
    steps = {}  # rule -> each row's steps under it
    for k, f in enumerate(settings):
        steps.setdefault(f["decoding"], []).extend(r.steps for r in python[k * FEW : (k + 1) * FEW])
    assert max(steps["threshold:1"]) > 20 and max(steps["fixed"]) == 64  # a step at a time; the schedule's 64
    assert sum(steps["threshold:0.9"]) < sum(steps["fixed"]) / 4  # the parallel rule took its short cut


def legacy_copy(src: Path, dst: Path, seer: SeerConfig | None = None) -> Path:
    """The export as schema 2.1 wrote it: the window graph returns the probability ``confidence`` (here the exp of
    this graph's log-probability), the manifest names no decoding; other files linked, weights copied (ONNX Runtime
    refuses external data that resolves outside the graph's folder)."""
    import onnx

    dst.mkdir()
    for path in src.iterdir():
        if path.name == "weights.data":
            shutil.copyfile(path, dst / path.name)
        elif path.name not in ("manifest.json", "denoise.onnx"):
            link_into(path, dst)
    model = onnx.load(src / "denoise.onnx", load_external_data=False)
    next(o for o in model.graph.output if o.name == "log_confidence").name = "confidence"
    model.graph.node.append(onnx.helper.make_node("Exp", ["log_confidence"], ["confidence"], name="legacy_confidence"))
    onnx.save(model, dst / "denoise.onnx")
    data = json.loads((src / "manifest.json").read_text())
    data["schema_version"] = "2.1"
    del data["generation"]["decoding"]
    for t in data["graphs"]["denoise"]["outputs"]:
        t["name"] = "confidence" if t["name"] == "log_confidence" else t["name"]
    if seer is not None:
        data["seer"] = seer.to_dict()
    (dst / "manifest.json").write_text(json.dumps(data))
    return dst


@pytest.mark.parametrize("signal", ["probe", "end_token_full_depth"])
def test_a_schema_2_1_export_logs_its_confidence_as_python(lib, folder, cpp_requests, tmp_path, signal):
    """A 2.1 window graph returns the probability: both runtimes rank its float32 log (C++ numpy's log, bit for bit),
    in the loop and in the full-depth step zero; its manifest has no decoding, so the default is fixed."""
    copy = legacy_copy(folder, tmp_path / "export", SIGNALS["end_token_full_depth"] if signal != "probe" else None)
    settings = [{}, {"early_stop": True}, {"decoding": "threshold:0.9"}, *STEPWISE[:3]]
    py = SeerPipeline.from_manifest(copy)
    assert py.manifest.generation.decoding == "fixed"
    with CppPipeline(lib, copy, ort_library=ort_library()) as cpp:
        assert_same(*both_runtimes(py, cpp, cpp_requests, settings, "naive_pad"))
    py.close()


def with_decoding(src: Path, dst: Path, decoding) -> Path:
    """The export with another generation.decoding in its manifest (the other files linked)."""
    dst.mkdir(exist_ok=True)
    for path in src.iterdir():
        if path.name != "manifest.json" and not (dst / path.name).exists():
            link_into(path, dst)
    data = json.loads((src / "manifest.json").read_text())
    data["generation"]["decoding"] = decoding
    (dst / "manifest.json").write_text(json.dumps(data))
    return dst


def test_the_manifest_decoding_is_the_default(lib, folder, cpp_requests, tmp_path):
    """The export's generation.decoding rules requests that name none; a request's own rule overrides it; a bad one in
    the manifest is refused at open, as Python refuses it."""
    copy = with_decoding(folder, tmp_path / "export", "threshold:1")
    py = SeerPipeline.from_manifest(copy)
    with CppPipeline(lib, copy, ort_library=ort_library()) as cpp:
        python, found = both_runtimes(py, cpp, cpp_requests, [{}, {"decoding": "threshold:0.9"}])
        assert_same(python, found)
    py.close()
    assert all(r.steps == r.kept for r in python[:FEW])  # threshold:1: one position a step
    assert sum(r.steps for r in python[FEW:]) < sum(r.steps for r in python[:FEW]) / 2
    for value, message in (("threshold:2", "decoding 'threshold:2': the parameter is out of range"),
                           (3, "decoding is 3; expected 'fixed'")):  # fmt: skip
        with_decoding(folder, copy, value)
        with pytest.raises(ManifestError, match=re.escape(message)):
            SeerPipeline.from_manifest(copy)
        with pytest.raises(ManifestError, match=re.escape(message)):
            CppPipeline(lib, copy, ort_library=ort_library())


BAD_DECODINGS = ["", "fixed:1", "Fixed", "threshold", "threshold:", "threshold:abc", "threshold:0", "threshold:1.5",
                 "threshold:nan", "factor:-1", "factor:inf", "factor:1:2", "factor:0x1p0", "factor:1__0", "top_k:3",
                 "it's", 3, True, [1]]  # fmt: skip


def test_a_bad_decoding_fails_its_request_alone(cpp_build, cpp, folder, cpp_requests, tmp_path):
    """Through the C ABI and through seer_run's JSONL: each bad rule fails its request alone with Python's message,
    word for word; other spellings of good rules are answered as their canonical one."""
    messages = []
    for value in BAD_DECODINGS:
        with pytest.raises(InputError) as err:
            Request("count to 7 .", decoding=value)
        messages.append(str(err.value))
    good = cpp_requests[0]
    spellings = [" fixed ", "threshold: 0.9 ", "threshold:9e-1", "factor:1_0", "factor:+1.0", "threshold:.9"]
    requests = [good, *({**good, "decoding": v} for v in BAD_DECODINGS), *({**good, "decoding": v} for v in spellings)]
    results = cpp.generate(requests)
    assert [r["error"] for r in results] == [None, *messages, *[None] * len(spellings)]
    canonical = cpp.generate([{**good, "decoding": canonical_decoding(v)} for v in spellings])
    strip = lambda rs: [{k: v for k, v in r.items() if k != "seconds"} for r in rs]  # noqa: E731
    assert strip(results[-len(spellings) :]) == strip(canonical)
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(r) for r in requests) + "\n")
    out = run_cli([cpp_build / "seer_run", "--engines", folder, "--input", tmp_path / "r.jsonl",
                   "--ort-library", ort_library()])  # fmt: skip
    assert out.returncode == 1 and f"answered, {len(BAD_DECODINGS)} failed" in out.stderr, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["error"] for r in lines] == [None, *(f"line {i + 2}: {m}" for i, m in enumerate(messages)),
                                           *[None] * len(spellings)]  # fmt: skip


def run_cli(args: list[str], **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(args, capture_output=True, text=True, timeout=kw.pop("timeout", 600), **kw)
    assert out.returncode >= 0, f"killed by signal {-out.returncode}: {out.stderr[-2000:]}"  # never a crash
    return out


def test_cli_with_seer_prompt_ids_equals_seer_run(cpp_build, folder, tmp_path):
    """The documented workflow: seer-run's JSONL -> seer-prompt-ids -> cpp/build/seer_run, against seer-run."""
    from PIL import Image

    lines = []
    for i, s in enumerate(SAMPLES[:8]):
        line = {"prompt": s.question}
        if s.image is not None:
            Image.fromarray(s.image).save(tmp_path / f"{i}.png")
            line["image"] = str(tmp_path / f"{i}.png")
        line |= {"early_stop": True} if i % 3 == 0 else {}
        line |= {"cache": ["reuse", "forecast"][i % 2], "refresh_interval": 2} if i % 4 == 1 else {}
        line |= {"decoding": ["threshold:0.9", "factor:1"][i % 2]} if i % 4 >= 2 else {}
        lines.append(json.dumps(line))
    (tmp_path / "requests.jsonl").write_text("\n".join(lines) + "\n")
    out = run_cli([sys.executable, "-m", "seer_trt.cli.prompt_ids", "--engines", folder, "--input", tmp_path / "requests.jsonl",
                   "--output", tmp_path / "cpp.jsonl", "--tiles-dir", tmp_path / "tiles"])  # fmt: skip
    assert out.returncode == 0, out.stderr
    out = run_cli([sys.executable, "-m", "seer_trt.cli.run", "--engines", folder, "--input", tmp_path / "requests.jsonl",
                   "--output", tmp_path / "python.jsonl"])  # fmt: skip
    assert out.returncode == 0, out.stderr
    out = run_cli([cpp_build / "seer_run", "--engines", folder, "--input", tmp_path / "cpp.jsonl",
                   "--output", tmp_path / "results.jsonl", "--ort-library", ort_library()])  # fmt: skip
    assert out.returncode == 0 and "8 answered, 0 failed" in out.stderr, out.stderr
    python = [json.loads(line) for line in (tmp_path / "python.jsonl").read_text().splitlines()]
    cpp = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [list(r) for r in cpp] == [list(r) for r in python]  # seer-run's fields, in its order
    keys = ("text", "token_ids", "window", "kept", "steps", "gen_length", "error")
    assert [[r[k] for k in keys] for r in cpp] == [[r[k] for k in keys] for r in python]
    assert set(cpp[0]["seconds"]) == set(python[0]["seconds"]) | {"graphs"}


def test_seer_run_sampling_flags_answer_as_seer_run_samples(cpp_build, folder, tmp_path):
    """seer_run --temperature 0.8 --top-p 0.9 --seed 7 over seer-prompt-ids' lines answers as seer-run does for the
    same requests with those fields (a line's own field wins over a flag, as for the other flags)."""
    from PIL import Image

    plain, sampled = [], []
    for i, s in enumerate(SAMPLES[:8]):
        line = {"prompt": s.question}
        if s.image is not None:
            Image.fromarray(s.image).save(tmp_path / f"{i}.png")
            line["image"] = str(tmp_path / f"{i}.png")
        own = {"seed": 11} if i == 3 else {}  # a line's own seed
        plain.append(json.dumps({**line, **own}))
        sampled.append(json.dumps({**line, "temperature": 0.8, "top_p": 0.9, "seed": 7, **own}))
    (tmp_path / "plain.jsonl").write_text("\n".join(plain) + "\n")
    (tmp_path / "sampled.jsonl").write_text("\n".join(sampled) + "\n")
    out = run_cli([sys.executable, "-m", "seer_trt.cli.prompt_ids", "--engines", folder, "--input", tmp_path / "plain.jsonl",
                   "--output", tmp_path / "cpp.jsonl", "--tiles-dir", tmp_path / "tiles"])  # fmt: skip
    assert out.returncode == 0, out.stderr
    out = run_cli([sys.executable, "-m", "seer_trt.cli.run", "--engines", folder, "--input", tmp_path / "sampled.jsonl",
                   "--output", tmp_path / "python.jsonl"])  # fmt: skip
    assert out.returncode == 0, out.stderr
    out = run_cli([cpp_build / "seer_run", "--engines", folder, "--input", tmp_path / "cpp.jsonl", "--temperature",
                   "0.8", "--top-p", "0.9", "--seed", "7", "--output", tmp_path / "results.jsonl", "--ort-library",
                   ort_library()])  # fmt: skip
    assert out.returncode == 0 and "8 answered, 0 failed" in out.stderr, out.stderr
    python = [json.loads(line) for line in (tmp_path / "python.jsonl").read_text().splitlines()]
    cpp = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    keys = ("text", "token_ids", "window", "kept", "steps", "gen_length", "error")
    assert [[r[k] for k in keys] for r in cpp] == [[r[k] for k in keys] for r in python]


def broken_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_bad_folders_are_one_line_errors(cpp_build, lib, folder, tmp_path):
    ort = ["--ort-library", ort_library()]
    (tmp_path / "r.jsonl").write_text('{"prompt_ids": [1, 2]}\n')
    cases = {"missing": (tmp_path / "nope", "is not an export folder")}
    for version in ("1.0", "3.0", "two"):
        d = broken_copy(folder, tmp_path / f"schema-{version}")
        data = json.loads((d / "manifest.json").read_text())
        (d / "manifest.json").write_text(json.dumps({**data, "schema_version": version}))
        cases[f"schema {version}"] = (d, "schema_version")
    d = broken_copy(folder, tmp_path / "corrupt-manifest")
    (d / "manifest.json").write_text('{"schema_version": "2.0", ')
    cases["corrupt manifest"] = (d, "not readable JSON")
    d = broken_copy(folder, tmp_path / "no-seer")
    data = json.loads((d / "manifest.json").read_text())
    del data["seer"]
    (d / "manifest.json").write_text(json.dumps(data))
    cases["key missing"] = (d, "lacks 'seer'")
    d = broken_copy(folder, tmp_path / "cache-out-of-order")
    data = json.loads((d / "manifest.json").read_text())
    inputs = data["graphs"]["denoise"]["inputs"]
    inputs[5], inputs[6] = inputs[6], inputs[5]  # past_key_values.0.value before .key
    (d / "manifest.json").write_text(json.dumps(data))
    cases["cache inputs out of order"] = (d, "hold past_key_values.0.value where past_key_values.0.key belongs")
    d = broken_copy(folder, tmp_path / "truncated-graph")
    graph = (d / "denoise.onnx").read_bytes()
    (d / "denoise.onnx").write_bytes(graph[: len(graph) // 2])
    cases["truncated graph"] = (d, "does not load")
    d = broken_copy(folder, tmp_path / "truncated-weights")
    weights = (d / "weights.data").read_bytes()
    (d / "weights.data").write_bytes(weights[: len(weights) // 2])
    cases["truncated weights"] = (d, "the manifest says")
    d = broken_copy(folder, tmp_path / "bad-index")
    index = json.loads((d / "weights.json").read_text())
    name = next(iter(index))
    index[name][0] = len(weights)  # a tensor past the end of the file: reading it would fault
    (d / "weights.json").write_text(json.dumps(index))
    cases["index past the file"] = (d, "lies outside")
    for case, (path, message) in cases.items():
        out = run_cli([cpp_build / "seer_run", "--engines", path, "--input", tmp_path / "r.jsonl", *ort])
        assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, (case, out)
        with pytest.raises(ManifestError, match=message):
            CppPipeline(lib, path, ort_library=ort_library())
    out = run_cli([cpp_build / "seer_run", "--engines", folder, "--input", tmp_path / "r.jsonl",
                   "--ort-library", tmp_path / "libnothing.so"])  # fmt: skip
    assert out.returncode == 2 and "cannot load ONNX Runtime" in out.stderr, out.stderr
    with pytest.raises(ManifestError, match="unknown dispatch policy"):
        CppPipeline(lib, folder, ort_library=ort_library(), policy="fastest")
    with pytest.raises(ManifestError, match="cache policy 'lru' is not one of none, reuse, forecast"):
        CppPipeline(lib, folder, ort_library=ort_library(), cache="lru")
    with pytest.raises(ManifestError, match="forecast order 3 is not one of 1, 2"):
        CppPipeline(lib, folder, ort_library=ort_library(), cache="forecast", forecast_order=3)
    with pytest.raises(ManifestError, match="unknown provider 'rocm'; choose cpu, cuda or tensorrt"):
        CppPipeline(lib, folder, ort_library=ort_library(), provider="rocm")
    # the CPU wheel has no CUDA provider: an error naming the ones it has, never a silent run on the CPU
    out = run_cli([cpp_build / "seer_run", "--engines", folder, "--input", tmp_path / "r.jsonl", *ort,
                   "--provider", "cuda"])  # fmt: skip
    assert out.returncode == 2 and re.search(r"offers [A-Za-z, ]*CPUExecutionProvider", out.stderr), out.stderr
    assert "not CUDAExecutionProvider" in out.stderr


def test_bad_requests_fail_alone(cpp_build, folder, cpp_requests, tmp_path):
    good = cpp_requests[0]
    image = next(r for r in cpp_requests if "image_tiles" in r)
    np.save(tmp_path / "small.npy", np.zeros((1, 3, 8, 8), np.float32))
    np.save(tmp_path / "ints.npy", np.zeros((1, 3, 32, 32), np.int64))
    bad = {
        "too long": ({"prompt_ids": [5] * 600}, "largest prompt bucket"),
        "id past the vocabulary": ({"prompt_ids": [5, 999]}, "outside the vocabulary"),
        "negative id": ({"prompt_ids": [-5, 5]}, "outside the vocabulary"),
        "empty": ({"prompt_ids": []}, "prompt_ids is empty"),
        "placeholder without image": ({"prompt_ids": [-200, 5]}, "image placeholder"),
        "image without placeholder": ({"prompt_ids": [5], "image_tiles": image["image_tiles"]}, "image placeholder"),
        "tiles too small": ({**image, "image_tiles": str(tmp_path / "small.npy")}, "claims shape (1, 3, 8, 8)"),
        "tiles not float32": ({**image, "image_tiles": str(tmp_path / "ints.npy")}, "expected float32"),
        "tiles missing": ({**image, "image_tiles": str(tmp_path / "none.npy")}, "does not exist"),
        "prompt text": ({"prompt": "count to 7 ."}, "seer-prompt-ids"),
        "unknown key": ({**good, "colour": 1}, "unknown request key"),
        "window too long": ({**good, "window": 65}, "must lie in [1, gen_length 64]"),
        "steps past gen_length": ({**good, "steps": 128}, "exceeds gen_length"),
        "gen_length past buckets": ({**good, "gen_length": 512}, "largest answer bucket"),
        "blocks": ({**good, "block_length": 24}, "not a multiple of block_length"),
        "temperature past 2": ({**good, "temperature": 2.5}, "temperature is 2.5; expected a number in [0, 2]"),
        "top_p 0": ({**good, "temperature": 0.7, "top_p": 0}, "top_p is 0; expected a number in (0, 1]"),
        "negative seed": ({**good, "seed": -1}, "seed is -1; expected a whole number in [0, 2**63)"),
        "string id": ({"prompt_ids": ["5"]}, "whole number"),
        "unknown cache": ({**good, "cache": "bogus"}, "'bogus' is not one of none, reuse, forecast"),
        "cache not text": ({**good, "cache": 3}, "expected one of none, reuse, forecast"),
        "refresh interval 0": ({**good, "cache": "reuse", "refresh_interval": 0}, "expected a whole number of steps"),
    }
    lines = [json.dumps(good)] + [json.dumps(r) for r, _ in bad.values()] + ["{not json", "[1, 2]", json.dumps(good)]
    (tmp_path / "r.jsonl").write_text("\n".join(lines) + "\n")
    out = run_cli([cpp_build / "seer_run", "--engines", folder, "--input", tmp_path / "r.jsonl",
                   "--ort-library", ort_library()])  # fmt: skip
    assert out.returncode == 1 and f"2 answered, {len(bad) + 2} failed" in out.stderr, out.stderr
    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert results[0]["error"] is None and results[-1] == {**results[0], "seconds": results[-1]["seconds"]}
    for (case, (_, message)), result in zip(bad.items(), results[1:], strict=False):
        assert result["error"] and message in result["error"], (case, result["error"])
    assert "not JSON" in results[-3]["error"] and "JSON object" in results[-2]["error"]


PEAK_RSS = """
import os, sys
pid = os.posix_spawn(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
open(sys.argv[1], "w").write(str(usage.ru_maxrss))
code = os.waitstatus_to_exitcode(status)
if code < 0:
    os.kill(os.getpid(), -code)
sys.exit(code)
"""  # runs argv[2:] and writes its peak RSS (KB) to argv[1]; spawned from this small process, since a child's
# ru_maxrss counts the image it was forked from (a fork of pytest starts at hundreds of MB before its exec)


def run_measured(args: list, timeout: float = 60, **kw) -> tuple[subprocess.CompletedProcess, float, float]:
    """``args`` run to the end within ``timeout`` seconds (a hang fails), with its wall seconds and peak RSS in MB."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "peak-rss"
        result, wall = run_timed([sys.executable, "-c", PEAK_RSS, report, *args], args[0], timeout, **kw)
        return result, wall, int(report.read_text()) / 1024


def run_timed(args: list, name: object, timeout: float, **kw) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    with subprocess.Popen([str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **kw) as proc:  # fmt: skip
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the wrapper and what it spawned
            proc.communicate()
            pytest.fail(f"{name} ran past {timeout} s: a hang")
    wall = time.monotonic() - start
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}: {stderr[-2000:]}"  # never a crash
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr), wall


def npy_bytes(shape: tuple, descr: str = "<f4", fortran: bool = False, data: bytes = b"") -> bytes:
    """A version 1.0 .npy file whose header claims ``shape`` over ``data``, whatever its length."""
    header = repr({"descr": descr, "fortran_order": fortran, "shape": shape}).encode() + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + data


def seer_run_lines(cpp_build, folder, path: Path, lines: list, *flags) -> list:
    """seer_run's argv over ``lines`` written to ``path`` (dicts as JSON, strings as they are)."""
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return [cpp_build / "seer_run", "--engines", folder, "--input", path, "--ort-library", ort_library(),
            "--policy", "naive_pad", *flags]  # fmt: skip


def test_image_tiles_are_checked_against_the_export_before_they_are_held(cpp_build, folder, cpp_requests, tmp_path):
    """An 82-byte .npy claiming 500 tiles of 600 px (2.1 GB) is refused from its header, in well under a second more
    than a run with nothing to read and under 200 MB, as is every other header that is not this export's tiles
    (seer_trt.contracts.profiles.tiles_per_image tiles of [3, S, S] float32, C order) or that its file's size
    belies; the other lines are answered."""
    vision = json.loads((folder / "manifest.json").read_text())["vision"]
    s = vision["image_size"]
    most = tiles_per_image(vision["image_aspect_ratio"], s, vision["grid_pinpoints"])
    image = next(r for r in cpp_requests if "image_tiles" in r)
    tile = np.zeros((3, s, s), np.float32).tobytes()
    files = {  # name: (file bytes, words of its line's error)
        "huge": (npy_bytes((500, 3, 600, 600)), "claims shape (500, 3, 600, 600)"),
        "too many tiles": (npy_bytes((most + 1, 3, s, s)), f"claims shape ({most + 1}, 3, {s}, {s})"),
        "no tiles": (npy_bytes((0, 3, s, s)), f"claims shape (0, 3, {s}, {s})"),
        "2**62 tiles": (npy_bytes((2**62, 3, s, s)), f"claims shape ({2**62}, 3, {s}, {s})"),
        "dims past int64": (npy_bytes((2**64, 3, s, s)), "has no .npy header numpy would read"),
        "short": (npy_bytes((1, 3, s, s), data=tile[:-4]), f"{len(tile)} bytes of float32, but {len(tile) - 4}"),
        "long": (npy_bytes((1, 3, s, s), data=tile + b"\0" * 4), f"but {len(tile) + 4} bytes follow"),
        "big-endian": (npy_bytes((1, 3, s, s), ">f4", data=tile), "holds '>f4'; expected float32 ('<f4')"),
        "fortran": (npy_bytes((1, 3, s, s), fortran=True, data=tile), "in Fortran order; expected float32"),
        "header past the file": (b"\x93NUMPY\x02\x00" + (2**31).to_bytes(4, "little"), "claims a 2147483648-byte"),
        "not a header": (b"\x93NUMPY\x01\x00\x06\x00{'a': " + tile, "no .npy header numpy would read"),
    }
    for name, (data, _) in files.items():
        (tmp_path / f"{name}.npy").write_bytes(data)
    assert len(files["huge"][0]) < 100
    lines = [{**image, "image_tiles": str(tmp_path / f"{name}.npy")} for name in files] + [image]
    limit = f"1 <= tiles <= {most} (this export's vision image_size and tiling); regenerate it with seer-prompt-ids"
    idle, idle_wall, _ = run_measured(seer_run_lines(cpp_build, folder, tmp_path / "none.jsonl", [" "]))
    assert idle.returncode == 2 and "holds no requests" in idle.stderr, idle.stderr
    out, wall, peak_mb = run_measured(seer_run_lines(cpp_build, folder, tmp_path / "r.jsonl", lines[:1]))
    assert out.returncode == 1 and limit in out.stdout, out
    assert peak_mb < 200 and wall < idle_wall + 1, (peak_mb, wall, idle_wall)
    out, _, peak_mb = run_measured(seer_run_lines(cpp_build, folder, tmp_path / "r.jsonl", lines))
    assert out.returncode == 1 and f"1 answered, {len(files)} failed" in out.stderr, out.stderr
    results = [json.loads(line) for line in out.stdout.splitlines()]
    for i, (name, (_, words)) in enumerate(files.items()):
        assert results[i]["error"].startswith(f"line {i + 1}: image_tiles {tmp_path / name}.npy "), name
        assert words in results[i]["error"] and results[i]["error"].endswith("seer-prompt-ids --tiles"), name
    assert limit in results[0]["error"] and results[-1]["error"] is None
    assert peak_mb < 200, peak_mb


def test_image_tiles_that_are_no_regular_file_are_refused_without_blocking(cpp_build, folder, cpp_requests, tmp_path):
    """A FIFO with no writer (opened as a file it would hang the batch), a device and a folder: each line fails
    alone at once, the others are answered."""
    image = next(r for r in cpp_requests if "image_tiles" in r)
    os.mkfifo(tmp_path / "tiles.fifo")
    (tmp_path / "linked.npy").symlink_to(tmp_path / "tiles.fifo")
    kinds = {tmp_path / "tiles.fifo": "is a FIFO", tmp_path / "linked.npy": "is a FIFO", Path("/dev/zero"): "is a device",
             tmp_path: "is a folder"}  # fmt: skip
    lines = [{**image, "image_tiles": str(path)} for path in kinds] + [image]
    out, wall, _ = run_measured(seer_run_lines(cpp_build, folder, tmp_path / "r.jsonl", lines))
    assert out.returncode == 1 and f"1 answered, {len(kinds)} failed" in out.stderr, out.stderr
    results = [json.loads(line) for line in out.stdout.splitlines()]
    for (path, words), result in zip(kinds.items(), results, strict=False):
        assert f"image_tiles {path} {words}, not a regular file of tiles" in result["error"], result["error"]
    assert results[-1]["error"] is None


def test_a_request_line_past_its_bound_fails_alone_unheld(cpp_build, folder, cpp_requests, tmp_path):
    """A line of 24 bytes per id of the largest prompt bucket + 65536 is read; one byte more fails alone, and a 64 MB
    line is read through in bounded memory, from a file and from stdin."""
    largest = json.loads((folder / "manifest.json").read_text())["buckets"]["prompt"][-1]
    limit = 24 * largest + 65536
    good = json.dumps(cpp_requests[0])
    lines = [good, good + " " * (limit - len(good)), good + " " * (limit + 1 - len(good)),
             '{"prompt_ids": [' + "5, " * (64 * 2**20 // 3) + "5]}", good]  # fmt: skip
    argv = seer_run_lines(cpp_build, folder, tmp_path / "r.jsonl", lines)
    for how, args, stdin in (("file", argv, None), ("stdin", [*argv[:4], "-", *argv[5:]], tmp_path / "r.jsonl")):
        with open(stdin or os.devnull, "rb") as feed:
            out, _, peak_mb = run_measured(args, stdin=feed)
        assert out.returncode == 1 and "3 answered, 2 failed" in out.stderr, (how, out.stderr)
        results = [json.loads(line) for line in out.stdout.splitlines()]
        assert [r["error"] is None for r in results] == [True, True, False, False, True], how
        for number, r in ((3, results[2]), (4, results[3])):
            size = len(lines[number - 1])
            assert r["error"].startswith(f"line {number}: {size} bytes, more than the {limit} a request line"), r
        assert f"a request holds at most {largest} prompt_ids" in results[2]["error"]
        assert peak_mb < 200, (how, peak_mb)


def test_an_error_line_of_seer_prompt_ids_fails_alone_with_its_error(cpp_build, folder, cpp_requests, tmp_path):
    """{"error": "..."}, what seer-prompt-ids --input writes for a line it could not convert (so line numbers stay
    aligned), is that line's result error; an "error" that is not text is an unknown request key."""
    good = cpp_requests[0]
    message = "line 2: cannot read image /nowhere/cat.png (No such file or directory); pass an image file"
    lines = [good, {"error": message}, {**good, "error": 3}, good]
    out, _, _ = run_measured(seer_run_lines(cpp_build, folder, tmp_path / "r.jsonl", lines))
    assert out.returncode == 1 and "2 answered, 2 failed" in out.stderr, out.stderr
    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["error"] for r in results[:2]] == [None, message] and results[3]["error"] is None
    assert results[2]["error"].startswith("line 3: unknown request key 'error'")
    assert results[1] == {**results[2], "error": message}  # seer-run's fields of a failed request


def test_output_is_whole_or_nothing_and_leaves_nothing_behind(cpp_build, folder, cpp_requests, tmp_path):
    """--output naming a folder, a FIFO or a file in a missing folder is one line before any work (here before the
    missing export is noticed) and makes nothing; a run writes only --output; an --output that turns into a folder
    while the run reads stdin fails at the rename, and its staging file is gone."""
    (tmp_path / "out").mkdir()
    os.mkfifo(tmp_path / "out.fifo")
    argv = [cpp_build / "seer_run", "--engines", tmp_path / "no-export", "--input", tmp_path / "no.jsonl"]
    refused = {tmp_path / "out": "names a folder", f"{tmp_path / 'out'}/": "names a folder",
               tmp_path / "out.fifo": "is not a regular file",
               tmp_path / "missing" / "r.jsonl": f"is in {tmp_path / 'missing'}, which does not exist"}  # fmt: skip
    for output, words in refused.items():
        out, _, _ = run_measured([*argv, "--output", output])
        assert out.returncode == 2 and out.stderr.startswith(f"seer_run: --output {output} {words}"), out.stderr
        assert len(out.stderr.splitlines()) == 1 and not out.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "out.fifo"] and not any((tmp_path / "out").iterdir())
    args = seer_run_lines(cpp_build, folder, tmp_path / "r.jsonl", [cpp_requests[0]])
    out, _, _ = run_measured([*args, "--output", tmp_path / "out" / "r.jsonl"])
    assert out.returncode == 0 and [p.name for p in (tmp_path / "out").iterdir()] == ["r.jsonl"], out.stderr
    assert json.loads((tmp_path / "out" / "r.jsonl").read_text())["error"] is None
    target = tmp_path / "out" / "late.jsonl"
    proc = subprocess.Popen([*map(str, args[:4]), "-", *map(str, args[5:]), "--output", str(target)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    start = time.monotonic()  # ONNX Runtime loads after --output is checked; seer_run then waits for stdin
    while proc.poll() is None and "libonnxruntime" not in Path(f"/proc/{proc.pid}/maps").read_text():
        assert time.monotonic() - start < 60, "seer_run never loaded ONNX Runtime"
        time.sleep(0.01)
    target.mkdir()
    (target / "keep").write_text("")
    _, err = proc.communicate(json.dumps(cpp_requests[0]).encode() + b"\n", timeout=60)
    assert proc.returncode == 2 and f"cannot write --output {target}" in err.decode(), err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["late.jsonl", "r.jsonl"]  # no staging file


def test_four_threads_on_one_pipeline_give_the_sequential_answers(cpp, cpp_requests):
    sequential = [cpp.generate(cpp_requests[i::4], policy="cost_model") for i in range(4)]
    found: dict[int, list] = {}

    def work(i: int) -> None:
        for _ in range(2):
            found.setdefault(i, []).append(cpp.generate(cpp_requests[i::4], policy="cost_model"))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    strip = lambda rs: [{k: v for k, v in r.items() if k != "seconds"} for r in rs]  # noqa: E731
    for i in range(4):
        assert [strip(r) for r in found[i]] == [strip(sequential[i])] * 2


def test_readme_cpp_example_builds_and_prints_what_it_says(cpp_build, folder, tmp_path):
    """The README's C++ example and its g++ command, verbatim, against this build, where the set-up's export lies."""
    out, printed = run_readme_example(tmp_path, folder, cpp_build, "cpp", r"g\+\+ -std=c\+\+17 example\.cpp [^`]+",
                                      r"it\s+prints `([^`]+)`", "example")  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == printed, (out.stdout, out.stderr)


def run_readme_example(tmp_path: Path, folder: Path, cpp_build: Path, fence: str, command: str, printed: str,
                       binary: str):  # fmt: skip
    """The README's C++ section's ``fence`` block built by its ``command`` (a pattern), verbatim, against this build
    where the set-up's export lies, and run: (the run, what the README says it prints: ``printed``'s group)."""
    section = re.search(r"^## C\+\+\n(.*?)(?=^## |\Z)", (ROOT / "README.md").read_text(), re.S | re.M).group(1)
    code = re.search(rf"```{fence}\n(.*?)```", section, re.S).group(1)
    build = re.search(rf"`({command})`", section).group(1)
    (tmp_path / f"example.{fence}").write_text(code)
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "tiny-llada-v-fp32").symlink_to(folder)
    (tmp_path / "cpp").mkdir()
    (tmp_path / "cpp" / "include").symlink_to(ROOT / "cpp" / "include")
    (tmp_path / "cpp" / "build").symlink_to(cpp_build)
    out = run_cli(["bash", "-c", build], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    out = run_cli([tmp_path / binary], cwd=tmp_path, env={**os.environ, "SEER_ORT_LIBRARY": ort_library()})
    return out, re.search(printed, section).group(1)


def test_readme_c_sampled_request_prints_what_seer_run_answers(cpp_build, folder, tmp_path):
    """The README's C example (a sampled request through the C ABI) and its cc command, verbatim: it prints what the
    README says, which is the Python runtime's answer to the same request and seed."""
    out, printed = run_readme_example(tmp_path, folder, cpp_build, "c", r"cc example\.c [^`]+",
                                      r"`cc example\.c [^`]+` builds it; it\s+prints\s+`([^`]+)`", "example_c")  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == printed, (out.stdout, out.stderr)
    py = SeerPipeline.from_manifest(folder)
    try:
        (want,) = py.generate([Request("count to 7 .", early_stop=True, temperature=0.8, top_p=0.9, seed=7)])
    finally:
        py.close()
    assert printed == f"{want.text} | L* {want.kept}"  # (the trained fixture is sure of this one at any seed)


# A caller of an older and of a newer seer_c.h than the library's, as compiled programs are: the C ABI's request
# promise (seer_c.h: struct_size). PROMPT_IDS: the ids of "count to 7 .".
ABI_CALLERS = r"""#include <stdio.h>
#include <string.h>
#include "seer/seer_c.h"

typedef struct {  /* seer_request of C ABI 4 (no struct_size), as a caller built then laid it out */
  const int64_t* prompt_ids; size_t prompt_len; const float* pixel_values; int64_t tiles;
  int64_t grid_cols, grid_rows, image_width, image_height, gen_length, steps, block_length, window;
  int32_t no_seer, early_stop; const char* cache; int64_t refresh_interval; const char* decoding;
  const char* remasking;
} request_v4;

typedef struct {  /* a later header's request: ABI 5's fields, then one this library does not know */
  seer_request base;
  int64_t later;
} request_next;

typedef seer_results* (*generate_v4)(seer_pipeline*, const request_v4*, size_t, const char*);

static void show(const char* who, seer_results* r) {
  if (!r) printf("%s refused: %s\n", who, seer_last_error());
  else printf("%s answered: %s\n", who, r->items[0].error ? r->items[0].error : r->items[0].text);
  if (r) seer_results_free(r);
}

int main(int argc, char** argv) {
  seer_pipeline* pipe = seer_open(argv[1], NULL, NULL, 0);
  if (!pipe) return printf("%s\n", seer_last_error()), 1;
  static const int64_t ids[] = {PROMPT_IDS};
  generate_v4 call_v4 = (generate_v4)(void (*)(void))seer_generate; /* the symbol an ABI 4 binary calls */
  request_v4 old;
  memset(&old, 0, sizeof old);
  old.prompt_ids = ids, old.prompt_len = sizeof ids / sizeof ids[0], old.early_stop = 1;
  show("v4", call_v4(pipe, &old, 1, NULL));
  request_next next[2];
  memset(next, 0, sizeof next);
  for (int i = 0; i < 2; ++i) {
    next[i].base = seer_request_defaults();
    next[i].base.struct_size = sizeof(request_next);
    next[i].base.prompt_ids = ids, next[i].base.prompt_len = sizeof ids / sizeof ids[0];
    next[i].base.early_stop = 1, next[i].base.temperature = 0.8, next[i].base.top_p = 0.9, next[i].base.seed = 7;
  }
  show("next, later 0", seer_generate(pipe, &next[0].base, 2, NULL));
  next[1].later = 1;
  show("next, later 1", seer_generate(pipe, &next[0].base, 2, NULL));
  seer_request now = seer_request_defaults();
  now.prompt_ids = ids, now.prompt_len = sizeof ids / sizeof ids[0];
  now.early_stop = 1, now.temperature = 0.8, now.top_p = 0.9, now.seed = 7;
  show("v5", seer_generate(pipe, &now, 1, NULL));
  seer_close(pipe);
  return 0;
}
"""


def test_c_abi_requests_of_older_and_newer_callers(cpp_build, folder, tmp_path):
    """C ABI 5's request promise, with compiled callers: one built before ABI 5 (its struct has no struct_size) is
    refused with an error that says so, never misread; one built against a later header is answered as an ABI 5
    caller when the fields this library lacks are 0 (struct_size the stride of its array), and refused, naming the
    byte, when it sets one; an ABI 5 caller's sampled answer is the Python runtime's."""
    ids = CppRequests(folder).convert({"prompt": "count to 7 ."}, None)["prompt_ids"]
    (tmp_path / "callers.c").write_text(ABI_CALLERS.replace("PROMPT_IDS", ", ".join(map(str, ids))))
    build = ["cc", "-std=c99", "callers.c", f"-I{ROOT / 'cpp' / 'include'}", f"-L{cpp_build}", "-lseer",
             f"-Wl,-rpath,{cpp_build}", "-o", "callers"]  # fmt: skip
    out = run_cli(build, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    out = run_cli([tmp_path / "callers", folder], cwd=tmp_path, env={**os.environ, "SEER_ORT_LIBRARY": ort_library()})
    assert out.returncode == 0, (out.stdout, out.stderr)
    py = SeerPipeline.from_manifest(folder)
    try:
        (want,) = py.generate([Request("count to 7 .", early_stop=True, temperature=0.8, top_p=0.9, seed=7)])
    finally:
        py.close()
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("v4 refused: seer_request.struct_size is "), lines
    assert "before ABI 5 has no struct_size" in lines[0] and "seer_request_defaults()" in lines[0], lines
    assert lines[1] == f"next, later 0 answered: {want.text}", lines
    assert lines[2].startswith("next, later 1 refused: request 1 sets a field at byte "), lines
    assert lines[3] == f"v5 answered: {want.text}", lines


@pytest.fixture(scope="module")
def anyres_export(tmp_path_factory) -> Path:
    """A random 2-layer LLaDA-V with anyres_max_4 tiling (16 px tiles of 2 x 2 patches, grids up to 6 x 6),
    exported without validation: parity of the two runtimes needs no trained weights."""
    import torch
    from tiny_models import tiny_config

    from seer_export.cli import main as export_main
    from seer_export.models.random_checkpoint import write_random_checkpoint

    root = tmp_path_factory.mktemp("anyres")
    cfg = tiny_config(vocab=83, layers=2)  # the fixture tokenizer's vocabulary
    assert cfg.image_aspect_ratio == "anyres_max_4"
    write_random_checkpoint(root / "checkpoint", cfg, dtype=torch.float32, gain=3.0)
    out = ["--out", str(root / "engines"), "--no-validate", "--sampling"]  # sampling: wide distributions, below
    assert export_main(["--checkpoint", str(root / "checkpoint"), *out]) == 0
    return root / "engines"


@pytest.mark.parametrize("graph", ["denoise_logits", "top ids"])
def test_sampled_requests_of_a_random_model_equal_python(lib, anyres_export, tmp_path, graph):
    """A random model's distributions are wide, so draws decide most tokens (the trained fixture's are sharp: a few
    windows in 40 differ from greedy): sampled requests (temperature 0.8, top_p 0.9, a seed each) answer as in
    Python through denoise_logits (Sampled) and denoise's top ids (TopK)."""
    export = anyres_export
    if graph == "top ids":
        graphs = json.loads((anyres_export / "manifest.json").read_text())["graphs"]
        kept = {k: v for k, v in graphs.items() if k != "denoise_logits"}
        export = calibrated_copy(anyres_export, tmp_path / "engines", graphs=kept)
    shape = {"gen_length": 16, "steps": 16}
    prompts = [s.question for s in SAMPLES if s.image is None]  # the 27 text ones
    fields = sampled_fields()[: len(prompts)]
    conv = CppRequests(export)
    cpp_requests = [{**conv.convert({"prompt": q, **shape}, None), **f} for q, f in zip(prompts, fields, strict=True)]
    py = SeerPipeline.from_manifest(export)
    try:
        python = py.generate([Request(q, **shape, **f) for q, f in zip(prompts, fields, strict=True)])
        greedy = py.generate([Request(q, **shape) for q in prompts])
    finally:
        py.close()
    with CppPipeline(lib, export, ort_library=ort_library()) as cpp:
        assert_same(python, cpp.generate(cpp_requests))
    assert sum(a.window != g.window for a, g in zip(python, greedy, strict=True)) > len(prompts) // 2


def test_anyres_images_equal_python(lib, anyres_export, tmp_path):
    """Grids from 1 x 1 to 6 x 3, crops above / below and left / right, maps shrunk past anyres_max_4."""
    rng = np.random.default_rng(0)
    sizes = [(12, 40), (50, 30), (20, 20), (33, 90), (90, 33), (64, 64), (7, 70), (100, 45), (16, 16), (40, 200)]
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    conv = CppRequests(anyres_export)
    fields = {"prompt": "count the shapes one by one .", "gen_length": 16, "steps": 16}
    cpp_requests = [conv.convert({**fields, "image": im}, tmp_path / f"{i}.npy") for i, im in enumerate(images)]
    assert len({tuple(r["image_grid"]) for r in cpp_requests}) >= 8
    py = SeerPipeline.from_manifest(anyres_export)
    python = py.generate([Request(fields["prompt"], im, gen_length=16, steps=16) for im in images])
    with CppPipeline(lib, anyres_export, ort_library=ort_library()) as cpp:
        assert_same(python, cpp.generate(cpp_requests))
        no_grid = {k: v for k, v in cpp_requests[0].items() if k != "image_grid"}
        assert "image_grid" in cpp.generate([no_grid])[0]["error"]
    py.close()


@pytest.fixture(scope="module")
def lavida_export(tmp_path_factory) -> Path:
    """A random LaViDa-LLaDA (tests/tiny_models.py): native names, tiles pooled 7 -> 4 inside the vision graph, plain
    anyres over LaViDa's five pinpoints; exported without validation (test_lavida.py checks its parity)."""
    import torch
    from tiny_models import tiny_lavida_config

    from seer_export.cli import main as export_main
    from seer_export.models.random_checkpoint import write_random_checkpoint

    root = tmp_path_factory.mktemp("lavida")
    write_random_checkpoint(root / "checkpoint", tiny_lavida_config(vocab=83), dtype=torch.float32, gain=3.0)
    assert export_main(["--model", "lavida-llada", "--checkpoint", str(root / "checkpoint"), "--out",
                        str(root / "engines"), "--no-validate"]) == 0  # fmt: skip
    return root / "engines"


def test_lavida_images_and_seer_equal_python(lib, lavida_export, tmp_path):
    """LaViDa's pooled features merged at side 4, every grid of its pinpoints, crops either way; LaViDa's own loop
    (no stop; blocks of min(128, N), also for a request's gen_length) and Seer."""
    rng = np.random.default_rng(2)
    sizes = [(12, 40), (50, 30), (20, 20), (33, 90), (90, 33), (64, 64), (7, 70), (100, 45), (28, 28), (40, 120)]
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    conv = CppRequests(lavida_export)
    prompt = "count the shapes one by one ."
    cpp_requests = [conv.convert({"prompt": prompt, "image": im}, tmp_path / f"{i}.npy") for i, im in enumerate(images)]
    assert len({tuple(r["image_grid"]) for r in cpp_requests}) == 5  # every pinpoint's grid
    py = SeerPipeline.from_manifest(lavida_export)
    with CppPipeline(lib, lavida_export, ort_library=ort_library()) as cpp:
        for seer in (False, True):  # blocks of min(128, N): one block at 16; a fixed policy, as for MMaDA below
            python = py.generate([Request(prompt, im, seer=seer, gen_length=16) for im in images], policy="naive_pad")
            assert_same(python, cpp.generate([{**r, "seer": seer, "gen_length": 16} for r in cpp_requests],
                                             policy="naive_pad"))  # fmt: skip
        # the default window: 256 steps in 2 blocks of 128, one token a step under the fixed rule (the default factor
        # rule's count depends on the random model's confidences)
        python = py.generate([Request(prompt, images[0], seer=False, decoding="fixed")])
        assert python[0].steps == 256 and python[0].gen_length == 256
        assert_same(python, cpp.generate([{**cpp_requests[0], "seer": False, "decoding": "fixed"}]))
    py.close()


@pytest.fixture(scope="module")
def mmada_export(tmp_path_factory) -> Path:
    """A random MMaDA (tests/tiny_models.py): no vision tower; the image_tokens graph's ids, embedded by embed, go
    before the question; exported without validation (test_mmada.py checks its parity)."""
    import torch
    from tiny_models import tiny_magvit, tiny_mmada_config

    from seer_export.cli import main as export_main
    from seer_export.models.random_checkpoint import write_random_checkpoint

    root = tmp_path_factory.mktemp("mmada")
    write_random_checkpoint(root / "checkpoint", tiny_mmada_config(), dtype=torch.float32, gain=3.0,
                            image_tokenizer=tiny_magvit())  # fmt: skip
    assert export_main(["--model", "mmada", "--checkpoint", str(root / "checkpoint"), "--out", str(root / "engines"),
                        "--no-validate"]) == 0  # fmt: skip
    return root / "engines"


def test_mmada_image_ids_and_seer_equal_python(lib, mmada_export, tmp_path):
    """MMaDA's centre crop, the image_tokens graph's ids through embed, <|mmu|><|soi|> ... <|eoi|> before the question;
    MMaDA's own loop (N / 2 steps in blocks of N / 4) and Seer."""
    rng = np.random.default_rng(3)
    sizes = [(12, 40), (50, 30), (20, 20), (90, 33), (16, 16), (7, 70)]
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    conv = CppRequests(mmada_export)
    prompt = "count the shapes one by one ."
    loop = {"gen_length": 16, "decoding": "fixed"}  # both runtimes give it MMaDA's shape: 8 steps in blocks of 4
    cpp_requests = [conv.convert({"prompt": prompt, "image": im}, tmp_path / f"{i}.npy") for i, im in enumerate(images)]
    assert all(r["prompt_ids"][:4] == [99, 100, -200, 101] for r in cpp_requests)
    cpp_requests.append(conv.convert({"prompt": prompt}, tmp_path / "text.npy"))  # and one without an image
    py = SeerPipeline.from_manifest(mmada_export)
    with CppPipeline(lib, mmada_export, ort_library=ort_library()) as cpp:
        # a fixed dispatch policy: under cost_model each runtime measures its own costs, so the groups may differ,
        # and with them the prompt computations a row shares (its tokens do not)
        for fields in (loop, {"gen_length": 16, "seer": True}):
            python = py.generate([Request(prompt, im, **fields) for im in [*images, None]], policy="naive_pad")
            assert_same(python, cpp.generate([{**r, **fields} for r in cpp_requests], policy="naive_pad"))
            assert fields is not loop or {r.steps for r in python} == {8}
    py.close()


def test_grouped_query_attention_with_biases_equals_python(lib, tmp_path):
    """4 query heads over 2 K/V heads with q/k/v biases (Qwen2's and Dream's attention): the prompt cache holds the 2
    K/V heads in both runtimes, exact, reuse and forecast."""
    import torch
    from tiny_models import gqa_bias_config

    from seer_export.cli import main as export_main
    from seer_export.models.random_checkpoint import write_random_checkpoint

    write_random_checkpoint(tmp_path / "ckpt", gqa_bias_config(), dtype=torch.float32, gain=3.0)
    assert (
        export_main(["--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "engines"), "--no-validate"]) == 0
    )
    conv = CppRequests(tmp_path / "engines")
    prompts = ["count to 5 .", "repeat cat 3 times .", "count the shapes one by one ."]
    cpp_requests = [conv.convert({"prompt": p}, None) for p in prompts]
    py = SeerPipeline.from_manifest(tmp_path / "engines")
    with CppPipeline(lib, tmp_path / "engines", ort_library=ort_library()) as cpp:
        for cache in ("none", "reuse", "forecast"):
            fields = {"cache": cache, "refresh_interval": 2, "decoding": "fixed"}
            python = py.generate([Request(p, **fields) for p in prompts], policy="naive_pad")
            assert_same(python, cpp.generate([{**r, **fields} for r in cpp_requests], policy="naive_pad"))
    py.close()


def test_bench_cpp_times_equal_answers(cpp_build, folder):
    """seer-bench --cpp's comparison (one short round): both runtimes answered alike, latencies and the time outside
    the graphs reported for both."""
    from seer_export.bench.cpp import cpp_vs_python, table

    py = SeerPipeline.from_manifest(folder, threads=1)
    report = cpp_vs_python(
        py, folder, cpp_build / "libseer.so", (32,), prompts=3, rounds=1, threads=1, seed=5, progress=print
    )
    py.close()
    row = report["32"]
    assert row["answers_equal"] == 3 and row["python_over_cpp"]["rounds"] == 1
    for key in ("latency_ms", "outside_graphs_ms"):
        assert set(row[key]) == {"python", "cpp"} and all(v > 0 for v in row[key].values()), row[key]
    assert row["outside_graphs_ms"]["cpp"] < row["latency_ms"]["cpp"]
    assert "| 32 |" in table(report)


def test_export_without_the_cache_refuses_a_cache_policy(lib, folder, tmp_path):
    """A window graph without cache inputs (schema 2.0, before the prompt K/V cache) runs with cache none only: the
    C++ runtime says so at open, as seer_trt.contracts.policies.check_cache does, before it loads a graph. (That it runs a 2.0
    export with cache none is checked by hand in docs/bench/cpp.md: this checkout exports 2.1 only.)"""
    d = broken_copy(folder, tmp_path / "schema-2.0")
    data = json.loads((d / "manifest.json").read_text())
    graph = data["graphs"]["denoise"]
    graph["inputs"] = graph["inputs"][:4]  # prefix_embeds, gen_ids, segment_ids, position_ids
    graph["outputs"] = [t for t in graph["outputs"] if not t["name"].startswith("present.")]
    (d / "manifest.json").write_text(json.dumps({**data, "schema_version": "2.0"}))
    for cache in (
        {"cache": "forecast"},
        {},
    ):  # the default policy (reuse, as seer_trt.contracts.policies.DEFAULT_CACHE) too
        with pytest.raises(ManifestError, match="takes no prompt K/V cache .exported before schema 2.1.; re-export"):
            CppPipeline(lib, d, ort_library=ort_library(), **cache)


@pytest.fixture(scope="module")
def dream_export(tmp_path_factory) -> Path:
    """A random Dream (tests/tiny_models.py): Hugging Face names, 4 query heads over 2 K/V heads with q/k/v biases,
    shifted logits, text only; exported without validation (test_dream.py checks its parity)."""
    import torch
    from tiny_models import tiny_dream_config

    from seer_export.cli import main as export_main
    from seer_export.models.random_checkpoint import write_random_checkpoint
    from seer_export.reference.fixture import build_tokenizer

    root = tmp_path_factory.mktemp("dream")
    cfg = tiny_dream_config(build_tokenizer("dream").get_vocab_size())
    write_random_checkpoint(root / "checkpoint", cfg, dtype=torch.float32, gain=3.0)
    assert export_main(["--model", "dream", "--checkpoint", str(root / "checkpoint"), "--out", str(root / "engines"),
                        "--no-validate"]) == 0  # fmt: skip
    return root / "engines"


def test_dream_schedule_shift_scores_and_cache_equal_python(lib, dream_export):
    """Dream's timestep schedule, its shifted logits (inside the graphs), its scores (the denoise graph's log_margin
    and neg_entropy) and the prompt cache whose cached step computes each row's last prompt position: C++ = Python,
    padded and packed, padded loop and Seer, every cache policy."""
    prompts = ["count to 5 .", "repeat cat 3 times .", "count from 3 to 9 .", "repeat dog sun 2 times ."]
    conv = CppRequests(dream_export)
    cpp_requests = [conv.convert({"prompt": p}, None) for p in prompts]
    tailed = calibrated_copy(
        dream_export,
        dream_export.parent / "tailed",
        SeerConfig.from_dict(
            {**json.loads((dream_export / "manifest.json").read_text())["seer"], "tail": 0.5, "tail_token": "endoftext"}
        ),
    )
    py = SeerPipeline.from_manifest(tailed)  # Seer's end tail ahead of the prompt, the cache holding it, shifted
    assert py.manifest.generation.schedule == "dream" and py.manifest.model.logit_shift == 1
    with CppPipeline(lib, tailed, ort_library=ort_library()) as cpp:
        for cache in ("none", "reuse", "forecast"):
            for seer in (False, True):
                fields = {"remasking": "low_confidence", "gen_length": 16, "cache": cache, "refresh_interval": 3,
                          "seer": seer}  # fmt: skip
                for policy in ("naive_pad", "packed"):
                    python = py.generate([Request(p, **fields) for p in prompts], policy=policy)
                    assert_same(python, cpp.generate([{**r, **fields} for r in cpp_requests], policy=policy))
        for remasking in (None, "topk_margin"):  # the export's default (entropy), then LaViDa-Dream's
            for fields in ({"cache": "none"}, {"cache": "reuse", "refresh_interval": 3, "seer": True}):
                fields = {**fields, "gen_length": 16, **({"remasking": remasking} if remasking else {})}
                python = py.generate([Request(p, **fields) for p in prompts], policy="naive_pad")
                assert_same(python, cpp.generate([{**r, **fields} for r in cpp_requests], policy="naive_pad"))
        refused = cpp.generate([{**cpp_requests[0], "remasking": "entropy", "decoding": "factor:1"}])[0]
        assert "decoding 'fixed'" in refused["error"] and "low_confidence" in refused["error"]
    py.close()


HOSTILE_CPP = {  # kind (tests/test_confined.py) -> what seer_run says
    "traversal": 'manifest entry graphs.denoise.file is "../../../../etc/passwd", a path outside the export folder',
    "absolute path": 'manifest entry graphs.denoise.file is "/etc/passwd", a path outside the export folder',
    "weights outside": 'manifest entry weights.file is "../../etc/passwd", a path outside the export folder',
    "outside symlink": "graphs.denoise.file (denoise.onnx) resolves through a symbolic link to a file outside",
    "fifo manifest": "the manifest manifest.json is not a regular file",
    "fifo tokenizer": "tokenizer tokenizer.json is not a regular file",
    "fifo index": "weights.index weights.json is not a regular file",
    "huge bucket": "buckets.answer: at most 64 sizes of at most 65536",
    "huge manifest": "the manifest manifest.json is 1073741824 bytes, more than the 16777216",
}


@pytest.mark.parametrize("kind", list(HOSTILE_CPP))
def test_a_hostile_export_is_refused_by_seer_run_in_one_line_at_once(cpp_build, folder, tmp_path, kind):
    """The Python catalogue of hostile exports (tests/test_confined.py) through cpp/build/seer_run: exit 2, one line
    naming the export and the entry, within seconds, nothing opened outside the folder and no FIFO waited on."""
    from test_confined import HOSTILE

    d = broken_copy(folder, tmp_path / "engines")
    HOSTILE[kind][0](d)
    (tmp_path / "r.jsonl").write_text('{"prompt_ids": [1, 2]}\n')
    start = time.monotonic()
    out = run_cli([cpp_build / "seer_run", "--engines", d, "--input", tmp_path / "r.jsonl", "--ort-library",
                   ort_library()], timeout=30)  # fmt: skip
    assert time.monotonic() - start < 5.0  # a FIFO waited on would hang to the timeout
    assert out.returncode == 2 and HOSTILE_CPP[kind] in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "root:" not in out.stderr  # no foreign file quoted


def test_a_tokenizer_naming_a_huge_id_costs_its_entries_not_the_id(cpp_build, folder, cpp_requests, tmp_path):
    """An added token at id 2^40 in tokenizer.json (a table indexed by id would ask for terabytes): seer_run answers
    as on the export's own tokenizer, at once."""
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in cpp_requests[:4]))
    texts = []
    for name, edit in (("own", False), ("huge-id", True)):
        d = broken_copy(folder, tmp_path / name)
        if edit:
            tok = json.loads((d / "tokenizer" / "tokenizer.json").read_text())
            tok["added_tokens"].append({"id": 2**40, "content": "<|far|>", "single_word": False, "lstrip": False,
                                        "rstrip": False, "normalized": False, "special": True})  # fmt: skip
            (d / "tokenizer" / "tokenizer.json").write_text(json.dumps(tok))
        start = time.monotonic()
        out = run_cli([cpp_build / "seer_run", "--engines", d, "--input", tmp_path / "r.jsonl", "--ort-library",
                       ort_library()], timeout=120)  # fmt: skip
        assert out.returncode == 0 and time.monotonic() - start < 60, out.stderr
        texts.append([json.loads(line)["text"] for line in out.stdout.splitlines()])
    assert len(texts[0]) == 4 and all(texts[0]) and texts[1] == texts[0]


@pytest.mark.parametrize("setting", [None, "0"])
def test_seer_run_leaves_onnx_runtimes_telemetry_off_unless_asked_for(cpp_build, folder, tmp_path, setting):
    """cpp/build/seer_run sets ORT_DISABLE_TELEMETRY=1 before it loads ONNX Runtime unless the environment set it:
    under an empty HOME nothing is written; =0 brings ONNX Runtime's device id back (docs/DESIGN.md "Telemetry")."""
    home = tmp_path / "home"
    home.mkdir()
    env = telemetry_env(os.environ, home, setting)
    (tmp_path / "r.jsonl").write_text('{"prompt_ids": [1, 2]}\n')
    out = run_cli([cpp_build / "seer_run", "--engines", folder, "--input", tmp_path / "r.jsonl", "--ort-library",
                   ort_library()], env=env, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    written = sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())
    if setting is None:
        assert written == [], written
    else:
        assert ".cache/Microsoft/DeveloperTools/.onnxruntime/deviceid" in written, (written, sorted(env))
