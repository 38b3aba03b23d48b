"""The files one request passes through, in order, from ``SeerPipeline.generate`` to its answer.

Usage: python tools/request_walk.py ENGINES [PROMPT] [--image PATH]

Traces every Python call made while ``generate`` answers one request. A stop is a call from ``pipeline.py`` into a
stage file of ``seer_trt/runtime/``; a return is a stop in a file the walk had already left. Asking a frozen
dataclass a stage handed on about itself (``Schedule.rows``, ``Layout.gen_ids``) is no stop: that is the object
travelling, not the work going back. Calls a stage makes into other stage files (its tools: ``denoise`` runs its
``kv_cache`` every step) are listed apart, each once.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path


def walk(pipe, request) -> tuple[list[str], list[str]]:
    """The stage files the pipeline called, in order (consecutive repeats folded), and the stage-to-stage calls."""
    import seer_trt.runtime

    runtime = Path(seer_trt.runtime.__file__).parent  # the stage files of the seer_trt that is running
    stops: list[str] = []
    tools: list[str] = []

    def profile(frame, event, arg):
        if event != "call" or frame.f_back is None:
            return
        callee, caller = Path(frame.f_code.co_filename), Path(frame.f_back.f_code.co_filename)
        if callee.parent != runtime or caller.parent != runtime or callee == caller:
            return
        owner = frame.f_locals.get("self")
        if owner is not None and dataclasses.is_dataclass(owner):
            return
        if caller.name == "pipeline.py":
            if not stops or stops[-1] != callee.stem:
                stops.append(callee.stem)
        else:
            edge = f"{caller.stem} -> {callee.stem}.{frame.f_code.co_name}"
            if edge not in tools:
                tools.append(edge)

    sys.setprofile(profile)
    try:
        result = pipe.generate([request])[0]
    finally:
        sys.setprofile(None)
    if not result.ok:
        raise SystemExit(f"the request failed: {result.error}")
    return stops, tools


def returns(stops: list[str]) -> list[str]:
    """Stops in a file the walk had already left."""
    seen: set[str] = set()
    back = []
    for stop in stops:
        if stop in seen:
            back.append(stop)
        seen.add(stop)
    return back


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("engines", type=Path)
    ap.add_argument("prompt", nargs="?", default="count the shapes one by one .")
    ap.add_argument("--image", type=Path, help="an image for the request (default: a fixture picture)")
    args = ap.parse_args(argv)
    from seer_trt import Request, SeerPipeline
    from seer_trt.eval.tasks import render

    image = args.image or render([("red", "square"), ("blue", "ring"), ("green", "dot")], grid=4, cell_px=8)
    pipe = SeerPipeline.from_manifest(args.engines)
    pipe.generate([Request(args.prompt, image=image)])  # warm: bindings and sessions, not part of the walk
    stops, tools = walk(pipe, Request(args.prompt, image=image))
    back = returns(stops)
    print("pipeline.py: " + " -> ".join(f"{s}.py" for s in stops))
    print(f"{len(stops)} stops in {len(set(stops))} files, {len(back)} returns{': ' + ', '.join(back) if back else ''}")
    print("stages' own calls into other stage files: " + ("; ".join(tools) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
