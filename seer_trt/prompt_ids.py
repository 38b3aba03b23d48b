"""``seer-prompt-ids``: what the C++ runtime takes as input (docs/DESIGN.md §11), from what ``seer-run`` takes.

In:  ``--engines DIR`` and one ``--prompt`` (with ``--image``, ``--system``), or ``--input requests.jsonl`` of
     seer-run's requests.
Out: C++ requests (``cpp/build/seer_run --input``, ``seer::Request``): ``prompt_ids`` chat-formatted by the export's
     own template and tokenizer, through the runtime's own encoder (``PromptEncoder.ids``: user text never becomes
     control tokens, ``<image>`` is prepended when an image comes without one, ``IMAGE_PLACEHOLDER`` marks where its
     features go), and the image as preprocessed float32 pixel tiles [tiles, 3, S, S] in a ``.npy`` file
     (``image_tiles``; anyres exports also get ``image_grid`` and ``image_size``). Other fields pass through.

The C++ runtime reads no tokenizer for prompts: a chat template is Jinja and LLaDA-V's tokenizer is BPE, both
already done right here; so a C++ service either calls this once per prompt or ports its tokenizer's encoder.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from seer_trt.cli import Parser, fail, interrupted
from seer_trt.errors import InputError, SeerError

PROG = "seer-prompt-ids"


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog=PROG, description="Chat-formatted prompt ids and pixel tiles of requests, for the C++ runtime "
                "(cpp/build/seer_run): one JSON request per line on stdout or in --output.")  # fmt: skip
    ap.add_argument("--engines", type=Path, required=True, help="export folder written by seer-export")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the question; put <image> where the image goes (prepended when absent)")
    src.add_argument("--input", type=Path, help="seer-run's JSONL requests to convert")
    ap.add_argument("--image", type=Path, help="image file for --prompt (needs --tiles)")
    ap.add_argument("--system", help="system message instead of the export's ('' for none)")
    ap.add_argument("--tiles", type=Path, help="--prompt: write the image's pixel tiles to this .npy file")
    ap.add_argument("--tiles-dir", type=Path, help="--input: write each image's tiles here, as LINE.npy")
    ap.add_argument("--output", type=Path, help="JSONL file for the C++ requests (default: stdout)")
    ap.add_argument("--verbose", action="store_true", help="tracebacks on errors")
    return ap


class CppRequests:
    """seer-run requests -> C++ requests, with one export's tokenizer, chat template and vision settings."""

    def __init__(self, folder: str | Path) -> None:
        from seer_trt.embed import PromptEncoder
        from seer_trt.manifest import Manifest

        self.manifest = Manifest.read(folder)
        # ids() and needed_size() read the tokenizer and the manifest only: no graph runs, so no backend
        self.encoder = PromptEncoder(folder, self.manifest, backend=None)

    def tiles(self, image: Any) -> tuple[np.ndarray, dict[str, Any]]:
        """The image's normalised pixel tiles [tiles, 3, S, S] float32, and the fields anyres merging needs."""
        from seer_trt.embed import load_image
        from seer_trt.preprocess import anyres_tiles, pixel_tiles

        v = self.manifest.vision
        pixels, original = load_image(image, self.encoder.limits, self.encoder.needed_size)
        if not v.image_aspect_ratio.startswith("anyres"):
            return pixel_tiles(pixels, v.image_size, v.pixel_mean, v.pixel_std).astype(np.float32), {}
        tiled = anyres_tiles(pixels, v.image_size, v.grid_pinpoints, v.pixel_mean, v.pixel_std, original)
        return tiled.tiles.astype(np.float32), {"image_grid": list(tiled.grid), "image_size": list(tiled.original_size)}

    def convert(self, data: dict[str, Any], tiles_path: Path | None) -> dict[str, Any]:
        """One seer-run request object as a C++ request object (its image's tiles saved at ``tiles_path``).

        Raises:
            InputError: a malformed request, an unreadable image, or an image without a place for its tiles.
        """
        from seer_trt.pipeline import Request

        request = Request.from_dict(data)
        out: dict[str, Any] = {k: v for k, v in data.items() if k not in ("prompt", "image", "system")}
        out["prompt_ids"] = self.encoder.ids(request.prompt, request.image is not None, request.system)
        if request.image is not None:
            if tiles_path is None:
                raise InputError("an image needs a file for its tiles; pass --tiles FILE.npy (or --tiles-dir DIR)")
            tiles, extra = self.tiles(request.image)
            tiles_path.parent.mkdir(parents=True, exist_ok=True)
            np.save(tiles_path, tiles)
            out.update(image_tiles=str(tiles_path), **extra)
        return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.input is not None and (args.image or args.tiles or args.system is not None):
            raise InputError("--image, --system and --tiles go with --prompt; in --input each request has its own")
        conv = CppRequests(args.engines)
        if args.prompt is not None:
            data: dict[str, Any] = {"prompt": args.prompt}
            if args.image is not None:
                data["image"] = str(args.image)
            if args.system is not None:
                data["system"] = args.system
            lines = [json.dumps(conv.convert(data, args.tiles))]
        else:
            try:
                text = args.input.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as err:
                raise InputError(f"cannot read --input {args.input} ({err}); pass a UTF-8 JSONL file") from None
            tiles_dir = args.tiles_dir
            lines = []
            for number, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    data = json.loads(line)
                except json.JSONDecodeError as err:
                    raise InputError(f"line {number}: not JSON ({err.msg})") from None
                path = None if tiles_dir is None else tiles_dir / f"{number}.npy"
                try:
                    lines.append(json.dumps(conv.convert(data, path)))
                except SeerError as err:
                    raise InputError(f"line {number}: {err}") from None
        text = "".join(line + "\n" for line in lines)
        if args.output is None:
            sys.stdout.write(text)
        else:
            tmp = args.output.with_name(args.output.name + ".partial")
            tmp.write_text(text)
            tmp.replace(args.output)
        return 0
    except KeyboardInterrupt as err:
        return interrupted(PROG, err, args.verbose)
    except (SeerError, OSError) as err:
        return fail(PROG, err, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
