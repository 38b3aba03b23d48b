"""``seer-build``: TensorRT plans for an export folder, one engine per graph with its length profiles (docs/DESIGN.md "Engines and profiles").

In:  ``--engines DIR`` (a ``seer-export`` folder), ``--builder``, ``--graphs``, ``--profiles`` overrides of the
     manifest's buckets, ``--timing-cache FILE``, ``--opt-level``, ``--dry-run``.
Out: the plans and the manifest's build record (``seer_trt.build.engines.run_build``); one progress line per stage, the
     profile plan. Bad input: one line on stderr, exit 2 (``--verbose`` shows the traceback).

Only argparse and ``seer_trt.contracts.errors`` are imported at module level, so ``--help`` starts instantly; TensorRT is
imported only when a build starts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from seer_trt.cli.common import Parser, add_engines, add_verbose, run_main

PROG = "seer-build"


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(
        prog=PROG,
        description="Build TensorRT plans from an export's ONNX graphs: one engine per graph holding one "
        "optimization profile per answer-length bucket (by default), precision as exported (strongly typed). "
        "Plans go to DIR/tensorrt/ (or DIR/tensorrt-rtx/) and the manifest records the TensorRT version, GPU, "
        "profiles and ONNX sha256. Everything is built in a temporary folder and swapped in only when complete.",
    )
    add_engines(ap)
    ap.add_argument("--builder", default="tensorrt", choices=["tensorrt", "tensorrt-rtx"],
                    help="tensorrt (default: needs the GPU the plans will run on) or tensorrt-rtx (builds without a "
                    "GPU; plans run on RTX GPUs only)")  # fmt: skip
    ap.add_argument("--graphs", nargs="+", default=[], metavar="GRAPH",
                    help="graphs to build (default: every graph of the export); plans of others are dropped")  # fmt: skip
    ap.add_argument("--profiles", nargs="+", default=[], metavar="SPEC",
                    help="override the manifest's buckets: AXIS=SIZES (batch, prompt or answer; e.g. answer=16,64,256) "
                    "and split=AXES (axes with one profile per bucket; default answer)")  # fmt: skip
    ap.add_argument("--timing-cache", type=Path, help="timing cache to read and update (default: in the engine folder)")
    ap.add_argument("--opt-level", type=int, help="TensorRT builder optimization level 0-5 (default: TensorRT's, 3)")
    ap.add_argument("--dry-run", action="store_true", help="print the profile plan and build nothing")
    add_verbose(ap, "TensorRT's warnings and tracebacks")
    return ap


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, build_parser(), work, argv, signals=True)


def work(args: argparse.Namespace) -> int:
    from seer_trt.build.engines import BuildOptions, run_build

    options = BuildOptions(
        engines=args.engines,
        builder=args.builder,
        graphs=tuple(args.graphs),
        profiles=tuple(args.profiles),
        timing_cache=args.timing_cache,
        opt_level=args.opt_level,
        dry_run=args.dry_run,
        verbose=args.verbose,
    )
    run_build(options, log=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
