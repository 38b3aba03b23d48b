"""GPU tier (docs/DESIGN.md "Engines and profiles", "Measuring", "Toolchain facts"): TensorRT plans of the fixture against the export's goldens and ONNX Runtime, CUDA
graph replay, and the per-step time table TensorRT vs ONNX Runtime vs PyTorch eager.

Every test is marked ``gpu`` and skips, with its reason, on a machine without a CUDA device, and the TensorRT tests
where TensorRT (or the Polygraphy the goldens need) is not installed: the only skips. Where TensorRT is installed,
any failure to build or run a plan fails the test; nothing turns it into a table cell.
``tools/gpu_check.sh`` runs them on a GPU machine.
Environment:
    SEER_GPU_WORK    exports, checkpoints and plans, reused between runs (default: a pytest temporary folder)
    SEER_GPU_OUT     where the step-time table is written (default: SEER_GPU_WORK)
    SEER_GPU_LAYERS  decoder layers of the random-weight model with LLaDA-V's layer shapes (default 2)
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest

from seer_trt.backends.cuda import cuda_device
from seer_trt.backends.onnxruntime import OrtBackend
from seer_trt.backends.tensorrt import TrtBackend
from seer_trt.contracts.graphs import TOKEN_AGREEMENT
from seer_trt.contracts.manifest import Manifest
from seer_trt.runtime.kv_cache import no_cache
from seer_trt.runtime.layout import window_layout

DEVICE = cuda_device()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(DEVICE is None, reason="no CUDA device (TensorRT engines need one)")]

FIXTURE_PROFILES = ("answer=16,64,256",)  # 3 profiles; the fixture's windows (64) and its static buckets fit
LARGE_PROFILES = ("batch=1,4", "prompt=128", "answer=16,64,256")  # LLaDA-V widths: keep the build and memory small
LARGE_OPT_LEVEL = 2  # a shorter kernel search than TensorRT's default 3, so the build fits the check's minutes
ANSWERS = (16, 64, 256)  # answer lengths of the table
BATCHES = (1, 4)
REPEATS = 10


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


TRT_INSTALL = "pip install tensorrt-cu12 (or -cu13) --extra-index-url https://pypi.nvidia.com"
needs_trt = pytest.mark.skipif(not _has("tensorrt"), reason=f"TensorRT is not installed ({TRT_INSTALL})")


@pytest.fixture(scope="session")
def work(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("SEER_GPU_WORK") or tmp_path_factory.mktemp("gpu"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _export(out: Path, *argv: str) -> Path:
    """``seer-export`` into ``out`` unless a complete export is already there (reused between runs)."""
    if (out / "manifest.json").is_file():
        return out
    from seer_export.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["--out", str(out), "--force", *argv])
    assert rc == 0, err.getvalue()
    return out


def _build(folder: Path, profiles: tuple[str, ...], opt_level: int | None = None) -> Manifest:
    """TensorRT plans of ``folder`` (reused when the recorded build matches this TensorRT and GPU)."""
    import tensorrt

    from seer_trt.build.engines import BuildOptions, run_build

    manifest = Manifest.read(folder)
    built = manifest.builds.get("tensorrt")
    if built is None or (built.version, built.device) != (tensorrt.__version__, DEVICE.name):
        run_build(BuildOptions(folder, "tensorrt", profiles=profiles, opt_level=opt_level), log=print)
    return Manifest.read(folder)


@pytest.fixture(scope="session")
def fixture_fp16(work) -> Path:
    """The bundled fixture exported in fp16, validated, with Polygraphy goldens when Polygraphy is installed."""
    goldens = ("--save-goldens",) if _has("polygraphy") else ()
    return _export(work / "fixture-fp16", "--dtype", "fp16", "--samples", "4", "--sampling", *goldens)


@pytest.fixture(scope="session")
def fixture_plans(fixture_fp16) -> tuple[Path, Manifest]:
    return fixture_fp16, _build(fixture_fp16, FIXTURE_PROFILES)


@needs_trt
def test_fixture_plans_are_built_for_this_gpu_with_several_profiles(fixture_plans):
    folder, manifest = fixture_plans
    build = manifest.builds["tensorrt"]
    assert (build.device, build.compute_capability) == (DEVICE.name, DEVICE.compute_capability)
    assert set(build.engines) == set(manifest.graphs)
    assert len(build.engines["denoise"].profiles) >= 2
    assert build.timing_cache and (folder / build.timing_cache).is_file()


def _goldens(folder: Path, graph: str) -> list[tuple[dict, dict]]:
    """(feeds, PyTorch outputs) per case, from the Polygraphy JSON the export saved."""
    from polygraphy.comparator import RunResults
    from polygraphy.json import load_json

    feeds = load_json(str(folder / "goldens" / f"{graph}.inputs.json"))
    (_, iterations), *_ = RunResults.load(str(folder / "goldens" / f"{graph}.outputs.json")).items()
    return [(f, {k: np.asarray(v) for k, v in it.items()}) for f, it in zip(feeds, iterations, strict=True)]


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


@needs_trt
@pytest.mark.skipif(not _has("polygraphy"), reason="Polygraphy is not installed (the export's goldens need it)")
def test_plans_match_the_goldens(fixture_plans):
    """Every graph on TensorRT against the PyTorch outputs the export saved, by the export's own criteria (the
    tolerance table; x0 equal or a near-tie of the reference, whose probabilities come from the denoise_logits
    goldens of the same inputs, exported with --sampling). Where no reference probabilities exist, x0 is held to
    the precision's end-to-end token agreement over all its cases."""
    from seer_export.onnx.parity import compare

    folder, manifest = fixture_plans
    backend = TrtBackend(folder, manifest)
    logits = _goldens(folder, "denoise_logits") if "denoise_logits" in manifest.graphs else []
    failures, lines = [], []
    for graph, entry in manifest.graphs.items():
        equal: dict[str, list[np.ndarray]] = {}
        for case, (feeds, want) in enumerate(_goldens(folder, graph)):
            got = backend.run(graph, feeds)
            probs = next((_softmax(ref["logits"]) for f, ref in logits
                          if f.keys() == feeds.keys() and all(np.array_equal(f[k], feeds[k]) for k in f)), None)  # fmt: skip
            for out in entry.spec.outputs:
                if out.kind == "index" and probs is None:
                    equal.setdefault(out.name, []).append((got[out.name] == want[out.name]).ravel())
                    continue
                row = compare(graph, out, f"case {case}", got[out.name], want[out.name], entry.precision, probs)
                lines.append(f"{graph}.{out.name} case {case}: max_abs {row.max_abs:.2e} within {row.agreement:.4f}")
                if not row.passed:
                    failures.append(lines[-1])
        for name, parts in equal.items():
            agreement = float(np.concatenate(parts).mean())
            lines.append(f"{graph}.{name} all cases: equal {agreement:.4f} (no reference probabilities)")
            if agreement < TOKEN_AGREEMENT[entry.precision]:
                failures.append(lines[-1])
    backend.close()
    print("\n".join(lines))
    assert not failures, failures


