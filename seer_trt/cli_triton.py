"""``seer-triton``: a Triton Inference Server model repository for an export folder (docs/DESIGN.md §7).

In:  ``--engines DIR`` (a ``seer-export`` folder, with TensorRT plans when ``seer-build`` ran), ``--out REPO``,
     ``--flavour gpu|cpu``, ``--name NAME``.
Out: REPO/ (see ``seer_trt.triton.repository``), written atomically and checked; one line per model on stdout.
     Bad input: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from seer_trt.cli import Parser, fail, interrupted
from seer_trt.errors import SeerError
from seer_trt.outfolder import signals_as_interrupts

PROG = "seer-triton"


def build_parser() -> argparse.ArgumentParser:
    from seer_trt.kv_cache import DEFAULT_CACHE

    ap = Parser(
        prog=PROG,
        description="Write a Triton model repository serving an export with Seer: an orchestrator model (Python "
        "backend, BLS) running the seer_trt pipeline, and one component model per graph.",
    )
    ap.add_argument("--engines", type=Path, required=True, help="export folder written by seer-export / seer-build")
    ap.add_argument("--out", type=Path, required=True, help="model repository folder to write")
    ap.add_argument("--flavour", default="gpu", choices=("gpu", "cpu"),
                    help="gpu: tensorrt_plan models (onnxruntime_onnx + TensorRT when no plans were built); cpu: "
                    "Python-backend models running ONNX Runtime (default: gpu)")  # fmt: skip
    ap.add_argument("--name", default="seer", help="the orchestrator's model name; components are NAME_GRAPH")
    ap.add_argument("--instances", type=int, default=2, help="orchestrator instances (default: 2)")
    ap.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads per cpu component (0: default)")
    ap.add_argument("--cache", default="none", choices=("none", "reuse", "forecast"),
                    help="the orchestrator's prompt K/V cache policy (default: none; its BLS calls move tensors "
                    "through host memory)")  # fmt: skip
    ap.add_argument("--refresh-interval", type=int, default=DEFAULT_CACHE.refresh, help="steps between prompt "
                    f"computations under --cache reuse/forecast (default: {DEFAULT_CACHE.refresh})")  # fmt: skip
    ap.add_argument("--force", action="store_true", help="replace a repository seer-triton wrote at --out; a folder "
                    "holding anything else is never replaced")  # fmt: skip
    ap.add_argument("--verbose", action="store_true", help="tracebacks on errors")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        from seer_trt.kv_cache import CacheConfig
        from seer_trt.triton.repository import plan_repository, write_repository

        cache = CacheConfig(args.cache, args.refresh_interval)
        plan = plan_repository(args.engines, args.flavour, args.name, args.instances, args.threads, cache)
        with signals_as_interrupts():
            out = write_repository(plan, args.out, args.force)
        for model in plan.models:
            print(f"{model.name}: {model.platform or model.backend}")
        print(f"{PROG}: wrote {len(plan.models)} models ({args.flavour}) to {out}", file=sys.stderr)
        return 0
    except KeyboardInterrupt as err:  # Ctrl-C, SIGTERM, SIGHUP: the staging folder is gone, --out as it was
        return interrupted(PROG, err, args.verbose)
    except (SeerError, OSError) as err:
        return fail(PROG, err, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
