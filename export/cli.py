"""``seer-export``: a LLaDA-V checkpoint -> ONNX graphs, tokenizer and ``manifest.json``, validated (docs/DESIGN.md "Graphs and their contract").

In:  ``--model NAME`` (``tiny-llada-v`` bundled, ``llada-v`` from ``--checkpoint DIR`` or the local HF cache),
     ``--out DIR``, precision, opset, which graphs.
Out: the export folder (``seer_export.onnx.run.run_export``); one progress line per stage; the parity
     table. Bad input: one line on stderr, exit 2 (``--verbose`` shows the traceback).

Only argparse and ``seer_trt.contracts.graphs`` are imported at module level, so ``--help`` starts instantly.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from seer_trt.cli.common import Parser, add_model, add_verbose, require_extra, run_main
from seer_trt.contracts.graphs import GRAPHS, SERVING_GRAPHS

PROG = "seer-export"


def build_parser() -> argparse.ArgumentParser:
    graphs = "; ".join(f"{g.name}: {g.summary}" for g in GRAPHS.values())
    ap = Parser(
        prog=PROG,
        description="Export LLaDA-V to ONNX graphs (embedding, vision, Seer's early-exit step zero, the denoising "
        "window graph) with a manifest, validated against PyTorch with ONNX Runtime. Every graph reads its tensors "
        "from one shared weights.data file, each tensor stored once. Output is written to a temporary folder next to "
        "--out and moved into place only when complete.",
    )
    add_model(ap)
    ap.add_argument("--out", type=Path, help="output folder (default: engines/MODEL-DTYPE); a folder of exports such as "
                    "engines/ gets a MODEL-DTYPE folder inside")  # fmt: skip
    ap.add_argument("--dtype", default="fp32", help="fp32 or fp16 (statistics and softmax stay fp32)")
    ap.add_argument("--opset", type=int, default=20, help="ONNX opset, 20-22 (default 20)")
    ap.add_argument("--graphs", nargs="+", default=list(SERVING_GRAPHS), metavar="GRAPH",
                    help=f"graphs to export (default: {' '.join(SERVING_GRAPHS)}). {graphs}")  # fmt: skip
    ap.add_argument("--sampling", action="store_true", help="also export denoise_logits, for LLaDA-V's exact "
                    "sampler over the whole vocabulary (without it, temperature > 0 samples from the window graph's "
                    "64 most probable ids per position; it reads the same shared weights file; greedy decoding never "
                    "calls it)")  # fmt: skip
    ap.add_argument("--no-validate", action="store_true", help="skip ONNX Runtime vs PyTorch validation")
    ap.add_argument("--samples", type=int, default=16, help="held-out prompts of the end-to-end check")
    ap.add_argument("--force", action="store_true", help="replace an existing export at --out (only once complete); a "
                    "folder holding anything else is never replaced")  # fmt: skip
    ap.add_argument("--save-goldens", action="store_true", help="write Polygraphy JSON inputs/outputs")
    add_verbose(ap, "exporter output and tracebacks")
    return ap


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, build_parser(), work, argv, signals=True)


def work(args: argparse.Namespace) -> int:
    require_extra(PROG)
    from seer_export.onnx.options import ExportOptions
    from seer_export.onnx.run import run_export

    options = ExportOptions(
        model=args.model,
        checkpoint=args.checkpoint,
        out=args.out,
        dtype=args.dtype,
        opset=args.opset,
        graphs=tuple(args.graphs),
        sampling=args.sampling,
        validate=not args.no_validate,
        force=args.force,
        save_goldens=args.save_goldens,
        samples=args.samples,
        verbose=args.verbose,
    )
    run_export(options, log=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