def _ort(folder: Path, manifest: Manifest, provider: str, notes: dict | None = None, label: str = ""):
    """An ONNX Runtime backend that has run one denoise call on ``provider``; None (reason in ``notes``) if it cannot."""
    try:
        backend = OrtBackend(folder, manifest, provider)
        backend.run("denoise", _window_feeds(manifest, 1, manifest.buckets.prompt[0], 16))  # CUDA libraries load here
        return backend
    except Exception as err:  # SeerError, or onnxruntime's own types when the CUDA provider cannot start
        if notes is not None:
            notes[label] = f"n/a ({str(err).splitlines()[0][:60]})"
        return None


def _window_feeds(manifest: Manifest, batch: int, prompt: int, answer: int, seed: int = 0) -> dict[str, np.ndarray]:
    """One uncached denoise call's inputs (an empty prompt K/V cache where the graph takes one)."""
    rng = np.random.default_rng(seed)
    valid = np.ones((batch, prompt), dtype=bool)
    segment_ids, position_ids = window_layout(valid, np.full(batch, answer), answer)
    return {
        "prefix_embeds": (rng.standard_normal((batch, prompt, manifest.model.hidden_size)) * 0.02).astype(
            manifest.precision
        ),
        "gen_ids": np.full((batch, answer), manifest.special_tokens.mask_id, dtype=np.int64),
        "segment_ids": segment_ids,
        "position_ids": position_ids,
        **no_cache(manifest.graph("denoise").spec, batch),
    }


