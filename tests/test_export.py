"""seer-export (docs/DESIGN.md "Seer, exactly"-5): the ONNX graphs against the PyTorch reference, the manifest they come with, the CLI.

Exports per module run, each graph once: the bundled fixture in fp32 through the CLI (the command a user runs,
calibrated to a probe), the fixture in fp16, and a tiny random LLaDA-V calibrated to the MLP rule at layer 1 (the
paper's path). Beyond the parity report the export writes itself, the graphs are
checked here against the reference code paths (``sampler.suppress_special``, ``seer.step_zero``), not against
the modules they were traced from, and left-padded / packed rows against the same rows run alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from seer_export.cli import main
from seer_export.models.config import DiffusionMLLMConfig, TextConfig, VisionConfig
from seer_export.models.loading import load_model
from seer_export.models.mllm import DiffusionMLLM, window_layout
from seer_export.models.random_checkpoint import write_random_checkpoint
from seer_export.models.registry import FIXTURE_DIR
from seer_export.onnx import export as onnx_graph
from seer_export.onnx import run as export_run
from seer_export.onnx import source as export_source
from seer_export.onnx.options import ExportError, ExportOptions
from seer_export.onnx.run import open_source, run_export
from seer_export.reference.sampler import suppress_special
from seer_export.reference.seer import seer_generate, step_zero
from seer_trt.backends.onnxruntime import OrtBackend
from seer_trt.contracts.config import GenerationConfig, SeerConfig
from seer_trt.contracts.graphs import SERVING_GRAPHS, TOLERANCES, WEIGHTS_FILE
from seer_trt.contracts.manifest import Manifest
from seer_trt.runtime.kv_cache import no_cache
from seer_trt.runtime.layout import left_pad
from seer_trt.runtime.layout import window_layout as np_window_layout

# (prompt lengths, kept answer lengths, window G): one row, a left-padded batch, a longer window
SHAPES = [((6,), (9,), 9), ((10, 3, 7), (12, 5, 12), 12), ((4, 4), (21, 21), 21)]


class Graphs:
    """The backend with copied outputs (it reuses its output buffers between calls of one shape), fed an empty
    prompt K/V cache where a graph takes one (the uncached call)."""

    def __init__(self, backend: OrtBackend) -> None:
        self.backend = backend

    def run(self, name: str, **feeds: np.ndarray) -> dict[str, np.ndarray]:
        feeds = {**no_cache(self.backend.spec(name), feeds["gen_ids"].shape[0]), **feeds}
        return {k: v.copy() for k, v in self.backend.run(name, feeds).items()}


def quiet_main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def fixture_model() -> DiffusionMLLM:
    return load_model(FIXTURE_DIR)


@pytest.fixture(scope="module")
def random_checkpoint(tmp_path_factory) -> Path:
    """A 3-layer LLaDA-V of width 32 with random weights (sharded), probing layer 1 with the gate statistic."""
    cfg = DiffusionMLLMConfig(
        text=TextConfig(vocab_size=103, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                        num_attention_heads=2, num_key_value_heads=2),
        vision=VisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                            image_size=16, patch_size=8),
        image_aspect_ratio="pad",
        seer=SeerConfig(statistic="gate_negative", probe_layer=1, tau_jump=0.1, label="test"),
        generation=GenerationConfig(gen_length=16, steps=16, block_length=16),
        system_prompt=None,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("random") / "ckpt"
    return write_random_checkpoint(folder, cfg, dtype=torch.float32, seed=3, gain=4.0, shard_bytes=40_000)


@pytest.fixture(scope="module")
def fixture_fp16(tmp_path_factory) -> tuple[Path, Manifest]:
    """The bundled fixture in fp16 (a random model's near-ties would make fp16 token agreement a coin toss; the
    trained fixture's predictions are decisive, as a real model's are)."""
    out = tmp_path_factory.mktemp("fixture16") / "engines"
    return out, run_export(ExportOptions(out=out, dtype="fp16", samples=8), log=lambda line: None)


def window_inputs(model: DiffusionMLLM, prompts, kept, g: int, mask_id: int, seed: int = 0, all_masks: bool = False):
    """Left-padded prompts of embedded random ids and answer windows (masks, and tokens unless ``all_masks``)."""
    rng = np.random.default_rng(seed)
    table = model.model.embed_tokens.weight.detach().numpy()
    prefix, valid = left_pad([table[rng.integers(0, len(table), p)] for p in prompts])
    segment_ids, position_ids = np_window_layout(valid, np.array(kept), g)
    gen_ids = rng.integers(0, len(table) - 8, (len(prompts), g))
    gen_ids = np.where(all_masks | (rng.random(gen_ids.shape) < 0.5), mask_id, gen_ids)
    feeds = dict(prefix_embeds=prefix, gen_ids=gen_ids, segment_ids=segment_ids, position_ids=position_ids)
    return feeds, valid


def torch_inputs(feeds):
    return [torch.from_numpy(np.ascontiguousarray(feeds[k])) for k in ("prefix_embeds", "gen_ids", "segment_ids",
                                                                          "position_ids")]  # fmt: skip


# --- the export and its report -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_writes_every_graph_tokenizer_and_manifest(fixture_export):
    out, manifest, stdout = fixture_export
    assert list(manifest.graphs) == [*SERVING_GRAPHS, "denoise_logits"]  # the session export asks for --sampling
    for entry in manifest.graphs.values():
        assert (out / entry.file).is_file() and entry.external_data == WEIGHTS_FILE and entry.precision == "float32"
    assert manifest.weights.file == WEIGHTS_FILE and (out / WEIGHTS_FILE).stat().st_size == manifest.weights.size_bytes
    assert (out / "tokenizer" / "tokenizer.json").is_file()
    assert "chat_template" in (out / "tokenizer" / "tokenizer_config.json").read_text()
    assert (
        manifest.versions.opset == 20
        and manifest.seer == DiffusionMLLMConfig.from_file(FIXTURE_DIR / "config.json").seer
    )
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no staging folder left behind
    stages = [line for line in stdout.splitlines() if line.startswith("[")]
    assert any("exported denoise.onnx" in line for line in stages) and "done" in stages[-1]
    assert "| denoise | x0 |" in stdout  # the parity table


@pytest.mark.slow
def test_parity_report_covers_every_output_padded_and_packed(fixture_export):
    _, manifest, _ = fixture_export
    report = manifest.parity
    assert report.status == "passed", report.note
    for name, entry in manifest.graphs.items():
        rows = [r for r in report.rows if r.graph == name]
        assert {r.output for r in rows} == {t.name for t in entry.spec.outputs}
        if name not in ("embed", "vision"):
            assert any("left-padded" in r.case for r in rows) and any("packed" in r.case for r in rows)
    e2e = report.end_to_end
    assert e2e is not None and e2e.samples == 8 and e2e.passed
    assert e2e.token_agreement == e2e.window_agreement == e2e.answer_match == e2e.kept_agreement == 1.0


@pytest.mark.slow
def test_goldens_load_with_polygraphy(fixture_export):
    from polygraphy.comparator import RunResults
    from polygraphy.json import load_json

    out, manifest, _ = fixture_export
    feeds = load_json(out / "goldens" / "denoise.inputs.json")
    results = RunResults.load(str(out / "goldens" / "denoise.outputs.json"))
    assert len(feeds) == len(results["pytorch"]) >= 4
    assert set(feeds[0]) == {t.name for t in manifest.graph("denoise").spec.inputs}
    layers = manifest.model.num_layers
    present = {f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")}  # the prompt K/V it computed
    assert set(results["pytorch"][0].keys()) == {"x0", "log_confidence", "p_end", "top_logits", "top_ids"} | present


# --- the graphs against the reference code paths -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("prompts, kept, g", SHAPES)
def test_denoise_graphs_match_the_reference_sampler(fixture_export, fixture_model, prompts, kept, g):
    """x0 / log_confidence / logits as ``sampler.generate`` computes them from ``DiffusionMLLM.forward``; p_end as
    ``seer.step_zero`` reads it (the unsuppressed softmax)."""
    out, manifest, _ = fixture_export
    special = manifest.special_tokens
    feeds, _ = window_inputs(fixture_model, prompts, kept, g, special.mask_id, seed=len(prompts))
    graphs = Graphs(OrtBackend(out, manifest))
    got = {**graphs.run("denoise", **feeds), **graphs.run("denoise_logits", **feeds)}
    with torch.no_grad():
        logits = fixture_model(*torch_inputs(feeds))
    p = torch.softmax(logits.double(), -1)
    p_end = (p[..., special.eot_id] + p[..., special.endoftext_id]).numpy()
    logits = suppress_special(logits, torch.from_numpy(feeds["gen_ids"] == special.mask_id), special)
    x0 = logits.argmax(-1)
    conf = torch.log_softmax(logits.double(), -1).gather(-1, x0[..., None])[..., 0]  # float64 log-probability
    tol = TOLERANCES[("float32", "value")]
    np.testing.assert_array_equal(got["x0"], x0.numpy())
    np.testing.assert_allclose(got["log_confidence"], conf.numpy(), atol=tol.atol, rtol=tol.rtol)
    np.testing.assert_allclose(got["logits"], logits.numpy(), atol=tol.atol, rtol=tol.rtol)  # -inf == -inf
    np.testing.assert_allclose(got["p_end"], p_end, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.slow
@pytest.mark.parametrize("prompts, kept, g", SHAPES)
def test_step_zero_graphs_match_the_seer_reference(fixture_export, fixture_model, prompts, kept, g):
    """The early exit's statistic and probe score, and the window graph's p_end on an all-mask window, as
    ``seer.step_zero`` records them with hooks."""
    out, manifest, _ = fixture_export
    seer, special = manifest.seer, manifest.special_tokens
    assert seer.signal == "probe"  # the bundled calibration
    feeds, valid = window_inputs(fixture_model, prompts, (g,) * len(prompts), g, special.mask_id, all_masks=True)
    graphs = Graphs(OrtBackend(out, manifest))
    early = graphs.run("step_zero", **feeds)
    full = graphs.run("denoise", **feeds)
    prefix = torch.from_numpy(feeds["prefix_embeds"])
    zero = step_zero(fixture_model, prefix, torch.from_numpy(valid), g, special, tau_abs=seer.tau_abs, residual=True)
    stats = zero.abs_below if seer.statistic == "abs_below" else zero.gate_negative  # [B, layers, G]
    atol = TOLERANCES[("float32", "fraction")].atol
    np.testing.assert_allclose(early["sparsity"], stats[:, seer.probe_layer], atol=atol)
    np.testing.assert_allclose(early["probe_score"], zero.profile(seer), atol=1e-5)
    np.testing.assert_allclose(full["p_end"], zero.p_end, atol=1e-5)


@pytest.mark.slow
def test_left_padded_and_packed_rows_equal_the_rows_alone(fixture_export, fixture_model):
    out, manifest, _ = fixture_export
    mask_id = manifest.special_tokens.mask_id
    graphs = Graphs(OrtBackend(out, manifest))
    batch, valid = window_inputs(fixture_model, (9, 4, 6), (11, 7, 3), 11, mask_id, seed=5)
    rows = []
    for b, kept in enumerate((11, 7, 3)):  # row b alone: no left padding, its own window
        alone = dict(
            prefix_embeds=batch["prefix_embeds"][b : b + 1, valid[b]], gen_ids=batch["gen_ids"][b : b + 1, :kept]
        )
        alone["segment_ids"], alone["position_ids"] = np_window_layout(
            valid[b : b + 1, valid[b]], np.array([kept]), kept
        )
        rows.append((alone, graphs.run("denoise", **alone), graphs.run("step_zero", **alone)))
    padded = graphs.run("denoise", **batch)
    for b, (_, den, _) in enumerate(rows):
        kept = den["x0"].shape[1]
        np.testing.assert_array_equal(padded["x0"][b, :kept], den["x0"][0])
        np.testing.assert_allclose(padded["log_confidence"][b, :kept], den["log_confidence"][0], atol=1e-5)
    first, second = rows[0][0], rows[1][0]
    p1, p2 = first["prefix_embeds"].shape[1], second["prefix_embeds"].shape[1]
    g1, g2 = first["gen_ids"].shape[1], second["gen_ids"].shape[1]
    packed = dict(
        prefix_embeds=np.concatenate([first["prefix_embeds"], second["prefix_embeds"]], axis=1),
        gen_ids=np.concatenate([first["gen_ids"], second["gen_ids"]], axis=1),
        segment_ids=np.array([[1] * p1 + [2] * p2 + [1] * g1 + [2] * g2], dtype=np.int32),
        position_ids=np.array([[*range(p1), *range(p2), *range(p1, p1 + g1), *range(p2, p2 + g2)]], dtype=np.int64),
    )
    den, zero = graphs.run("denoise", **packed), graphs.run("step_zero", **packed)
    atol = TOLERANCES[("float32", "fraction")].atol
    np.testing.assert_array_equal(den["x0"][0], np.concatenate([rows[0][1]["x0"][0], rows[1][1]["x0"][0]]))
    np.testing.assert_allclose(den["log_confidence"][0, :g1], rows[0][1]["log_confidence"][0], atol=1e-5)
    np.testing.assert_allclose(zero["sparsity"][0, g1:], rows[1][2]["sparsity"][0], atol=atol)
    np.testing.assert_allclose(zero["probe_score"][0, :g1], rows[0][2]["probe_score"][0], atol=1e-5)


def test_graphs_agree_with_torch_window_layout(fixture_model):
    """The numpy layout the ONNX loop uses is the PyTorch reference's."""
    valid = np.array([[False, True, True], [True, True, True]])
    seg, pos = np_window_layout(valid, np.array([2, 4]), 4)
    ref_seg, ref_pos = window_layout(torch.from_numpy(valid), torch.tensor([2, 4]), 4)
    np.testing.assert_array_equal(seg, ref_seg.numpy())
    np.testing.assert_array_equal(pos, ref_pos.numpy())
    assert seg.dtype == np.int32 and pos.dtype == np.int64


