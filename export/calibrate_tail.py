"""``seer-calibrate``'s accuracy stage: Seer's cut judged by exact match against the uncut loop, and the end tail
chosen from it (docs/DESIGN.md "Seer, exactly", "The end tail").

In:  the PyTorch model, held-out samples of the choosing and report splits per window N, the detector, the end
     tails to judge (shares of the cut-away positions kept as committed end tokens) and the decoding rules.
Out: per split, rule and N: the uncut loop's exact match and, per tail, the answers the cut lost and gained and
     McNemar's exact p (``seer_trt.eval.paired``); the smallest tail that keeps the uncut loop's accuracy on every
     rule and N of the choosing split (or the largest, said so); tables; the choice written into config.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
from pathlib import Path

import numpy as np

from seer_trt.contracts.config import SeerConfig
from seer_trt.eval.report import write_json


def cut_accuracy(
    model, enc, samples, n: int, seer: SeerConfig, tails: list[float], rule: str, batch: int = 50
) -> dict[str, dict]:
    """Exact match of the uncut loop and of Seer's cut with each end tail of ``tails`` on ``samples`` (PyTorch
    reference, greedy, steps = N over one block, LLaDA-V's early stop unless ``rule`` is fixed): {"uncut": {"exact":
    rate}, "tail T": paired statistics against the uncut loop}."""
    from seer_export.reference.sampler import generate
    from seer_export.reference.seer import seer_generate
    from seer_trt.eval.paired import paired
    from seer_trt.runtime.decoding import Rule

    base, fixed = model.config.generation, Rule.parse(rule).fixed
    gen = dataclasses.replace(base, gen_length=n, steps=n, block_length=n, decoding=rule,
                              remasking=base.remasking if fixed else "low_confidence")  # fmt: skip
    early = not fixed
    special = enc.special
    truth = [enc.answer_ids(s)[:-1] for s in samples]
    hits: dict[str, list[bool]] = {"uncut": [], **{f"tail {t:g}": [] for t in tails}}

    def score(key: str, tokens: np.ndarray, first: int) -> None:
        for row, want in zip(tokens.tolist(), truth[first : first + len(tokens)], strict=True):
            answer = row[: row.index(special.eot_id)] if special.eot_id in row else None
            hits[key].append(answer == want)

    for first in range(0, len(samples), batch):
        prefix, valid = enc.prefix(model, samples[first : first + batch])
        score("uncut", generate(model, prefix, valid, gen, special, early_stop=early).tokens, first)
        for t in tails:
            out, _ = seer_generate(model, prefix, valid, gen, special, seer.replace(tail=t), early_stop=early)
            score(f"tail {t:g}", out.tokens, first)
    out = {"uncut": {"exact": float(np.mean(hits["uncut"]))}}
    out.update({k: paired(hits["uncut"], v).to_dict() for k, v in hits.items() if k != "uncut"})
    return out


def choose_tail(results: dict, tails: list[float], max_loss: float) -> tuple[float, bool]:
    """The smallest tail whose cut loses at most ``max_loss`` points with McNemar's p > 0.1 in every one of
    ``results`` (each a ``cut_accuracy``: one rule at one N), and True; else the largest tail and False."""
    for t in sorted(tails):
        rows = [r[f"tail {t:g}"] for r in results.values()]
        if all(row["points"] >= -max_loss and row["p"] > 0.1 for row in rows):
            return t, True
    return max(tails), False


def accuracy_table(results: dict[int, dict[str, dict]], rule: str, split: str) -> str:
    lines = [f"Exact match with and without the cut ({split} split, {rule}): lost / gained against the uncut loop",
             "| N | uncut | end tail | with the cut | lost / gained | McNemar p |", "|---|---|---|---|---|---|"]  # fmt: skip
    for n, r in results.items():
        for key, row in r.items():
            if key != "uncut":
                lines.append(f"| {n} | {100 * r['uncut']['exact']:.1f} % | {key[5:]} | {100 * row['exact_b']:.1f} % "
                             f"| {row['only_a']} / {row['only_b']} | {row['p']:.3g} |")  # fmt: skip
    return "\n".join(lines)


def judge_accuracy(
    model, enc, drawn: dict[str, dict[int, list]], seer: SeerConfig, args: argparse.Namespace, summary: dict
) -> tuple[SeerConfig, bool]:
    """The detector ``seer`` with the end tail its accuracy on the choosing split asks for (``choose_tail``); the
    figures of both splits into ``summary`` and printed."""
    import torch

    from seer_export.models.families import FAMILIES as MODEL_FAMILIES

    # the tail holds what the uncut loop commits past the answer: <|eot_id|> where <|endoftext|> is banned at masks
    seer = seer.replace(tail_token="eot" if MODEL_FAMILIES[model.config.family].suppress_special else "endoftext")
    judged: dict[str, dict[str, dict[int, dict]]] = {}  # split -> rule -> N -> figures
    with torch.no_grad():
        for name in ("choose", "report"):
            judged[name] = {rule: {} for rule in args.accuracy_rule}
            for rule, n in itertools.product(args.accuracy_rule, drawn[name]):
                samples = drawn[name][n]
                print(f"decoding {len(samples)} {name} samples uncut and cut, {rule}, N = {n}", file=sys.stderr)
                judged[name][rule][n] = cut_accuracy(model, enc, samples, n, seer, args.tails, rule, args.batch)
            if name == "choose":
                every = {(rule, n): r for rule, by_n in judged[name].items() for n, r in by_n.items()}
                tail, accurate = choose_tail(every, args.tails, args.max_loss)
            for rule, by_n in judged[name].items():
                print(accuracy_table(by_n, rule, name))
    summary["accuracy"] = {"rules": args.accuracy_rule, "max_loss_points": args.max_loss, "tail": tail,
                           "meets_accuracy_bar": accurate,
                           **{name: {rule: {str(n): r for n, r in by_n.items()} for rule, by_n in v.items()}
                              for name, v in judged.items()}}  # fmt: skip
    return seer.replace(tail=tail), accurate


def draw_splits(enc, seeds: dict[str, int], n: int, grid: int, cell_px: int) -> dict[str, list]:
    """``n`` samples per split (fit, choose, report): held-out task samples of each split's seed, or for easy-vqa
    disjoint random parts of its train split (``seer_trt.eval.easy_vqa``: the test split is never used to choose)."""
    from seer_trt.eval import easy_vqa
    from seer_trt.eval.tasks import make_samples

    if enc.family == easy_vqa.DATASET:
        return dict(zip(seeds, easy_vqa.disjoint_parts("train", n, len(seeds)), strict=True))
    return {name: make_samples(seed, n, grid, cell_px, enc.family) for name, seed in seeds.items()}


def write_seer(folder: Path, seer: SeerConfig) -> None:
    config_path = folder / "config.json"
    data = json.loads(config_path.read_text())
    data["seer"] = seer.to_dict()
    write_json(config_path, data)
    print(f"wrote the chosen calibration into {config_path}")


def judge_tail_only(model, enc, folder: Path, grid: int, cell_px: int, args: argparse.Namespace,
                    seeds: dict[str, int]) -> int:  # fmt: skip
    """``--tail-only``: the model's own detector kept; only its end tail judged and chosen (``judge_accuracy``) on
    the splits drawn from ``seeds`` ("choose", "report")."""
    parts = draw_splits(enc, seeds, args.n, grid, cell_px)
    drawn = {name: {n: [s for s in parts[name] if len(enc.answer_ids(s)) < n] for n in args.gen_length}
             for name in ("choose", "report")}  # fmt: skip
    summary = {"model": args.model, "task_family": enc.family, "detector": model.config.seer.describe()}
    seer, accurate = judge_accuracy(model, enc, drawn, model.config.seer, args, summary)
    summary["chosen"], summary["chosen_name"] = seer.to_dict(), seer.describe()
    print(
        f"\nchosen: {seer.describe()} ("
        + ("its cut keeps the uncut loop's accuracy)" if accurate else "NO end tail keeps the uncut loop's accuracy)")
    )
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "tail.json", summary)
    print(f"wrote {args.out / 'tail.json'}")
    if args.write:
        write_seer(folder, seer)
    return 0
