"""``seer-run``: answer prompts with the Seer pipeline over an export folder (docs/DESIGN.md §2).

In:  ``--engines DIR`` (a ``seer-export`` folder), one ``--prompt`` (with ``--image``) or ``--input FILE.jsonl``
     (one request object per line: ``prompt``, optional ``image`` path, ``system``, ``gen_length``, ``steps``,
     ``block_length``, ``temperature``, ``remasking``, ``seer``, ``early_stop``, ``window``, ``seed``, ``cache``,
     ``refresh_interval``), UTF-8.
Out: the answer text (or, with ``--json``, the whole result); with ``--input``, one JSON result per line in
     ``--output`` (stdout by default), a failed request (bad JSON, not UTF-8, a bad field or image) carrying its
     ``error`` while the others are answered. Exit status: 0 every request answered, 1 some failed (``--input``),
     2 bad invocation or a failed ``--prompt`` (one line on stderr).
"""

from __future__ import annotations

import argparse
import codecs
import json
import sys
from pathlib import Path

from seer_trt.cli import Parser, fail, interrupted
from seer_trt.errors import InputError, SeerError

PROG = "seer-run"


def build_parser() -> argparse.ArgumentParser:
    from seer_trt.dispatch import DEFAULT_POLICY, POLICIES
    from seer_trt.kv_cache import CACHE_MODES, DEFAULT_CACHE

    ap = Parser(
        prog=PROG,
        description="Answer prompts with LLaDA-V and Seer (step-zero truncation) through exported graphs on ONNX "
        "Runtime. One --prompt, or many requests from a JSONL file, batched together.",
    )
    ap.add_argument("--engines", type=Path, required=True, help="export folder written by seer-export")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the question; put <image> where the image goes (prepended when absent)")
    src.add_argument("--input", type=Path, help="JSONL file, one request per line ('-' for stdin)")
    ap.add_argument("--image", type=Path, help="image file for --prompt")
    ap.add_argument("--output", type=Path, help="JSONL results for --input (default: stdout)")
    ap.add_argument("--json", action="store_true", help="print the whole result as JSON (--prompt)")
    ap.add_argument("--no-seer", action="store_true", help="the padded baseline: denoise all gen_length positions")
    ap.add_argument("--early-stop", action="store_true",
                    help="LLaDA-V's official stopping criterion: stop once the answer before the first <|eot_id|> "
                    "is complete (with or without Seer)")  # fmt: skip
    ap.add_argument("--gen-length", type=int, help="answer window (default: the export's)")
    ap.add_argument("--steps", type=int, help="denoising steps over the window (default: the export's)")
    ap.add_argument("--temperature", type=float, help="0 greedy (default); > 0 needs the denoise_logits graph")
    ap.add_argument("--cache", choices=CACHE_MODES, default=DEFAULT_CACHE.mode,
                    help=f"prompt K/V cache: none (every step computes the prompt: the exact loop), reuse (refresh every "
                    f"--refresh-interval steps and at block starts, reuse in between) or forecast (ResilPhase "
                    f"extrapolation between refreshes) (default: {DEFAULT_CACHE.mode})")  # fmt: skip
    ap.add_argument("--refresh-interval", type=int, default=DEFAULT_CACHE.refresh,
                    help=f"steps between exact prompt computations under --cache reuse/forecast (default: "
                    f"{DEFAULT_CACHE.refresh})")  # fmt: skip
    ap.add_argument("--forecast-order", type=int, default=DEFAULT_CACHE.order, choices=(1, 2),
                    help=f"Lagrange order of --cache forecast (default: {DEFAULT_CACHE.order})")  # fmt: skip
    ap.add_argument("--policy", default=DEFAULT_POLICY, choices=POLICIES,
                    help=f"how rows are batched (default: {DEFAULT_POLICY}, timed on the backend at first use)")  # fmt: skip
    ap.add_argument("--backend", default="onnxruntime", choices=("onnxruntime", "tensorrt", "tensorrt-rtx"),
                    help="onnxruntime (default), or the TensorRT plans seer-build recorded")  # fmt: skip
    ap.add_argument("--provider", default="cpu", help="ONNX Runtime provider: cpu (default), cuda, tensorrt")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: ONNX Runtime's default)")
    ap.add_argument("--verify", action="store_true",
                    help="check every graph file against the sha256 the export recorded before running")  # fmt: skip
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="TensorRT backends: replay CUDA graphs for calls at a static bucket shape")  # fmt: skip
    ap.add_argument("--verbose", action="store_true", help="tracebacks on errors")
    return ap