@pytest.mark.slow
def test_step_zero_graph_stops_at_the_probe_layer(fixture_export):
    import onnx

    out, manifest, _ = fixture_export
    k = manifest.seer.probe_layer
    model = onnx.load(str(out / "step_zero.onnx"), load_external_data=False)
    names = [i.name for i in model.graph.initializer]
    layers = {int(n.split("layers.")[1].split(".")[0]) for n in names if "layers." in n}
    assert layers == set(range(k + 1))  # nothing past layer k
    assert not any("lm_head" in n or n.startswith("model.norm") for n in names)
    matmuls = sum(n.op_type == "MatMul" for n in model.graph.node)
    # q, k, v, o, QK^T, AV, gate, up, down and RoPE's rotation of q and of k per layer, the probe; no head
    assert matmuls <= 11 * (k + 1) + 1
    full = onnx.load(str(out / "denoise.onnx"), load_external_data=False)
    # per layer also the scores against the cached keys, their output over the cached values, and the two weighted
    # sums over the snapshots; then the head
    assert sum(n.op_type == "MatMul" for n in full.graph.node) == 15 * manifest.model.num_layers + 1


def _stored_tensors(folder: Path) -> list[tuple[str, str, bytes]]:
    """(file, initializer, bytes) of every tensor of every graph of an export, inline or external."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    out = []
    for path in sorted(folder.glob("*.onnx")):
        model = onnx.load(str(path), load_external_data=False)
        for t in model.graph.initializer:
            if uses_external_data(t):
                info = {e.key: e.value for e in t.external_data}
                with open(folder / info["location"], "rb") as f:
                    f.seek(int(info["offset"]))
                    out.append((f"{info['location']}@{info['offset']}", t.name, f.read(int(info["length"]))))
            else:
                out.append((path.name, t.name, onnx.numpy_helper.to_array(t).tobytes()))
    return out


@pytest.mark.slow
def test_no_two_files_of_an_export_hold_the_same_tensor_bytes(fixture_export):
    """Every checkpoint tensor lives once, in the shared weights file, whatever the number of graphs reading it; the
    .onnx files keep only the exporter's small constants (shapes, scalars)."""
    from seer_export.onnx.shared_weights import INLINE_BYTES

    out, manifest, _ = fixture_export
    stored = _stored_tensors(out)
    places: dict[bytes, set[str]] = {}
    for where, _, data in stored:
        places.setdefault(data, set()).add(where.split("@")[0] if where.endswith(".onnx") else where)
    big = {data: where for data, where in places.items() if len(data) > INLINE_BYTES}
    assert all(len(where) == 1 for where in big.values()), [w for w in big.values() if len(w) > 1][:3]
    assert all(w.startswith(WEIGHTS_FILE) for where in big.values() for w in where)
    external = {name for where, name, _ in stored if where.startswith(WEIGHTS_FILE)}
    assert "model.embed_tokens.weight" in external and "model.layers.0.input_layernorm.weight" in external  # 512 B
    assert len({where for where, _, _ in stored if where.startswith(WEIGHTS_FILE)}) == manifest.weights.tensors
    weights = sum(p.numel() * 4 for p in load_model(FIXTURE_DIR).parameters())
    files = sum(p.stat().st_size for p in out.iterdir() if p.is_file())  # graphs, weights, index, manifest
    assert files <= 1.2 * weights, (files, weights)  # was 3.8x with a copy of the weights per graph


