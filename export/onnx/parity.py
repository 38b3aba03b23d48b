"""Validation inside export: the graphs under ONNX Runtime vs PyTorch, then a Seer generation through them (DESIGN "Graphs and their contract").

In:  the export folder being written (graphs, draft manifest), the checkpoint folder, ``ExportOptions``.
Out: ``ParityReport`` (stored in the manifest): per graph, output and input case the max abs / rel error and
     agreement against ``seer_trt.contracts.graphs.TOLERANCES``; the end-to-end token agreement of
     the runtime's ``seer_trt.runtime.pipeline.SeerPipeline`` with ``seer_export.reference.seer.seer_generate`` on held-out
     fixture prompts (answer tokens through the first ``<|eot_id|>``; the whole-window figure is stored beside
     it). A summary table is printed; ``--save-goldens`` writes Polygraphy JSON inputs and outputs.

Cases for the window graphs: one row; a left-padded batch whose rows keep different answer windows; a
batch of other lengths; and two rows packed into one sequence (segment ids 1 and 2, positions restarting),
whose reference is the two rows run separately, so packing must not change a row's outputs. Graphs with the
prompt K/V cache get zero-length caches in those cases, and two cached steps: the left-padded batch and the packed
rows with no prompt, two snapshots of their prompt K/V (from two answer states) weighted like a forecast, and a
changed answer window. The reference
is the fp32 PyTorch model with the graph's own module (``seer_export.onnx.modules``) around it; float inputs are
rounded to the graph's precision first, so fp16 rows measure the graph's arithmetic, not its inputs.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from seer_export.models.loading import load_model
from seer_export.models.mllm import DiffusionMLLM
from seer_export.onnx.modules import build
from seer_trt.backends.onnxruntime import OrtBackend
from seer_trt.contracts.errors import ConfigError
from seer_trt.contracts.graphs import (
    TOKEN_AGREEMENT,
    GraphSpec,
    TensorSpec,
    graph_precision,
    has_cache,
    image_graph,
    past_names,
    present_names,
    tolerance,
)
from seer_trt.contracts.manifest import EndToEnd, Manifest, ParityReport, ParityRow
from seer_trt.eval.tasks import HELD_OUT_SEED
from seer_trt.runtime.kv_cache import no_cache
from seer_trt.runtime.layout import left_pad, window_layout

if TYPE_CHECKING:
    from seer_export.onnx.options import ExportOptions

# (name, prompt lengths, kept answer lengths, answer window G): the left-padded and mixed-length batches
WINDOW_CASES = (
    ("b1 p9 g16", (9,), (16,), 16),
    ("b3 p12 g20 left-padded", (12, 7, 4), (20, 13, 6), 20),
    ("b2 p5 g33", (5, 5), (33, 33), 33),
)
PACKED_CASE = ("packed 2 rows p8+5 g10+7", (8, 5), (10, 7))
CACHED_WEIGHTS = (-0.25, 1.25)  # two snapshots combined as an order-1 forecast would (weights sum to 1)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    feeds: dict[str, np.ndarray]  # graph inputs, float ones in the graph's precision
    reference: dict[str, np.ndarray]  # PyTorch outputs by name
    probs: np.ndarray | None = None  # [B, G, V] reference softmax of the suppressed logits, for graphs with x0


def _torch_outputs(module: torch.nn.Module, spec: GraphSpec, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    args = []
    for t in spec.inputs:
        a = torch.from_numpy(np.array(feeds[t.name]))  # a copy: feeds may be read-only (kv_cache.no_cache)
        args.append(a.float() if a.is_floating_point() else a)  # the fp32 reference on the rounded inputs
    with torch.no_grad():
        out = module(*args)
    out = out if isinstance(out, tuple) else (out,)
    return {t.name: o.detach().cpu().numpy() for t, o in zip(spec.outputs, out, strict=True)}


def _window_feeds(
    rng: np.random.Generator, table: np.ndarray, prompts: tuple[int, ...], kept: tuple[int, ...], g: int,
    mask_id: int, all_masks: bool, dtype: np.dtype,
) -> dict[str, np.ndarray]:  # fmt: skip
    """Left-padded prompts of embedded random ids, answer windows of masks (and tokens unless ``all_masks``)."""
    rows = [table[rng.integers(0, table.shape[0], p)] for p in prompts]
    prefix, valid = left_pad(rows)
    segment_ids, position_ids = window_layout(valid, np.array(kept), g)
    gen_ids = rng.integers(0, table.shape[0], (len(prompts), g))
    gen_ids = np.where(all_masks | (rng.random(gen_ids.shape) < 0.5), mask_id, gen_ids)
    return dict(prefix_embeds=prefix.astype(dtype), gen_ids=gen_ids.astype(np.int64), segment_ids=segment_ids,
                position_ids=position_ids)  # fmt: skip


def _pack(rows: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One sequence holding every row: prompts, then answers; segment r + 1 and positions restarting per row."""
    prompts = [r["prefix_embeds"].shape[1] for r in rows]
    answers = [r["gen_ids"].shape[1] for r in rows]
    segment = [np.full(p, i + 1) for i, p in enumerate(prompts)] + [np.full(a, i + 1) for i, a in enumerate(answers)]
    position = [np.arange(p) for p in prompts] + [np.arange(p, p + a) for p, a in zip(prompts, answers, strict=True)]
    return dict(
        prefix_embeds=np.concatenate([r["prefix_embeds"] for r in rows], axis=1),
        gen_ids=np.concatenate([r["gen_ids"] for r in rows], axis=1),
        segment_ids=np.concatenate(segment)[None].astype(np.int32),
        position_ids=np.concatenate(position)[None].astype(np.int64),
    )