def read_requests(path: Path, overrides: dict):
    """Requests from a JSONL file; a line that is not a valid request (not UTF-8, not JSON, a bad field) becomes its
    error, the rest go on."""
    from seer_trt.pipeline import Request

    try:
        if str(path) == "-":  # bytes, so a bad line fails alone (a text stream without a buffer: as given)
            stdin = getattr(sys.stdin, "buffer", None)
            data = stdin.read() if stdin is not None else sys.stdin.read().encode("utf-8", "surrogateescape")
        else:
            data = path.read_bytes()
    except OSError as err:
        raise InputError(f"cannot read --input {path} ({err.strerror}); pass a JSONL file") from None
    data = data.removeprefix(codecs.BOM_UTF8)
    out: list[Request | str] = []
    for number, raw in enumerate(data.splitlines(), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            out.append(f"line {number}: not UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1}); write the "
                       f"file as UTF-8")  # fmt: skip
            continue
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            out.append(Request.from_dict({**overrides, **data} if isinstance(data, dict) else data))
        except json.JSONDecodeError as err:
            out.append(f"line {number}: not JSON ({err.msg})")
        except (SeerError, TypeError) as err:
            out.append(f"line {number}: {err}")
    if not out:
        raise InputError(f"--input {path} holds no requests; write one JSON object per line")
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import dataclasses

        from seer_trt.kv_cache import DEFAULT_CACHE
        from seer_trt.pipeline import Request, Result, SeerPipeline

        overrides = {k: v for k, v in (("gen_length", args.gen_length), ("steps", args.steps),
                                       ("temperature", args.temperature)) if v is not None}  # fmt: skip
        if args.no_seer:
            overrides["seer"] = False
        if args.early_stop:
            overrides["early_stop"] = True
        if args.input is not None and args.image is not None:
            raise InputError("--image goes with --prompt; in --input, give each request an 'image' path")
        cache = dataclasses.replace(
            DEFAULT_CACHE, mode=args.cache, refresh=args.refresh_interval, order=args.forecast_order
        )  # a request's own "cache" keys override it
        pipe = SeerPipeline.from_manifest(args.engines, backend=args.backend, provider=args.provider,
                                          threads=args.threads, policy=args.policy, verify=args.verify,
                                          cuda_graphs=args.cuda_graphs, cache=cache)  # fmt: skip
        try:  # the flags on their own, before any request: --temperature nan, --steps past --gen-length
            pipe.generation(Request("flags", **overrides))
        except InputError as err:
            raise InputError(f"{str(err).removeprefix('request settings: ')} (command-line flags)") from None
        if args.input is None:
            requests: list = [Request(args.prompt, args.image, **overrides)]
        else:
            requests = read_requests(args.input, overrides)
        valid = [r for r in requests if isinstance(r, Request)]
        answers = iter(pipe.generate(valid)) if valid else iter(())
        results = [next(answers) if isinstance(r, Request) else Result.failed(r) for r in requests]
        if args.input is None:
            result = results[0]
            if not result.ok:
                raise InputError(result.error)
            print(json.dumps(result.to_dict()) if args.json else result.text)
            return 0
        lines = "".join(json.dumps(r.to_dict()) + "\n" for r in results)
        if args.output is None:
            sys.stdout.write(lines)
        else:
            tmp = args.output.with_name(args.output.name + ".partial")
            tmp.write_text(lines)
            tmp.replace(args.output)
        failed = sum(not r.ok for r in results)
        print(f"{PROG}: {len(results) - failed} answered, {failed} failed", file=sys.stderr)
        return 1 if failed else 0
    except KeyboardInterrupt as err:
        return interrupted(PROG, err, args.verbose)
    except (SeerError, OSError) as err:
        return fail(PROG, err, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