# --- fp16 ---------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_fp16_export_is_within_its_tolerance(fixture_fp16):
    out, manifest = fixture_fp16
    assert manifest.precision == "float16" and manifest.parity.status == "passed", manifest.parity.note
    assert manifest.parity.end_to_end is not None and manifest.parity.end_to_end.token_agreement >= 0.99
    rows = [r for r in manifest.parity.rows if r.graph == "denoise" and r.output == "log_confidence"]
    assert rows and all(r.atol == TOLERANCES[("float16", "value")].atol for r in rows)


@pytest.mark.slow
def test_fp16_graphs_keep_statistics_in_fp32(fixture_fp16):
    import onnx_ir as ir

    out, manifest = fixture_fp16
    for name in manifest.graphs:
        model = ir.load(out / f"{name}.onnx")
        weights = {v.dtype for n, v in model.graph.initializers.items() if "weight" in n}
        assert weights == {ir.DataType.FLOAT16}
        means = [n for n in model.graph.all_nodes() if n.op_type == "ReduceMean"]
        assert all(n.outputs[0].dtype == ir.DataType.FLOAT for n in means)  # RMSNorm and the statistic
        assert bool(means) == (name not in ("embed", "vision"))
    denoise = ir.load(out / "denoise.onnx")
    vocab = manifest.model.vocab_size
    over_vocab = [n for n in denoise.graph.all_nodes() if n.op_type in ("ReduceMax", "ReduceSum", "ArgMax")
                  and n.inputs[0].shape is not None and n.inputs[0].shape[-1] == vocab]  # fmt: skip
    assert {n.op_type for n in over_vocab} == {"ReduceSum", "ArgMax"}  # argmax, the one sum of the others' mass
    assert all(n.inputs[0].dtype == ir.DataType.FLOAT for n in over_vocab)
    assert not [n for n in denoise.graph.all_nodes() if n.op_type == "Softmax" and n.outputs[0].shape[-1] == vocab]
    cached = [ir.DataType.FLOAT16] * 2 * manifest.model.num_layers  # the prompt K/V in the graph's precision
    assert [v.dtype for v in denoise.graph.outputs] == [ir.DataType.INT64, ir.DataType.FLOAT, ir.DataType.FLOAT,
                                                        ir.DataType.FLOAT, ir.DataType.INT64, *cached]  # fmt: skip
    assert [v.dtype for v in denoise.graph.inputs][4:] == [ir.DataType.FLOAT] + cached  # past_weights in fp32