@needs_trt
def test_cuda_graph_replay_equals_direct_execution(fixture_plans):
    folder, manifest = fixture_plans
    prompt = manifest.buckets.prompt[0]
    direct, replay = TrtBackend(folder, manifest), TrtBackend(folder, manifest, cuda_graphs=True)
    for answer in (32, 16, 32, 32):  # switch profiles, come back to a captured shape, replay it
        feeds = _window_feeds(manifest, 2, prompt, answer, seed=answer)
        want = {k: v.copy() for k, v in direct.run("denoise", feeds).items()}
        got = replay.run("denoise", feeds)
        assert np.array_equal(got["x0"], want["x0"]) and np.array_equal(got["log_confidence"], want["log_confidence"])
    direct.close()
    replay.close()


@needs_trt
def test_seer_pipeline_on_tensorrt_answers_as_onnxruntime(fixture_plans):
    from seer_trt.eval.tasks import make_samples
    from seer_trt.runtime.pipeline import SeerPipeline
    from seer_trt.runtime.request import Request

    folder, manifest = fixture_plans
    v = manifest.vision
    samples = make_samples(7, 16, v.image_size // v.patch_size, v.patch_size)
    requests = [Request(s.question, s.image) for s in samples]
    ort = _ort(folder, manifest, "cuda") or OrtBackend(folder, manifest, "cpu")  # no CUDA provider: the same graphs
    # "static": every group padded to its bucket, the shapes the profiles and CUDA graphs are built for.
    want = SeerPipeline(folder, manifest, ort, policy="static").generate(requests)
    trt = TrtBackend(folder, manifest, cuda_graphs=True)
    pipe = SeerPipeline(folder, manifest, trt, policy="static")
    assert pipe.buckets == manifest.builds["tensorrt"].buckets  # dispatch to the buckets the profiles were built for
    got = pipe.generate(requests)
    assert len(trt._engines["denoise"].pool) == 1  # one buffer set for every profile of the engine
    assert all(r.ok for r in want + got), [r.error for r in want + got if not r.ok]
    same_answer = [a.token_ids == b.token_ids for a, b in zip(got, want, strict=True)]
    # ONNX Runtime's answer positions through its <|eot_id|> (as the export's end-to-end check counts them)
    tokens = [i < len(a.window) and a.window[i] == b.window[i] for a, b in zip(got, want, strict=True)
              for i in range(min(len(b.token_ids) + 1, len(b.window)))]  # fmt: skip
    agreement = float(np.mean(tokens)) if tokens else 1.0
    print(f"TensorRT vs {ort.name}: {sum(same_answer)}/{len(requests)} answers identical, answer-token agreement "
          f"{agreement:.4f}, L* equal {np.mean([a.kept == b.kept for a, b in zip(got, want, strict=True)]):.2f}")  # fmt: skip
    assert agreement >= TOKEN_AGREEMENT[manifest.precision]
    assert sum(same_answer) >= len(requests) - 1


# --- per-step times ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def large_export(work) -> Path:
    """A random-weight checkpoint with LLaDA-V's layer shapes (SEER_GPU_LAYERS layers), its denoise graph in fp16."""
    import torch

    from seer_export.models.random_checkpoint import llada_v_layout, write_random_checkpoint

    layers = int(os.environ.get("SEER_GPU_LAYERS", "2"))
    ckpt = work / f"llada-v-{layers}l"
    if not (ckpt / "config.json").is_file():
        write_random_checkpoint(ckpt, llada_v_layout(layers), dtype=torch.float16)
    return _export(work / f"llada-v-{layers}l-fp16", "--model", "llada-v", "--checkpoint", str(ckpt), "--dtype",
                   "fp16", "--graphs", "denoise", "--no-validate")  # fmt: skip


def _ms(call, sync) -> float:
    """Median milliseconds of ``call`` after warm-up (first calls build bindings, contexts and CUDA graphs)."""
    for _ in range(3):
        call()
    sync()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def _torch_step(folder: Path, manifest: Manifest, checkpoint: Path):
    """The denoise graph's own PyTorch module on the GPU in the export's precision, and a call maker."""
    import torch

    from seer_export.models.loading import load_model
    from seer_export.onnx.modules import build

    model = load_model(checkpoint, dtype=getattr(torch, manifest.precision), device="cuda")
    module = build("denoise", model, manifest.special_tokens, manifest.seer)

    def step(feeds):
        args = [
            torch.from_numpy(np.ascontiguousarray(feeds[t.name])).cuda() for t in manifest.graph("denoise").spec.inputs
        ]

        def call():
            with torch.inference_mode():
                module(*args)

        return call

    return step, torch.cuda.synchronize


def _rows(name: str, folder: Path, checkpoint: Path, prompt: int, cpu: bool, profiles: tuple[str, ...],
          opt_level: int | None = None) -> tuple[list[str], dict[str, list[float]]]:  # fmt: skip
    """The table's rows of one model, and the milliseconds of every backend that ran (the others' cells hold why
    not)."""
    manifest = Manifest.read(folder)
    backends, notes = {}, {}
    if _has("tensorrt"):  # installed: a build or load failure fails the test
        manifest = _build(folder, profiles, opt_level)
        backends["TensorRT"] = TrtBackend(folder, manifest, cuda_graphs=True)
    else:
        notes["TensorRT"] = "not installed"
    for label, provider in (("ORT CUDA", "cuda"), ("ORT CPU", "cpu")):
        backend = _ort(folder, manifest, provider, notes, label) if provider == "cuda" or cpu else None
        if backend is not None:
            backends[label] = backend
        notes.setdefault(label, "-")
    torch_step, torch_sync = _torch_step(folder, manifest, checkpoint)
    rows, times = [], {label: [] for label in (*backends, "PyTorch eager")}
    for batch in BATCHES:
        for answer in ANSWERS:
            feeds = _window_feeds(manifest, batch, prompt, answer)
            cells = {}
            for label in ("TensorRT", "ORT CUDA", "ORT CPU"):
                if label in backends:
                    times[label].append(_ms(lambda b=backends[label], f=feeds: b.run("denoise", f), lambda: None))
                    cells[label] = f"{times[label][-1]:.2f}"
                else:
                    cells[label] = notes[label]
            times["PyTorch eager"].append(_ms(torch_step(feeds), torch_sync))
            cells["PyTorch eager"] = f"{times['PyTorch eager'][-1]:.2f}"
            rows.append(f"| {name} | {batch} | {prompt} | {answer} | " + " | ".join(cells.values()) + " |")
    for backend in backends.values():
        backend.close()
    return rows, times


def test_step_time_table(work, fixture_fp16, large_export):
    """Milliseconds per denoising step (one ``denoise`` call, host copies included for TensorRT and ONNX Runtime;
    PyTorch's inputs already on the GPU) at several answer lengths: one table, printed and written to a file (the
    table tools/gpu_check.sh shows). What is asserted is that the table is whole, not how fast anything is: every
    backend the table claims (TensorRT wherever it is installed, PyTorch always) has a finite, positive time in
    every row (a backend that did not run says why in its cells)."""
    from seer_export.models.registry import resolve

    out = Path(os.environ.get("SEER_GPU_OUT") or work) / "gpu_step_times.md"
    header = [
        f"# ms per denoising step on {DEVICE}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        "| model | batch | prompt | answer | TensorRT | ORT CUDA | ORT CPU | PyTorch eager |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows, fixture_times = _rows("tiny-llada-v fp16", fixture_fp16, resolve("tiny-llada-v"), 64, True, FIXTURE_PROFILES)
    out.write_text("\n".join(header + rows) + "\n")  # the fixture's rows survive a timeout in the large model's
    layers = os.environ.get("SEER_GPU_LAYERS", "2")
    large = Manifest.read(large_export)
    checkpoint = work / f"llada-v-{layers}l"
    large_rows, large_times = _rows(f"LLaDA-V shapes, {layers} layers, random fp16 (d {large.model.hidden_size})",
                                    large_export, checkpoint, 128, False, LARGE_PROFILES, LARGE_OPT_LEVEL)  # fmt: skip
    rows += large_rows
    out.write_text("\n".join(header + rows) + "\n")
    print("\n".join(header + rows))
    assert len(rows) == 2 * len(BATCHES) * len(ANSWERS)
    assert "ORT CPU" in fixture_times, "ONNX Runtime's CPU provider did not run the fixture"
    for model, times in (("fixture", fixture_times), ("large", large_times)):
        assert "PyTorch eager" in times and ("TensorRT" in times) == _has("tensorrt"), (model, sorted(times))
        for label, values in times.items():
            assert len(values) == len(BATCHES) * len(ANSWERS), (model, label, values)
            assert all(math.isfinite(v) and v > 0 for v in values), (model, label, values)
