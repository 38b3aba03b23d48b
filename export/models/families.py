"""Model families: what tells LLaDA-V, LaViDa-LLaDA (and later MMaDA) apart, as configuration of the one model.

In:  a family name, from a checkpoint's ``config.json`` (the product's ``family`` key) or inferred from its keys.
Out: ``Family``: how image features are pooled, the defaults a config.json of that family may leave out, and the
     generation settings of that family's own loop.

The families share the LLaDA-8B language model, its tokenizer and chat template, and LLaVA-OneVision's SigLIP
tower + ``mlp2x_gelu`` projector; they differ in what is listed here (docs/DESIGN.md "The model (LLaDA-V) in plain
PyTorch", "Model families"):

    llada-v       GSAI-ML/LLaDA-V: LLaDA-V's parameter names, SigLIP2, 27 x 27 features per tile,
                  anyres_max_4 over 1..6 x 1..6 grids; its loop: 128 steps over 128 positions, one block
    lavida-llada  jacklishufan/lavida-llada-v1.0-instruct: LLaDA's native names, SigLIP (v1, the same code and
                  names), every tile's projected 27 x 27 map bilinearly pooled to 14 x 14 (LaViDa's ``get_2dPool``,
                  always on), plain anyres over five pinpoints; its loop (``llada/generate.py`` as its lmms-eval
                  wrapper calls it): one token per step, blocks of min(128, N), no stop, no special id suppressed

A real LaViDa config.json has no ``family`` key; its native keys (``d_model``, ...) beside a vision tower's
(``mm_hidden_size``) are LaViDa's signature, as LLaDA-V's config uses Hugging Face's keys.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any

from seer_trt.contracts.config import DEFAULT_DECODING, GenerationConfig, SpecialTokens
from seer_trt.contracts.errors import ConfigError
from seer_trt.contracts.geometry import LLADA_V_PINPOINTS

# LaViDa's training scripts (scripts/train/exps/cluster/llada-hd-llada-s*.sh): --image_grid_pinpoints
LAVIDA_PINPOINTS = ((384, 768), (768, 384), (768, 768), (1152, 384), (384, 1152))


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    image_pool_stride: int  # 1: tile features as projected; s: [side, side] -> [ceil(side / s)]^2, bilinear
    image_aspect_ratio: str  # default when config.json names none
    image_grid_pinpoints: str | tuple[tuple[int, int], ...]
    generation: GenerationConfig  # the export's defaults when config.json has no "generation"
    # LLaDA-V's generate_with_embeds sets the logits of <|endoftext|>, <|startoftext|> and the header ids to -inf at
    # masked positions; LaViDa's generate.py suppresses nothing
    suppress_special: bool = True

    def own_loop(self, gen_length: int) -> GenerationConfig:
        """The family's official loop over ``gen_length`` positions (the baseline its users run): one token a step
        by confidence (the fixed rule), in one block (LLaDA-V) or blocks of min(128, N) (LaViDa)."""
        block = min(128, gen_length) if self.name == "lavida-llada" else gen_length
        if gen_length % block:
            raise ConfigError(f"LaViDa's loop needs a gen_length that is a multiple of 128 or at most 128; "
                              f"got {gen_length}")  # fmt: skip
        return GenerationConfig(gen_length=gen_length, steps=gen_length, block_length=block, decoding="fixed")


FAMILIES = MappingProxyType(
    {
        f.name: f
        for f in (
            Family("llada-v", 1, "anyres_max_4", LLADA_V_PINPOINTS, GenerationConfig(decoding=DEFAULT_DECODING)),
            Family(
                "lavida-llada",
                2,
                "anyres",
                LAVIDA_PINPOINTS,
                # lmms-eval's LaViDa wrapper: max_new_tokens 256 unless the task sets it, steps = max_new_tokens
                GenerationConfig(gen_length=256, steps=256, block_length=128, decoding=DEFAULT_DECODING),
                suppress_special=False,
            ),
        )
    }
)


def suppressed_ids(family: str, special: SpecialTokens) -> tuple[int, ...]:
    """The ids whose logits are -inf at masked positions in ``family``'s loop (none for LaViDa)."""
    return special.suppressed_ids if FAMILIES[family].suppress_special else ()


def get_family(name: str) -> Family:
    if name not in FAMILIES:
        raise ConfigError(f"model family {name!r} is not one of {list(FAMILIES)}")
    return FAMILIES[name]


def infer_family(data: dict[str, Any], native: bool) -> str:
    """The family of a config.json: its ``family`` key, else LaViDa-LLaDA for native keys beside a vision tower."""
    if "family" in data:
        return str(data["family"])
    if native and ("mm_hidden_size" in data or "mm_vision_tower" in data):
        return "lavida-llada"
    if native:
        raise ConfigError("a config.json in LLaDA's native keys (d_model, n_layers, ...) without a vision tower is "
                          "not a model seer-trt serves yet (LaViDa-LLaDA's names one: mm_hidden_size)")  # fmt: skip
    return "llada-v"