@pytest.mark.slow
def test_graphs_of_another_opset_share_one_weights_file(random_checkpoint, tmp_path):
    import onnx
    import onnxruntime as ort

    from seer_export.onnx.shared_weights import SharedWeights
    from seer_trt.contracts.graphs import graph_specs

    source = open_source("tiny-llada-v", random_checkpoint)
    specs = graph_specs(export_source.model_dims(source.config), "float32", ("embed", "denoise"))
    weights = SharedWeights(tmp_path)
    entries = {n: onnx_graph.export_graph(s, "float32", source, 22, tmp_path / f"{n}.onnx", weights)[0]
               for n, s in specs.items()}  # fmt: skip
    info = weights.close()
    assert entries["embed"].external_data == entries["denoise"].external_data == WEIGHTS_FILE
    assert info.size_bytes == (tmp_path / WEIGHTS_FILE).stat().st_size and (tmp_path / info.index).is_file()
    embed = onnx.load(str(tmp_path / "embed.onnx"), load_external_data=False)
    assert {o.domain: o.version for o in embed.opset_import}[""] == 22
    table = next(source.tensors.read(["model.embed_tokens.weight"]))[1].numpy()
    assert info.size_bytes < 1.1 * sum(p.numel() * 4 for p in load_model(random_checkpoint).parameters())
    sess = ort.InferenceSession(str(tmp_path / "embed.onnx"), providers=["CPUExecutionProvider"])
    ids = np.array([[1, 5, 9]], dtype=np.int64)
    np.testing.assert_array_equal(sess.run(None, {"input_ids": ids})[0][0], table[ids[0]])


