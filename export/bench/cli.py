"""``seer-bench``: the fixture scenarios (``seer_export.bench.fixture``) or the prompt K/V cache at LLaDA-V's token
counts (``seer_export.bench.cache``), with the C++ runtime beside (``seer_export.bench.cpp``); docs/DESIGN.md
"Measuring"."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from seer_trt.cli.common import (
    Parser,
    add_engines,
    add_report,
    add_threads,
    add_verbose,
    command_line,
    require_extra,
    run_main,
)
from seer_trt.contracts.errors import ConfigError
from seer_trt.contracts.policies import DEFAULT_CACHE
from seer_trt.eval.tasks import HELD_OUT_SEED

PROG = "seer-bench"


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(
        prog=PROG,
        description="Side-by-side speed of Seer vs the padded loop vs LLaDA-V's early-stopping loop vs the oracle, "
        "dispatch policies on two batches, and ONNX Runtime vs PyTorch eager, on an export of the fixture model "
        "(ratios of medians over interleaved rounds, measured in one run).",
    )
    ap.add_argument("--workload", default="fixture",
                    choices=("fixture", "llada-v-shaped", "lavida-shaped", "mmada-shaped", "serving", "triton"),
                    help="fixture: the scenarios above on an export of the fixture (default); llada-v-shaped: the prompt "
                    "K/V cache at LLaDA-V's token counts on a random-weight model (seer_export.bench.cache); "
                    "lavida-shaped / mmada-shaped: the same at LaViDa-LLaDA's (1008 and 616 image features) or "
                    "MMaDA's (1027) counts, in that model's own loop; serving: "
                    "seer-serve on loopback at 1, 4 and 16 clients: its defaults vs the same server without the prompt "
                    "cache, vs one request at a time, vs SeerPipeline.generate of every request at once, and its "
                    "overhead over SeerPipeline.generate (seer_export.bench.serving; --shape; needs the 'serve' "
                    "extra); triton: Triton's one-engine model (seer-triton --flavour cpu) against seer-serve at 1, 4 "
                    "and 16 clients and on one long request, in rotating rounds (seer_export.bench.triton; needs the "
                    "'triton' and 'serve' extras and the tritonserver install of python -m seer_trt.serving.triton.local setup)")  # fmt: skip
    add_engines(ap, "export folder (seer-export); llada-v-shaped: its random model's export, written there when the "
                "folder is new")  # fmt: skip
    ap.add_argument("--checkpoint", type=Path, help="PyTorch checkpoint for the eager comparison (default: registry)")
    ap.add_argument("--quick", action="store_true", help="fewer lengths, prompts and rounds: about two minutes")
    # one thread by default, unlike the serving commands: rounds compare best when neither side has a pool to spin
    add_threads(ap, default=1, help="intra-op threads of both backends, ONNX Runtime and PyTorch")
    ap.add_argument(
        "--seed", type=int, default=HELD_OUT_SEED, help=f"seed of the held-out prompts (default {HELD_OUT_SEED})"
    )
    ap.add_argument("--cpp", type=Path, metavar="LIBSEER",
                    help="also time the C++ runtime (cpp/build/libseer.so) against the Python one, per request")  # fmt: skip
    ap.add_argument("--refresh-interval", type=int, default=DEFAULT_CACHE.refresh,
                    help=f"llada-v-shaped: R of the cached modes (default: the pipeline's, {DEFAULT_CACHE.refresh})")  # fmt: skip
    ap.add_argument("--shape", choices=("fixture", "llada-v"), default="fixture",
                    help="serving: the export served, the fixture's (default; held-out prompts with images) or the "
                    "random LLaDA-V-shaped model of --workload llada-v-shaped (prompts of 729 stand-in image tokens "
                    "and the question; written to --engines when that folder is new)")  # fmt: skip
    ap.add_argument("--decoding", metavar="RULE",
                    help="parallel rule of the parallel-decoding scenario, threshold:TAU or factor:F (default: the "
                    "export's default rule, factor:1 when that is fixed)")  # fmt: skip
    add_report(ap, json="write the report here",
               plot="write a PNG here: speedups vs gen_length, throughput per policy")  # fmt: skip
    add_verbose(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, build_parser(), lambda args: work(args, command_line(PROG, argv)), argv)


def work(args: argparse.Namespace, command: str) -> int:
    require_extra(PROG)
    t0 = time.time()

    def progress(text: str) -> None:
        print(f"[{time.time() - t0:6.1f}s] {text}", file=sys.stderr, flush=True)

    if args.shape != "fixture" and args.workload != "serving":
        raise ConfigError(f"--shape {args.shape} applies to --workload serving; the shaped cache workloads are "
                          f"--workload llada-v-shaped, lavida-shaped or mmada-shaped")  # fmt: skip
    if args.workload in ("llada-v-shaped", "lavida-shaped", "mmada-shaped"):
        from seer_export.bench import cache

        return cache.run(args, command, progress)
    if args.workload == "serving":
        require_extra(PROG, ("fastapi", "uvicorn", "httpx"), "serve")
        from seer_export.bench import serving
        from seer_trt.eval.report import write_json

        settings = serving.Settings.quick(args.shape) if args.quick else serving.Settings(shape=args.shape)
        report = serving.bench(args.engines, settings, args.seed, progress, command, args.threads)
        print(serving.table(report))
        if args.json:
            write_json(args.json, report)
        return 0
    if args.workload == "triton":
        require_extra(PROG, ("tritonclient",), "triton")
        require_extra(PROG, ("fastapi", "uvicorn"), "serve")
        from seer_export.bench import triton
        from seer_trt.eval.report import write_json

        settings = triton.Settings.quick() if args.quick else triton.Settings()
        report = triton.bench(args.engines, settings, args.seed, progress, command, args.threads)
        print(triton.table(report))
        if args.json:
            write_json(args.json, report)
        return 0
    from seer_export.bench.fixture import Settings, bench, plot, tables
    from seer_trt.contracts.config import canonical_decoding
    from seer_trt.contracts.manifest import Manifest
    from seer_trt.eval.report import write_json
    from seer_trt.runtime.decoding import Rule

    rule = args.decoding or Manifest.read(args.engines).generation.decoding
    if Rule.parse(rule).fixed and not args.decoding:  # the export's fixed default: the scenario's factor:1
        rule = "factor:1"
    rule = canonical_decoding(rule)
    if Rule.parse(rule).fixed:
        raise ConfigError("--decoding fixed: the parallel-decoding scenario needs a parallel rule (threshold:TAU, "
                          "factor:F); the fixed loop is its baseline already")  # fmt: skip
    quick = Settings.quick(args.threads, rule) if args.quick else None
    settings = quick or Settings(threads=args.threads, decoding=rule)
    report = bench(args.engines, args.checkpoint, settings, args.seed, progress, command, args.cpp)
    print(tables(report))
    if "cpp" in report:
        from seer_export.bench.cpp import table

        print("\n" + table(report["cpp"]))
    if args.json:
        write_json(args.json, report)
    if args.plot:
        plot(report, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
