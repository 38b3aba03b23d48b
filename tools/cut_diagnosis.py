"""Why does a cut window change answers the full window gets right? Paired factors on the PyTorch reference (issue 35).

    python tools/cut_diagnosis.py --model tiny-llada-v-hard --n 300 --seed 35 --gen-length 64 128 \
        --json docs/cut/hard.json

Every variant runs the same held-out prompts as the uncut loop of its decoding rule; each row reports exact match,
the discordant pairs against that uncut loop (answers lost, answers gained) and McNemar's exact p
(``seer_trt.eval.paired``). The factors:

- ``oracle``: the window cut at the true length + 1 (answer and its ``<|eot_id|>``): the cut itself.
- ``oracle+m``: the oracle's cut with m more positions (the margin).
- ``oracle budget N``: the oracle's cut, its kept positions spread over the full window's step budget (``fixed``
  only; with steps = N and one block the rescaled budget is already one token a step, so this differs only when a
  step commits more than one token).
- ``oracle tail T eot``: T positions after the cut held as ``<|eot_id|>`` from the start, attended by every step,
  never committed: the end-token context the full window shows after the answer once its padding is committed.
  ``endoftext`` holds the padding token instead (loops that ban nothing pad with ``<|endoftext|>``: Dream).
- ``oracle tail rest mask``: the whole rest of the window kept as masks, attended, never committed (the full
  window's compute with the oracle's eligibility).
- ``seer`` / ``seer tail rest``: the model's calibrated detector instead of the oracle (a full-depth detector's
  step-zero logits serve as step 0, as in the runtime).
- ``context``: for the uncut ``fixed`` loop, the share of positions past the answer already committed (and as
  ``<|eot_id|>``) when the answer's first content token commits.

The decoding rules: ``fixed`` (the exact loop: steps = N, one block) and the default rule ``factor:1`` with
LLaDA-V's early stop. Runs on the CPU; a few minutes per model and length at n = 300.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

from seer_export.models.families import FAMILIES
from seer_export.models.registry import load
from seer_export.reference.fixture import TaskEncoder
from seer_export.reference.run import answer_of
from seer_export.reference.sampler import generate
from seer_export.reference.seer import step_zero
from seer_trt.contracts.config import GenerationConfig
from seer_trt.eval.paired import paired
from seer_trt.eval.tasks import make_samples
from seer_trt.runtime.boundary import detect
from seer_trt.runtime.decoding import Rule

RULES = {"fixed": ("fixed", False), "factor:1": ("factor:1", True)}  # rule -> (decoding, LLaDA-V's early stop)


def variants(rule: str, tails: list[int], family_pad: str) -> list[dict]:
    """The factor grid of one rule: label, cut source (None: no cut), extra margin, tail, tail token, budget."""
    out = [dict(label="full", cut=None), dict(label="oracle", cut="oracle")]
    out += [dict(label=f"oracle+{m}", cut="oracle", margin=m) for m in (1, 3)]
    if Rule.parse(rule).fixed:
        out += [dict(label="oracle budget N/2", cut="oracle", steps="half")]
    out += [dict(label=f"oracle tail {t} {family_pad}", cut="oracle", tail=t, token=family_pad) for t in tails]
    out += [dict(label="oracle tail rest mask", cut="oracle", tail=REST, token="mask")]
    out += [dict(label=f"oracle tail rest {family_pad}", cut="oracle", tail=REST, token=family_pad)]
    out += [dict(label="seer", cut="seer")]
    out += [dict(label=f"seer tail rest {family_pad}", cut="seer", tail=REST, token=family_pad)]
    return out


REST = 10**6  # a tail to the end of the window (capped at N)


def context_at_answer(model, prefix, valid, gen, special, truth_len: np.ndarray) -> dict[str, float]:
    """Uncut fixed loop, one token a step: when each row commits its first answer position, the share of its
    positions past the answer (true length on) already committed, and committed as ``<|eot_id|>``."""
    n = gen.gen_length
    from seer_export.models.mllm import window_layout

    b = prefix.shape[0]
    kept = torch.full((b,), n)
    seg, pos = window_layout(valid, kept, n)
    x = torch.full((b, n), special.mask_id)
    positions = torch.arange(n)[None]
    first = torch.full((b,), -1.0)
    eot_share = torch.full((b,), -1.0)
    after = positions >= torch.as_tensor(truth_len)[:, None]  # past the answer's <|eot_id|>
    for _ in range(n):
        masked = x == special.mask_id
        if not masked.any():
            break
        logits = model(prefix, x, seg, pos).float()
        for tid in special.suppressed_ids:
            logits[..., tid] = torch.where(masked, torch.tensor(float("-inf")), logits[..., tid])
        p = torch.softmax(logits.double(), -1)
        conf, x0 = p.max(-1)
        conf = torch.where(masked, conf, torch.tensor(-1.0, dtype=conf.dtype))
        j = conf.argmax(1)
        x[torch.arange(b), j] = x0[torch.arange(b), j]
        is_answer = j < torch.as_tensor(truth_len - 1)
        new = is_answer & (first < 0)
        done = (~(x == special.mask_id) & after).sum(1).float() / after.sum(1).clamp(min=1)
        eots = ((x == special.eot_id) & after).sum(1).float() / after.sum(1).clamp(min=1)
        first = torch.where(new, done, first)
        eot_share = torch.where(new, eots, eot_share)
    return {
        "committed_past_answer": float(first[first >= 0].mean()),
        "eot_past_answer": float(eot_share[eot_share >= 0].mean()),
    }


def run(model, enc, samples, n: int, rule: str, tails: list[int], batch: int, only: str = ".") -> dict:
    decoding, early = RULES[rule]
    gen = GenerationConfig(gen_length=n, steps=n, block_length=n, decoding=decoding)
    special = enc.special
    drop = (special.endoftext_id, special.mask_id)
    # what the uncut loop commits past the answer: <|eot_id|> where <|endoftext|> is banned at masks (LLaDA-V's loop)
    pad = "eot" if FAMILIES[model.config.family].suppress_special else "endoftext"
    grid = [v for v in variants(rule, tails, pad) if v["label"] == "full" or re.search(only, v["label"])]
    truth = [enc.answer_ids(s)[:-1] for s in samples]
    hits = {v["label"]: [] for v in grid}
    kept_all = {v["label"]: [] for v in grid}
    steps_all = {v["label"]: [] for v in grid}
    seer = model.config.seer
    context = []
    for start in range(0, len(samples), batch):
        chunk = samples[start : start + batch]
        t_len = np.array([min(len(t) + 1, n) for t in truth[start : start + batch]])
        prefix, valid = enc.prefix(model, chunk)
        layers = () if seer.full_depth else (seer.probe_layer,)
        zero = step_zero(model, prefix, valid, n, special, layers, seer.tau_abs, full_depth=seer.full_depth,
                         residual=seer.signal == "probe")  # fmt: skip
        seer_cut = detect(zero.profile(seer), seer)
        if Rule.parse(rule).fixed and start == 0:
            context.append(context_at_answer(model, prefix, valid, gen, special, t_len))
        for v in grid:
            cut = v.get("cut")
            kept = None if cut is None else np.minimum(n, (t_len if cut == "oracle" else seer_cut) + v.get("margin", 0))
            steps = None
            if v.get("steps") == "half":
                steps = np.maximum(1, (kept + 1) // 2)
            out = generate(model, prefix, valid, gen, special, kept=kept, early_stop=early,
                           tail=v.get("tail", 0), tail_token=v.get("token", "eot"), steps_kept=steps,
                           step0_logits=zero.logits if cut == "seer" else None)  # fmt: skip
            answers = [answer_of(r, special.eot_id, drop) for r in out.tokens]
            hits[v["label"]] += [a == t for a, t in zip(answers, truth[start : start + batch], strict=True)]
            kept_all[v["label"]] += out.kept.tolist()
            steps_all[v["label"]] += out.steps.tolist()
        print(f"  {rule} N={n}: {min(start + batch, len(samples))}/{len(samples)}", file=sys.stderr)
    rows = []
    for v in grid:
        label = v["label"]
        ref = hits["full"] if "budget" not in label else hits["oracle"]
        rows.append({"variant": label, "against": "full" if "budget" not in label else "oracle",
                     **paired(ref, hits[label]).to_dict(), "mean_kept": float(np.mean(kept_all[label])),
                     "mean_steps": float(np.mean(steps_all[label]))})  # fmt: skip
    tasks = sorted({s.task for s in samples})
    per_task = {
        label: {t: int(sum(h for h, s in zip(hits[label], samples, strict=True) if s.task == t)) for t in tasks}
        for label in hits
    }
    per_task["n"] = {t: sum(1 for s in samples if s.task == t) for t in tasks}
    return {"rule": rule, "gen_length": n, "rows": rows, "per_task": per_task, "context": context}


def table(report: dict) -> str:
    lines = [f"{report['rule']}, N = {report['gen_length']}",
             "| variant | exact | against | lost | gained | McNemar p | kept | passes |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in report["rows"]:
        lines.append(f"| {r['variant']} | {100 * r['exact_b']:.1f} % | {r['against']} | {r['only_a']} | {r['only_b']} | "
                     f"{r['p']:.3g} | {r['mean_kept']:.1f} | {r['mean_steps']:.1f} |")  # fmt: skip
    if report["context"]:
        lines.append(f"uncut fixed loop, at the answer's first commit: {report['context'][0]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-llada-v-hard")
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=35, help="held-out seed (trainer seeds are >= 1_000_000)")
    ap.add_argument("--gen-length", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--rules", nargs="+", default=list(RULES), choices=list(RULES))
    ap.add_argument("--tails", type=int, nargs="*", default=[8, 32], help="tail lengths of the oracle's cut")
    ap.add_argument("--batch", type=int, default=60)
    ap.add_argument("--only", default=".", help="regular expression: run only the variants it finds (and full)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model, folder = load(args.model, None)
    model.eval()
    enc = TaskEncoder(folder, model.config)
    v = model.config.vision
    grid, cell = (v.image_size // v.patch_size, v.patch_size) if v is not None else (4, 8)
    samples = make_samples(args.seed, args.n, grid, cell, enc.family)
    out = {"command": " ".join(["python", "tools/cut_diagnosis.py", *(argv or sys.argv[1:])]), "model": args.model,
           "seed": args.seed, "n": args.n, "detector": model.config.seer.describe(), "reports": []}  # fmt: skip
    t0 = time.perf_counter()
    with torch.no_grad():
        for n in args.gen_length:
            for rule in args.rules:
                report = run(model, enc, samples, n, rule, args.tails, args.batch, args.only)
                out["reports"].append(report)
                print(table(report), flush=True)
                if args.json:
                    args.json.parent.mkdir(parents=True, exist_ok=True)
                    args.json.write_text(json.dumps(out, indent=1))
    print(f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
