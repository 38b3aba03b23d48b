"""Stage 1c, embed: prompt ids and a prepared image -> the prompt's embeddings [P, D] (docs/DESIGN.md "The model
(LLaDA-V) in plain PyTorch", "Graphs and their contract").

In:  prompt ids (``IMAGE_PLACEHOLDER`` where features go, ``seer_trt.runtime.prompt``), an optional
     ``PreparedImage`` (tiles and their layout, ``seer_trt.runtime.image``), a ``Backend`` holding the ``embed``
     and ``vision`` graphs.
Out: ``PromptEmbeds``: the prompt ids and embeddings [P, D] in the graphs' precision.

The runtime holds no weights: text goes through the ``embed`` graph, pixel tiles through ``vision``; this
file splices them as LLaDA-V's ``prepare_inputs_labels_for_multimodal`` does. Single-tile images ("pad"): the
tile's features, then ``image_newline`` under "unpad" merging. Anyres images: the base tile, then the grid's
patch map cropped, shrunk under ``anyres_max_N`` (bilinear, half-pixel centres, as ``F.interpolate``), each map
row ending with ``image_newline`` (the image's ``AnyresLayout`` says where).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from seer_trt.contracts.backend import Backend
from seer_trt.contracts.geometry import IMAGE_PLACEHOLDER, AnyresLayout
from seer_trt.contracts.graphs import graph_precision
from seer_trt.contracts.manifest import Manifest
from seer_trt.runtime.image import PreparedImage


@dataclasses.dataclass(frozen=True)
class PromptEmbeds:
    ids: tuple[int, ...]  # prompt ids, IMAGE_PLACEHOLDER where image features are spliced
    embeds: np.ndarray  # [P, D] in the graphs' precision, P = text tokens + image features


def resize_bilinear(grid: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """[D, H, W] -> [D, h, w], bilinear with half-pixel centres (``F.interpolate(align_corners=False)``)."""

    def taps(src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = np.maximum((np.arange(dst) + 0.5) * (src / dst) - 0.5, 0.0)
        lo = np.minimum(np.floor(x).astype(np.int64), src - 1)
        return lo, np.minimum(lo + 1, src - 1), (x - lo).astype(grid.dtype)

    (y0, y1, wy), (x0, x1, wx) = taps(grid.shape[1], size[0]), taps(grid.shape[2], size[1])
    rows = grid[:, y0] * (1 - wy)[None, :, None] + grid[:, y1] * wy[None, :, None]  # [D, h, W]
    return rows[:, :, x0] * (1 - wx)[None, None] + rows[:, :, x1] * wx[None, None]


def merge_anyres(features: np.ndarray, newline: np.ndarray, grid: tuple[int, int], layout: AnyresLayout) -> np.ndarray:
    """[1 + cols*rows, T, D] tile features of one anyres image -> its [M, D] prompt features (``spatial_unpad``)."""
    side = layout.side
    cols, rows = grid
    dim = features.shape[-1]
    patches = features[1:].reshape(rows, cols, side, side, dim).transpose(4, 0, 2, 1, 3)
    patches = patches.reshape(dim, rows * side, cols * side)  # [D, H, W] patch map, tiles as cut
    top, bottom, left, right = layout.crop
    patches = patches[:, top:bottom, left:right]
    if tuple(patches.shape[1:]) != layout.size:
        patches = resize_bilinear(patches, layout.size)
    lines = np.broadcast_to(newline[:, None, None], (dim, patches.shape[1], 1))
    patches = np.concatenate([patches, lines.astype(patches.dtype)], axis=2)  # [D, h, w + 1]
    return np.concatenate([features[0], patches.reshape(dim, -1).T]).astype(features.dtype)


class Embedder:
    """Prompt ids and a prepared image -> ``PromptEmbeds``, through the backend's ``embed`` and ``vision`` graphs."""

    def __init__(self, manifest: Manifest, backend: Backend) -> None:
        self.manifest = manifest
        self.backend = backend
        self.float = np.dtype(manifest.precision)

    def image_features(self, image: PreparedImage) -> np.ndarray:
        """[M, D] features of one image, as its placeholder is replaced: the vision graph's, or, for an image
        tokenizer (MMaDA), the embeddings of the ids the ``image_tokens`` graph gives."""
        if self.manifest.vision.encoder == "magvitv2":
            pixels = image.tiles.astype(graph_precision("image_tokens", self.manifest.precision))  # fp32 always
            ids = self.backend.run("image_tokens", {"pixel_values": pixels})["image_ids"]
            out = self.backend.run("embed", {"input_ids": np.ascontiguousarray(ids[:1], dtype=np.int64)})
            return out["embeds"][0].copy()  # the backend reuses its output buffers
        out = self.backend.run("vision", {"pixel_values": image.tiles.astype(self.float)})
        if image.layout is not None:
            return merge_anyres(out["image_features"], out["image_newline"], image.grid, image.layout)
        feats = out["image_features"][0]
        unpad = self.manifest.vision.newline == "unpad"
        return np.concatenate([feats, out["image_newline"][None]]) if unpad else feats.copy()

    def embed(self, ids: list[int], image: PreparedImage | None = None) -> PromptEmbeds:
        """Embeddings of a prompt's ids, the image's features where its placeholder stands."""
        parts: list[np.ndarray] = []
        text: list[int] = []
        for i in [*ids, None]:
            if (i is None or i == IMAGE_PLACEHOLDER) and text:
                out = self.backend.run("embed", {"input_ids": np.array([text], dtype=np.int64)})
                parts.append(out["embeds"][0].copy())  # the backend reuses its output buffers
                text = []
            if i == IMAGE_PLACEHOLDER:
                parts.append(self.image_features(image))
            elif i is not None:
                text.append(i)
        return PromptEmbeds(ids=tuple(ids), embeds=np.concatenate(parts).astype(self.float))
