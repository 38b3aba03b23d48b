"""Preprocess: chat template, tokenization with image placeholders, and pixel normalisation.

In:  a user message (``<image>`` marks where the picture goes), an optional image [H, W, 3] uint8.
Out: prompt ids with ``IMAGE_PLACEHOLDER`` where image features are spliced, and pixel tiles [N, 3, S, S]:
     one tile per image (``pixel_tiles``, the "pad" aspect-ratio mode) or LLaVA-OneVision's "anyres" tiling
     (``anyres_tiles``: the whole image, then a grid of tiles chosen from the checkpoint's grid pinpoints).

Uses the light ``tokenizers`` package and jinja2 (the tokenizer's own chat template), never transformers;
PIL for resizing. User text is text: only the chat template's own text may hold control tokens; a message's
content is tokenized with special-token matching off (``ChatTokenizer``), so typing ``<|eot_id|>`` cannot end a
turn or forge one. ``anyres_layout`` gives the feature-side geometry of ``spatial_unpad`` merging (which rows
and columns of the grid's patch map survive unpadding and the ``anyres_max_N`` downsampling), so the exporter
and the runtime agree on how many features an image takes.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import math
import re
import secrets
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from seer_trt.errors import ConfigError, InputError

IMAGE_TOKEN = "<image>"
IMAGE_PLACEHOLDER = -200  # LLaDA-V's IMAGE_TOKEN_INDEX: not a vocabulary id, replaced by image features
LLADA_V_PINPOINTS = "(1x1),...,(6x6)"  # LLaDA-V's image_grid_pinpoints: every grid of 1..6 x 1..6 tiles

Pinpoints = str | Sequence[Sequence[int]]  # "(1x1),...,(6x6)", "[(384, 768), ...]" or [[w, h], ...] px


@dataclasses.dataclass(frozen=True)
class ChatFormat:
    """The tokenizer's chat template and what it needs, from ``tokenizer_config.json``."""

    template: str  # jinja2 source, as HF tokenizers store it
    bos_token: str  # <|startoftext|> for LLaDA-V
    system: str | None = None  # default system message, None for none

    @classmethod
    def from_folder(cls, folder: str | Path, system: str | None = None) -> ChatFormat:
        path = Path(folder) / "tokenizer_config.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ConfigError(f"cannot read the chat template from {path} ({err})") from None
        if "chat_template" not in data:
            raise ConfigError(f"{path} has no 'chat_template'; LLaDA-V tokenizers ship one")
        bos = data.get("bos_token")
        bos = bos["content"] if isinstance(bos, dict) else bos
        return cls(template=data["chat_template"], bos_token=bos or "", system=system)

    @functools.cached_property
    def _compiled(self):
        import jinja2

        return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(self.template)

    def _render(self, contents: Sequence[str]) -> str:
        """The template over ``contents``: (system, user) when there are two, (user,) otherwise."""
        roles = ("system", "user")[-len(contents) :]
        messages = [{"role": r, "content": c} for r, c in zip(roles, contents, strict=True)]
        return self._compiled.render(messages=messages, bos_token=self.bos_token, add_generation_prompt=True)

    def render(self, user: str, system: str | None = None) -> str:
        """The full prompt text for one user turn, ending with the assistant header (``system``: None for the
        default system message, "" for none)."""
        return "".join(text for text, _ in self.segments(user, system))

    def segments(self, user: str, system: str | None = None) -> list[tuple[str, str | None]]:
        """The prompt as (text, role) pieces, in order: role None for the template's own text, "system" or "user"
        for message content.

        The template's own text (role headers, ``<|eot_id|>``, BOS) is what may hold control tokens; message
        content is the user's and is tokenized as plain text (``ChatTokenizer``). Each content goes through the
        template as it would whole (its ``trim`` and the like applied): the template is rendered with an
        unguessable slot per content, then once per content with only that slot filled, and the text between
        the slot's neighbours is the content as placed.

        Raises:
            ConfigError: the template does not place each message's content exactly once, as one piece.
        """
        system = self.system if system is None else system
        roles, contents = (["system", "user"], [system, user]) if system else (["user"], [user])
        nonce = secrets.token_hex(8)
        slots = [f"\x00seer-content-{i}-{nonce}\x00" for i in range(len(contents))]
        base = self._render(slots)
        placed = []
        for i, content in enumerate(contents):
            if base.count(slots[i]) != 1:
                raise ConfigError(f"the chat template places message content {base.count(slots[i])} times, expected "
                                  f"once; seer-trt cannot keep user text apart from its control tokens")  # fmt: skip
            start = base.index(slots[i])
            prefix, suffix = base[:start], base[start + len(slots[i]) :]
            filled = self._render([content if j == i else s for j, s in enumerate(slots)])
            if not (filled.startswith(prefix) and filled.endswith(suffix) and len(filled) >= len(prefix) + len(suffix)):
                raise ConfigError("the chat template renders around message content differently depending on the "
                                  "content; seer-trt cannot keep user text apart from its control tokens")  # fmt: skip
            placed.append(filled[len(prefix) : len(filled) - len(suffix)])
        pieces: list[tuple[str, str | None]] = []
        rest = base
        for slot, text, role in sorted(zip(slots, placed, roles, strict=True), key=lambda p: base.index(p[0])):
            head, _, rest = rest.partition(slot)
            pieces += [(head, None), (text, role)]
        pieces.append((rest, None))
        return [(text, role) for text, role in pieces if text]