def make_cases(spec: GraphSpec, model: DiffusionMLLM, manifest: Manifest, seed: int = 0) -> list[Case]:
    """Input cases of graph ``spec`` with their PyTorch reference outputs."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(graph_precision(spec.name, manifest.precision))
    module = build(spec.name, model, manifest.special_tokens, manifest.seer)

    def ref(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return _torch_outputs(module, spec, feeds)

    has_x0 = any(t.kind == "index" for t in spec.outputs)
    logits_module = build("denoise_logits", model, manifest.special_tokens, manifest.seer) if has_x0 else None

    def probs(feeds: dict[str, np.ndarray]) -> np.ndarray | None:
        """Where x0 differs, the reference tells whether it was a near-tie (see ``compare``)."""
        if logits_module is None:
            return None
        args = [torch.from_numpy(np.array(feeds[t.name])) for t in spec.inputs]
        with torch.no_grad():
            out = logits_module(*[a.float() if a.is_floating_point() else a for a in args])
        return torch.softmax(out[0] if isinstance(out, tuple) else out, dim=-1).numpy()

    vocab = manifest.model.vocab_size
    if spec.name == "embed":
        feeds = [{"input_ids": rng.integers(0, vocab, shape).astype(np.int64)} for shape in ((1, 6), (3, 17))]
        return [Case(f"b{f['input_ids'].shape[0]} s{f['input_ids'].shape[1]}", f, ref(f)) for f in feeds]
    if spec.name in ("vision", "image_tokens"):
        size = manifest.vision.image_size
        feeds = [{"pixel_values": rng.uniform(-1, 1, (n, 3, size, size)).astype(dtype)} for n in (1, 3)]
        return [Case(f"{f['pixel_values'].shape[0]} tile(s)", f, ref(f)) for f in feeds]
    table = model.model.embed_tokens.weight.detach().float().numpy()  # prompts: embedded random ids
    all_masks = spec.name.startswith("step_zero")  # step zero sees an all-mask window
    mask_id = manifest.special_tokens.mask_id

    def window(prompts: tuple[int, ...], kept: tuple[int, ...], g: int) -> dict[str, np.ndarray]:
        feeds = _window_feeds(rng, table, prompts, kept, g, mask_id, all_masks, dtype)
        return {**feeds, **no_cache(spec, len(prompts))}

    cases = []
    for name, prompts, kept, g in WINDOW_CASES:
        feeds = window(prompts, kept, g)
        cases.append(Case(name, feeds, ref(feeds), probs(feeds)))
    name, prompts, answers = PACKED_CASE
    rows = [window((p,), (a,), a) for p, a in zip(prompts, answers, strict=True)]
    cases.append(_packed_case(name, spec, rows, ref, probs))
    if has_cache(spec):
        cases.append(
            _cached_case("cached step, " + WINDOW_CASES[1][0], spec, [cases[1].feeds], ref, probs, rng, mask_id)
        )
        cases.append(_cached_case("cached step, " + name, spec, rows, ref, probs, rng, mask_id))
    return cases


def _concat_outputs(spec: GraphSpec, parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-row outputs as one packed call's: answer outputs along the answer axis, K/V along the prompt axis."""
    return {
        t.name: np.concatenate(
            [p[t.name] for p in parts], axis=t.shape.index("answer" if "answer" in t.shape else "prompt")
        )  # fmt: skip
        for t in spec.outputs
    }


