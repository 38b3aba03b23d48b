"""The tiny random LLaDA-V configuration tests build models from (not a test module)."""

from __future__ import annotations

from seer_export.models.config import DiffusionMLLMConfig, TextConfig, VisionConfig
from seer_trt.contracts.config import SeerConfig


def tiny_config(vocab: int = 64, layers: int = 2) -> DiffusionMLLMConfig:
    """Width 32, 2 heads; a 2-layer SigLIP on 16 px images (4 patches); probe layer 1."""
    return DiffusionMLLMConfig(
        text=TextConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=layers,
            num_attention_heads=2,
            num_key_value_heads=2,
        ),
        vision=VisionConfig(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=16,
            patch_size=8,
        ),
        seer=SeerConfig(probe_layer=1),
    )


def tiny_lavida_config(vocab: int = 103, layers: int = 3) -> DiffusionMLLMConfig:
    """LaViDa-LLaDA in small: LLaDA's native names, 28 px tiles of 7 x 7 patches pooled to 4 x 4 (odd sides round up,
    as 27 -> 14 does), plain anyres over LaViDa's five pinpoints scaled from 384 px tiles to 28 px, its loop's defaults
    (256 positions, 256 steps, blocks of 128), the MLP rule at layer 1."""
    from seer_export.models.families import FAMILIES, LAVIDA_PINPOINTS

    return DiffusionMLLMConfig(
        text=TextConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                        num_attention_heads=2, num_key_value_heads=2),
        vision=VisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                            image_size=28, patch_size=4),
        image_aspect_ratio="anyres",
        image_grid_pinpoints=tuple((w * 28 // 384, h * 28 // 384) for w, h in LAVIDA_PINPOINTS),
        seer=SeerConfig(statistic="gate_negative", probe_layer=1, tau_jump=0.1, label="test"),
        generation=FAMILIES["lavida-llada"].generation,
        system_prompt=None,
        naming="llada-native",
        family="lavida-llada",
    )  # fmt: skip


def tiny_mmada_config(vocab: int = 103, layers: int = 3) -> DiffusionMLLMConfig:
    """MMaDA in small: LLaDA's native names, no vision tower; a 16 px image is 8 x 8 = 64 codes of 16 (4 bits) at
    ids 83-98 (the fixture tokenizer's length, 83, is the offset, as MMaDA's 126,349), behind the marker ids 99, 100
    and before 101 (its <|mmu|> <|soi|> ... <|eoi|>); its loop's defaults (512 positions, 256 steps, blocks of 128).
    Pass ``tiny_magvit()`` as the random checkpoint's image tokenizer."""
    from seer_export.models.families import FAMILIES

    return DiffusionMLLMConfig(
        text=TextConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                        num_attention_heads=2, num_key_value_heads=2),
        vision=VisionConfig(image_size=16, patch_size=2),
        image_aspect_ratio="center_crop",
        seer=SeerConfig(statistic="gate_negative", probe_layer=1, tau_jump=0.1, label="test"),
        generation=FAMILIES["mmada"].generation,
        system_prompt=None,
        naming="llada-native",
        family="mmada",
        image_prefix_ids=(99, 100),
        image_suffix_ids=(101,),
        codebook_size=16,
    )  # fmt: skip


def tiny_magvit():
    """A MAGVIT-v2 encoder of two levels (widths 32, 64; one ResNet block each), 4 bits a code, 16 px images."""
    from seer_export.models.magvit import MagvitConfig

    return MagvitConfig(ch=32, ch_mult=(1, 2), num_res_blocks=(1, 1), z_channels=4, image_size=16)


def tiny_dream_config(vocab: int, layers: int = 3, family: str = "dream") -> DiffusionMLLMConfig:
    """Dream in small (``family`` "dream", or "lavida-dream" with LaViDa's tiles as ``tiny_lavida_config``): Hugging
    Face names, 4 query heads over 2 K/V heads with q/k/v biases, RoPE base 1e6, shifted logits; its loop (steps =
    positions, Dream's schedule, one block) over 16 positions, ranked by the family's score; the MLP rule at layer 1.
    ``vocab``: the Dream-strings tokenizer's size (``seer_export.reference.fixture.build_tokenizer("dream")``)."""
    import dataclasses

    from seer_export.models.families import FAMILIES

    lavida = tiny_lavida_config(vocab, layers)
    own = FAMILIES[family]
    return dataclasses.replace(
        lavida,
        text=TextConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6,
                        qkv_bias=True),
        image_aspect_ratio=lavida.image_aspect_ratio if own.front_end == "siglip" else "pad",
        generation=own.own_loop(16),
        system_prompt=own.system_prompt,
        naming="llada-v",
        family=family,
    )  # fmt: skip


def gqa_bias_config():
    """``tiny_config`` with grouped-query attention (4 query heads, 2 K/V heads) and q/k/v biases, as Qwen2's and
    Dream's attention; one tile per image, a 16-position loop."""
    import dataclasses

    from seer_trt.contracts.config import GenerationConfig

    cfg = tiny_config(vocab=103, layers=2)
    text = dataclasses.replace(cfg.text, num_attention_heads=4, num_key_value_heads=2, qkv_bias=True)
    return dataclasses.replace(cfg, text=text, image_aspect_ratio="pad", system_prompt=None,
                               generation=GenerationConfig(gen_length=16, steps=16, block_length=16))  # fmt: skip