class ChatTokenizer:
    """Prompt ids of one turn: the template's text with its control tokens, message content as plain text.

    Two ``tokenizers.Tokenizer``s over one ``tokenizer.json``: one matches the added tokens (``<|eot_id|>``,
    headers, BOS) in the template's own text; the other has ``encode_special_tokens`` set, so a special-token
    string typed by a user is split like any other text and never becomes a control id. (Two instances, since
    that flag is state of the tokenizer and a pipeline may encode from several threads at once.)
    """

    def __init__(self, tokenizer_json: str | Path, chat: ChatFormat) -> None:
        """
        Raises:
            InputError: the tokenizer file is missing or corrupt.
        """
        from tokenizers import Tokenizer

        try:
            self.control = Tokenizer.from_file(str(tokenizer_json))
            self.text = Tokenizer.from_file(str(tokenizer_json))
        except Exception as err:  # tokenizers raises its own Exception type for a corrupt file
            raise InputError(f"cannot read the tokenizer {tokenizer_json} ({err}); re-export") from None
        self.text.encode_special_tokens = True
        self.chat = chat
        self.special_ids = frozenset(i for i, t in self.control.get_added_tokens_decoder().items() if t.special)

    def user_ids(self, text: str, images: bool) -> list[int]:
        """Ids of message content; with ``images``, ``IMAGE_PLACEHOLDER`` for every ``<image>``.

        Raises:
            InputError: the tokenizer maps the text to a control token anyway (a vocabulary holding one as a word).
        """
        ids: list[int] = []
        for k, chunk in enumerate(text.split(IMAGE_TOKEN) if images else [text]):
            if k:
                ids.append(IMAGE_PLACEHOLDER)
            if chunk:
                ids.extend(self.text.encode(chunk, add_special_tokens=False).ids)
        control = sorted(self.special_ids.intersection(ids))
        if control:
            raise InputError(f"this tokenizer encodes the message text to control token(s) "
                             f"{[self.control.id_to_token(i) for i in control]}; remove them from the text")  # fmt: skip
        return ids

    def encode(self, user: str, system: str | None = None) -> list[int]:
        """Prompt ids of one user turn, ``IMAGE_PLACEHOLDER`` for every ``<image>`` of the user's message
        (``tokenizer_image_token``); ``system``: None for the default system message, "" for none."""
        ids: list[int] = []
        for text, role in self.chat.segments(user, system):
            if role is None:
                ids.extend(self.control.encode(text, add_special_tokens=False).ids)
            else:
                ids.extend(self.user_ids(text, images=role == "user"))
        return ids


def pixel_tiles(image: np.ndarray, size: int, mean: float = 0.5, std: float = 0.5) -> np.ndarray:
    """SigLIP normalisation of one RGB image into a single tile [1, 3, size, size] float32."""
    arr = _check_rgb(image)
    if arr.shape[:2] != (size, size):
        arr = _resize(arr.astype(np.uint8), (size, size))
    return _normalise(arr[None], mean, std)


@dataclasses.dataclass(frozen=True)
class AnyresImage:
    """One image tiled as LLaVA-OneVision's "anyres" does: the whole image first, then its grid row by row."""

    tiles: np.ndarray  # [1 + cols * rows, 3, S, S] float32, normalised; tile 0 is the whole image squashed to S
    grid: tuple[int, int]  # (cols, rows): the grid tiles cover the image resized and padded to (cols*S, rows*S)
    original_size: tuple[int, int]  # (width, height) px of the input, which unpadding the features needs

    def feature_layout(self, side: int, max_tiles: int | None = None) -> AnyresLayout:
        """``anyres_layout`` of this image for a tower with ``side`` x ``side`` patches per tile."""
        return anyres_layout(self.grid, side, self.original_size, max_tiles)


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
