"""``seer-prompt-ids``: what the C++ runtime takes as input (docs/DESIGN.md "C++ runtime"), from what ``seer-run`` takes.

In:  ``--engines DIR`` and one ``--prompt`` (with ``--image``, ``--system``), or ``--input requests.jsonl`` of
     seer-run's requests.
Out: C++ requests (``cpp/build/seer_run --input``, ``seer::Request``): ``prompt_ids`` chat-formatted by the export's
     own template and tokenizer, through the runtime's own encoder (``PromptFormat.ids``: user text never becomes
     control tokens, ``<image>`` is prepended when an image comes without one, ``IMAGE_PLACEHOLDER`` marks where its
     features go), and the image as preprocessed float32 pixel tiles [tiles, 3, S, S] in a ``.npy`` file
     (``image_tiles``; anyres exports also get ``image_grid`` and ``image_size``). Other fields pass through. A line
     that cannot be converted becomes ``{"error": "line N: ..."}`` in its place (the C++ ``seer_run`` answers it
     with that error) and the others are converted; exit status 1 then. ``--input`` streams: each line is read,
     converted and written in turn, ``--output`` through a staging file renamed once the last line is written.

The C++ runtime reads no tokenizer for prompts: a chat template is Jinja and LLaDA-V's tokenizer is BPE, both
already done right here; so a C++ service either calls this once per prompt or ports its tokenizer's encoder.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from seer_trt.cli.common import (
    Parser,
    add_engines,
    add_verbose,
    check_output,
    iter_jsonl,
    jsonl_line_limit,
    open_jsonl,
    run_main,
    write_output,
    write_output_stream,
)
from seer_trt.contracts.errors import InputError, SeerError
from seer_trt.serving.cpp import CppRequests

PROG = "seer-prompt-ids"


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog=PROG, description="Chat-formatted prompt ids and pixel tiles of requests, for the C++ runtime "
                "(cpp/build/seer_run): one JSON request per line on stdout or in --output.")  # fmt: skip
    add_engines(ap)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the question; put <image> where the image goes (prepended when absent)")
    src.add_argument("--input", type=Path, help="seer-run's JSONL requests to convert")
    ap.add_argument("--image", type=Path, help="image file for --prompt (needs --tiles)")
    ap.add_argument("--system", help="system message instead of the export's ('' for none)")
    ap.add_argument("--tiles", type=Path, help="--prompt: write the image's pixel tiles to this .npy file")
    ap.add_argument("--tiles-dir", type=Path, help="--input: write each image's tiles here, as LINE.npy")
    ap.add_argument("--output", type=Path, help="JSONL file for the C++ requests (default: stdout)")
    add_verbose(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, build_parser(), work, argv)


def work(args: argparse.Namespace) -> int:
    if args.input is not None and (args.image or args.tiles or args.system is not None):
        raise InputError("--image, --system and --tiles go with --prompt; in --input each request has its own")
    if args.prompt is not None and args.tiles_dir is not None:
        raise InputError("--tiles-dir goes with --input; for --prompt, name the file with --tiles FILE.npy")
    if args.prompt is not None and (args.image is None) != (args.tiles is None):
        raise InputError("--image and --tiles go together: --tiles names the .npy file the image's tiles go to")
    check_output(args.output, source=args.input)
    check_output(args.tiles, "--tiles", example="tiles.npy")
    if args.tiles_dir is not None:
        if args.tiles_dir.exists() and not args.tiles_dir.is_dir():
            raise InputError(f"--tiles-dir {args.tiles_dir} is a file; name a folder")
        if not args.tiles_dir.parent.is_dir():
            raise InputError(f"--tiles-dir {args.tiles_dir}: the folder {args.tiles_dir.parent} does not exist; create "
                             f"it first (mkdir -p {args.tiles_dir})")  # fmt: skip
    stream = None if args.input is None else open_jsonl(args.input)  # before the export loads
    try:
        conv = CppRequests(args.engines)
        if stream is None:
            data: dict[str, Any] = {"prompt": args.prompt}
            if args.image is not None:
                data["image"] = str(args.image)
            if args.system is not None:
                data["system"] = args.system
            write_output(args.output, json.dumps(conv.convert(data, args.tiles)) + "\n")
            return 0
        return convert_input(conv, args, stream)
    finally:
        if stream is not None and stream is not getattr(sys.stdin, "buffer", None):
            stream.close()


def convert_input(conv: CppRequests, args: argparse.Namespace, stream: BinaryIO) -> int:
    """``--input``'s lines read, converted and written one at a time; the summary line on stderr; exit status 1
    when some failed."""
    counts = [0, 0]  # converted, failed

    def pieces() -> Iterator[str]:
        for number, data in iter_jsonl(stream, args.input, jsonl_line_limit(conv.prompts.max_chars)):
            error = data if isinstance(data, str) else None
            if error is None:
                path = None if args.tiles_dir is None else args.tiles_dir / f"{number}.npy"
                try:
                    if path is not None and isinstance(data, dict) and data.get("image") is not None:
                        args.tiles_dir.mkdir(exist_ok=True)  # the folder asked for, not its parents
                    line = json.dumps(conv.convert(data, path))
                    counts[0] += 1
                    yield line + "\n"
                    continue
                except SeerError as err:
                    error = f"line {number}: {err}"
            counts[1] += 1
            yield json.dumps({"error": error}) + "\n"  # in its place: the C++ seer_run answers it with this error

    write_output_stream(args.output, pieces())
    print(f"{PROG}: {counts[0]} converted, {counts[1]} failed", file=sys.stderr)
    return 1 if counts[1] else 0


if __name__ == "__main__":
    sys.exit(main())
