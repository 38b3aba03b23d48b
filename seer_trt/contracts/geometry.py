"""Image geometry: how many features an image takes and where they sit (LLaVA-OneVision "anyres", docs/DESIGN.md
"The model (LLaDA-V) in plain PyTorch").

In:  an image's original (width, height), the checkpoint's grid pinpoints and tile size.
Out: the grid resolution chosen for it (``select_best_resolution``), the fitted size inside it (``fitted_size``) and
     the feature-side layout of ``spatial_unpad`` merging (``anyres_layout``: which rows and columns of the grid's
     patch map survive unpadding and the ``anyres_max_N`` downsampling); ``AnyresImage``, one image's tiles with the
     grid and original size that layout is read from, as the PyTorch model and the runtime both take it.

A contract, not a stage: the exporter (``seer_export.models``), the runtime's image and embedding stages and the
C++ runtime agree on it, so an image costs the same number of prompt positions everywhere. Pixels are made by the
runtime's image stage (``seer_trt.runtime.image``); ``AnyresImage`` only carries them.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from collections.abc import Sequence

import numpy as np

from seer_trt.contracts.errors import ConfigError

IMAGE_TOKEN = "<image>"


IMAGE_PLACEHOLDER = -200  # LLaDA-V's IMAGE_TOKEN_INDEX: not a vocabulary id, replaced by image features


LLADA_V_PINPOINTS = "(1x1),...,(6x6)"  # LLaDA-V's image_grid_pinpoints: every grid of 1..6 x 1..6 tiles


Pinpoints = str | Sequence[Sequence[int]]  # "(1x1),...,(6x6)", "[(384, 768), ...]" or [[w, h], ...] px


@dataclasses.dataclass(frozen=True)
class AnyresLayout:
    """Feature geometry of one anyres image under ``spatial_unpad`` merging (LLaVA-OneVision).

    The grid tiles' patch maps are laid side by side into one [rows*side, cols*side] map, cropped back to the
    image's aspect ratio, shrunk when larger than ``max_tiles`` tiles, and each of its rows gets a newline.
    """

    side: int  # patches per tile side (27 for SigLIP so400m at 384 px); the base tile gives side**2 features
    crop: tuple[int, int, int, int]  # (top, bottom, left, right) of the patch map that unpadding keeps
    size: tuple[int, int]  # (height, width) of the kept map after anyres_max downsampling (crop extent if none)

    @property
    def tokens(self) -> int:
        """Features the image takes in the prompt: the base tile, then ``height`` rows of ``width`` + newline."""
        height, width = self.size
        return self.side**2 + height * (width + 1)


def parse_pinpoints(pinpoints: Pinpoints, tile_size: int) -> list[tuple[int, int]]:
    """Candidate (width, height) px resolutions from a checkpoint's ``image_grid_pinpoints``.

    ``"(AxB),...,(CxD)"`` is LLaVA-OneVision's range form: every grid from A..C tiles wide by B..D tiles high
    (only the first and last pair count), times ``tile_size``, widths varying slowest. Otherwise a list of
    (width, height) pixel pairs, or its Python-literal string, as ``config.json`` stores it after training.
    """
    if tile_size <= 0:
        raise ConfigError(f"tile size must be a positive number of pixels, got {tile_size}")
    spec = pinpoints
    if isinstance(spec, str) and "x" in spec:
        found = re.findall(r"\((\d+)x(\d+)\)", spec)
        if not found:
            raise ConfigError(
                f"image_grid_pinpoints {spec!r} has no '(COLSxROWS)' pair; expected e.g. '(1x1),...,(6x6)'"
            )
        (c0, r0), (c1, r1) = (tuple(map(int, pair)) for pair in (found[0], found[-1]))
        grid = [(c * tile_size, r * tile_size) for c in range(c0, c1 + 1) for r in range(r0, r1 + 1)]
        if not grid or min(c0, r0) < 1:
            raise ConfigError(f"image_grid_pinpoints {spec!r} spans no grid; expected '(1x1),...,(CxR)' with C, R >= 1")
        return grid
    if isinstance(spec, str):
        try:
            spec = ast.literal_eval(spec)
        except (ValueError, SyntaxError):
            raise ConfigError(
                f"image_grid_pinpoints {pinpoints!r} is neither '(1x1),...,(CxR)' nor a list of [width, height]"
            ) from None
    try:
        pairs = [(int(w), int(h)) for w, h in spec]
    except (TypeError, ValueError):
        raise ConfigError(f"image_grid_pinpoints {pinpoints!r} is not a list of [width, height] pairs") from None
    bad = [p for p in pairs if min(p) <= 0 or p[0] % tile_size or p[1] % tile_size]
    if not pairs or bad:
        raise ConfigError(
            f"image_grid_pinpoints {pinpoints!r}: {bad or 'no pairs'}; every resolution must be a positive "
            f"multiple of the {tile_size} px tile"
        )
    return pairs


def select_best_resolution(original_size: tuple[int, int], resolutions: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The candidate (width, height) that keeps most of the image's pixels, then wastes fewest (LLaVA-NeXT).

    Each candidate is scored by the area of the image fitted inside it (aspect kept, never counted above the
    original area); ties go to the smaller candidate, then to the earlier one.
    """
    width, height = original_size
    best, best_kept, best_waste = None, -1, math.inf
    for w, h in resolutions:
        scale = min(w / width, h / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        waste = w * h - kept
        if kept > best_kept or (kept == best_kept and waste < best_waste):
            best, best_kept, best_waste = (w, h), kept, waste
    if best is None:
        raise ConfigError("no candidate resolutions to choose from; check image_grid_pinpoints")
    return best


def fitted_size(original: tuple[int, int], target: tuple[int, int]) -> tuple[int, int]:
    """(width, height) of an ``original``-sized image fitted into ``target``, aspect kept (``resize_and_pad``)."""
    width, height = original
    tw, th = target
    if tw / width < th / height:  # width fills, black bands above and below
        return tw, min(math.ceil(height * (tw / width)), th)
    return min(math.ceil(width * (th / height)), tw), th


def anyres_layout(
    grid: tuple[int, int], side: int, original_size: tuple[int, int], max_tiles: int | None = None
) -> AnyresLayout:
    """Which part of a (cols, rows) grid's patch map ``spatial_unpad`` keeps, and its size after downsampling.

    Unpadding crops the [rows*side, cols*side] map symmetrically to the image's aspect ratio: the image side
    scaled into the map is truncated to an integer and the padding on each end is half the rest, rounded down.
    With ``anyres_max_N`` (``max_tiles`` = N), a kept map of h x w patches is resized bilinearly to
    (floor(h / t), floor(w / t)) when t = sqrt(h * w / (N * side**2)) exceeds 1.1. floor(h / t) is 0 only when
    w > N * side**2 * h, which LLaDA-V's 27 x 27 maps (w <= 162) never reach; upstream's interpolation fails
    there, this keeps one row (or column).
    """
    cols, rows = grid
    width, height = original_size
    map_h, map_w = rows * side, cols * side
    if width / height > map_w / map_h:  # the image is wider than the grid: padding was above and below
        kept = int(height * (map_w / width))
        pad = (map_h - kept) // 2
        crop = (pad, map_h - pad, 0, map_w)
    else:
        kept = int(width * (map_h / height))
        pad = (map_w - kept) // 2
        crop = (0, map_h, pad, map_w - pad)
    h, w = crop[1] - crop[0], crop[3] - crop[2]
    if max_tiles is not None:
        times = math.sqrt(h * w / (max_tiles * side**2))
        if times > 1.1:  # at least one row and column: upstream fails on a map shrunk to nothing
            h, w = max(1, int(h // times)), max(1, int(w // times))
    return AnyresLayout(side=side, crop=crop, size=(h, w))


@dataclasses.dataclass(frozen=True)
class AnyresImage:
    """One image tiled as LLaVA-OneVision's "anyres" does: the whole image first, then its grid row by row."""

    tiles: np.ndarray  # [1 + cols * rows, 3, S, S] float32, normalised; tile 0 is the whole image squashed to S
    grid: tuple[int, int]  # (cols, rows): the grid tiles cover the image resized and padded to (cols*S, rows*S)
    original_size: tuple[int, int]  # (width, height) px of the input, which unpadding the features needs

    def feature_layout(self, side: int, max_tiles: int | None = None) -> AnyresLayout:
        """``anyres_layout`` of this image for a tower with ``side`` x ``side`` patches per tile."""
        return anyres_layout(self.grid, side, self.original_size, max_tiles)
