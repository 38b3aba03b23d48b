"""Stage 1, preprocess: a request's text and image -> its prompt embeddings [P, D] (docs/DESIGN.md §3, §5).

In:  prompt text (``<image>`` marks where the picture goes; prepended when an image comes without one), an
     optional system message, an optional image (path, bytes or [H, W, 3] uint8 array, within ``ImageLimits``),
     the export's tokenizer, chat template and vision settings, a ``Backend`` holding the ``embed`` and
     ``vision`` graphs.
Out: ``PromptEmbeds``: prompt ids (``IMAGE_PLACEHOLDER`` where features go) and embeddings [P, D].

The runtime holds no weights: text goes through the ``embed`` graph, pixel tiles through ``vision``; this
file splices them as LLaDA-V's ``prepare_inputs_labels_for_multimodal`` does. Single-tile images ("pad"): the
tile's features, then ``image_newline`` under "unpad" merging. Anyres images: the base tile, then the grid's
patch map cropped, shrunk under ``anyres_max_N`` (bilinear, half-pixel centres, as ``F.interpolate``), each map
row ending with ``image_newline`` (``seer_trt.preprocess.anyres_layout`` is the geometry).
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from pathlib import Path

import numpy as np

from seer_trt.backend import Backend
from seer_trt.errors import ConfigError, InputError, describe
from seer_trt.manifest import Manifest
from seer_trt.preprocess import (
    IMAGE_PLACEHOLDER,
    IMAGE_TOKEN,
    AnyresImage,
    ChatFormat,
    ChatTokenizer,
    anyres_tiles,
    fitted_size,
    parse_pinpoints,
    pixel_tiles,
    select_best_resolution,
)

Image = str | Path | bytes | np.ndarray  # a file path, encoded bytes (PNG, JPEG, ...) or [H, W, 3] uint8 RGB


@dataclasses.dataclass(frozen=True)
class PromptEmbeds:
    ids: tuple[int, ...]  # prompt ids, IMAGE_PLACEHOLDER where image features are spliced
    embeds: np.ndarray  # [P, D] in the graphs' precision, P = text tokens + image features


@dataclasses.dataclass(frozen=True)
class ImageLimits:
    """What an image may cost before it is decoded: a bad or hostile file fails alone, with one line."""

    pixels: int  # most width x height pixels, read from the file's header before any pixel is decoded
    bytes: int  # largest encoded file (path or bytes)

    def __post_init__(self) -> None:
        if isinstance(self.pixels, bool) or isinstance(self.bytes, bool) or min(self.pixels, self.bytes) < 1:
            raise ConfigError(f"image limits must be positive integers, got pixels {self.pixels}, bytes {self.bytes}")


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
    import warnings

    from PIL import Image as PILImage

    source = io.BytesIO(image) if isinstance(image, bytes | bytearray) else Path(image)
    where = "image bytes" if isinstance(source, io.BytesIO) else f"image {source}"
    try:
        size = len(image) if isinstance(image, bytes | bytearray) else source.stat().st_size
    except FileNotFoundError:
        raise InputError(f"{where} does not exist; pass an existing image file") from None
    except (OSError, ValueError) as err:
        raise InputError(f"{where} cannot be read ({describe(err)}); pass a readable image file") from None
    if limits is not None and size > limits.bytes:
        raise InputError(f"{where} is {size} bytes, more than the {limits.bytes} accepted (max_image_bytes); send "
                         f"a smaller file (the model uses far fewer pixels)")  # fmt: skip
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PILImage.DecompressionBombWarning)  # our own limit decides
            with PILImage.open(source) as im:
                original = im.size
                _check_pixels(where, original, limits)
                if needed is not None:
                    im.draft("RGB", needed(original))  # JPEG: decode at a reduced scale, never below ``needed``
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


def resize_bilinear(grid: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """[D, H, W] -> [D, h, w], bilinear with half-pixel centres (``F.interpolate(align_corners=False)``)."""

    def taps(src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = np.maximum((np.arange(dst) + 0.5) * (src / dst) - 0.5, 0.0)
        lo = np.minimum(np.floor(x).astype(np.int64), src - 1)
        return lo, np.minimum(lo + 1, src - 1), (x - lo).astype(grid.dtype)

    (y0, y1, wy), (x0, x1, wx) = taps(grid.shape[1], size[0]), taps(grid.shape[2], size[1])
    rows = grid[:, y0] * (1 - wy)[None, :, None] + grid[:, y1] * wy[None, :, None]  # [D, h, W]
    return rows[:, :, x0] * (1 - wx)[None, None] + rows[:, :, x1] * wx[None, None]


def merge_anyres(features: np.ndarray, newline: np.ndarray, image: AnyresImage, max_tiles: int | None) -> np.ndarray:
    """[1 + cols*rows, T, D] tile features of one anyres image -> its [M, D] prompt features (``spatial_unpad``)."""
    side = int(round(features.shape[1] ** 0.5))
    cols, rows = image.grid
    dim = features.shape[-1]
    layout = image.feature_layout(side, max_tiles)
    grid = features[1:].reshape(rows, cols, side, side, dim).transpose(4, 0, 2, 1, 3)
    grid = grid.reshape(dim, rows * side, cols * side)  # [D, H, W] patch map, tiles as cut
    top, bottom, left, right = layout.crop
    grid = grid[:, top:bottom, left:right]
    if tuple(grid.shape[1:]) != layout.size:
        grid = resize_bilinear(grid, layout.size)
    lines = np.broadcast_to(newline[:, None, None], (dim, grid.shape[1], 1))
    grid = np.concatenate([grid, lines.astype(grid.dtype)], axis=2)  # [D, h, w + 1]
    return np.concatenate([features[0], grid.reshape(dim, -1).T]).astype(features.dtype)


class PromptEncoder:
    """Text and image of one request -> ``PromptEmbeds``, through the backend's ``embed`` and ``vision`` graphs."""

    def __init__(self, folder: str | Path, manifest: Manifest, backend: Backend,
                 limits: ImageLimits | None = None) -> None:  # fmt: skip
        """
        Args:
            limits: what an image may cost before decoding; None: the manifest's (``VisionInfo``).
        """
        tok = Path(folder) / manifest.tokenizer
        chat = ChatFormat.from_folder(tok, system=manifest.system_prompt)
        self.chat_tokenizer = ChatTokenizer(tok / "tokenizer.json", chat)
        self.tokenizer = self.chat_tokenizer.control  # decoding answers
        self.chat = chat
        self.manifest = manifest
        self.backend = backend
        self.float = np.dtype(manifest.precision)
        v = manifest.vision
        self.limits = limits or ImageLimits(v.max_image_pixels, v.max_image_bytes)

    def ids(self, prompt: str, has_image: bool, system: str | None = None) -> list[int]:
        """Prompt ids of one user turn; ``<image>`` is prepended when an image comes without a placeholder.
        The prompt and ``system`` are text: special-token strings in them stay text (``ChatTokenizer``)."""
        if not prompt or not prompt.strip():
            raise InputError("the prompt is empty; send the question as text")
        n_tokens = prompt.count(IMAGE_TOKEN)
        if has_image and n_tokens == 0:
            prompt = f"{IMAGE_TOKEN}\n{prompt}"
        elif n_tokens != (1 if has_image else 0):
            raise InputError(
                f"the prompt holds {n_tokens} {IMAGE_TOKEN} placeholder(s) for {int(has_image)} image(s); use one "
                f"{IMAGE_TOKEN} per image (or none: it is prepended)"
            )
        return self.chat_tokenizer.encode(prompt, system)

    def needed_size(self, original: tuple[int, int]) -> tuple[int, int]:
        """The smallest (width, height) preprocessing resizes an image of ``original`` size to."""
        v = self.manifest.vision
        if not v.image_aspect_ratio.startswith("anyres"):
            return v.image_size, v.image_size
        fitted = fitted_size(
            original, select_best_resolution(original, parse_pinpoints(v.grid_pinpoints, v.image_size))
        )
        return max(fitted[0], v.image_size), max(fitted[1], v.image_size)

    def image_features(self, image: np.ndarray, original: tuple[int, int] | None = None) -> np.ndarray:
        """[M, D] features of one image, as its placeholder is replaced (``original``: its size before a reduced
        decode, which anyres tiling chooses its grid from)."""
        v = self.manifest.vision
        if v.image_aspect_ratio.startswith("anyres"):
            tiled = anyres_tiles(image, v.image_size, v.grid_pinpoints, v.pixel_mean, v.pixel_std, original)
            out = self.backend.run("vision", {"pixel_values": tiled.tiles.astype(self.float)})
            return merge_anyres(out["image_features"], out["image_newline"], tiled, v.anyres_max_tiles)
        tiles = pixel_tiles(image, v.image_size, v.pixel_mean, v.pixel_std).astype(self.float)
        out = self.backend.run("vision", {"pixel_values": tiles})
        feats = out["image_features"][0]
        return np.concatenate([feats, out["image_newline"][None]]) if v.newline == "unpad" else feats.copy()

    def encode(self, prompt: str, image: Image | None = None, system: str | None = None) -> PromptEmbeds:
        """Prompt ids and embeddings of one request (``system``: None for the export's system message).

        Raises:
            InputError: an empty prompt, misplaced ``<image>`` placeholders, or an unreadable or too large image.
        """
        pixels, original = (None, None) if image is None else load_image(image, self.limits, self.needed_size)
        ids = self.ids(prompt, pixels is not None, system)
        parts: list[np.ndarray] = []
        text: list[int] = []
        for i in [*ids, None]:
            if (i is None or i == IMAGE_PLACEHOLDER) and text:
                out = self.backend.run("embed", {"input_ids": np.array([text], dtype=np.int64)})
                parts.append(out["embeds"][0].copy())  # the backend reuses its output buffers
                text = []
            if i == IMAGE_PLACEHOLDER:
                parts.append(self.image_features(pixels, original))
            elif i is not None:
                text.append(i)
        return PromptEmbeds(ids=tuple(ids), embeds=np.concatenate(parts).astype(self.float))