def _packed_case(name: str, spec: GraphSpec, rows: list[dict[str, np.ndarray]], ref, probs) -> Case:
    """``rows`` (each a one-row call) packed into one sequence; the reference is each row run alone."""
    row_probs = [probs(r) for r in rows]
    packed_probs = None if row_probs[0] is None else np.concatenate(row_probs, axis=1)
    packed = {**_pack(rows), **{k: v for k, v in rows[0].items() if k.startswith("past")}}  # empty caches
    return Case(name, packed, _concat_outputs(spec, [ref(r) for r in rows]), packed_probs)


def _cached_case(name: str, spec: GraphSpec, calls: list[dict[str, np.ndarray]], ref, probs,
                 rng: np.random.Generator, mask_id: int) -> Case:  # fmt: skip
    """A cached step after ``calls`` (one call, or one-row calls to pack): no prompt; per layer two snapshots of
    the calls' prompt K/V (the reference's, at the calls' answer window and at a re-masked one) combined with
    CACHED_WEIGHTS; the answer window changed again. Packed: the rows' snapshots side by side on the past axis."""
    layers = len([t for t in spec.inputs if t.name.startswith("past_key_values.")]) // 2
    dtypes = {t.name: t.dtype for t in spec.inputs}

    def remask(gen: np.ndarray) -> np.ndarray:
        return np.where(rng.random(gen.shape) < 0.3, mask_id, gen)

    steps = []
    for call in calls:
        first = ref(call)
        second = ref({**call, "gen_ids": remask(call["gen_ids"])})
        past = {"past_weights": np.array(CACHED_WEIGHTS, dtype=np.float32)}
        for i in range(layers):
            for p_name, o_name in zip(past_names(i), present_names(i), strict=True):  # in the graph's precision
                past[p_name] = np.stack([first[o_name], second[o_name]]).astype(dtypes[p_name])
        empty = call["prefix_embeds"][:, :0]
        steps.append({**call, **past, "prefix_embeds": empty, "gen_ids": remask(call["gen_ids"])})
    if len(steps) == 1:
        return Case(name, steps[0], ref(steps[0]), probs(steps[0]))
    packed = _pack(steps)  # prompts are empty: segment and position ids of the answers only, then the past first
    segment = np.concatenate([np.full(s["gen_ids"].shape[1], i + 1) for i, s in enumerate(steps)])
    past_seg = np.concatenate([np.full(s["past_key_values.0.key"].shape[3], i + 1) for i, s in enumerate(steps)])
    past_pos = np.concatenate([c["position_ids"][0, : s["past_key_values.0.key"].shape[3]]
                               for c, s in zip(calls, steps, strict=True)])  # fmt: skip
    answer_pos = np.concatenate([s["position_ids"][0, s["past_key_values.0.key"].shape[3] :] for s in steps])
    packed["segment_ids"] = np.concatenate([past_seg, segment])[None].astype(np.int32)
    packed["position_ids"] = np.concatenate([past_pos, answer_pos])[None].astype(np.int64)
    packed["past_weights"] = steps[0]["past_weights"]
    for t in spec.inputs:
        if t.name.startswith("past_key_values."):
            packed[t.name] = np.concatenate([s[t.name] for s in steps], axis=3)
    row_probs = [probs(s) for s in steps]
    packed_probs = None if row_probs[0] is None else np.concatenate(row_probs, axis=1)
    return Case(name, packed, _concat_outputs(spec, [ref(s) for s in steps]), packed_probs)


