"""Stage 1b, image: a request's image -> pixel tiles and their layout, bounded before decoding (docs/DESIGN.md
"The model (LLaDA-V) in plain PyTorch").

In:  a path, encoded bytes or an [H, W, 3] uint8 array; the export's ``VisionInfo``; ``ImageLimits``.
Out: ``PreparedImage``: SigLIP-normalised tiles [T, 3, S, S] float32 and, for "anyres", the grid and original size
     from which ``embed`` merges the tile features (``seer_trt.contracts.geometry`` gives the geometry).

Limits come first: the file size, then the pixel count from the header, before any pixel is decoded; a JPEG
decodes at the smallest scale the tiling needs. One tile per image in the "pad" mode (``pixel_tiles``) and in MMaDA's
"center_crop" (``center_crop_tile``), or LLaVA-OneVision's "anyres" tiling (``anyres_tiles``: the whole image, then a
grid of tiles chosen from the checkpoint's grid pinpoints). PIL for decoding and resizing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from seer_trt.contracts.errors import ConfigError, InputError, describe
from seer_trt.contracts.geometry import (
    LLADA_V_PINPOINTS,
    AnyresImage,
    AnyresLayout,
    Pinpoints,
    fitted_size,
    parse_pinpoints,
    select_best_resolution,
)
from seer_trt.contracts.manifest import VisionInfo


def pixel_tiles(image: np.ndarray, size: int, mean: float = 0.5, std: float = 0.5) -> np.ndarray:
    """SigLIP normalisation of one RGB image into a single tile [1, 3, size, size] float32."""
    arr = _check_rgb(image)
    if arr.shape[:2] != (size, size):
        arr = _resize(arr.astype(np.uint8), (size, size))
    return _normalise(arr[None], mean, std)


def center_crop_tile(image: np.ndarray, size: int, mean: float = 0.5, std: float = 0.5) -> np.ndarray:
    """MMaDA's ``image_transform`` of one RGB image into a tile [1, 3, size, size] float32: bicubic resize of the
    short side to ``size`` (the long one to int(size * long / short), torchvision's ``Resize(size)``), a centre crop
    at round((side - size) / 2) (``CenterCrop``), then (x / 255 - mean) / std."""
    arr = _check_rgb(image).astype(np.uint8)
    h, w = arr.shape[:2]
    short, long = min(h, w), max(h, w)
    new_long = int(size * long / short)
    arr = _resize(arr, (size, new_long) if w < h else (new_long, size))
    h, w = arr.shape[:2]
    top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    return _normalise(arr[None, top : top + size, left : left + size], mean, std)


def resize_and_pad(image: np.ndarray, target: tuple[int, int], original: tuple[int, int] | None = None) -> np.ndarray:
    """Fit [H, W, 3] uint8 into ``target`` (width, height), aspect kept, centred on black: [height, width, 3].

    ``original``: the image's (width, height) before a reduced-scale decode, which the fit is computed from.
    """
    tw, th = target
    nw, nh = fitted_size(original or (image.shape[1], image.shape[0]), target)
    out = np.zeros((th, tw, 3), dtype=np.uint8)
    top, left = (th - nh) // 2, (tw - nw) // 2
    out[top : top + nh, left : left + nw] = _resize(image, (nw, nh))
    return out


def anyres_tiles(
    image: np.ndarray,
    tile_size: int,
    pinpoints: Pinpoints = LLADA_V_PINPOINTS,
    mean: float = 0.5,
    std: float = 0.5,
    original_size: tuple[int, int] | None = None,
) -> AnyresImage:
    """LLaVA-OneVision "anyres" tiling of one [H, W, 3] uint8 image, SigLIP-normalised.

    The grid resolution is ``select_best_resolution`` over ``pinpoints``; the image is resized and padded to
    it and cut into S x S tiles row by row. The base tile (the whole image squashed to S x S, not padded)
    comes first. Pixels: bicubic resize, x / 255, then (x - mean) / std per channel. ``original_size``: the
    image's (width, height) when ``image`` was decoded at a reduced scale; the grid and the unpadding follow it.
    """
    arr = _check_rgb(image)
    if arr.dtype != np.uint8:
        raise InputError(
            f"image dtype is {arr.dtype}, expected uint8 RGB; convert 0..1 floats with (x * 255).astype(np.uint8)"
        )
    width, height = original_size or (arr.shape[1], arr.shape[0])
    tw, th = select_best_resolution((width, height), parse_pinpoints(pinpoints, tile_size))
    cols, rows = tw // tile_size, th // tile_size
    padded = resize_and_pad(arr, (tw, th), (width, height))  # [th, tw, 3]
    grid = padded.reshape(rows, tile_size, cols, tile_size, 3).transpose(0, 2, 1, 3, 4)
    grid = grid.reshape(rows * cols, tile_size, tile_size, 3)  # row-major tiles
    base = _resize(arr, (tile_size, tile_size))[None]
    tiles = _normalise(np.concatenate([base, grid]), mean, std)
    return AnyresImage(tiles=tiles, grid=(cols, rows), original_size=(width, height))


def _check_rgb(image: np.ndarray) -> np.ndarray:
    arr = np.asarray(image)
    if arr.ndim != 3 or arr.shape[2] != 3 or 0 in arr.shape:
        raise InputError(f"image must be a non-empty [H, W, 3] RGB array, got shape {arr.shape}")
    return arr


def _resize(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Bicubic resize of [H, W, 3] uint8 to ``size`` (width, height), as PIL's default resize does."""
    if image.shape[1::-1] == size:
        return image
    from PIL import Image

    return np.asarray(Image.fromarray(image).resize(size, Image.BICUBIC))


def _normalise(images: np.ndarray, mean: float, std: float) -> np.ndarray:
    """[N, S, S, 3] pixels 0..255 -> [N, 3, S, S] float32, (x / 255 - mean) / std."""
    x = (images.astype(np.float32) / 255.0 - mean) / std
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


Image = str | Path | bytes | np.ndarray  # a file path, encoded bytes (PNG, JPEG, ...) or [H, W, 3] uint8 RGB


@dataclasses.dataclass(frozen=True)
class ImageLimits:
    """What an image may cost before it is decoded: a bad or hostile file fails alone, with one line."""

    pixels: int  # most width x height pixels, read from the file's header before any pixel is decoded
    bytes: int  # largest encoded file (path or bytes)
    decoded: int | None = None  # most pixels decoded (after a JPEG's reduced-scale decode); None: no own limit

    def __post_init__(self) -> None:
        values = (self.pixels, self.bytes, self.pixels if self.decoded is None else self.decoded)
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
            raise ConfigError(f"image limits must be positive integers, got pixels {self.pixels}, bytes {self.bytes}, "
                              f"decoded {self.decoded}")  # fmt: skip

    @classmethod
    def of(cls, vision: VisionInfo) -> ImageLimits:
        """An export's limits: its manifest's, the decode limit following what its tiling can use by default."""
        decoded = vision.max_decoded_pixels or decoded_pixel_limit(vision)
        return cls(vision.max_image_pixels, min(vision.max_image_bytes, encoded_byte_limit(decoded)), decoded)


DECODE_HEADROOM = 4  # an image may decode to this many times the pixels of the largest input the tiling makes
DECODE_FLOOR = 2048 * 2048  # and to this many whatever the tiling (a small fixture still takes a normal photo)


def encoded_byte_limit(decoded_pixels: int) -> int:
    """The largest encoded file worth reading for a decode limit: an image that decodes whole is stored in no more
    than 8 bytes a pixel (16-bit RGBA, uncompressed) plus 1 MiB of headers; a JPEG decoded at reduced scale is
    smaller than that for the pixels it keeps. (The fixture: 33 MiB where the manifest says 50.)"""
    return 8 * decoded_pixels + 2**20


def largest_input(vision: VisionInfo) -> tuple[int, int]:
    """The largest (width, height) the tiling resizes an image to: one tile ("pad"), or the largest grid."""
    if not vision.image_aspect_ratio.startswith("anyres"):
        return vision.image_size, vision.image_size
    return max(parse_pinpoints(vision.grid_pinpoints, vision.image_size), key=lambda wh: wh[0] * wh[1])


def decoded_pixel_limit(vision: VisionInfo) -> int:
    """The default decode limit: ``DECODE_HEADROOM`` times the largest input's pixels, at least ``DECODE_FLOOR``.
    Decoding costs memory and time in proportion to the pixels; beyond this the model sees nothing more, since
    every image is resized down to at most ``largest_input`` (LLaDA-V: 2304 x 2304 px, a 21.2 MP limit)."""
    w, h = largest_input(vision)
    return max(DECODE_HEADROOM * w * h, DECODE_FLOOR)


def load_image(image: Image, limits: ImageLimits | None = None,
               needed: Callable[[tuple[int, int]], tuple[int, int]] | None = None) -> tuple[np.ndarray, tuple[int, int]]:  # fmt: skip
    """[H, W, 3] uint8 RGB from a path, encoded bytes or an array, and the image's original (width, height).

    ``limits`` are checked before decoding: the file size first, then the pixel count from the header. With
    ``needed`` (original size -> the smallest (width, height) the preprocessing resizes to), formats that can
    decode at a reduced scale (JPEG's DCT scaling, through Pillow's ``draft``) decode at no less than that, so a
    huge photo never exists in memory at full size; other formats decode whole, within ``limits``.

    Raises:
        InputError: the file is missing, too large or not an image, or the array is not [H, W, 3] uint8.
    """
    if isinstance(image, np.ndarray):
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8 or 0 in image.shape:
            raise InputError(f"image array has shape {image.shape} {image.dtype}; expected [H, W, 3] uint8 RGB")
        _check_pixels("image array", (image.shape[1], image.shape[0]), limits)
        return image, (image.shape[1], image.shape[0])
    if not isinstance(image, str | Path | bytes | bytearray):
        raise InputError(f"image is a {type(image).__name__}; pass a file path, encoded bytes or an [H, W, 3] array")
    if isinstance(image, bytes | bytearray):
        where, source = "image bytes", io.BytesIO(image)
        size = len(image)
    else:
        where = f"image {image}"
        source, size = _open_regular(Path(image), where)
    with contextlib.ExitStack() as stack:
        stack.callback(source.close)
        if limits is not None and size > limits.bytes:
            raise InputError(f"{where} is {size} bytes, more than the {limits.bytes} accepted (max_image_bytes); "
                             f"send a smaller file (the model uses far fewer pixels)")  # fmt: skip
        return _decode(source, where, limits, needed)


def _open_regular(path: Path, where: str) -> tuple[BinaryIO, int]:
    """A regular file opened for reading, and its size; anything else (a FIFO, which would block until some
    process writes to it, a device, a socket, a folder) is refused without waiting.

    Raises:
        InputError: missing, not a regular file, or unreadable.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"{where} does not exist; pass an existing image file") from None
    except IsADirectoryError:
        raise InputError(f"{where} is a folder; pass an image file") from None
    except (OSError, ValueError) as err:
        raise InputError(f"{where} cannot be read ({describe(err)}); pass a readable image file") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = ("a folder" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode)
                else "a socket" if stat.S_ISSOCK(info.st_mode) else "a device")  # fmt: skip
        raise InputError(f"{where} is {kind}, not a regular file; pass an image file")
    return os.fdopen(fd, "rb"), info.st_size


def _decode(source: BinaryIO, where: str, limits: ImageLimits | None,
            needed: Callable[[tuple[int, int]], tuple[int, int]] | None) -> tuple[np.ndarray, tuple[int, int]]:  # fmt: skip
    """Pixels and original size of an opened image, within ``limits`` (see ``load_image``)."""
    import warnings

    from PIL import Image as PILImage

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PILImage.DecompressionBombWarning)  # our own limit decides
            with PILImage.open(source) as im:
                original = im.size
                _check_pixels(where, original, limits)
                if needed is not None:
                    im.draft("RGB", needed(original))  # JPEG: decode at a reduced scale, never below ``needed``
                if limits is not None and limits.decoded is not None and im.size[0] * im.size[1] > limits.decoded:
                    raise InputError(
                        f"{where} is {original[0]}x{original[1]} px and would decode to {im.size[0] * im.size[1]} "
                        f"pixels, more than the {limits.decoded} accepted (max_decoded_pixels: what this export's "
                        f"tiling can use, with headroom); send a smaller image, or a JPEG (it decodes at a reduced "
                        f"scale)"
                    )
                return np.asarray(im.convert("RGB")), original
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(f"{where} does not exist; pass an existing image file") from None
    except PILImage.DecompressionBombError as err:  # past Pillow's own ceiling, which it checks before we can
        accepted = f"the {limits.pixels} accepted (max_image_pixels)" if limits else "Pillow accepts"
        raise InputError(f"{where} has more pixels than {accepted} ({describe(err)}); send a smaller image") from None
    except Exception as err:  # Pillow raises many types (OSError, ValueError, SyntaxError...) for a corrupt file
        reason = "not a format Pillow reads" if isinstance(err, PILImage.UnidentifiedImageError) else describe(err)
        raise InputError(f"{where} is not a readable image ({reason}); pass a PNG or JPEG file") from None


def _check_pixels(where: str, size: tuple[int, int], limits: ImageLimits | None) -> None:
    if limits is not None and size[0] * size[1] > limits.pixels:
        raise InputError(f"{where} is {size[0]}x{size[1]} = {size[0] * size[1]} pixels, more than the {limits.pixels} "
                         f"accepted (max_image_pixels); send a smaller image")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class PreparedImage:
    """One image ready for the ``vision`` graph, and where its features go in the prompt (``embed`` consumes it)."""

    tiles: np.ndarray  # [T, 3, S, S] float32, SigLIP-normalised: one tile ("pad"), or the base tile then the grid
    grid: tuple[int, int] | None  # anyres: (cols, rows) of the grid tiles; None: a single tile
    original_size: tuple[int, int]  # (width, height) px of the image as sent, before any reduced decode
    layout: AnyresLayout | None  # anyres: the patch map's crop and size after unpadding; None: a single tile


def needed_size(original: tuple[int, int], vision: VisionInfo) -> tuple[int, int]:
    """The smallest (width, height) tiling resizes an image of ``original`` size to (a JPEG decodes no smaller)."""
    if not vision.image_aspect_ratio.startswith("anyres"):
        return vision.image_size, vision.image_size
    target = select_best_resolution(original, parse_pinpoints(vision.grid_pinpoints, vision.image_size))
    fitted = fitted_size(original, target)
    return max(fitted[0], vision.image_size), max(fitted[1], vision.image_size)


def prepare_image(image: Image, vision: VisionInfo, limits: ImageLimits | None = None) -> PreparedImage:
    """Decode ``image`` within ``limits`` and tile it as the export's vision settings say.

    Raises:
        InputError: the image is missing, too large or not an image.
    """
    pixels, original = load_image(image, limits, lambda size: needed_size(size, vision))
    if vision.image_aspect_ratio == "center_crop":
        tiles = center_crop_tile(pixels, vision.image_size, vision.pixel_mean, vision.pixel_std)
        return PreparedImage(tiles, None, original, None)
    if not vision.image_aspect_ratio.startswith("anyres"):
        tiles = pixel_tiles(pixels, vision.image_size, vision.pixel_mean, vision.pixel_std)
        return PreparedImage(tiles, None, original, None)
    tiled = anyres_tiles(
        pixels, vision.image_size, vision.grid_pinpoints, vision.pixel_mean, vision.pixel_std, original
    )
    side = round(vision.tokens_per_tile**0.5)  # patches per tile side
    layout = tiled.feature_layout(side, vision.anyres_max_tiles)
    return PreparedImage(tiled.tiles, tiled.grid, tiled.original_size, layout)