@pytest.fixture(scope="module")
def paper_path_export(random_checkpoint, tmp_path_factory) -> tuple[Path, Manifest]:
    """The random checkpoint's export: calibrated to the MLP rule (gate sign, jump) at layer 1 of 3, the signal a
    real LLaDA-V export reads by default (there: |h| < 1e-3 at layer 3 of 32)."""
    out = tmp_path_factory.mktemp("paper") / "engines"
    return out, run_export(ExportOptions(checkpoint=random_checkpoint, out=out, samples=4), log=lambda line: None)


@pytest.mark.slow
def test_paper_path_runs_the_early_exit_and_matches_seer_generate(paper_path_export, random_checkpoint):
    """The runtime, on an export calibrated to mlp_sparsity at layer 1, gives the L* and tokens of ``seer_generate``
    in PyTorch; step zero runs the early-exit graph (layers 0-1), then step 0 runs on the truncated windows."""
    from seer_export.reference.fixture import TaskEncoder
    from seer_trt.eval.tasks import make_samples
    from seer_trt.runtime.pipeline import SeerPipeline
    from seer_trt.runtime.request import Request

    out, manifest = paper_path_export
    assert manifest.parity.status == "passed", manifest.parity.note
    assert manifest.seer.signal == "mlp_sparsity" and manifest.seer.probe_layer == 1
    assert [t.name for t in manifest.graph("step_zero").spec.outputs] == ["sparsity"]
    model = load_model(random_checkpoint)
    enc = TaskEncoder(random_checkpoint, model.config)
    samples = make_samples(5, 12, model.config.vision.image_size // model.config.vision.patch_size,
                           model.config.vision.patch_size)  # fmt: skip
    prefix, valid = enc.prefix(model, samples)
    ref, _ = seer_generate(model, prefix, valid, manifest.generation, enc.special, manifest.seer)
    pipe = SeerPipeline.from_manifest(out)
    calls = []
    run = pipe.backend.run
    pipe.backend.run = lambda graph, feeds, *rest: calls.append((graph, np.shape(feeds.get("gen_ids")))) or run(
        graph, feeds, *rest)  # fmt: skip
    results = pipe.generate([Request(s.question, s.image, cache="none") for s in samples],
                            policy="per_request")  # exact shapes, the exact loop  # fmt: skip
    assert all(r.ok for r in results), [r.error for r in results]
    assert [r.kept for r in results] == ref.kept.tolist()
    assert 1 < len(set(ref.kept.tolist())) and min(ref.kept) < manifest.generation.gen_length  # cuts, and varied
    assert [list(r.window) for r in results] == [row[:k].tolist() for row, k in zip(ref.tokens, ref.kept, strict=True)]
    window_calls = [(g, shape) for g, shape in calls if g in ("step_zero", "denoise")]
    n = manifest.generation.gen_length
    assert window_calls[0] == ("step_zero", (len(samples), n))  # the early exit, over the whole window
    assert {g for g, _ in window_calls[1:]} == {"denoise"}
    assert {shape[-1] for _, shape in window_calls[1:]} == set(ref.kept.tolist())  # step 0 on the truncated windows
    pipe.close()


