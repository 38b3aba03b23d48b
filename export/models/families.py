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

    dream         Dream-org/Dream-v0-Instruct-7B: Qwen2.5-7B's shapes (grouped-query attention, q/k/v biases, RoPE
                  base 1e6), Hugging Face names, shifted logits, ChatML; text only; its loop (``diffusion_generate``):
                  N steps over the whole window, Dream's timestep schedule, ranked by negative entropy, no stop
    lavida-dream  jacklishufan/lavida-dream-v1.0-instruct: Dream with LaViDa's SigLIP, pooling and projector; its
                  loop ranks by top-1 minus top-2 probability (eval/run_dream.sh: alg topk_margin)

    mmada         Gen-Verse/MMaDA-8B-*: LLaDA's native names, the vocabulary grown to 134,656 (8,192 image codes);
                  no vision tower: the MAGVIT-v2 tokenizer (showlab/magvitv2) turns a 512 px centre crop into 1,024
                  ids placed as <|mmu|><|soi|> ids <|eoi|> before the chat-templated question; its loop
                  (``mmu_generate`` as ``inference_mmu.py`` calls it): N / 2 steps in blocks of N / 4, no stop,
                  nothing suppressed

A real config.json has no ``family`` key; native keys (``d_model``, ...) beside a vision tower's (``mm_hidden_size``)
are LaViDa's signature, beside an image codebook's (``codebook_size``, ``model_type`` "mmada") MMaDA's; LLaDA-V's
config uses Hugging Face's keys.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import MappingProxyType
from typing import Any

from seer_trt.contracts.config import DEFAULT_DECODING, SCORED, GenerationConfig, SpecialTokens
from seer_trt.contracts.errors import ConfigError
from seer_trt.contracts.geometry import LLADA_V_PINPOINTS

