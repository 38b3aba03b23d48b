"""``seer-run``: answer prompts with the Seer pipeline over an export folder (docs/DESIGN.md "Layout and dependency direction").

In:  ``--engines DIR`` (a ``seer-export`` folder), one ``--prompt`` (with ``--image``) or ``--input FILE.jsonl``
     (one request object per line: ``prompt``, optional ``image`` path, ``system``, ``gen_length``, ``steps``,
     ``block_length``, ``temperature``, ``remasking``, ``decoding``, ``seer``, ``early_stop``, ``window``, ``seed``, ``cache``,
     ``refresh_interval``), UTF-8.
Out: the answer text (or, with ``--json``, the whole result); with ``--input``, one JSON result per line in
     ``--output`` (stdout by default), in input order, a failed request (bad JSON, not UTF-8, a bad field or image)
     carrying its ``error`` while the others are answered. Exit status: 0 every request answered, 1 some failed
     (``--input``), 2 bad invocation or a failed ``--prompt`` (one line on stderr).

``--input`` streams: it reads, answers and writes a group of lines at a time (``GROUP_BATCHES`` of the largest batch
bucket per ``generate`` call), so its memory does not grow with the file (docs/DESIGN.md "Bounds and output folders");
``--output`` is still written through a staging file renamed once the last group is written.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from seer_trt.cli.common import (
    Parser,
    add_backend,
    add_cache,
    add_engines,
    add_generation,
    add_verbose,
    backend_options,
    check_output,
    iter_jsonl,
    jsonl_line_limit,
    open_jsonl,
    run_main,
    write_output_stream,
)
from seer_trt.contracts.errors import ConfigError, InputError, SeerError

PROG = "seer-run"
# Lines of --input answered per generate call, in largest batch buckets: enough rows for the dispatch policy to fill
# whole buckets of like lengths, few enough that a group's prepared prompts (about 200 KB a line on the fixture) stay
# a small, fixed share of the memory whatever the file's length.
GROUP_BATCHES = 4


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


def read_requests(records: Iterable[tuple[int, Any]], overrides: dict) -> Iterator[tuple[int, Any]]:
    """``iter_jsonl``'s lines as requests, each with its line number, one at a time; a line that is not a valid
    request (too long, not UTF-8, not JSON, a bad field) becomes its error, the rest go on."""
    from seer_trt.runtime.request import Request

    for number, data in records:
        if isinstance(data, str):  # the line's error
            yield number, data
            continue
        try:
            yield number, Request.from_dict({**overrides, **data} if isinstance(data, dict) else data)
        except (SeerError, TypeError) as err:
            yield number, f"line {number}: {err}"


def answer_in_groups(pipe: Any, requests: Iterable[tuple[int, Any]], group: int) -> Iterator[list[Any]]:
    """The results of ``requests`` (``read_requests``'), a list per group of at most ``group`` lines, in input
    order: one ``pipe.generate`` call per group, of its valid requests only; a line that failed to read keeps its
    error in its place, and one that fails at run time (its image, its length) gets its line number."""
    import dataclasses

    from seer_trt.runtime.request import Request, Result

    requests = iter(requests)
    while chunk := list(itertools.islice(requests, group)):
        valid = [r for _, r in chunk if isinstance(r, Request)]
        answers = iter(pipe.generate(valid)) if valid else iter(())
        results = []
        for number, r in chunk:
            if not isinstance(r, Request):
                results.append(Result.failed(r))
                continue
            result = next(answers)
            results.append(result if result.ok else dataclasses.replace(result, error=f"line {number}: {result.error}"))
        yield results


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, build_parser(), work, argv)


def work(args: argparse.Namespace) -> int:
    overrides = {k: v for k, v in (("gen_length", args.gen_length), ("steps", args.steps),
                                   ("temperature", args.temperature), ("decoding", args.decoding))
                 if v is not None}  # fmt: skip
    if args.no_seer:
        overrides["seer"] = False
    if args.early_stop:
        overrides["early_stop"] = True
    if args.input is not None and args.image is not None:
        raise InputError("--image goes with --prompt; in --input, give each request an 'image' path")
    if args.input is not None and args.json:
        raise InputError("--json goes with --prompt; --input always writes one JSON result per line")
    if args.prompt is not None and args.output is not None:
        raise InputError("--output goes with --input; --prompt prints its answer (redirect it to a file)")
    check_output(args.output, source=args.input)
    stream = None if args.input is None else open_jsonl(args.input)  # before the export loads: a bad file costs nothing
    try:
        return answer(args, overrides, stream)
    finally:
        if stream is not None and stream is not getattr(sys.stdin, "buffer", None):
            stream.close()


def answer(args: argparse.Namespace, overrides: dict, stream: BinaryIO | None) -> int:
    """Load the export, check the flags, answer ``--prompt`` or the opened ``--input``."""
    import dataclasses

    from seer_trt.contracts.policies import DEFAULT_CACHE
    from seer_trt.runtime.pipeline import SeerPipeline
    from seer_trt.runtime.request import GENERATION_FIELDS, Request

    try:  # a request's own "cache" keys override it
        cache = dataclasses.replace(
            DEFAULT_CACHE, mode=args.cache, refresh=args.refresh_interval, order=args.forecast_order
        )
    except ConfigError as err:
        raise InputError(f"{err} (command-line flags)") from None
    pipe = SeerPipeline.from_manifest(args.engines, cache=cache, **backend_options(args))
    try:  # the flags on their own, before any request: --temperature nan, --steps past --gen-length
        pipe.settings(**{k: v for k, v in overrides.items() if k in GENERATION_FIELDS})
    except InputError as err:
        raise InputError(f"{str(err).removeprefix('request settings: ')} (command-line flags)") from None
    if stream is None:
        result = pipe.generate([Request(args.prompt, args.image, **overrides)])[0]
        if not result.ok:
            raise InputError(result.error)
        print(json.dumps(result.to_dict()) if args.json else result.text)
        return 0
    return answer_input(pipe, args, overrides, stream)


def answer_input(pipe: Any, args: argparse.Namespace, overrides: dict, stream: BinaryIO) -> int:
    """``--input``'s requests read, answered and written a group at a time (``answer_in_groups``); the summary line
    on stderr; exit status 1 when some failed."""
    counts = [0, 0]  # answered, failed
    group = GROUP_BATCHES * pipe.buckets.batch[-1]

    def pieces() -> Iterator[str]:
        records = iter_jsonl(stream, args.input, jsonl_line_limit(pipe.prompts.max_chars))
        for results in answer_in_groups(pipe, read_requests(records, overrides), group):
            for r in results:
                counts[not r.ok] += 1
            yield "".join(json.dumps(r.to_dict()) + "\n" for r in results)

    write_output_stream(args.output, pieces())
    print(f"{PROG}: {counts[0]} answered, {counts[1]} failed", file=sys.stderr)
    return 1 if counts[1] else 0


if __name__ == "__main__":
    sys.exit(main())
