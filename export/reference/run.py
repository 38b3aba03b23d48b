"""``seer-reference``: the PyTorch reference, padded baseline vs Seer, on fixture prompts or one prompt.

In:  a registered model (``tiny-llada-v`` bundled, ``llada-v`` from a local checkpoint), held-out task
     samples drawn from a seed (or ``--prompt`` / ``--image``), generation settings, detectors.
Out: a markdown table per gen_length: exact match of the baseline and of Seer under each detector, premature
     cuts, mean kept window over the true length, mean steps; optional JSON.

Detectors: ``calibrated`` (the model's own ``seer`` calibration from its config.json, e.g. a probe at layer k),
``paper`` (the paper's rule: |h| < 1e-3 at layer 3, up, 0.03, 0.6, window 3, margin 1) and ``end_token_prob``
(step-zero probability of the end tokens at full depth, threshold 0.5, margin 1). Every row names its detector. This is the reference every exported graph and engine is
compared with; it is not the fast path.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

from seer_trt.cli.common import Parser, add_model, add_report, add_samples, add_verbose, require_extra, run_main
from seer_trt.contracts.config import GenerationConfig, SeerConfig
from seer_trt.contracts.errors import SeerError
from seer_trt.eval.report import write_json
from seer_trt.eval.tasks import HELD_OUT_SEED

PAPER = SeerConfig()
END_TOKEN = SeerConfig(signal="end_token_prob", label="end_token_prob")


def detectors_for(model_seer: SeerConfig, names: list[str]) -> dict[str, SeerConfig]:
    table = {"calibrated": model_seer, "paper": PAPER, "end_token_prob": END_TOKEN}
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SeerError(f"unknown detector(s) {unknown}; choose from {sorted(table)}")
    return {n: table[n] for n in names}


def answer_of(row: np.ndarray, eot_id: int, drop: tuple[int, ...]) -> list[int]:
    """Answer ids of a generated row: up to the first ``<|eot_id|>``, or the row without padding/masks."""
    row = row.tolist()
    if eot_id in row:
        return row[: row.index(eot_id)]
    return [t for t in row if t not in drop]


@dataclasses.dataclass(frozen=True)
class ModeResult:
    """One mode (baseline or a detector) over the evaluated samples."""

    answers: list[list[int]]  # decoded answer ids per sample
    kept: np.ndarray  # [n] kept window
    steps: np.ndarray  # [n] denoising steps used
    seconds: float  # wall time of the mode, all batches


def run_modes(model, enc, samples, gen: GenerationConfig, detectors: dict[str, SeerConfig], batch: int = 50,
              progress=None) -> dict[str, ModeResult]:  # fmt: skip
    """Generate every sample with the padded baseline and with Seer under each detector."""
    import torch

    from seer_export.reference.sampler import generate
    from seer_export.reference.seer import seer_generate

    special = enc.special
    drop = (special.endoftext_id, special.mask_id)
    acc = {name: ([], [], [], 0.0) for name in ["baseline", *detectors]}
    with torch.no_grad():
        for start in range(0, len(samples), batch):
            chunk = samples[start : start + batch]
            prefix, valid = enc.prefix(model, chunk)
            for name in acc:
                t0 = time.perf_counter()
                if name == "baseline":
                    out = generate(model, prefix, valid, gen, special)
                else:
                    out, _ = seer_generate(model, prefix, valid, gen, special, detectors[name])
                answers, kept, steps, secs = acc[name]
                answers.extend(answer_of(r, special.eot_id, drop) for r in out.tokens)
                kept.extend(out.kept.tolist())
                steps.extend(out.steps.tolist())
                acc[name] = (answers, kept, steps, secs + time.perf_counter() - t0)
            if progress:
                progress(min(start + batch, len(samples)), len(samples))
    return {k: ModeResult(a, np.array(kp), np.array(st), s) for k, (a, kp, st, s) in acc.items()}


def metrics(results: dict[str, ModeResult], truth: list[list[int]]) -> dict[str, dict[str, float]]:
    """Exact match vs ground truth and vs the baseline; premature cuts and kept/true for truncating modes."""
    true_len = np.array([len(t) + 1 for t in truth])  # answer + <|eot_id|>
    base = results["baseline"].answers
    out = {}
    for name, r in results.items():
        row = {
            "exact_match": float(np.mean([a == t for a, t in zip(r.answers, truth, strict=True)])),
            "match_baseline": float(np.mean([a == b for a, b in zip(r.answers, base, strict=True)])),
            "mean_steps": float(r.steps.mean()),
            "seconds": round(r.seconds, 3),
        }
        if name != "baseline":
            row["premature_cut_rate"] = float(np.mean(r.kept < true_len))
            row["mean_kept_over_true"] = float(np.mean(r.kept / true_len))
        out[name] = row
    return out


def table(gen_length: int, m: dict[str, dict[str, float]], labels: dict[str, str]) -> str:
    lines = [
        f"gen_length {gen_length}",
        "| mode | exact match | = baseline | premature cuts | kept / true | mean steps | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in m.items():
        pre = f"{100 * row['premature_cut_rate']:.1f} %" if "premature_cut_rate" in row else "-"
        ratio = f"{row['mean_kept_over_true']:.2f}x" if "mean_kept_over_true" in row else "-"
        lines.append(
            f"| {labels.get(name, name)} | {100 * row['exact_match']:.1f} % | {100 * row['match_baseline']:.1f} % "
            f"| {pre} | {ratio} | {row['mean_steps']:.1f} | {row['seconds']:.1f} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(
        prog="seer-reference",
        description="Run the PyTorch reference of LLaDA-V with and without Seer on held-out fixture prompts "
        "(or one --prompt) and print exact match, premature cuts and kept windows side by side.",
    )
    add_model(ap)
    add_samples(ap, n=16, seed=HELD_OUT_SEED)
    ap.add_argument("--gen-length", type=int, nargs="+", help="answer windows (default: the model's)")
    ap.add_argument("--steps", type=int, help="denoising steps (default: = gen_length)")
    ap.add_argument("--detectors", nargs="+", default=["calibrated", "paper", "end_token_prob"],
                    help="boundary detectors to compare: calibrated, paper, end_token_prob")  # fmt: skip
    ap.add_argument("--batch", type=int, default=50, help="rows per forward")
    ap.add_argument("--prompt", help="one user message instead of the fixture task (use <image> for the image)")
    ap.add_argument("--image", type=Path, help="image file for --prompt")
    add_report(ap)
    add_verbose(ap)
    return ap


def _one_prompt(model, enc, args, gen: GenerationConfig, detectors: dict[str, SeerConfig]) -> None:
    from seer_trt.eval.tasks import Sample

    image = None
    if args.image:
        from PIL import Image

        try:
            image = np.asarray(Image.open(args.image).convert("RGB"))
        except OSError as err:
            raise SeerError(f"cannot read image {args.image}: {err}") from None
        if "<image>" not in args.prompt:
            args.prompt = "<image>\n" + args.prompt
    sample = Sample("prompt", args.prompt, (), image)
    results = run_modes(model, enc, [sample], gen, detectors)
    for name, r in results.items():
        text = enc.tokenizer.decode(r.answers[0], skip_special_tokens=True)
        print(f"{name:>15}: L* {int(r.kept[0]):4d}  steps {int(r.steps[0]):4d}  {text!r}")


PROG = "seer-reference"


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, build_parser(), work, argv)


def work(args: argparse.Namespace) -> int:
    require_extra("seer-reference")
    import torch

    from seer_export.models.registry import load
    from seer_export.reference.fixture import TaskEncoder
    from seer_trt.eval.tasks import make_samples

    torch.manual_seed(0)
    model, folder = load(args.model, args.checkpoint)
    model.eval()
    enc = TaskEncoder(folder, model.config)
    detectors = detectors_for(model.config.seer, args.detectors)
    lengths = args.gen_length or [model.config.generation.gen_length]
    report: dict = {"model": args.model, "task_family": enc.family, "n": args.n, "seed": args.seed, "detectors": {}}
    for name, seer in detectors.items():
        report["detectors"][name] = seer.to_dict()
        print(f"detector {name}: {seer.describe()} [{seer.label}]")
    for n in lengths:
        gen = GenerationConfig(gen_length=n, steps=args.steps or n, block_length=n)
        if args.prompt:
            _one_prompt(model, enc, args, gen, detectors)
            continue
        vision = model.config.vision
        samples = make_samples(args.seed, args.n, vision.image_size // vision.patch_size, vision.patch_size,
                               enc.family)  # fmt: skip
        truth = [enc.answer_ids(s)[:-1] for s in samples]
        too_long = sum(len(t) + 1 > n for t in truth)
        if too_long:
            print(f"note: {too_long} of {len(samples)} answers are longer than gen_length {n}", file=sys.stderr)
        results = run_modes(model, enc, samples, gen, detectors, args.batch,
                            progress=lambda i, k: print(f"  {i}/{k}", file=sys.stderr, end="\r"))  # fmt: skip
        m = metrics(results, truth)
        report[str(n)] = m
        labels = {"baseline": "baseline (padded)", **{k: f"Seer, {k}: {s.name}" for k, s in detectors.items()}}
        print(table(n, m, labels))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
