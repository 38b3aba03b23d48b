"""Checkpoint parameter names: LLaDA-V's Hugging Face names, which the modules carry, and LLaDA's native ones.

In:  a checkpoint's tensor name and its naming (``DiffusionMLLMConfig.naming``).
Out: the module's name for it (``to_module``), or back (``to_checkpoint``), and the native config keys.

LLaDA's own checkpoints (GSAI-ML/LLaDA-8B-*, and the models built on them without renaming: LaViDa-LLaDA, MMaDA) keep
the OLMo names of its modeling code, ``model.transformer.{wte, blocks.N.*, ln_f, ff_out}``; LLaDA-V renamed them
(its ``train/llada_v_prepare/rename_checkpoint.py``), and the modules here carry LLaDA-V's. One language model,
two namings: a table, not a second model. The block's ``ff_out`` is the MLP's down projection and the top-level
``ff_out`` the LM head, so the block forms are matched first; ``ff_proj`` is the gate (SiLU), ``up_proj`` the linear
half (LLaDA's ``LLaDALlamaBlock``). Tensors outside the language model (a vision tower, the projector) keep their
names in both.
"""

from __future__ import annotations

import re

NAMINGS = ("llada-v", "llada-native")

# native (checkpoint) -> LLaDA-V (module), block forms first
_NATIVE = (
    ("model.transformer.blocks.{}.attn_norm.weight", "model.layers.{}.input_layernorm.weight"),
    ("model.transformer.blocks.{}.q_proj.weight", "model.layers.{}.self_attn.q_proj.weight"),
    ("model.transformer.blocks.{}.k_proj.weight", "model.layers.{}.self_attn.k_proj.weight"),
    ("model.transformer.blocks.{}.v_proj.weight", "model.layers.{}.self_attn.v_proj.weight"),
    ("model.transformer.blocks.{}.attn_out.weight", "model.layers.{}.self_attn.o_proj.weight"),
    ("model.transformer.blocks.{}.ff_norm.weight", "model.layers.{}.post_attention_layernorm.weight"),
    ("model.transformer.blocks.{}.ff_proj.weight", "model.layers.{}.mlp.gate_proj.weight"),
    ("model.transformer.blocks.{}.up_proj.weight", "model.layers.{}.mlp.up_proj.weight"),
    ("model.transformer.blocks.{}.ff_out.weight", "model.layers.{}.mlp.down_proj.weight"),
    ("model.transformer.wte.weight", "model.embed_tokens.weight"),
    ("model.transformer.ln_f.weight", "model.norm.weight"),
    ("model.transformer.ff_out.weight", "lm_head.weight"),
)


def _rules(pairs: tuple[tuple[str, str], ...], reverse: bool) -> list[tuple[re.Pattern[str], str]]:
    rules = []
    for native, module in pairs:
        src, dst = (module, native) if reverse else (native, module)
        pattern = re.escape(src).replace(re.escape("{}"), r"(\d+)")
        rules.append((re.compile(f"^{pattern}$"), dst.replace("{}", r"\1")))
    return rules


_TO_MODULE = _rules(_NATIVE, reverse=False)
_TO_CHECKPOINT = _rules(_NATIVE, reverse=True)

# OLMo config keys of a native config.json -> LLaDA-V's (``TextConfig`` fields)
NATIVE_CONFIG_KEYS = {
    "d_model": "hidden_size",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "n_layers": "num_hidden_layers",
    "mlp_hidden_size": "intermediate_size",
    "rms_norm_eps": "rms_norm_eps",
    "rope_theta": "rope_theta",
}
# native options the one language model implements, and the value it implements (anything else is refused)
NATIVE_REQUIRED = {
    "block_type": "llama",
    "rope": True,  # LLaDA's modeling code asserts it ("Rope must be used in Llama-Encoder for MDM")
    "activation_type": "silu",
    "layer_norm_type": "rms",
    "weight_tying": False,
    "include_bias": False,
    "include_qkv_bias": False,
    "alibi": False,
    "scale_logits": False,
    "input_emb_norm": False,
}


def _apply(rules: list[tuple[re.Pattern[str], str]], name: str) -> str:
    for pattern, replacement in rules:
        renamed, n = pattern.subn(replacement, name)
        if n:
            return renamed
    return name


def to_module(name: str, naming: str) -> str:
    """The module's name of checkpoint tensor ``name`` under ``naming``."""
    return name if naming == "llada-v" else _apply(_TO_MODULE, name)


def to_checkpoint(name: str, naming: str) -> str:
    """The checkpoint's name, under ``naming``, of the module's tensor ``name``."""
    return name if naming == "llada-v" else _apply(_TO_CHECKPOINT, name)


# the rest of a native config.json, as GSAI-ML/LLaDA-8B-Instruct's has it: written (random checkpoints, so that the
# official modeling code loads them too), never read; none changes the forward pass in eval mode
NATIVE_WRITTEN = {
    "mlp_ratio": 4,
    "block_group_size": 1,
    "alibi_bias_max": 8.0,
    "rope_full_precision": True,
    "flash_attention": False,
    "attention_dropout": 0.0,
    "residual_dropout": 0.0,
    "embedding_dropout": 0.0,
    "multi_query_attention": None,
    "attention_layer_norm": False,
    "layer_norm_with_affine": True,
    "attention_layer_norm_with_affine": True,
    "max_sequence_length": 4096,
    "bias_for_layer_norm": False,
    "init_device": "meta",
    "init_fn": "mitchell",
    "init_std": 0.02,
    "init_cutoff_factor": None,
    "precision": "amp_bf16",
    "use_cache": False,
}
