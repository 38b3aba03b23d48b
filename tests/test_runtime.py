"""The runtime pipeline on the fixture export (docs/DESIGN.md "Layout and dependency direction", "Seer, exactly"): tokens equal to the PyTorch reference, with and
without Seer, in batches of one and mixed batches, under every dispatch policy and from several threads; bad
input failing alone; the export folder checked; seer-run."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from ort_sessions import prepacks
from test_imports import BLOCKER

from seer_export.models.loading import load_model
from seer_export.models.registry import FIXTURE_DIR
from seer_export.reference.fixture import TaskEncoder
from seer_export.reference.sampler import generate
from seer_export.reference.seer import seer_generate
from seer_trt.backends.onnxruntime import OrtBackend, loop_prepack_fits
from seer_trt.cli.run import main as run_main
from seer_trt.contracts.config import SeerConfig
from seer_trt.contracts.errors import ConfigError, ManifestError
from seer_trt.contracts.policies import POLICIES
from seer_trt.eval.tasks import make_samples
from seer_trt.runtime.kv_cache import no_cache
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request

pytestmark = pytest.mark.slow  # every test runs the fixture export (a minute of seer-export)
SAMPLES = make_samples(11, 10)  # held-out: the trainer draws from seeds >= 1_000_000


@pytest.fixture(scope="module")
def pipe(fixture_export) -> SeerPipeline:
    folder, _, _ = fixture_export
    return SeerPipeline.from_manifest(folder)


@pytest.fixture(scope="module")
def reference(fixture_export) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """PyTorch reference of SAMPLES: {"seer": (tokens [B, N], kept [B], steps [B]), "baseline": ...,
    "early_stop": ..., "seer_early_stop": ...}."""
    _, manifest, _ = fixture_export
    model = load_model(FIXTURE_DIR)
    enc = TaskEncoder(FIXTURE_DIR, model.config)
    with torch.no_grad():
        prefix, valid = enc.prefix(model, SAMPLES)
        gen, special = manifest.generation, enc.special
        out = {
            "seer": seer_generate(model, prefix, valid, gen, special, manifest.seer)[0],
            "baseline": generate(model, prefix, valid, gen, special),
            "early_stop": generate(model, prefix, valid, gen, special, early_stop=True),
            "seer_early_stop": seer_generate(model, prefix, valid, gen, special, manifest.seer, early_stop=True)[0],
        }
    return {k: (g.tokens, g.kept, g.steps) for k, g in out.items()}


def requests(seer: bool = True, **overrides) -> list[Request]:
    """SAMPLES as requests on the exact loop (cache "none": what the PyTorch reference computes)."""
    return [Request(s.question, s.image, seer=seer, **{"cache": "none", **overrides}) for s in SAMPLES]


def request_mode(mode: str) -> list[Request]:
    return requests(seer=mode.startswith("seer"), early_stop=mode.endswith("early_stop"))


def windows(results) -> list[list[int]]:
    return [list(r.window) for r in results]


@pytest.mark.parametrize("mode", ["seer", "baseline", "early_stop", "seer_early_stop"])
def test_pipeline_tokens_equal_the_pytorch_reference(pipe, reference, mode):
    tokens, kept, steps = reference[mode]
    results = pipe.generate(request_mode(mode))
    assert all(r.ok for r in results), [r.error for r in results]
    assert [r.kept for r in results] == kept.tolist()
    assert [r.steps for r in results] == steps.tolist()
    assert windows(results) == [row[:k].tolist() for row, k in zip(tokens, kept, strict=True)]
    eot = pipe.manifest.special_tokens.eot_id
    for r in results:  # the answer is the window up to <|eot_id|>, and the text is its decoding
        assert list(r.token_ids) == (list(r.window)[: list(r.window).index(eot)] if eot in r.window else list(r.window))
        assert r.text == pipe.prompts.tokenizer.decode(list(r.token_ids), skip_special_tokens=True)
        assert set(r.seconds) >= {"preprocess", "step_zero", "boundary", "dispatch", "denoise", "detokenize"}
    if mode != "baseline":
        assert max(r.steps for r in results) < pipe.manifest.generation.steps  # truncation / stopping saved steps
    if mode.endswith("early_stop"):
        assert all(r.window[len(r.token_ids)] == eot for r in results)  # every answer ended at its <|eot_id|>
    alone = [pipe.generate(r)[0] for r in request_mode(mode)[:3]]  # batch of one
    assert windows(alone) == windows(results[:3]) and [r.steps for r in alone] == [r.steps for r in results[:3]]


@pytest.mark.parametrize("decoding", ["threshold:0.9", "factor:1"])
@pytest.mark.parametrize("mode", ["seer", "baseline", "seer_early_stop"])
def test_parallel_decoding_equals_the_pytorch_reference(fixture_export, pipe, decoding, mode):
    """docs/DESIGN.md "Decoding strategies": every rule gives the reference sampler's tokens and forward passes,
    batched and alone, with Seer's cut and the stop rule; under the prompt cache it still answers every row."""
    _, manifest, _ = fixture_export
    model = load_model(FIXTURE_DIR)
    enc = TaskEncoder(FIXTURE_DIR, model.config)
    gen = dataclasses.replace(manifest.generation, decoding=decoding)
    early = mode.endswith("early_stop")
    with torch.no_grad():
        prefix, valid = enc.prefix(model, SAMPLES)
        if mode.startswith("seer"):
            ref = seer_generate(model, prefix, valid, gen, enc.special, manifest.seer, early_stop=early)[0]
        else:
            ref = generate(model, prefix, valid, gen, enc.special, early_stop=early)
    reqs = [dataclasses.replace(r, decoding=decoding) for r in request_mode(mode)]
    results = pipe.generate(reqs)
    assert [r.kept for r in results] == ref.kept.tolist()
    assert [r.steps for r in results] == ref.steps.tolist()
    assert windows(results) == [row[:k].tolist() for row, k in zip(ref.tokens, ref.kept, strict=True)]
    assert sum(r.steps for r in results) < sum(r.kept for r in results)  # several tokens a step
    assert windows([pipe.generate(r)[0] for r in reqs[:2]]) == windows(results[:2])
    cached = pipe.generate([dataclasses.replace(r, cache="reuse") for r in reqs])
    assert all(r.ok and r.kept == c.kept for r, c in zip(results, cached, strict=True))


