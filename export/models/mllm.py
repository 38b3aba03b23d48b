"""The one model every family loads (``DiffusionMLLM``; the families differ in configuration, ``families.py``), as
LLaDA-V builds it: a masked-diffusion language model (LLaDA's, or Dream's shapes), an image front end (the SigLIP
tower, the ``mlp2x_gelu`` projector and ``image_newline``; or MMaDA's image tokenizer) and the LM head.

In:  prompt ids with ``IMAGE_PLACEHOLDER`` slots and images (single pixel tiles, or ``AnyresImage`` tilings);
     answer ids (masks included).
Out: prompt embeddings with image features spliced in, and answer-position logits.

Image features per placeholder, as LLaVA-OneVision's ``prepare_inputs_labels_for_multimodal`` builds them:
single tile ("pad"): the tile's T features, then ``image_newline`` (under "unpad" merging).
anyres ("spatial_unpad"): the base tile's T features (no newline), then the grid's patch map, unpadded and
possibly downsampled, row by row with ``image_newline`` after each row:

    base [T, D] | row 0 of the map, newline | row 1, newline | ... | row h-1, newline

Parameter names are the ``GSAI-ML/LLaDA-V`` checkpoint's: ``model.embed_tokens``, ``model.layers.*``,
``model.norm``, ``model.vision_tower.vision_tower.vision_model.*``, ``model.mm_projector.{0,2}``,
``model.image_newline``, ``lm_head``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from seer_export.models.config import DiffusionMLLMConfig
from seer_export.models.llada import DecoderLayer, RMSNorm, attention_mask, gather_positions, predecessors, rope
from seer_export.models.magvit import MagvitTokenizer
from seer_export.models.siglip import SigLipVisionTower
from seer_trt.contracts.errors import ConfigError, InputError
from seer_trt.contracts.geometry import IMAGE_PLACEHOLDER, AnyresImage


class Backbone(nn.Module):
    """Under ``model.``: the embeddings, the decoder layers, the final norm and the image front end (the names the
    checkpoints use)."""

    def __init__(self, cfg: DiffusionMLLMConfig) -> None:
        super().__init__()
        t = cfg.text
        self.embed_tokens = nn.Embedding(t.vocab_size, t.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(t) for _ in range(t.num_hidden_layers))
        self.norm = RMSNorm(t.hidden_size, t.rms_norm_eps)
        if cfg.has_tower:  # an image tokenizer's family (MMaDA) has none: its images are ids, embedded as text
            self.vision_tower = SigLipVisionTower(cfg.vision)
            self.mm_projector = nn.Sequential(
                nn.Linear(cfg.vision.hidden_size, t.hidden_size), nn.GELU(), nn.Linear(t.hidden_size, t.hidden_size)
            )
            self.image_newline = nn.Parameter(torch.zeros(t.hidden_size))
        elif cfg.magvit is not None:  # MMaDA: the MAGVIT-v2 encoder (from its own folder) turns pixels into codes
            self.image_tokenizer = MagvitTokenizer(cfg.magvit)


class DiffusionMLLM(nn.Module):
    """The whole model of any family (LLaDA-V, LaViDa, MMaDA, Dream); ``forward`` gives answer-position logits for a
    prefix + answer window."""

    def __init__(self, cfg: DiffusionMLLMConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.text.hidden_size, cfg.text.vocab_size, bias=False)

    def image_ids(self, pixels: torch.Tensor) -> torch.Tensor:
        """[N, 3, S, S] pixels in [-1, 1] -> vocabulary ids [N, T] of their codes (MMaDA: ``get_code`` +
        ``len(text_tokenizer)``)."""
        return self.model.image_tokenizer(pixels) + self.config.image_token_offset

    def tile_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """[N, 3, S, S] pixel tiles -> projected patch features [N, T, D]; T = ``config.features_per_tile``.

        A family that pools (LaViDa: stride 2) shrinks each tile's projected side x side map bilinearly to
        ceil(side / stride) a side, after the projector, as LaViDa's ``get_2dPool`` does on every image tile.
        """
        feats = self.model.mm_projector(self.model.vision_tower(pixels))
        if self.config.image_pool_stride == 1:
            return feats
        n, t, dim = feats.shape
        side, out = round(t**0.5), self.config.feature_side
        grid = feats.view(n, side, side, dim).permute(0, 3, 1, 2)  # [N, D, side, side]
        grid = F.interpolate(grid, size=(out, out), mode="bilinear", align_corners=False)
        return grid.permute(0, 2, 3, 1).reshape(n, out * out, dim)

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """[N, 3, S, S] single-tile images -> [N, T (+1), D]; ``image_newline`` appended under "unpad" merging."""
        feats = self.tile_features(pixels)  # [N, T, D]
        if "unpad" in self.config.patch_merge_type:  # one base tile: features then the newline embedding
            newline = self.model.image_newline.to(feats.dtype)[None, None].expand(feats.shape[0], 1, -1)
            feats = torch.cat([feats, newline], dim=1)
        return feats

    def merge_anyres(self, features: torch.Tensor, image: AnyresImage) -> torch.Tensor:
        """[1 + cols*rows, T, D] tile features of one anyres image (``tile_features``) -> its [M, D] prompt features.

        ``spatial_unpad`` merging: the grid tiles' side x side patch maps are laid out as the tiles were cut
        (row-major) into one [rows*side, cols*side] map, cropped to the image's aspect ratio and, under
        ``anyres_max_N``, bilinearly shrunk (``anyres_layout``); each map row then ends with ``image_newline``.
        The base tile's features go first, without a newline. M = ``image.feature_layout(...).tokens``.
        """
        cfg = self.config
        if "unpad" not in cfg.patch_merge_type or not cfg.image_aspect_ratio.startswith("anyres"):
            raise ConfigError(
                f"anyres images need image_aspect_ratio 'anyres'/'anyres_max_N' and mm_patch_merge_type "
                f"'spatial_unpad'; this model has {cfg.image_aspect_ratio!r} / {cfg.patch_merge_type!r}: "
                f"pass single tiles (seer_trt.runtime.image.pixel_tiles) instead"
            )
        side = cfg.feature_side
        cols, rows = image.grid
        if tuple(features.shape[:2]) != (1 + cols * rows, side * side):
            raise InputError(
                f"features {tuple(features.shape)} do not fit a {cols}x{rows} grid of {side}x{side} patch tiles; "
                f"expected [{1 + cols * rows}, {side * side}, D]"
            )
        layout = image.feature_layout(side, cfg.anyres_max_tiles)
        dim = features.shape[-1]
        grid = features[1:].view(rows, cols, side, side, dim)  # [tile row, tile col, patch row, patch col, D]
        grid = grid.permute(4, 0, 2, 1, 3).reshape(dim, rows * side, cols * side)  # [D, H, W] patch map
        top, bottom, left, right = layout.crop
        grid = grid[:, top:bottom, left:right]
        if tuple(grid.shape[1:]) != layout.size:  # anyres_max: shrink to about N tiles' worth of patches
            grid = F.interpolate(grid[None], size=layout.size, mode="bilinear", align_corners=False)[0]
        newline = self.model.image_newline.to(grid.dtype)[:, None, None].expand(dim, grid.shape[1], 1)
        grid = torch.cat([grid, newline], dim=2)  # [D, h, w + 1]
        return torch.cat([features[0], grid.flatten(1).T], dim=0)  # [T + h * (w + 1), D]

    def spliced_features(self, images: torch.Tensor | Sequence[AnyresImage] | None) -> list[torch.Tensor]:
        """One [M_i, D] feature block per image, in order: what each ``IMAGE_PLACEHOLDER`` is replaced by.

        ``images`` is either a pixel tensor [N, 3, S, S] of N single-tile images (``pixel_tiles``, "pad"), or
        a sequence of ``AnyresImage`` (``anyres_tiles``), whose tiles go through the tower in one batch; for an
        image tokenizer's family (MMaDA), the images' vocabulary ids [N, T] (``image_ids``), embedded as text is.
        """
        if images is None:
            return []
        if not self.config.has_tower:
            if not isinstance(images, torch.Tensor) or images.dtype != torch.long or images.dim() != 2:
                raise TypeError("a model without a vision tower takes images as vocabulary ids [N, T] int64 "
                                "(DiffusionMLLM.image_ids)")  # fmt: skip
            return list(self.model.embed_tokens(images.to(self.lm_head.weight.device)))
        if isinstance(images, torch.Tensor):
            return list(self.image_features(images))
        images = list(images)
        if not all(isinstance(im, AnyresImage) for im in images):
            found = sorted({type(im).__name__ for im in images})
            raise TypeError(f"images must be a pixel tensor [N, 3, S, S] or AnyresImage objects, got {found}")
        if not images:
            return []
        weight = self.model.vision_tower.vision_tower.vision_model.embeddings.patch_embedding.weight
        pixels = torch.cat([torch.from_numpy(im.tiles) for im in images]).to(weight.device, weight.dtype)
        feats = self.tile_features(pixels).split([im.tiles.shape[0] for im in images])
        return [self.merge_anyres(f, im) for f, im in zip(feats, images, strict=True)]

    def embed_prompt(self, ids: list[int], images: torch.Tensor | Sequence[AnyresImage] | None = None) -> torch.Tensor:
        """[P, D] embeddings of one prompt; each ``IMAGE_PLACEHOLDER`` takes the next image's features.

        ``images``: single-tile pixels [N, 3, S, S] or a sequence of ``AnyresImage`` (see ``spliced_features``).
        """
        n_images = sum(1 for i in ids if i == IMAGE_PLACEHOLDER)
        have = 0 if images is None else len(images)
        if n_images != have:
            raise InputError(f"prompt has {n_images} image placeholder(s) but {have} image(s) were given")
        feats = self.spliced_features(images) if n_images else []
        parts, text, k = [], [], 0
        for i in ids + [None]:
            if i is None or i == IMAGE_PLACEHOLDER:
                if text:
                    parts.append(self.model.embed_tokens(torch.tensor(text, device=self.lm_head.weight.device)))
                    text = []
                if i is not None:
                    parts.append(feats[k])
                    k += 1
            else:
                text.append(i)
        return torch.cat(parts, dim=0)

    def hidden_states(
        self, embeds: torch.Tensor, segment_ids: torch.Tensor, position_ids: torch.Tensor, upto: int | None = None
    ) -> torch.Tensor:
        """Run decoder layers 0..upto-1 (all by default) and, for a full pass, the final norm. [B, S, D]."""
        mask = attention_mask(segment_ids)
        cos, sin = rope(position_ids, self.config.text.head_dim, self.config.text.rope_theta, embeds.dtype)
        x = embeds
        layers = self.model.layers if upto is None else self.model.layers[:upto]
        for layer in layers:
            x = layer(x, mask, cos, sin)
        return self.model.norm(x) if upto is None else x

    def forward(
        self, prefix_embeds: torch.Tensor, gen_ids: torch.Tensor, segment_ids: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Logits [B, G, V] of the answer window ``gen_ids`` [B, G] after the prompt [B, P, D]."""
        embeds = torch.cat([prefix_embeds, self.model.embed_tokens(gen_ids).to(prefix_embeds.dtype)], dim=1)
        hidden = self.hidden_states(embeds, segment_ids, position_ids)
        return self.lm_head(self.answer_states(hidden, segment_ids, prefix_embeds.shape[1])).float()

    def answer_states(self, hidden: torch.Tensor, segment_ids: torch.Tensor, start: int) -> torch.Tensor:
        """The states [B, G, ...] that predict the positions from ``start`` on, of ``hidden`` [B, S, ...] over the
        call's S positions (``segment_ids`` [B, S]): those positions' own, or for a shifted family (Dream) those of
        the position before each in its row (``predecessors``)."""
        if not self.config.shift_logits:
            return hidden[:, start:]
        return gather_positions(hidden, predecessors(segment_ids, start))

    def forward_cached(
        self, prefix_embeds: torch.Tensor, gen_ids: torch.Tensor, segment_ids: torch.Tensor,
        position_ids: torch.Tensor, weights: torch.Tensor, past: Sequence[tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:  # fmt: skip
        """``forward`` with a prompt K/V cache (docs/DESIGN.md "Prompt K/V cache").

        Args:
            prefix_embeds: [B, P, D] the prompt positions computed in this call (P = 0 on a cached step).
            gen_ids: [B, G] the answer window.
            segment_ids, position_ids: [B, C + P + G]: the C cached positions first (their position ids are not
                read: cached keys carry their rotation), then this call's.
            weights: [M] the weight of each cached snapshot.
            past: per layer (keys, values) [M, B, H_kv, C, hd], keys after RoPE; C may be 0.

        Returns:
            Logits [B, G, V] of the answer window, and per layer this call's prompt (keys, values) [B, H_kv, P, hd].
        """
        c, p = past[0][0].shape[-2], prefix_embeds.shape[1]
        x = torch.cat([prefix_embeds, self.model.embed_tokens(gen_ids).to(prefix_embeds.dtype)], dim=1)
        allowed = attention_mask(segment_ids, c)
        mask = torch.zeros_like(allowed, dtype=x.dtype).masked_fill(~allowed, float("-inf"))  # additive, once
        cos, sin = rope(position_ids[:, c:], self.config.text.head_dim, self.config.text.rope_theta, x.dtype)
        present = []
        for layer, (past_k, past_v) in zip(self.model.layers, past, strict=True):
            x, k, v = layer.forward_cached(x, mask, cos, sin, past_k, past_v, weights)
            present.append((k[:, :, :p], v[:, :, :p]))
        return self.lm_head(self.answer_states(self.model.norm(x), segment_ids[:, c:], p)).float(), present


def left_pad_prompts(prompts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack [P_i, D] prompts left-padded with zeros: embeds [B, P, D] and validity [B, P] bool."""
    longest = max(p.shape[0] for p in prompts)
    dim = prompts[0].shape[1]
    embeds = prompts[0].new_zeros(len(prompts), longest, dim)
    valid = torch.zeros(len(prompts), longest, dtype=torch.bool, device=prompts[0].device)
    for b, p in enumerate(prompts):
        embeds[b, longest - p.shape[0] :] = p
        valid[b, longest - p.shape[0] :] = True
    return embeds, valid


def window_layout(prefix_valid: torch.Tensor, kept: torch.Tensor, gen_length: int) -> tuple[torch.Tensor, ...]:
    """``segment_ids`` and ``position_ids`` [B, P + G] for left-padded prompts and per-row answer windows.

    Row b's segment covers its real prompt tokens and its first ``kept[b]`` answer positions; everything else
    is padding (0). Positions count from 0 at the first real token of each row.
    """
    b = prefix_valid.shape[0]
    gen_valid = torch.arange(gen_length, device=kept.device)[None].expand(b, -1) < kept[:, None]
    valid = torch.cat([prefix_valid, gen_valid], dim=1)  # [B, P + G]
    segment_ids = valid.to(torch.int32)
    position_ids = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
    return segment_ids, position_ids
