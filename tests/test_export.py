"""seer-export (docs/DESIGN.md §4-5): the ONNX graphs against the PyTorch reference, the manifest they come with, the CLI.

Two exports per module run, each graph once: the bundled fixture in fp32 through the CLI (the command a user
runs), and a tiny random LLaDA-V in fp16. Beyond the parity report the export writes itself, the graphs are
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

from seer_export import onnx_export
from seer_export.cli_export import main
from seer_export.models.config import LLaDAVConfig, TextConfig, VisionConfig
from seer_export.models.llada_v import LLaDAV, window_layout
from seer_export.models.loading import load_model
from seer_export.models.registry import FIXTURE_DIR
from seer_export.onnx_export import ExportError, ExportOptions, open_source, run_export
from seer_export.random_checkpoint import write_random_checkpoint
from seer_export.sampler import suppress_special
from seer_export.seer import step_zero
from seer_trt.backend import OrtBackend
from seer_trt.config import GenerationConfig, SeerConfig
from seer_trt.graphs import GRAPH_NAMES, TOLERANCES
from seer_trt.layout import left_pad
from seer_trt.layout import window_layout as np_window_layout
from seer_trt.manifest import Manifest

# (prompt lengths, kept answer lengths, window G): one row, a left-padded batch, a longer window
SHAPES = [((6,), (9,), 9), ((10, 3, 7), (12, 5, 12), 12), ((4, 4), (21, 21), 21)]


class Graphs:
    """The backend with copied outputs: it reuses its output buffers between calls of one shape."""

    def __init__(self, backend: OrtBackend) -> None:
        self.backend = backend

    def run(self, name: str, **feeds: np.ndarray) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self.backend.run(name, feeds).items()}


def quiet_main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def fixture_model() -> LLaDAV:
    return load_model(FIXTURE_DIR)


@pytest.fixture(scope="module")
def random_checkpoint(tmp_path_factory) -> Path:
    """A 3-layer LLaDA-V of width 32 with random weights (sharded), probing layer 1 with the gate statistic."""
    cfg = LLaDAVConfig(
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
    """The bundled fixture in fp16: the graphs the end-to-end check needs (a random model's near-ties would make
    fp16 token agreement a coin toss; the trained fixture's predictions are decisive, as a real model's are)."""
    out = tmp_path_factory.mktemp("fixture16") / "engines"
    cfg = LLaDAVConfig.from_file(FIXTURE_DIR / "config.json")
    zero = "step_zero_full" if cfg.seer.needs_full_depth(cfg.text.num_hidden_layers) else "step_zero"
    options = ExportOptions(out=out, dtype="fp16", graphs=("embed", "vision", zero, "denoise"), samples=8)
    return out, run_export(options, log=lambda line: None)


def window_inputs(model: LLaDAV, prompts, kept, g: int, mask_id: int, seed: int = 0, all_masks: bool = False):
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


def test_cli_writes_every_graph_tokenizer_and_manifest(fixture_export):
    out, manifest, stdout = fixture_export
    assert list(manifest.graphs) == list(GRAPH_NAMES)
    for entry in manifest.graphs.values():
        assert (out / entry.file).is_file() and entry.external_data is None and entry.precision == "float32"
    assert (out / "tokenizer" / "tokenizer.json").is_file()
    assert "chat_template" in (out / "tokenizer" / "tokenizer_config.json").read_text()
    assert manifest.versions.opset == 20 and manifest.seer == LLaDAVConfig.from_file(FIXTURE_DIR / "config.json").seer
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no staging folder left behind
    stages = [line for line in stdout.splitlines() if line.startswith("[")]
    assert any("exported denoise.onnx" in line for line in stages) and "done" in stages[-1]
    assert "| denoise | x0 |" in stdout  # the parity table


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


def test_goldens_load_with_polygraphy(fixture_export):
    from polygraphy.comparator import RunResults
    from polygraphy.json import load_json

    out, manifest, _ = fixture_export
    feeds = load_json(out / "goldens" / "denoise.inputs.json")
    results = RunResults.load(str(out / "goldens" / "denoise.outputs.json"))
    assert len(feeds) == len(results["pytorch"]) >= 4
    assert set(feeds[0]) == {t.name for t in manifest.graph("denoise").spec.inputs}
    assert set(results["pytorch"][0].keys()) == {"x0", "confidence"}


# --- the graphs against the reference code paths -----------------------------------------------------------------


@pytest.mark.parametrize("prompts, kept, g", SHAPES)
def test_denoise_graphs_match_the_reference_sampler(fixture_export, fixture_model, prompts, kept, g):
    """x0 / confidence / logits as ``sampler.generate`` computes them from ``LLaDAV.forward``."""
    out, manifest, _ = fixture_export
    special = manifest.special_tokens
    feeds, _ = window_inputs(fixture_model, prompts, kept, g, special.mask_id, seed=len(prompts))
    graphs = Graphs(OrtBackend(out, manifest))
    got = {**graphs.run("denoise", **feeds), **graphs.run("denoise_logits", **feeds)}
    with torch.no_grad():
        logits = fixture_model(*torch_inputs(feeds))
    logits = suppress_special(logits, torch.from_numpy(feeds["gen_ids"] == special.mask_id), special)
    x0 = logits.argmax(-1)
    conf = torch.softmax(logits.double(), -1).gather(-1, x0[..., None])[..., 0]
    tol = TOLERANCES[("float32", "value")]
    np.testing.assert_array_equal(got["x0"], x0.numpy())
    np.testing.assert_allclose(got["confidence"], conf.numpy(), atol=tol.atol, rtol=tol.rtol)
    np.testing.assert_allclose(got["logits"], logits.numpy(), atol=tol.atol, rtol=tol.rtol)  # -inf == -inf


@pytest.mark.parametrize("prompts, kept, g", SHAPES)
def test_step_zero_graphs_match_the_seer_reference(fixture_export, fixture_model, prompts, kept, g):
    """sparsity, every layer's statistic and p_end as ``seer.step_zero`` records them with hooks."""
    out, manifest, _ = fixture_export
    seer, special = manifest.seer, manifest.special_tokens
    feeds, valid = window_inputs(fixture_model, prompts, (g,) * len(prompts), g, special.mask_id, all_masks=True)
    graphs = Graphs(OrtBackend(out, manifest))
    early = graphs.run("step_zero", **feeds)["sparsity"]
    full = graphs.run("step_zero_full", **feeds)
    prefix = torch.from_numpy(feeds["prefix_embeds"])
    zero = step_zero(fixture_model, prefix, torch.from_numpy(valid), g, special, tau_abs=seer.tau_abs)
    stats = zero.abs_below if seer.statistic == "abs_below" else zero.gate_negative  # [B, layers, G]
    atol = TOLERANCES[("float32", "fraction")].atol
    np.testing.assert_allclose(early, stats[:, seer.probe_layer], atol=atol)
    np.testing.assert_allclose(full["sparsity_layers"], stats, atol=atol)
    np.testing.assert_allclose(full["p_end"], zero.p_end, atol=1e-5)


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
        np.testing.assert_allclose(padded["confidence"][b, :kept], den["confidence"][0], atol=1e-5)
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
    np.testing.assert_allclose(den["confidence"][0, :g1], rows[0][1]["confidence"][0], atol=1e-5)
    np.testing.assert_allclose(zero["sparsity"][0, g1:], rows[1][2]["sparsity"][0], atol=atol)