def test_a_call_plans_first_then_executes_its_plan(fixture_export):
    """plan() prepares and groups every request before any denoising, a bad one recorded as failed; execute()
    measures the cost model first when the plan needs it and returns what generate() returns."""
    pipe = SeerPipeline.from_manifest(fixture_export[0])
    calls = [Request("count to 3 ."), " ", Request("count to 4 .", seer=False), Request("count to 5 .")]
    plan = pipe.plan(calls)
    assert plan.size == 4 and list(plan.failed) == [1] and "prompt is empty" in plan.failed[1][0]
    assert [g.rows for g in plan.groups] == [(0, 3), (2,)] and [g.mode for g in plan.groups] == ["seer", "full"]
    assert plan.needs_costs and pipe.cost is None  # nothing ran yet
    out = pipe.execute(plan)
    assert pipe.cost is not None
    assert [r.text for r in out.results] == [r.text for r in pipe.generate(calls)]
    assert [r.ok for r in out.results] == [True, False, True, True]
    assert not pipe.plan(calls[:1]).needs_costs  # one row: no batch to route


def test_every_policy_gives_the_same_tokens(pipe):
    """Every split of each step's rows into calls gives the same answers: one row a call (the most calls), a batch
    bucket's worth a call in order (the fewest), and the rest between."""
    out = {p: pipe.generate_batch(requests(), policy=p) for p in POLICIES}
    first = windows(out["hybrid"].results)
    for policy, batch in out.items():
        assert windows(batch.results) == first, policy
        assert batch.stats.steps == out["hybrid"].stats.steps  # every live row steps at every step, whatever the split
        assert out["per_request"].stats.calls >= batch.stats.calls >= out["naive_pad"].stats.calls, policy
    assert out["per_request"].stats.rows_per_call == 1.0 and out["naive_pad"].stats.rows_per_call > 1.0
    assert pipe.cost is not None and pipe.cost.c1 > 0  # cost_model measured the backend first


