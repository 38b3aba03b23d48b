"""MMaDA's image tokenizer: the MAGVIT-v2 encoder and its lookup-free quantizer, under ``showlab/magvitv2``'s names.

In:  pixels [N, 3, S, S] in [-1, 1] (MMaDA's ``image_transform``: bicubic resize of the short side to S, centre crop,
     (x / 255 - 0.5) / 0.5); S = 512 for MMaDA.
Out: code ids [N, (S / 2^(levels - 1))^2] int64 in [0, 2^z): 1024 ids from 512 px.

The encoder is the taming-transformers VQGAN encoder as MAGVIT-v2 configures it (``MAGVITv2.encoder``): ``conv_in``,
per level ``down.{i}.block.{j}`` ResNet blocks (GroupNorm(32) + swish + 3x3 conv, twice, with a 1x1 ``nin_shortcut``
when the width changes) and, between levels, ``down.{i}.downsample.conv`` (3x3, stride 2, after padding right and
bottom by one), then ``mid.{block_1, attn_1, block_2}`` (one single-head attention block over the positions),
``norm_out``, swish, ``conv_out`` to z channels and the 1x1 ``quant_conv``. The quantizer is lookup free: channel c
of z is one bit, set when z_c > 0, and the code is sum_c 2^(z - 1 - c) [z_c > 0] (``LFQuantizer.get_indices``).
No attention inside the levels: ``attn_resolutions`` (5) is never a level's resolution. The decoder (image
generation) is not built; its tensors in the checkpoint are left unread (``decoder.*``), and the quantizer's two
buffers (``quantize.embedding``, ``quantize.power_vals``) are derived, not read.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# the image tokenizer's config.json and where its files lie, read without torch (seer_export.models.config)
from seer_export.models.config import (  # noqa: F401 - re-exported: MagvitConfig's home before it moved
    IMAGE_TOKENIZER_DIR,
    IMAGE_TOKENIZER_FILES,
    IMAGE_TOKENIZER_REPO,
    UNUSED_PREFIXES,
    MagvitConfig,
)


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = _norm(cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2, self.conv2 = _norm(cout), nn.Conv2d(cout, cout, 3, padding=1)
        if cin != cout:
            self.nin_shortcut = nn.Conv2d(cin, cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x) + h


class AttnBlock(nn.Module):
    """One head over the H x W positions, 1x1 convolutions for q, k, v and the output."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = _norm(channels)
        self.q, self.k, self.v = (nn.Conv2d(channels, channels, 1) for _ in range(3))
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        y = self.norm(x)
        q, k, v = (p(y).flatten(2).transpose(1, 2) for p in (self.q, self.k, self.v))  # [N, HW, C]
        out = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]  # scale 1 / sqrt(C)
        return x + self.proj_out(out.transpose(1, 2).reshape(n, c, h, w))


class Downsample(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Encoder(nn.Module):
    def __init__(self, cfg: MagvitConfig) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(3, cfg.ch, 3, padding=1)
        self.down = nn.ModuleList()
        width = cfg.ch
        for level, (mult, blocks) in enumerate(zip(cfg.ch_mult, cfg.num_res_blocks, strict=True)):
            stage = nn.Module()
            stage.block = nn.ModuleList()
            for _ in range(blocks):
                stage.block.append(ResnetBlock(width, cfg.ch * mult))
                width = cfg.ch * mult
            if level != len(cfg.ch_mult) - 1:
                stage.downsample = Downsample(width)
            self.down.append(stage)
        self.mid = nn.Module()
        self.mid.block_1, self.mid.attn_1 = ResnetBlock(width, width), AttnBlock(width)
        self.mid.block_2 = ResnetBlock(width, width)
        self.norm_out = _norm(width)
        self.conv_out = nn.Conv2d(width, cfg.z_channels, 3, padding=1)
        self.quant_conv = nn.Conv2d(cfg.z_channels, cfg.z_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for stage in self.down:
            for block in stage.block:
                h = block(h)
            if hasattr(stage, "downsample"):
                h = stage.downsample(h)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        return self.quant_conv(self.conv_out(F.silu(self.norm_out(h))))


class MagvitTokenizer(nn.Module):
    """``MAGVITv2.get_code``: pixels -> code ids [N, tokens]; module names as the checkpoint's ``encoder.*``."""

    def __init__(self, cfg: MagvitConfig) -> None:
        super().__init__()
        self.config = cfg
        self.encoder = Encoder(cfg)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        z = self.encoder(pixels)  # [N, bits, h, w]
        bits = self.config.z_channels
        powers = 2 ** torch.arange(bits - 1, -1, -1, device=z.device)  # the first channel is the top bit
        codes = ((z > 0).long() * powers[None, :, None, None]).sum(1)  # [N, h, w]
        return codes.flatten(1)  # row-major, as get_indices(...).reshape(N, -1)
