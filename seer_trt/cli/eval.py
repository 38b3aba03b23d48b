"""``seer-eval``: accuracy of every mode, or fidelity of every cache policy, on held-out fixture prompts or a public
dataset's questions (``--dataset easy-vqa``) (``seer_trt.eval.accuracy`` does the work; docs/DESIGN.md "Measuring")."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from seer_trt.cli.common import (
    Parser,
    add_engines,
    add_report,
    add_samples,
    add_threads,
    add_verbose,
    check_output,
    command_line,
    require_extra,
    run_main,
)
from seer_trt.contracts.errors import ConfigError
from seer_trt.contracts.policies import CACHE_MODES
from seer_trt.eval.easy_vqa import DATASET
from seer_trt.eval.tasks import HELD_OUT_SEED

PROG = "seer-eval"


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(
        prog=PROG,
        description="Accuracy of the padded loop, LLaDA-V's early-stopping loop, Seer and the oracle (window cut at "
        "the true length) on held-out prompts of the fixture task, through an export of tiny-llada-v.",
    )
    add_engines(ap, "export folder (seer-export --model tiny-llada-v); not with --merge", required=False)
    add_samples(ap, n=200, seed=HELD_OUT_SEED)
    g = ap.add_argument_group("public dataset (instead of the fixture's held-out prompts)")
    g.add_argument("--dataset", choices=[DATASET],
                   help=f"score a public dataset's questions (exact match against its answers) instead of held-out "
                   f"fixture prompts; {DATASET} needs the evaluation extra (pip install 'seer-trt[eval]') and an "
                   "export of tiny-llada-v-vqa")  # fmt: skip
    g.add_argument("--split", choices=["train", "test"], default="test", help="--dataset's split (default test)")
    g.add_argument("--limit", type=int, metavar="N",
                   help="--dataset: the first N questions in the dataset's order (default: the whole split)")  # fmt: skip
    ap.add_argument("--gen-length", type=int, help="answer window N (default: the export's)")
    add_threads(ap)
    ap.add_argument("--end-tail", type=float, metavar="SHARE",
                    help="Seer's end tail instead of the export's: the share (0-1) of the cut-away positions kept as "
                    "committed end tokens after the window, attended and never denoised (0: the paper's cut; 1: the "
                    "whole window stays context); it also applies to the oracle's cut")  # fmt: skip
    g = ap.add_argument_group("prompt K/V cache fidelity")
    g.add_argument("--cache", help=f"prompt K/V cache policies to measure against the exact loop, comma-separated "
                   f"({', '.join(CACHE_MODES[1:])}): Seer under each instead of the modes table")  # fmt: skip
    g.add_argument("--refresh-interval", default="2,4,8",
                   help="refresh intervals R of --cache, comma-separated (default 2,4,8)")  # fmt: skip
    g.add_argument("--forecast-order", type=int, default=1, help="Lagrange order of the forecast policy (1 or 2)")
    g.add_argument("--drift-gate", type=float,
                   help="--cache: also each policy with this drift gate (relative K/V error that brings a refresh "
                   "forward)")  # fmt: skip
    g = ap.add_argument_group("decoding strategies")
    g.add_argument("--decoding", metavar="RULES",
                   help="decoding rules to measure, comma-separated (e.g. threshold:0.9,factor:1; fixed is always "
                   "included): each under LLaDA-V's early stop, Seer, Seer + early stop and that with the prompt "
                   "cache, and the prompt cache with and without Seer (the default request), beside the exact fixed "
                   "loop, instead of the modes table")  # fmt: skip
    g.add_argument("--settings", metavar="SETTINGS",
                   help="--decoding: only these settings, comma-separated (padded, early_stop, early_stop_reuse, "
                   "seer, seer_early_stop, seer_early_stop_reuse, reuse, seer_reuse; default all), and only the rules "
                   "named (fixed is then not added; the exact loop is fixed under padded)")  # fmt: skip
    g = ap.add_argument_group("a long run in slices (the modes table)")
    g.add_argument("--shard", metavar="I/N",
                   help="only the I-th of N contiguous slices of the prompts (from 0: 0/4 is the first quarter); the "
                   "--json report keeps every answer, so slices run in parallel processes (one --threads 1 each) or "
                   "one after another and --merge makes the whole table")  # fmt: skip
    g.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                   help="the --json reports of --shard runs: print and write (--json) the table of every answer they "
                   "kept, as one run over those prompts would (no --engines: nothing runs); slices missing are named "
                   "and the table says how many prompts it covers")  # fmt: skip
    add_report(ap, plot="write a PNG here: L* minus true length, exact match per mode")
    add_verbose(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, build_parser(), lambda args: work(args, command_line(PROG, argv)), argv)


def work(args: argparse.Namespace, command: str) -> int:
    from seer_trt.eval import cache_fidelity
    from seer_trt.eval.accuracy import MODES, cache_policies, describe, evaluate, evaluate_cache
    from seer_trt.eval.report import write_json

    if args.merge:
        return merge(args, command)
    if args.engines is None:
        raise ConfigError("--engines is required (an export folder: seer-export --model tiny-llada-v)")
    if args.n < 1:
        raise ConfigError(f"--n must be >= 1, got {args.n}")
    if args.limit is not None and not args.dataset:
        raise ConfigError(f"--limit {args.limit} counts a dataset's questions; pass --dataset {DATASET} (or --n)")
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {args.limit} (leave it out for the whole split)")
    if args.settings and not args.decoding:
        raise ConfigError(f"--settings {args.settings} picks --decoding's settings; pass --decoding RULES too")
    n = args.limit if args.dataset else args.n  # a dataset's default: its whole split
    what = f"{args.dataset} {args.split} split" if args.dataset else f"{args.n} held-out prompts"
    if args.plot:  # before the work, not after it
        require_extra("seer-eval --plot", ("matplotlib",))
        if args.plot.is_dir():
            raise ConfigError(f"--plot {args.plot} is a folder; name a file (for example {args.plot / 'eval.png'})")
    check_output(args.json, "--json", example="eval.json")
    t0 = time.time()

    def progress(text: str) -> None:
        print(f"[{time.time() - t0:6.1f}s] seer-eval {text}", file=sys.stderr, flush=True)

    if args.cache and args.decoding:
        raise ConfigError("--cache and --decoding are two different tables; pass one")
    if args.shard and (args.cache or args.decoding or args.plot):
        raise ConfigError("--shard slices the modes table; leave out --cache, --decoding and --plot (plot the merge)")
    shard = None
    if args.shard:
        from seer_trt.eval import shards

        shard = shards.parse(args.shard)
        what += f", slice {shard[0]} of {shard[1]}"
    if args.decoding:
        from seer_trt.contracts.config import canonical_decoding
        from seer_trt.eval.accuracy import decoding_table, evaluate_decoding

        named = [canonical_decoding(r) for r in args.decoding.split(",") if r.strip()]
        settings = [s.strip() for s in args.settings.split(",") if s.strip()] if args.settings else None
        rules = list(dict.fromkeys(named if settings else ["fixed"] + named))
        from seer_trt.eval.accuracy import DECODING_SETTINGS, UNCUT

        progress(f"{what} x {len(rules)} rules x {len(settings or DECODING_SETTINGS)} settings "
                 f"({len(UNCUT)} with Seer's cut among all)")  # fmt: skip
        report = evaluate_decoding(args.engines, rules, n, args.seed, args.gen_length, progress, args.threads,
                                   args.end_tail, args.dataset, args.split, settings)  # fmt: skip
        report["command"] = command
        print(decoding_table(report["rows"], report["n"], report["gen_length"], report["detector"],
                             describe(report["n"], args.dataset, args.split)))  # fmt: skip
        print_baseline(report)
        best = report["fastest_within_0.5_points"]
        if best:
            print(f"\nfastest within 0.5 exact-match points of the exact loop: {best['decoding']} / {best['setting']}")
        if args.json:
            write_json(args.json, report)
        return 0
    if args.cache:
        configs = cache_policies(args.cache, args.refresh_interval, args.forecast_order, args.drift_gate)
        progress(f"{what} x {len(configs) + 1} cache policies (the exact loop first)")
        report = evaluate_cache(args.engines, configs, n, args.seed, args.gen_length, progress, args.dataset,
                                args.split, args.threads)  # fmt: skip
        report["command"] = command
        print(cache_fidelity.table(report, report["n"], report["gen_length"], report["detector"],
                                   describe(report["n"], args.dataset, args.split)))  # fmt: skip
        if args.json:
            write_json(args.json, report)
        return 0
    progress(f"{what} x {len(MODES)} modes ({', '.join(MODES)})")
    report = evaluate(args.engines, n, args.seed, args.gen_length, progress=progress, tail=args.end_tail,
                      dataset=args.dataset, split=args.split, shard=shard, threads=args.threads)  # fmt: skip
    report["command"] = command
    title = describe(report["n"], args.dataset, args.split)
    if shard:
        s = report["shard"]
        title += (
            f" (slice {s['index']} of {s['count']}: questions {s['first']}-{s['first'] + s['n'] - 1} of {s['total']})"
        )
    return report_modes(args, report, title)


def merge(args: argparse.Namespace, command: str) -> int:
    """``--merge``: the slices' table, printed and written."""
    from seer_trt.eval.accuracy import describe
    from seer_trt.eval.accuracy import merge as merge_slices

    if args.engines or args.shard or args.cache or args.decoding:
        raise ConfigError("--merge reads the slices' reports and runs nothing; leave out --engines, --shard, --cache "
                          "and --decoding")  # fmt: skip
    check_output(args.json, "--json", example="eval.json")
    if args.plot:
        require_extra("seer-eval --plot", ("matplotlib",))
    report = merge_slices(args.merge)
    report["command"] = command
    s = report["shards"]
    title = describe(report["n"], report["dataset"], report["split"] or "")
    if not s["complete"]:
        title += (f" -- PARTIAL: slices {s['merged']} of {s['count']} ({report['n']} of {s['total']} prompts; "
                  f"missing {s['missing']})")  # fmt: skip
    return report_modes(args, report, title)


def report_modes(args: argparse.Namespace, report: dict, title: str) -> int:
    """The modes table under ``title``, printed; the report written (``--json``) and plotted (``--plot``)."""
    from seer_trt.eval.accuracy import plot, table
    from seer_trt.eval.report import write_json

    print(table(report["modes"], report["n"], report["gen_length"], report["detector"], title))
    print_baseline(report)
    if args.json:
        write_json(args.json, report)
    if args.plot:
        plot(report["modes"], args.plot, report["gen_length"], report["detector"])
    return 0


def print_baseline(report: dict) -> None:
    """A dataset's majority-answer baseline, under its table."""
    base = report.get("majority_baseline")
    if base:
        print(f"\nmajority-answer baseline (the train split's most frequent answer, {base['answer']!r}, to every "
              f"question): {100 * base['exact_match']:.1f} %")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