# --- CLI ------------------------------------------------------------------------------------------------------------


def test_help_imports_no_torch():
    code = "import sys; from seer_export.cli import main\ntry: main(['--help'])\nexcept SystemExit: pass\n"
    code += "assert 'torch' not in sys.modules, 'torch imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--no-validate" in done.stdout


def _broken_checkpoint(src: Path, dst: Path, how: str) -> Path:
    shutil.copytree(src, dst)
    if how == "truncated":
        shard = sorted(dst.glob("model-*.safetensors"))[0]
        shard.write_bytes(shard.read_bytes()[:100])
    else:
        (dst / "tokenizer.json").unlink()
    return dst


@pytest.mark.parametrize(
    "argv, expect",
    [
        (["--model", "nope"], "unknown model 'nope'"),
        (["--opset", "23"], "--opset 23 is outside 20-22"),
        (["--dtype", "bf16"], "--dtype 'bf16'"),
        (["--graphs", "decode"], "--graphs"),
        (["--model", "llada-v", "--checkpoint", "/nonexistent/llada-v"], "does not exist"),
        (["--checkpoint", "{truncated}"], "truncated or corrupt"),
        (["--checkpoint", "{no-tokenizer}"], "tokenizer.json"),
        (["--out", "{file}/engines"], "is a file"),
        (["--no-validate", "--save-goldens"], "--save-goldens"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, expect, random_checkpoint, tmp_path):
    def under_a_file() -> Path:
        (tmp_path / "f").write_text("x")
        return tmp_path / "f" / "engines"

    subs = {
        "{truncated}": lambda: _broken_checkpoint(random_checkpoint, tmp_path / "t", "truncated"),
        "{no-tokenizer}": lambda: _broken_checkpoint(random_checkpoint, tmp_path / "n", "no-tokenizer"),
        "{file}/engines": under_a_file,
    }
    argv = [str(subs[a]()) if a in subs else a for a in argv]
    out = tmp_path / "out"
    rc, _, stderr = quiet_main(([] if "--out" in argv else ["--out", str(out)]) + argv)
    assert rc == 2
    assert len(stderr.strip().splitlines()) == 1 and stderr.startswith("seer-export: error:") and expect in stderr
    assert not out.exists()


@pytest.mark.slow
def test_non_empty_out_needs_force_and_failed_export_leaves_the_old_one(random_checkpoint, tmp_path, monkeypatch):
    out = tmp_path / "engines"
    out.mkdir()
    old = json.dumps({"schema_version": "1.1", "graphs": {}, "note": "old"})  # an earlier export of ours
    (out / "manifest.json").write_text(old)
    base = ["--checkpoint", str(random_checkpoint), "--out", str(out), "--no-validate"]
    rc, _, stderr = quiet_main(base)
    assert rc == 2 and "--force" in stderr

    calls = []
    real = onnx_graph.export_graph  # run_export imports it once the checkpoint is checked, torch with it

    def fail_second(*args, **kwargs):
        calls.append(args[0].name)
        if len(calls) == 2:
            raise ExportError("simulated failure while exporting the second graph")
        return real(*args, **kwargs)

    monkeypatch.setattr(onnx_graph, "export_graph", fail_second)
    rc, _, stderr = quiet_main([*base, "--force", "--graphs", "embed", "denoise"])
    assert rc == 2 and "simulated failure" in stderr
    assert [p.name for p in tmp_path.iterdir()] == ["engines"]  # no staging folder left behind
    assert (out / "manifest.json").read_text() == old  # untouched: replaced only when complete

    fresh = tmp_path / "fresh"
    calls.clear()
    rc, _, _ = quiet_main(["--checkpoint", str(random_checkpoint), "--out", str(fresh), "--no-validate",
                           "--graphs", "embed", "vision"])  # fmt: skip
    assert rc == 2 and not fresh.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("dtype, value, found", [("fp32", float("nan"), "as float32"),
                                                  ("fp16", 1e6, "exceed float16's range")])  # fmt: skip
def test_a_non_finite_weight_is_refused_by_name_even_without_validation(random_checkpoint, tmp_path, dtype, value,
                                                                        found):  # fmt: skip
    """issue 42: a NaN weight under --no-validate exported, and the runtime answered mask ids with rc 0. Every
    checkpoint tensor is checked finite as the shared weights file is written (a value past float16's range becomes
    an infinity in an fp16 export): one line naming the tensor, nothing written."""
    from safetensors.torch import load_file, save_file

    name = "model.embed_tokens.weight"
    ckpt = shutil.copytree(random_checkpoint, tmp_path / "ckpt")
    shard = ckpt / json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"][name]
    tensors = load_file(shard)
    tensors[name][3, 5] = value
    save_file(tensors, str(shard), metadata={"format": "pt"})
    out = tmp_path / "out"
    rc, _, stderr = quiet_main(["--checkpoint", str(ckpt), "--out", str(out), "--no-validate", "--dtype", dtype,
                                "--graphs", "embed"])  # fmt: skip
    assert rc == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert f"checkpoint tensor {name} holds 1 of {103 * 32} values that are not finite" in stderr and found in stderr
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no staging folder either


def test_validation_that_cannot_fit_in_memory_is_refused_up_front(random_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(export_run, "_available_ram", lambda: 1024)
    rc, _, stderr = quiet_main(["--checkpoint", str(random_checkpoint), "--out", str(tmp_path / "o")])
    assert rc == 2 and "--no-validate" in stderr and not (tmp_path / "o").exists()


def test_options_are_validated_as_a_dataclass():
    assert ExportOptions(graphs=("denoise", "denoise")).graphs == ("denoise",)
    assert dataclasses.replace(ExportOptions(), dtype="fp16").precision == "float16"


def test_out_pointing_at_a_folder_of_exports_writes_its_own_subfolder(tmp_path):
    engines = tmp_path / "engines"
    engines.mkdir()
    (engines / "README.md").write_text("exports live here\n")
    rc, _, stderr = quiet_main(["--out", str(engines), "--graphs", "embed", "--no-validate"])
    assert rc == 0, stderr
    assert (engines / "tiny-llada-v-fp32" / "manifest.json").is_file()
    assert (engines / "README.md").read_text() == "exports live here\n"  # the folder itself is untouched
    other = tmp_path / "other"  # any other non-empty folder still needs --force
    other.mkdir()
    (other / "notes.txt").write_text("x")
    rc, _, stderr = quiet_main(["--out", str(other), "--graphs", "embed", "--no-validate"])
    assert rc == 2 and "--force" in stderr