def test_sampled_decoding_is_seeded_and_independent_of_dispatch(pipe):
    reqs = [dataclasses.replace(r, seed=i) for i, r in enumerate(requests(temperature=0.7))]
    packed = windows(pipe.generate(reqs, policy="packed"))
    assert packed == windows(pipe.generate(reqs, policy="per_request"))
    assert packed == windows(pipe.generate(reqs[::-1], policy="hybrid"))[::-1]  # seeds go with their request


def test_concurrent_threads_get_the_sequential_answers(pipe):
    expected = windows(pipe.generate(requests()))
    got: dict[int, list] = {}

    def work(k: int) -> None:
        got[k] = windows(pipe.generate(requests()[k:] + requests()[:k]))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert sorted(got) == [0, 1, 2, 3]
    for k, w in got.items():
        assert w == expected[k:] + expected[:k]


def test_bad_requests_fail_alone(pipe, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    good = requests()[:2]
    bad = [
        Request(""),
        Request("look <image> here", image=broken),
        Request("count to 3 .", image=tmp_path / "missing.png"),
        Request("count to 3 . " * 200),
        Request("count to 3 .", gen_length=7, block_length=3),
        Request("count to 3 .", gen_length=4096),
    ]
    results = pipe.generate([good[0], *bad, good[1]])
    assert results[0].ok and results[-1].ok
    assert windows([results[0], results[-1]]) == windows(pipe.generate(good))
    errors = [r.error for r in results[1:-1]]
    assert all(errors), errors
    for error, words in zip(errors, ["empty", "not a readable image", "does not exist", "largest prompt bucket",
                                     "multiple of block_length", "largest answer bucket"], strict=True):  # fmt: skip
        assert words in error


def copy_export(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_export_folder_problems_are_one_clear_error(fixture_export, tmp_path):
    src, _, _ = fixture_export
    with pytest.raises(ManifestError, match="not an export folder"):
        SeerPipeline.from_manifest(tmp_path / "nowhere")
    bad = copy_export(src, tmp_path / "corrupt")
    (bad / "manifest.json").write_text("{ not json")
    with pytest.raises(ManifestError, match="not readable JSON"):
        SeerPipeline.from_manifest(bad)
    future = copy_export(src, tmp_path / "future")
    data = json.loads((future / "manifest.json").read_text())
    (future / "manifest.json").write_text(json.dumps({**data, "schema_version": "9.0"}))
    with pytest.raises(ManifestError, match="schema_version 9.0 is not supported"):
        SeerPipeline.from_manifest(future)
    missing = copy_export(src, tmp_path / "missing")
    (missing / "denoise.onnx").unlink()
    with pytest.raises(ManifestError, match="denoise.onnx is missing"):
        SeerPipeline.from_manifest(missing)
    swapped = copy_export(src, tmp_path / "swapped")
    shutil.copy(swapped / "embed.onnx", swapped / "denoise.onnx")
    with pytest.raises(ManifestError, match="does not match the manifest"):
        SeerPipeline.from_manifest(swapped).generate("count to 3 .")
    cut = copy_export(src, tmp_path / "cut")
    with open(cut / "weights.data", "r+b") as f:
        f.truncate(1000)
    (result,) = SeerPipeline.from_manifest(cut).generate("count to 3 .")  # the first graph opened says why
    assert "weights.data is 1000 bytes, the manifest says" in result.error


# --- step zero: the early exit, the full-depth fallback ------------------------------------------------------------


def spy(pipe: SeerPipeline) -> list[tuple[str, tuple[int, ...]]]:
    """Record (graph, gen_ids shape) of every window-graph call the pipeline makes."""
    calls: list[tuple[str, tuple[int, ...]]] = []
    run = pipe.backend.run

    def record(graph, feeds, outputs=None, into=None):
        if "gen_ids" in feeds:
            calls.append((graph, feeds["gen_ids"].shape))
        return run(graph, feeds, outputs, into)

    pipe.backend.run = record
    return calls


def test_the_probe_calibration_runs_the_early_exit_at_step_zero(fixture_export):
    folder, manifest, _ = fixture_export
    pipe = SeerPipeline.from_manifest(folder)
    calls = spy(pipe)
    results = pipe.generate(requests()[:4], policy="per_request")
    n = manifest.generation.gen_length
    assert pipe.seer.signal == "probe" and calls[0] == ("step_zero", (4, n))
    assert {g for g, _ in calls[1:]} == {"denoise"}
    assert {shape[-1] for _, shape in calls[1:]} == {r.kept for r in results}  # step 0 on the kept windows


def test_end_token_fallback_reuses_its_full_depth_pass_and_matches_pytorch(fixture_export):
    """The labelled fallback: step zero is the window graph over all N positions; its x0 / confidence serve as
    step 0, so no further call covers the whole window; tokens and L* equal ``seer_generate``'s."""
    folder, manifest, _ = fixture_export
    end = SeerConfig(signal="end_token_prob", threshold=0.3, label="fallback")
    pipe = SeerPipeline.from_manifest(folder, seer=end)
    calls = spy(pipe)
    results = pipe.generate(requests(), policy="per_request")
    model = load_model(FIXTURE_DIR)
    enc = TaskEncoder(FIXTURE_DIR, model.config)
    with torch.no_grad():
        prefix, valid = enc.prefix(model, SAMPLES)
        ref, _ = seer_generate(model, prefix, valid, manifest.generation, enc.special, end)
    assert [r.kept for r in results] == ref.kept.tolist()
    assert windows(results) == [row[:k].tolist() for row, k in zip(ref.tokens, ref.kept, strict=True)]
    n = manifest.generation.gen_length
    assert calls[0] == ("denoise", (len(SAMPLES), n)) and all(shape[-1] < n for _, shape in calls[1:])
    with pytest.raises(ConfigError, match="paper rule at layer 3 differs"):
        SeerPipeline.from_manifest(folder, seer=SeerConfig())  # the export's step_zero stops at another layer


def test_sessions_share_one_memory_mapped_copy_of_the_weights(fixture_export):
    folder, manifest, _ = fixture_export
    shared, own = OrtBackend(folder, manifest), OrtBackend(folder, manifest, share_weights=False)
    rng = np.random.default_rng(0)
    feeds = {"prefix_embeds": rng.normal(0, 0.02, (2, 9, manifest.model.hidden_size)).astype(np.float32),
             "gen_ids": np.full((2, 12), manifest.special_tokens.mask_id), "segment_ids": np.ones((2, 21), np.int32),
             "position_ids": np.tile(np.arange(21), (2, 1))}  # fmt: skip
    for graph in ("step_zero", "denoise"):
        graph_feeds = {**feeds, **no_cache(manifest.graph(graph).spec, 2)}
        a, b = shared.run(graph, graph_feeds), own.run(graph, graph_feeds)
        for name in a:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-6, atol=1e-7)
    arrays = [array for array, _ in shared._shared_weights().values()]
    assert len(arrays) == manifest.weights.tensors
    mapped = arrays[0]
    while isinstance(mapped.base, np.ndarray):  # up to the whole file's mapping
        mapped = mapped.base
    assert isinstance(mapped, np.memmap) and mapped.size == manifest.weights.size_bytes
    assert Path(mapped.filename) == (folder / manifest.weights.file).resolve()
    assert all(np.shares_memory(a, mapped) for a in arrays)  # views of the one mapping: no copy per session
    # the loop graph packs its own copy where it fits in a quarter of memory; the once-per-request graphs never do
    assert shared.prepack_loop and prepacks(shared, "denoise") and not prepacks(shared, "step_zero")
    packed = sum(manifest.graph(g).size_bytes for g in ("denoise", "denoise_logits"))  # the fixture has both
    assert loop_prepack_fits(manifest, 4 * packed) and not loop_prepack_fits(manifest, 4 * packed - 1)
    shared.close()
    own.close()


def test_unavailable_provider_is_an_error_not_a_cpu_fallback(fixture_export):
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime build offers CUDA; the refusal is for builds without it")
    with pytest.raises(Exception, match="offers .* not CUDAExecutionProvider"):
        SeerPipeline.from_manifest(fixture_export[0], provider="cuda")


def cli(argv: list[str], stdin: str | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdin
    if stdin is not None:
        sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = run_main(argv)
            except SystemExit as exit_:  # argparse's errors exit from inside the parser
                rc = exit_.code
    finally:
        sys.stdin = old
    return rc, out.getvalue(), err.getvalue()


def test_seer_run_prompt_json_and_jsonl(pipe, fixture_export, tmp_path):
    folder = str(fixture_export[0])
    expected = pipe.generate("count to 5 .")[0]
    rc, out, err = cli(["--engines", folder, "--prompt", "count to 5 ."])
    assert rc == 0, err
    assert out.strip() == expected.text
    rc, out, _ = cli(["--engines", folder, "--prompt", "count to 5 .", "--json", "--no-seer"])
    data = json.loads(out)
    assert rc == 0 and data["kept"] == pipe.manifest.generation.gen_length and data["error"] is None
    lines = [json.dumps({"prompt": "count to 5 ."}), "{broken", json.dumps({"prompt": "repeat cat 3 times .",
             "gen_length": 32}), json.dumps({"prompt": "x", "colour": "red"})]  # fmt: skip
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    rc, _, err = cli(
        ["--engines", folder, "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o.jsonl")]
    )
    assert rc == 1 and "2 answered, 2 failed" in err  # exit 1: some requests failed, the rest are answered
    got = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert got[0]["text"] == expected.text and got[2]["gen_length"] == 32
    assert "line 2: not JSON" in got[1]["error"] and "unknown request key(s) ['colour']" in got[3]["error"]
    rc, out, _ = cli(["--engines", folder, "--input", "-"], stdin=lines[0] + "\n")
    assert rc == 0 and json.loads(out)["text"] == expected.text


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--engines", "{tmp}/none", "--prompt", "hi"], "not an export folder"),
        (["--engines", "{export}", "--prompt", ""], "the prompt is empty"),
        (["--engines", "{export}", "--prompt", "hi", "--image", "{tmp}/no.png"], "does not exist"),
        (["--engines", "{export}", "--prompt", "hi", "--policy", "fast"], "invalid choice"),
        (["--engines", "{export}", "--input", "{tmp}/none.jsonl"], "does not exist; pass a JSONL file"),
        (["--engines", "{export}"], "one of the arguments --prompt --input is required"),
    ],
)
def test_seer_run_errors_are_one_line_exit_2(fixture_export, tmp_path, argv, words):
    argv = [a.format(tmp=tmp_path, export=fixture_export[0]) for a in argv]
    rc, out, err = cli(argv)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and words in err, err


def test_generation_runs_with_torch_and_seer_export_blocked(fixture_export):
    code = BLOCKER + (
        "from seer_trt.runtime.pipeline import SeerPipeline\n"
        f"pipe = SeerPipeline.from_manifest({str(fixture_export[0])!r})\n"
        "r = pipe.generate('count to 4 .')[0]\n"
        "assert r.ok and r.kept >= 1, r\n"
        "assert not any(m.split('.')[0] in {'torch', 'transformers', 'seer_export', 'onnx'} for m in sys.modules)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
