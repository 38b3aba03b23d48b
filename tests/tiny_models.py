"""The tiny random LLaDA-V configuration tests build models from (not a test module)."""

from __future__ import annotations

from seer_export.models.config import LLaDAVConfig, TextConfig, VisionConfig
from seer_trt.contracts.config import SeerConfig


def tiny_config(vocab: int = 64, layers: int = 2) -> LLaDAVConfig:
    """Width 32, 2 heads; a 2-layer SigLIP on 16 px images (4 patches); probe layer 1."""
    return LLaDAVConfig(
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
