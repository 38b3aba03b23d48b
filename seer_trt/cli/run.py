"""``seer-run``: answer prompts with the Seer pipeline over an export folder (docs/DESIGN.md "Layout and dependency direction").

In:  ``--engines DIR`` (a ``seer-export`` folder), one ``--prompt`` (with ``--image``) or ``--input FILE.jsonl``
     (one request object per line: ``prompt``, optional ``image`` path, ``system``, ``gen_length``, ``steps``,
     ``block_length``, ``temperature``, ``remasking``, ``decoding``, ``seer``, ``early_stop``, ``window``, ``seed``, ``cache``,
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

from seer_trt.cli.common import (
    Parser,
    add_backend,
    add_cache,
    add_engines,
    add_generation,
    add_verbose,
    run_main,
    write_output,
)
from seer_trt.contracts.errors import InputError, SeerError

PROG = "seer-run"


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(
        prog=PROG,
        description="Answer prompts with LLaDA-V and Seer (step-zero truncation) through exported graphs on ONNX "
        "Runtime. One --prompt, or many requests from a JSONL file, batched together.",
    )
    add_engines(ap)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the question; put <image> where the image goes (prepended when absent)")
    src.add_argument("--input", type=Path, help="JSONL file, one request per line ('-' for stdin)")
    ap.add_argument("--image", type=Path, help="image file for --prompt")
    ap.add_argument("--output", type=Path, help="JSONL results for --input (default: stdout)")
    ap.add_argument("--json", action="store_true", help="print the whole result as JSON (--prompt)")
    add_generation(ap)
    add_cache(ap)
    add_backend(ap)
    add_verbose(ap)
    return ap


def read_requests(path: Path, overrides: dict):
    """Requests from a JSONL file; a line that is not a valid request (not UTF-8, not JSON, a bad field) becomes its
    error, the rest go on."""
    from seer_trt.runtime.request import Request

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
    return run_main(PROG, build_parser(), work, argv)


def work(args: argparse.Namespace) -> int:
    import dataclasses

    from seer_trt.contracts.policies import DEFAULT_CACHE
    from seer_trt.runtime.pipeline import SeerPipeline
    from seer_trt.runtime.request import GENERATION_FIELDS, Request, Result

    overrides = {k: v for k, v in (("gen_length", args.gen_length), ("steps", args.steps),
                                   ("temperature", args.temperature), ("decoding", args.decoding))
                 if v is not None}  # fmt: skip
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
        pipe.settings(**{k: v for k, v in overrides.items() if k in GENERATION_FIELDS})
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
    write_output(args.output, lines)
    failed = sum(not r.ok for r in results)
    print(f"{PROG}: {len(results) - failed} answered, {failed} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