LLADA_V_SYSTEM = (
    "You are a helpful language and vision assistant. You are able to understand the visual content that the "
    "user provides, and assist the user with a variety of tasks using natural language."
)  # conv_llava_llada in LLaDA-V's conversation.py, and in LaViDa's (its "llada" template)

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
    front_end: str = "siglip"  # "siglip": tower + projector features; "magvitv2": an image tokenizer's ids
    # "inline": the image's features where <image> stands in the user's message; "before_prompt": MMaDA's
    # <|mmu|><|soi|> ids <|eoi|> ahead of the chat-templated question
    image_placement: str = "inline"
    vision_defaults: dict = dataclasses.field(default_factory=dict)  # VisionConfig keys when config.json has none
    image_prefix_ids: tuple[int, ...] = ()  # ids before an image's codes (before_prompt placement)
    image_suffix_ids: tuple[int, ...] = ()  # and after them
    system_prompt: str | None = LLADA_V_SYSTEM  # when config.json names none; MMaDA's inference_mmu.py sends none
    # a request's gen_length N: None keeps blocks of at most the default's; k splits N into k blocks (MMaDA: 4)
    loop_blocks: int | None = None
    own_tokens_per_step: int = 1  # the official loop's tokens per step: steps = N / this (MMaDA's inference_mmu.py: 2)
    own_block_max: int | None = None  # its blocks of min(this, N) without loop_blocks (LaViDa's 128); None: one block
    # Dream: position i's logits come from hidden state i - 1 (``cat(logits[:, :1], logits[:, :-1])``, kept from
    # its autoregressive initialisation); the step-zero statistic is read where the logits are
    shift_logits: bool = False
    text_defaults: dict = dataclasses.field(default_factory=dict)  # TextConfig keys a config.json leaves out
    special_strings: dict = dataclasses.field(default_factory=dict)  # SpecialTokens' strings, where not LLaDA's

    def own_loop(self, gen_length: int) -> GenerationConfig:
        """The family's official loop over ``gen_length`` positions (the baseline its users run), by confidence (the
        fixed rule), from the family's fields: Dream's schedule N steps in one block; else ``N / own_tokens_per_step``
        steps in ``loop_blocks`` blocks, or in blocks of at most ``own_block_max`` (LLaDA-V one token a step in one
        block; LaViDa one a step in blocks of min(128, N); MMaDA, ``inference_mmu.py``, two a step in four blocks).

        Raises:
            ConfigError: a ``gen_length`` that loop's steps and blocks do not divide evenly.
        """
        n = gen_length
        if self.generation.schedule == "dream":  # diffusion_generate: N steps over the window, one block
            return dataclasses.replace(self.generation, gen_length=n, steps=n, block_length=n)
        per = self.own_tokens_per_step
        block = n // self.loop_blocks if self.loop_blocks else min(self.own_block_max or n, n)
        if block < 1 or n % block or n % per or (n // per) % (n // block):
            shape = (
                f"{self.loop_blocks} blocks" if self.loop_blocks else f"blocks of min({self.own_block_max or 'N'}, N)"
            )
            raise ConfigError(f"the {self.name} family's own loop ({per} token(s) a step, {shape}) cannot spread "
                              f"gen_length {n} evenly over its steps and blocks; pick one it divides (e.g. "
                              f"{self.generation.gen_length})")  # fmt: skip
        return GenerationConfig(gen_length=n, steps=n // per, block_length=block, decoding="fixed")


# Dream's ChatML tokens (Dream-org/Dream-v0-Instruct-7B's tokenizer; Qwen2.5's plus <|beginoftext|>, <|mask|>):
# the answer ends with <|im_end|>, then <|endoftext|> pads; ChatML has no end-of-header token, so that field
# names the header's <|im_start|> again (Dream's loop suppresses nothing, so neither is read)
DREAM_STRINGS = {
    "mask_id": "<|mask|>",
    "endoftext_id": "<|endoftext|>",
    "startoftext_id": "<|beginoftext|>",
    "eot_id": "<|im_end|>",
    "start_header_id": "<|im_start|>",
    "end_header_id": "<|im_start|>",
}
# diffusion_generate as Dream's README and LaViDa's eval run it, greedy: N steps over N positions, one block
DREAM_LOOP = dict(block_length=256, gen_length=256, steps=256, decoding="fixed", schedule="dream")
DREAM = dict(suppress_special=False, loop_blocks=1, shift_logits=True, special_strings=DREAM_STRINGS,
             text_defaults={"qkv_bias": True})  # fmt: skip

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
                own_block_max=128,  # llada/generate.py as the lmms-eval wrapper calls it: blocks of min(128, N)
            ),
            Family(
                "mmada",
                1,
                "center_crop",  # image_transform: bicubic resize of the short side to 512, centre crop
                LLADA_V_PINPOINTS,  # unused: one image, one crop
                # inference_mmu.py: max_new_tokens = max_seq_length (512), steps 256, block_length 128
                GenerationConfig(gen_length=512, steps=256, block_length=128, decoding=DEFAULT_DECODING),
                suppress_special=False,
                front_end="magvitv2",
                image_placement="before_prompt",
                # the image tokenizer's geometry: 512 px, 16x downsampling -> 32 x 32 = 1024 codes
                vision_defaults={"image_size": 512, "patch_size": 16},
                # training/prompting_utils.py reserved_token_mapping (use_reserved_token=True)
                image_prefix_ids=(126089, 126084),  # <|mmu|>, <|soi|>
                image_suffix_ids=(126085,),  # <|eoi|>
                system_prompt=None,
                loop_blocks=4,
                own_tokens_per_step=2,  # inference_mmu.py: steps N / 2, block_length N / 4
            ),
            Family(
                "dream",
                1,
                "pad",
                LLADA_V_PINPOINTS,  # unused: text only
                # the README's example: max_new_tokens = steps = 512, alg "entropy"
                GenerationConfig(
                    **{**DREAM_LOOP, "gen_length": 512, "steps": 512, "block_length": 512}, remasking="entropy"
                ),  # fmt: skip
                front_end="none",
                system_prompt=None,  # Qwen's template writes its own default system turn
                **DREAM,
            ),
            Family(
                "lavida-dream",
                2,
                "anyres",
                LAVIDA_PINPOINTS,
                # eval/run_dream.sh: alg topk_margin; lmms-eval's wrapper: max_new_tokens 256, steps min(512, 256)
                GenerationConfig(**DREAM_LOOP, remasking="topk_margin"),
                **DREAM,
            ),
        )
    }
)


def ranks_by_score(family: str) -> bool:
    """Whether ``family``'s own loop ranks positions by one of Dream's scores (topk_margin, entropy): its ``denoise``
    graph then returns them (``seer_trt.contracts.graphs.SCORE_OUTPUTS``)."""
    return get_family(family).generation.remasking in SCORED


def special_tokens(family: str, tokenizer_json: str | Path) -> SpecialTokens:
    """The ids of ``family``'s special tokens in ``tokenizer_json`` (LLaDA's strings, or Dream's ChatML ones)."""
    return SpecialTokens.from_tokenizer(tokenizer_json, get_family(family).special_strings)


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
    kind = str(data.get("model_type", "")).lower()
    if kind in ("dream", "llava_dream"):  # DreamConfig's model_type "Dream"; LaViDa's LlavaDreamConfig "llava_dream"
        return "lavida-dream" if kind == "llava_dream" or "mm_hidden_size" in data else "dream"
    if native and (data.get("model_type") == "mmada" or "codebook_size" in data):
        return "mmada"
    if native and ("mm_hidden_size" in data or "mm_vision_tower" in data):
        return "lavida-llada"
    if native:
        raise ConfigError("a config.json in LLaDA's native keys (d_model, n_layers, ...) without a vision tower or an "
                          "image codebook is not a model seer-trt serves yet (LaViDa-LLaDA's names one: "
                          "mm_hidden_size; MMaDA's: codebook_size)")  # fmt: skip
    return "llada-v"