def test_graphs_agree_with_torch_window_layout(fixture_model):
    """The numpy layout the ONNX loop uses is the PyTorch reference's."""
    valid = np.array([[False, True, True], [True, True, True]])
    seg, pos = np_window_layout(valid, np.array([2, 4]), 4)
    ref_seg, ref_pos = window_layout(torch.from_numpy(valid), torch.tensor([2, 4]), 4)
    np.testing.assert_array_equal(seg, ref_seg.numpy())
    np.testing.assert_array_equal(pos, ref_pos.numpy())
    assert seg.dtype == np.int32 and pos.dtype == np.int64


def test_step_zero_graph_stops_at_the_probe_layer(fixture_export):
    import onnx

    out, manifest, _ = fixture_export
    k = manifest.seer.probe_layer
    model = onnx.load(str(out / "step_zero.onnx"))
    names = [i.name for i in model.graph.initializer]
    layers = {int(n.split("layers.")[1].split(".")[0]) for n in names if "layers." in n}
    assert layers == set(range(k + 1))  # nothing past layer k
    assert not any("lm_head" in n or n.startswith("model.norm") for n in names)
    matmuls = sum(n.op_type == "MatMul" for n in model.graph.node)
    assert matmuls <= 9 * (k + 1)  # q, k, v, o, QK^T, AV, gate, up, down per layer; no head
    full = onnx.load(str(out / "step_zero_full.onnx"))
    assert sum(n.op_type == "MatMul" for n in full.graph.node) == 9 * manifest.model.num_layers + 1


