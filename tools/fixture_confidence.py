"""How confident a fixture is, and what that does to parallel decoding: can it rank decoding strategies?

    python tools/fixture_confidence.py --model tiny-llada-v-hard --n 100 --gen-length 128

In:  a registered model (or ``--checkpoint DIR``), held-out prompts of the task family its config.json names
     (``seer_trt.eval.tasks.held_out``; for ``tiny-llada-v-vqa`` the first n questions of easy-vqa's test split), an
     answer window N.
Out: per task and overall, on stdout (and ``--json``):
- exact match and mean forward passes of the one-token-per-step loop (steps = N, greedy, low-confidence remasking,
  LLaDA-V's early stop; ``seer_export.reference.sampler.generate``);
- the first denoising step's top-1 probability at the masked answer positions (the true answer's, before its
  ``<|eot_id|>``): median, 10th and 90th percentiles, share below 0.9 and 0.99;
- how many window positions the runtime's ``factor:1`` rule commits in the first pass (from step zero's top-1
  probabilities), and the share of prompts whose whole answer and its ``<|eot_id|>`` commit there;
- exact match and mean forward passes of a confidence-threshold parallel rule (Fast-dLLM's threshold
  strategy): per step, among the still-masked positions before the first committed ``<|eot_id|>``, commit all
  whose probability is at least ``--threshold``, and at least the most confident one.

An overconfident fixture (top-1 near 1 everywhere) finishes every answer in about one pass under any parallel
rule, and cannot rank them. This is a measuring script, not the runtime's decoding (that is ``seer_trt.runtime``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from seer_export.models.mllm import window_layout
from seer_export.models.registry import load
from seer_export.reference.fixture import TaskEncoder
from seer_export.reference.run import answer_of
from seer_export.reference.sampler import generate, suppress_special
from seer_trt.contracts.config import GenerationConfig
from seer_trt.eval import easy_vqa
from seer_trt.eval.tasks import HELD_OUT_SEED, held_out
from seer_trt.runtime.decoding import commit_factor


@torch.no_grad()
def threshold_decode(model, prefix, valid, n: int, special, tau: float):
    """Parallel decoding by confidence threshold. Returns answer ids [B, N], passes [B], step-0 top-1 p [B, N]."""
    batch = prefix.shape[0]
    segment_ids, position_ids = window_layout(valid, torch.full((batch,), n), n)
    positions = torch.arange(n)[None]  # [1, N]
    x = torch.full((batch, n), special.mask_id, dtype=torch.long)  # [B, N]
    stop = torch.full((batch,), n)  # [B] first committed <|eot_id|>
    passes = torch.zeros(batch, dtype=torch.long)
    first = None
    for _ in range(n):
        masked = x == special.mask_id
        before = positions < stop[:, None]
        live = (masked & before).any(1)  # [B]
        if not live.any():
            break
        passes += live.long()
        logits = suppress_special(model(prefix, x, segment_ids, position_ids).float(), masked, special)
        conf, x0 = torch.softmax(logits.double(), dim=-1).max(-1)  # [B, N]
        if first is None:
            first = conf.clone()
        eligible = masked & before & live[:, None]
        conf = torch.where(eligible, conf, torch.full_like(conf, -1.0))
        top = torch.zeros_like(eligible).scatter_(1, conf.argmax(1, keepdim=True), True)
        commit = eligible & ((conf >= tau) | top)
        x = torch.where(commit, x0, x)
        stop = torch.where(x == special.eot_id, positions, n).amin(1)
    return x.numpy(), passes.numpy(), first.numpy()


def summary(values: np.ndarray) -> dict[str, float]:
    return {"median": float(np.median(values)), "p10": float(np.percentile(values, 10)),
            "p90": float(np.percentile(values, 90)), "below_0.9": float(np.mean(values < 0.9)),
            "below_0.99": float(np.mean(values < 0.99)), "positions": int(values.size)}  # fmt: skip


def measure(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    model, folder = load(args.model, args.checkpoint)
    model.eval()
    enc = TaskEncoder(folder, model.config)
    v = model.config.vision
    if enc.family == easy_vqa.DATASET:  # the first n questions of its test split, in the dataset's order
        samples = easy_vqa.load("test", args.n)
    else:
        samples = held_out(args.n, args.seed, enc.family, v.image_size // v.patch_size, v.patch_size)
    samples = [s for s in samples if len(enc.answer_ids(s)) <= args.gen_length]
    truth = [enc.answer_ids(s)[:-1] for s in samples]
    special = enc.special
    drop = (special.endoftext_id, special.mask_id)
    gen = GenerationConfig(gen_length=args.gen_length, steps=args.gen_length, block_length=args.gen_length)
    rows = []  # per sample: task, sequential hit, sequential passes, threshold hit, threshold passes, factor:1 at step 0
    first_p: list[np.ndarray] = []  # per sample: step-0 top-1 probability at its answer positions
    with torch.no_grad():
        for start in range(0, len(samples), args.batch):
            chunk = samples[start : start + args.batch]
            prefix, valid = enc.prefix(model, chunk)
            seq = generate(model, prefix, valid, gen, special, early_stop=True)
            par, passes, first = threshold_decode(model, prefix, valid, args.gen_length, special, args.threshold)
            # what the runtime's factor:1 rule commits in the first pass: positions of the window, and the answer
            first_pass = commit_factor(np.log(first), np.ones(first.shape, dtype=bool), 1.0)  # [B, N]
            for i, s in enumerate(chunk):
                t = truth[start + i]
                rows.append((s.task, answer_of(seq.tokens[i], special.eot_id, drop) == t, int(seq.steps[i]),
                             answer_of(par[i], special.eot_id, drop) == t, int(passes[i]),
                             int(first_pass[i].sum()), bool(first_pass[i, : len(t) + 1].all())))  # fmt: skip
                first_p.append(first[i, : len(t)])
            print(f"  {len(rows)}/{len(samples)}", file=sys.stderr, end="\r")

    def block(keep) -> dict:
        sel = [r for r, k in zip(rows, keep, strict=True) if k]
        p = np.concatenate([f for f, k in zip(first_p, keep, strict=True) if k])
        return {"n": len(sel), "sequential_exact": float(np.mean([r[1] for r in sel])),
                "sequential_passes": float(np.mean([r[2] for r in sel])),
                "threshold_exact": float(np.mean([r[3] for r in sel])),
                "threshold_passes": float(np.mean([r[4] for r in sel])), "first_step_top1": summary(p),
                "factor1_first_pass_positions": float(np.mean([r[5] for r in sel])),
                "factor1_first_pass_whole_answer": float(np.mean([r[6] for r in sel]))}  # fmt: skip

    tasks = sorted({r[0] for r in rows})
    out = {"model": args.model, "family": enc.family, "n": len(rows), "seed": args.seed,
           "gen_length": args.gen_length, "threshold": args.threshold, "all": block([True] * len(rows)),
           "by_task": {t: block([r[0] == t for r in rows]) for t in tasks}}  # fmt: skip
    return out


def table(out: dict) -> str:
    lines = [f"{out['model']} ({out['family']} family), {out['n']} held-out prompts (seed {out['seed']}), "
             f"N = {out['gen_length']}, threshold {out['threshold']:g}",
             "| task | n | sequential exact | passes | threshold exact | passes | step-0 top-1 median | p10 | p90 "
             "| < 0.9 | factor:1 pass 1: positions | whole answer + <|eot_id|> |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, b in [("all", out["all"]), *out["by_task"].items()]:
        f = b["first_step_top1"]
        lines.append(f"| {name} | {b['n']} | {100 * b['sequential_exact']:.0f} % | {b['sequential_passes']:.1f} "
                     f"| {100 * b['threshold_exact']:.0f} % | {b['threshold_passes']:.2f} | {f['median']:.3f} "
                     f"| {f['p10']:.3f} | {f['p90']:.3f} | {100 * f['below_0.9']:.0f} % "
                     f"| {b['factor1_first_pass_positions']:.1f} | {100 * b['factor1_first_pass_whole_answer']:.0f} % |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-llada-v-hard")
    ap.add_argument("--checkpoint", type=Path, help="checkpoint folder instead of the registry's")
    ap.add_argument("--n", type=int, default=100, help="held-out prompts")
    ap.add_argument("--seed", type=int, default=HELD_OUT_SEED)
    ap.add_argument("--gen-length", type=int, default=128)
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    out = measure(args)
    print(table(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
