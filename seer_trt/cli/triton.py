"""``seer-triton``: a Triton Inference Server model repository for an export folder (docs/DESIGN.md "Serving and embedding").

In:  ``--engines DIR`` (a ``seer-export`` folder, with TensorRT plans when ``seer-build`` ran), ``--out REPO``,
     ``--flavour gpu|cpu``, ``--name NAME``.
Out: REPO/ (see ``seer_trt.serving.triton.repository``), written atomically and checked; one line per model on stdout.
     Bad input: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from seer_trt.cli.common import Parser, add_cache, add_engines, add_threads, add_verbose, run_main

PROG = "seer-triton"


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(
        prog=PROG,
        description="Write a Triton model repository serving an export with Seer: one decoupled Python-backend model "
        "whose one engine runs the export in-process and streams (--orchestration bls: an orchestrator calling one "
        "component model per graph through BLS).",
    )
    add_engines(ap, "export folder written by seer-export / seer-build")
    ap.add_argument("--out", type=Path, required=True, help="model repository folder to write")
    ap.add_argument("--flavour", default="gpu", choices=("gpu", "cpu"),
                    help="gpu: tensorrt_plan models (onnxruntime_onnx + TensorRT when no plans were built); cpu: "
                    "Python-backend models running ONNX Runtime (default: gpu)")  # fmt: skip
    ap.add_argument("--name", default="seer", help="the orchestrator's model name; components are NAME_GRAPH")
    ap.add_argument("--instances", type=int, default=2, help="orchestrator instances (default: 2)")
    ap.add_argument("--gpus", type=_gpus, default=(), metavar="0,1,...",
                    help="gpu flavour: the GPUs every component runs on, one instance group naming them (default: "
                    "every GPU Triton sees)")  # fmt: skip
    ap.add_argument(
        "--component-instances",
        type=int,
        default=1,
        metavar="N",
        help="gpu flavour: instances of each component on each GPU (default: 1)",
    )
    add_threads(ap, help="ONNX Runtime threads per cpu component")
    ap.add_argument("--orchestration", default="engine", choices=("engine", "bls"),
                    help="engine: one decoupled model whose one engine runs the export in-process and streams; bls: "
                    "an orchestrator per instance calling one component model per graph, whole answers only "
                    "(default: engine)")  # fmt: skip
    add_cache(ap, default=None, orders=False, why=": seer-run's for --orchestration engine, none for bls, whose "
              "calls move tensors through host memory")  # fmt: skip
    ap.add_argument("--force", action="store_true", help="replace a repository seer-triton wrote at --out; a folder "
                    "holding anything else is never replaced")  # fmt: skip
    add_verbose(ap)
    return ap


def _gpus(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of GPU indices such as 0,1") from None


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, build_parser(), work, argv, signals=True)


def work(args: argparse.Namespace) -> int:
    from seer_trt.contracts.policies import CacheConfig
    from seer_trt.serving.triton.repository import plan_repository, write_repository

    cache = None if args.cache is None else CacheConfig(args.cache, args.refresh_interval)
    plan = plan_repository(args.engines, args.flavour, args.name, args.instances, args.threads, cache, args.gpus,
                           args.component_instances, args.orchestration)  # fmt: skip
    out = write_repository(plan, args.out, args.force)
    for model in plan.models:
        print(f"{model.name}: {model.platform or model.backend}")
    print(f"{PROG}: wrote {len(plan.models)} models ({args.flavour}) to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