# --- fp16 ---------------------------------------------------------------------------------------------------------


def test_fp16_export_is_within_its_tolerance(fixture_fp16):
    out, manifest = fixture_fp16
    assert manifest.precision == "float16" and manifest.parity.status == "passed", manifest.parity.note
    assert manifest.parity.end_to_end is not None and manifest.parity.end_to_end.token_agreement >= 0.99
    rows = [r for r in manifest.parity.rows if r.graph == "denoise" and r.output == "confidence"]
    assert rows and all(r.atol == TOLERANCES[("float16", "value")].atol for r in rows)


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
    softmax = [n for n in denoise.graph.all_nodes() if n.op_type == "Softmax" and n.outputs[0].shape[-1] == vocab]
    assert softmax and all(n.outputs[0].dtype == ir.DataType.FLOAT for n in softmax)
    assert [v.dtype for v in denoise.graph.outputs] == [ir.DataType.INT64, ir.DataType.FLOAT]


def test_large_graphs_use_external_data_and_other_opsets(random_checkpoint, tmp_path, monkeypatch):
    import onnx
    import onnxruntime as ort

    from seer_trt.graphs import graph_specs

    monkeypatch.setattr(onnx_export, "LARGE_BYTES", 0)
    source = open_source("tiny-llada-v", random_checkpoint)
    spec = graph_specs(onnx_export.model_dims(source.config), "float32", ("embed",))["embed"]
    entry, _ = onnx_export.export_graph(spec, "float32", source, 22, tmp_path / "embed.onnx")
    assert entry.external_data == "embed.onnx.data" and (tmp_path / "embed.onnx.data").is_file()
    model = onnx.load(str(tmp_path / "embed.onnx"), load_external_data=False)
    assert {o.domain: o.version for o in model.opset_import}[""] == 22
    sess = ort.InferenceSession(str(tmp_path / "embed.onnx"), providers=["CPUExecutionProvider"])
    ids = np.array([[1, 5, 9]], dtype=np.int64)
    table = next(source.tensors.read(["model.embed_tokens.weight"]))[1].numpy()
    np.testing.assert_array_equal(sess.run(None, {"input_ids": ids})[0][0], table[ids[0]])


# --- CLI ------------------------------------------------------------------------------------------------------------


def test_help_imports_no_torch():
    code = "import sys; from seer_export.cli_export import main\ntry: main(['--help'])\nexcept SystemExit: pass\n"
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


def test_non_empty_out_needs_force_and_failed_export_leaves_the_old_one(random_checkpoint, tmp_path, monkeypatch):
    out = tmp_path / "engines"
    out.mkdir()
    old = json.dumps({"schema_version": "1.1", "graphs": {}, "note": "old"})  # an earlier export of ours
    (out / "manifest.json").write_text(old)
    base = ["--checkpoint", str(random_checkpoint), "--out", str(out), "--no-validate"]
    rc, _, stderr = quiet_main(base)
    assert rc == 2 and "--force" in stderr

    calls = []
    real = onnx_export.export_graph

    def fail_second(*args, **kwargs):
        calls.append(args[0].name)
        if len(calls) == 2:
            raise ExportError("simulated failure while exporting the second graph")
        return real(*args, **kwargs)

    monkeypatch.setattr(onnx_export, "export_graph", fail_second)
    rc, _, stderr = quiet_main([*base, "--force", "--graphs", "embed", "denoise"])
    assert rc == 2 and "simulated failure" in stderr
    assert [p.name for p in tmp_path.iterdir()] == ["engines"]  # no staging folder left behind
    assert (out / "manifest.json").read_text() == old  # untouched: replaced only when complete

    fresh = tmp_path / "fresh"
    calls.clear()
    rc, _, _ = quiet_main(["--checkpoint", str(random_checkpoint), "--out", str(fresh), "--no-validate",
                           "--graphs", "embed", "vision"])  # fmt: skip
    assert rc == 2 and not fresh.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_validation_that_cannot_fit_in_memory_is_refused_up_front(random_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_export, "_available_ram", lambda: 1024)
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