def compare(
    graph: str, out: TensorSpec, case: str, got: np.ndarray, want: np.ndarray, precision: str,
    probs: np.ndarray | None = None,
) -> ParityRow:  # fmt: skip
    """One output of one case against its row of ``seer_trt.contracts.graphs.TOLERANCES``.

    "value": |got - want| <= atol + rtol * max(|want|, rms), rms over the last axis's finite values: rounding
    error in a matmul's output follows the size of the vector it belongs to, not of the single element, so a
    near-zero logit next to large ones is held to the vector's scale. "fraction": |got - want| <= atol.
    "index": equal, or a near-tie in the reference: the reference probability of the graph's choice is within
    atol of the reference's own choice's (``probs``); ``max_abs`` is then the largest such gap.
    """
    tol = tolerance(precision, out.kind)
    if got.shape != want.shape:
        return ParityRow(graph, out.name, case, out.kind, np.inf, np.inf, 0.0, tol.atol, tol.rtol, tol.agreement, False)
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    same = got64 == want64  # also equal infinities (suppressed logits are -inf on both sides)
    if out.kind == "index":
        gap = np.zeros(got.shape)
        if probs is not None:
            if got.ndim == probs.ndim:  # ids along the last axis already (top_ids [B, G, k])
                p_got, p_want = np.take_along_axis(probs, got, -1), np.take_along_axis(probs, want, -1)
            else:  # one id per position (x0 [B, G])
                p_got = np.take_along_axis(probs, got[..., None], axis=-1)[..., 0]
                p_want = np.take_along_axis(probs, want[..., None], axis=-1)[..., 0]
            gap = np.where(same, 0.0, p_want - p_got)
        within = same | ((gap <= tol.atol) & (probs is not None))
        agreement = float(within.mean()) if within.size else 1.0
        return ParityRow(graph, out.name, case, out.kind, float(gap.max(initial=0.0)), 0.0, agreement, tol.atol,
                         tol.rtol, tol.agreement, agreement >= tol.agreement)  # fmt: skip
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(got64 - want64))  # NaN stays NaN: never within tolerance
        finite = np.where(np.isfinite(want64), want64, 0.0)
        rms = np.sqrt((finite**2).mean(axis=-1, keepdims=True)) if want.ndim else np.abs(finite)
    scale = np.maximum(np.abs(want64), rms) if out.kind == "value" else np.zeros_like(want64)
    within = diff <= tol.atol + tol.rtol * scale
    scaled = np.abs(want64) > tol.atol
    max_abs = float(np.nanmax(np.where(np.isnan(diff), np.inf, diff))) if diff.size else 0.0
    max_rel = float((diff[scaled] / np.abs(want64[scaled])).max()) if scaled.any() else 0.0
    agreement = float(within.mean()) if within.size else 1.0
    return ParityRow(graph, out.name, case, out.kind, max_abs, max_rel, agreement, tol.atol, tol.rtol, 1.0,
                     bool(within.all()))  # fmt: skip


