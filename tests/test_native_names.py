"""LLaDA's native (OLMo) parameter names and config keys (export/models/names.py): what LLaDA's own checkpoints and
the models built on them without renaming (LaViDa-LLaDA, MMaDA) store, loaded strictly into the one language model."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from seer_export.models import DiffusionMLLMConfig, load_model
from seer_export.models.names import NATIVE_REQUIRED, to_checkpoint, to_module
from seer_export.models.random_checkpoint import write_random_checkpoint
from seer_trt.contracts.errors import CheckpointError, ConfigError

torch.set_num_threads(1)

from tiny_models import tiny_config  # noqa: E402

# LLaDA-V's train/llada_v_prepare/rename_checkpoint.py, read: each native name and what it renames it to
OFFICIAL = {
    "model.transformer.blocks.7.q_proj.weight": "model.layers.7.self_attn.q_proj.weight",
    "model.transformer.blocks.7.k_proj.weight": "model.layers.7.self_attn.k_proj.weight",
    "model.transformer.blocks.7.v_proj.weight": "model.layers.7.self_attn.v_proj.weight",
    "model.transformer.blocks.7.attn_out.weight": "model.layers.7.self_attn.o_proj.weight",
    "model.transformer.blocks.7.ff_proj.weight": "model.layers.7.mlp.gate_proj.weight",
    "model.transformer.blocks.7.up_proj.weight": "model.layers.7.mlp.up_proj.weight",
    "model.transformer.blocks.7.ff_out.weight": "model.layers.7.mlp.down_proj.weight",
    "model.transformer.blocks.7.attn_norm.weight": "model.layers.7.input_layernorm.weight",
    "model.transformer.blocks.7.ff_norm.weight": "model.layers.7.post_attention_layernorm.weight",
    "model.transformer.wte.weight": "model.embed_tokens.weight",
    "model.transformer.ln_f.weight": "model.norm.weight",
    "model.transformer.ff_out.weight": "lm_head.weight",
}


def native(layers: int = 2) -> DiffusionMLLMConfig:
    return dataclasses.replace(tiny_config(vocab=120, layers=layers), naming="llada-native")


def test_the_native_names_are_the_official_renaming_both_ways():
    for name, module in OFFICIAL.items():
        assert to_module(name, "llada-native") == module and to_checkpoint(module, "llada-native") == name
    vision = "model.vision_tower.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"
    assert to_module(vision, "llada-native") == vision  # outside the language model: the same name
    assert to_module("model.transformer.wte.weight", "llada-v") == "model.transformer.wte.weight"


def test_a_native_config_reads_as_the_same_model_and_round_trips():
    cfg = native()
    data = cfg.to_dict()
    assert data["d_model"] == 32 and data["n_layers"] == 2 and data["mlp_hidden_size"] == 64
    assert "hidden_size" not in data and data["embedding_size"] == 120 and data["weight_tying"] is False
    again = DiffusionMLLMConfig.from_dict(data)
    assert again == cfg and again.naming == "llada-native"
    grown = DiffusionMLLMConfig.from_dict({**data, "vocab_size": 100})  # embedding_size is the rows (MMaDA grows it)
    assert grown.text.vocab_size == 120
    for key, value in (("weight_tying", True), ("include_qkv_bias", True), ("block_type", "sequential")):
        with pytest.raises(ConfigError, match=key):
            DiffusionMLLMConfig.from_dict({**data, key: value})
    assert set(NATIVE_REQUIRED) <= set(data)


def test_a_native_checkpoint_loads_strictly_and_computes_what_the_renamed_one_does(tmp_path):
    cfg = native()
    folder = write_random_checkpoint(tmp_path / "native", cfg, dtype=torch.float32, seed=3, gain=2.0)
    stored = set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"])
    assert {"model.transformer.wte.weight", "model.transformer.ff_out.weight",
            "model.transformer.blocks.1.ff_out.weight", "model.transformer.ln_f.weight"} <= stored  # fmt: skip
    assert not any(n.startswith("model.layers.") or n == "lm_head.weight" for n in stored)
    model = load_model(folder)
    renamed = write_random_checkpoint(tmp_path / "hf", dataclasses.replace(cfg, naming="llada-v"),
                                      dtype=torch.float32, seed=3, gain=2.0)  # fmt: skip
    reference = load_model(renamed)
    assert model.state_dict().keys() == reference.state_dict().keys()
    for name, tensor in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    assert torch.equal(model.state_dict()["model.norm.weight"], torch.ones(32))  # ln_f is a norm: ones
    gen = torch.randint(0, 120, (1, 6))
    prefix, segments, positions = torch.randn(1, 3, 32), torch.ones(1, 9, dtype=torch.long), torch.arange(9)[None]
    with torch.no_grad():
        logits = model(prefix, gen, segments, positions)
        assert torch.equal(logits, reference(prefix, gen, segments, positions)) and logits.std() > 0.1


def test_a_native_checkpoint_under_the_wrong_names_is_one_error_naming_them(tmp_path):
    folder = write_random_checkpoint(tmp_path / "native", native(), dtype=torch.float32)
    config = json.loads((folder / "config.json").read_text())
    config["n_layers"] = 3  # config.json says 3 layers, the weights hold 2
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as err:
        load_model(folder)
    text = str(err.value)
    assert "n_layers 3 (decoder layers), the tensors hold 2 (model.transformer.blocks.N.*)" in text  # before building


def test_the_random_checkpoint_command_writes_either_naming(tmp_path, monkeypatch):
    from seer_export.models import random_checkpoint

    monkeypatch.setattr(random_checkpoint, "llada_v_layout", lambda layers: tiny_config(vocab=120, layers=layers))
    for naming, key in (("llada-native", "model.transformer.blocks.0.ff_proj.weight"),
                        ("llada-v", "model.layers.0.mlp.gate_proj.weight")):  # fmt: skip
        out = tmp_path / naming
        assert random_checkpoint.main(["--out", str(out), "--layers", "2", "--naming", naming, "--dtype", "fp32"]) == 0
        assert key in json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
        assert load_model(out).config.naming == naming
