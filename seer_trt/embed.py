"""Stage 1, preprocess: a request's text and image -> its prompt embeddings [P, D] (DESIGN §3, §5).

In:  prompt text (``<image>`` marks where the picture goes; prepended when an image comes without one), an
     optional image (path, bytes or [H, W, 3] uint8 array), the export's tokenizer, chat template and vision
     settings, a ``Backend`` holding the ``embed`` and ``vision`` graphs.
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
from pathlib import Path

import numpy as np

from seer_trt.backend import Backend
from seer_trt.errors import InputError
from seer_trt.manifest import Manifest
from seer_trt.preprocess import (
    IMAGE_PLACEHOLDER,
    IMAGE_TOKEN,
    AnyresImage,
    ChatFormat,
    anyres_tiles,
    pixel_tiles,
    tokenize_prompt,
)

Image = str | Path | bytes | np.ndarray  # a file path, encoded bytes (PNG, JPEG, ...) or [H, W, 3] uint8 RGB


@dataclasses.dataclass(frozen=True)
class PromptEmbeds:
    ids: tuple[int, ...]  # prompt ids, IMAGE_PLACEHOLDER where image features are spliced
    embeds: np.ndarray  # [P, D] in the graphs' precision, P = text tokens + image features


def load_image(image: Image) -> np.ndarray:
    """[H, W, 3] uint8 RGB from a path, encoded bytes or an array.

    Raises:
        InputError: the file is missing or not an image, or the array is not [H, W, 3] uint8.
    """
    if isinstance(image, np.ndarray):
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8 or 0 in image.shape:
            raise InputError(f"image array has shape {image.shape} {image.dtype}; expected [H, W, 3] uint8 RGB")
        return image
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    source = io.BytesIO(image) if isinstance(image, bytes | bytearray) else Path(image)
    where = "image bytes" if isinstance(source, io.BytesIO) else f"image {source}"
    try:
        with PILImage.open(source) as im:
            return np.asarray(im.convert("RGB"))
    except FileNotFoundError:
        raise InputError(f"{where} does not exist; pass an existing image file") from None
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise InputError(f"{where} is not a readable image ({err}); pass a PNG or JPEG file") from None


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

    def __init__(self, folder: str | Path, manifest: Manifest, backend: Backend) -> None:
        from tokenizers import Tokenizer

        tok = Path(folder) / manifest.tokenizer
        try:
            self.tokenizer = Tokenizer.from_file(str(tok / "tokenizer.json"))
        except Exception as err:  # tokenizers raises its own Exception type for a corrupt file
            raise InputError(f"cannot read the tokenizer {tok / 'tokenizer.json'} ({err}); re-export") from None
        self.chat = ChatFormat.from_folder(tok, system=manifest.system_prompt)
        self.manifest = manifest
        self.backend = backend
        self.float = np.dtype(manifest.precision)

    def ids(self, prompt: str, has_image: bool) -> list[int]:
        """Prompt ids of one user turn; ``<image>`` is prepended when an image comes without a placeholder."""
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
        return tokenize_prompt(self.tokenizer, self.chat.render(prompt))

    def image_features(self, image: np.ndarray) -> np.ndarray:
        """[M, D] features of one image, as its placeholder is replaced."""
        v = self.manifest.vision
        if v.image_aspect_ratio.startswith("anyres"):
            tiled = anyres_tiles(image, v.image_size, v.grid_pinpoints, v.pixel_mean, v.pixel_std)
            out = self.backend.run("vision", {"pixel_values": tiled.tiles.astype(self.float)})
            return merge_anyres(out["image_features"], out["image_newline"], tiled, v.anyres_max_tiles)
        tiles = pixel_tiles(image, v.image_size, v.pixel_mean, v.pixel_std).astype(self.float)
        out = self.backend.run("vision", {"pixel_values": tiles})
        feats = out["image_features"][0]
        return np.concatenate([feats, out["image_newline"][None]]) if v.newline == "unpad" else feats.copy()

    def encode(self, prompt: str, image: Image | None = None) -> PromptEmbeds:
        """Prompt ids and embeddings of one request.

        Raises:
            InputError: an empty prompt, misplaced ``<image>`` placeholders, or an unreadable image.
        """
        pixels = None if image is None else load_image(image)
        ids = self.ids(prompt, pixels is not None)
        parts: list[np.ndarray] = []
        text: list[int] = []
        for i in [*ids, None]:
            if (i is None or i == IMAGE_PLACEHOLDER) and text:
                out = self.backend.run("embed", {"input_ids": np.array([text], dtype=np.int64)})
                parts.append(out["embeds"][0].copy())  # the backend reuses its output buffers
                text = []
            if i == IMAGE_PLACEHOLDER:
                parts.append(self.image_features(pixels))
            elif i is not None:
                text.append(i)
        return PromptEmbeds(ids=tuple(ids), embeds=np.concatenate(parts).astype(self.float))