def summary_table(rows: list[ParityRow], precision: str) -> str:
    """One line per graph output (the per-layer K/V outputs of a cached graph as one line): the worst case's
    figures."""
    lines = [
        "| graph | output | dtype | cases | max abs | max rel | agreement | tolerance | ok |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def output(r: ParityRow) -> str:
        return re.sub(r"^present\.\d+\.", "present.*.", r.output)

    keys = list(dict.fromkeys((r.graph, output(r)) for r in rows))
    for graph, name in keys:
        group = [r for r in rows if (r.graph, output(r)) == (graph, name)]
        kind = group[0].kind
        tol = (f"equal or p gap <= {group[0].atol:g}" if kind == "index"
               else f"atol {group[0].atol:g} rtol {group[0].rtol:g}")  # fmt: skip
        cases = len({r.case for r in group})
        lines.append(
            f"| {graph} | {name} | {precision} | {cases} | {max(r.max_abs for r in group):.2e} "
            f"| {max(r.max_rel for r in group):.2e} | {100 * min(r.agreement for r in group):.2f} % | {tol} "
            f"| {'yes' if all(r.passed for r in group) else 'NO'} |"
        )
    return "\n".join(lines)


def save_goldens(folder: Path, spec: GraphSpec, cases: list[Case]) -> None:
    """Polygraphy JSON: ``{graph}.inputs.json`` (feed dicts) and ``{graph}.outputs.json`` (RunResults)."""
    from polygraphy.comparator import IterationResult, RunResults
    from polygraphy.json import save_json

    folder.mkdir(exist_ok=True)
    save_json([c.feeds for c in cases], folder / f"{spec.name}.inputs.json")
    results = [IterationResult(outputs=c.reference, runner_name="pytorch") for c in cases]
    RunResults([("pytorch", results)]).save(str(folder / f"{spec.name}.outputs.json"))


def answer_positions(tokens: np.ndarray, kept: np.ndarray, eot_id: int) -> np.ndarray:
    """[B, N] bool: each row's answer, positions 0 through its first ``<|eot_id|>`` (its kept window without one).

    What the user reads (docs/DESIGN.md "Measuring" counts valid tokens the same way); what follows the end token is dropped by
    decoding, and there a model's near-tied guesses flip under fp16 rounding without changing any answer.
    """
    positions = np.arange(tokens.shape[1])[None]  # [1, N]
    is_eot = tokens == eot_id
    end = np.where(is_eot.any(axis=1), is_eot.argmax(axis=1) + 1, kept)  # [B] exclusive end
    return positions < end[:, None]


def end_to_end(
    folder: Path, model: DiffusionMLLM, manifest: Manifest, checkpoint: Path, samples: int
) -> EndToEnd | None:
    """Seer through the runtime's pipeline on the exported graphs vs ``seer_generate`` in PyTorch, on held-out
    fixture prompts; None when the export lacks a graph the generation needs."""
    from seer_export.reference.fixture import TaskEncoder
    from seer_export.reference.seer import seer_generate
    from seer_trt.eval.tasks import make_samples
    from seer_trt.runtime.pipeline import SeerPipeline
    from seer_trt.runtime.request import Request
    from seer_trt.runtime.step_zero import step_zero_graph

    seer = manifest.seer
    zero = step_zero_graph(seer)
    image = image_graph(manifest.vision.encoder)  # None: a text-only model (Dream)
    if any(g not in manifest.graphs for g in ("embed", zero, "denoise", *([image] if image else []))):
        return None
    gen = dataclasses.replace(manifest.generation, temperature=0.0, remasking="low_confidence")
    enc = TaskEncoder(checkpoint, model.config)
    vision = manifest.vision
    batch = make_samples(HELD_OUT_SEED, 4 * samples, vision.image_size // vision.patch_size, vision.patch_size)
    batch = [s for s in batch if image or s.image is None][:samples]  # a text-only model: the questions without one
    prefix, valid = enc.prefix(model, batch)
    ref, _ = seer_generate(model, prefix, valid, gen, manifest.special_tokens, seer)
    pipe = SeerPipeline(folder, manifest, OrtBackend(folder, manifest))
    results = pipe.generate([Request(s.question, s.image, temperature=0.0, remasking="low_confidence", cache="none")
                             for s in batch])  # the exact loop: what seer_generate computes  # fmt: skip
    pipe.close()
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise ConfigError(f"the runtime failed on fixture prompts: {failed[0]}")
    tokens = np.full_like(ref.tokens, manifest.special_tokens.mask_id)
    for row, r in zip(tokens, results, strict=True):
        row[: len(r.window)] = r.window
    same = tokens == ref.tokens  # [B, N]
    answer = answer_positions(ref.tokens, ref.kept, manifest.special_tokens.eot_id)  # [B, N] bool
    agreement = float(same[answer].mean())
    required = TOKEN_AGREEMENT[manifest.precision]
    return EndToEnd(
        samples=samples,
        seed=HELD_OUT_SEED,
        gen_length=gen.gen_length,
        steps=gen.steps,
        detector=seer.describe(),
        token_agreement=agreement,
        window_agreement=float(same.mean()),
        answer_match=float((same | ~answer).all(axis=1).mean()),
        kept_agreement=float(np.mean([r.kept == k for r, k in zip(results, ref.kept, strict=True)])),
        required=required,
        passed=agreement >= required,
    )


def validate(
    folder: Path, manifest: Manifest, checkpoint: Path, options: ExportOptions, stage: Callable[[str], None]
) -> ParityReport:
    """Every exported graph vs PyTorch on the parity cases, then the end-to-end generation.

    Args:
        folder: the export folder holding the graphs.
        manifest: the draft manifest (graphs, special ids, calibration).
        checkpoint: the checkpoint folder (weights and tokenizer).
        options: ``ExportOptions`` (``save_goldens``, ``samples``).
        stage: progress callback, one line per stage.
    """
    model = load_model(checkpoint, dtype=torch.float32)
    backend = OrtBackend(folder, manifest)
    rows: list[ParityRow] = []
    for name, entry in manifest.graphs.items():
        cases = make_cases(entry.spec, model, manifest)
        for case in cases:
            got = backend.run(name, case.feeds)
            rows += [compare(name, t, case.name, got[t.name], case.reference[t.name], entry.precision, case.probs)
                     for t in entry.spec.outputs]  # fmt: skip
        if options.save_goldens:
            save_goldens(folder / "goldens", entry.spec, cases)
        bad = sum(not r.passed for r in rows if r.graph == name)
        stage(f"parity {name}: {len(cases)} cases, {'ok' if not bad else f'{bad} output(s) out of tolerance'}")
    backend.close()
    e2e = end_to_end(folder, model, manifest, checkpoint, options.samples)
    if e2e is None:
        stage("end-to-end Seer check skipped: needs the embed, vision, step-zero and denoise graphs")
    else:
        stage(
            f"end-to-end Seer ({e2e.detector}) on {e2e.samples} held-out prompts, gen_length {e2e.gen_length}: "
            f"answer-token agreement {100 * e2e.token_agreement:.2f} % (required {100 * e2e.required:.0f} %), "
            f"whole window {100 * e2e.window_agreement:.2f} %, identical answers {100 * e2e.answer_match:.0f} %, "
            f"same L* {100 * e2e.kept_agreement:.0f} %"
        )
    failed = [f"{r.graph}.{r.output} [{r.case}]" for r in rows if not r.passed]
    if e2e is not None and not e2e.passed:
        failed.append(f"end-to-end token agreement {100 * e2e.token_agreement:.2f} %")
    return ParityReport(
        status="failed" if failed else "passed",
        reference=f"PyTorch float32 (seer_export), ONNX Runtime {backend.provider}",
        rows=tuple(rows),
        end_to_end=e2e,
        note=("out of tolerance: " + ", ".join(failed[:6])) if failed else "",
    )
