"""Checkpoint loading and the model registry: HF layouts, strict key checks, the offline HF cache."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from seer_export.models import (
    MODELS,
    DiffusionMLLM,
    DiffusionMLLMConfig,
    get_entry,
    load,
    load_model,
    load_state,
    resolve,
    resolve_checkpoint,
)
from seer_export.models.registry import FIXTURE_DIR
from seer_trt.contracts.errors import CheckpointError, ConfigError

torch.set_num_threads(1)

from tiny_models import tiny_config as shared_tiny_config  # noqa: E402

REPO_ID = "GSAI-ML/LLaDA-V"


def tiny_config(layers: int = 2) -> DiffusionMLLMConfig:
    return shared_tiny_config(vocab=64, layers=layers)


def random_state(cfg: DiffusionMLLMConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = DiffusionMLLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()  # norms start at ones and image_newline at zeros: make every tensor distinctive
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def write_checkpoint(folder: Path, cfg: DiffusionMLLMConfig, state: dict[str, torch.Tensor], shards: int = 2) -> Path:
    """HF layout: config.json plus model.safetensors, or ``shards`` files with model.safetensors.index.json."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    if shards == 1:
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: state[n] for n in names[i::shards]}
        save_file(part, str(folder / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard))
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return folder


def assert_loaded(model: DiffusionMLLM, state: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> None:
    loaded = model.state_dict()
    assert set(loaded) == set(state)
    for name, tensor in state.items():
        assert loaded[name].dtype == dtype, name
        assert not loaded[name].is_meta, name
        torch.testing.assert_close(loaded[name], tensor.to(dtype), rtol=0, atol=0, msg=name)


@pytest.fixture
def cfg() -> DiffusionMLLMConfig:
    return tiny_config()


@pytest.fixture
def state(cfg: DiffusionMLLMConfig) -> dict[str, torch.Tensor]:
    return random_state(cfg)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face cache that every lookup in the test sees; no network is ever used."""
    cache = tmp_path / "hf-hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def cache_snapshot(cache: Path, repo_id: str = REPO_ID, commit: str = "0123abcd" * 5, ref: bool = True) -> Path:
    """The folder a download would fill: models--org--name/snapshots/<commit>/, with refs/main naming it."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    if ref:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(commit)
    return snapshot


def test_official_parameter_names_are_the_models(cfg: DiffusionMLLMConfig) -> None:
    names = set(DiffusionMLLM(cfg).state_dict())
    for name in (
        "model.embed_tokens.weight",
        "model.layers.1.self_attn.o_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.norm.weight",
        "lm_head.weight",
        "model.vision_tower.vision_tower.vision_model.embeddings.patch_embedding.weight",
        "model.vision_tower.vision_tower.vision_model.encoder.layers.0.self_attn.out_proj.bias",
        "model.vision_tower.vision_tower.vision_model.post_layernorm.weight",
        "model.mm_projector.0.weight",
        "model.mm_projector.2.bias",
        "model.image_newline",
    ):
        assert name in names, name
    # LLaDA-V deletes the tower's last layer and its pooling head: neither is in the checkpoint.
    assert not any(".encoder.layers.1." in n or ".head." in n for n in names if "vision_tower" in n)


def test_sharded_checkpoint_loads_every_tensor(tmp_path: Path, cfg: DiffusionMLLMConfig, state: dict) -> None:
    folder = write_checkpoint(tmp_path / "ckpt", cfg, state, shards=2)
    ckpt = load_state(folder)
    assert len(ckpt) == len(state)
    assert len(set(ckpt.files.values())) == 2
    assert ckpt.shapes["lm_head.weight"] == (64, 32)
    assert ckpt.dtypes["lm_head.weight"] == "F32"
    torch.testing.assert_close(ckpt["model.norm.weight"], state["model.norm.weight"], rtol=0, atol=0)

    model = load_model(folder)
    assert model.config == cfg
    assert not model.training
    assert_loaded(model, state)
    logits = model(
        model.model.embed_tokens(torch.tensor([[1, 2, 3]])),
        torch.tensor([[4, 5]]),
        torch.ones(1, 5, dtype=torch.int32),
        torch.arange(5)[None],
    )
    assert logits.shape == (1, 2, 64) and torch.isfinite(logits).all()


def test_single_file_checkpoint_loads_and_casts(tmp_path: Path, cfg: DiffusionMLLMConfig, state: dict) -> None:
    folder = write_checkpoint(tmp_path / "ckpt", cfg, state, shards=1)
    assert_loaded(load_model(folder), state)
    assert_loaded(load_model(folder, dtype=torch.float16), state, dtype=torch.float16)
    with pytest.raises(ConfigError, match="int64"):
        load_model(folder, dtype=torch.int64)


def test_missing_unexpected_and_misshaped_named_in_one_error(
    tmp_path: Path, cfg: DiffusionMLLMConfig, state: dict
) -> None:
    del state["model.norm.weight"]
    del state["model.mm_projector.2.bias"]
    state["model.vision_tower.vision_tower.vision_model.head.probe"] = torch.zeros(1, 1, 16)
    state["model.layers.1.mlp.up_proj.weight"] = torch.zeros(65, 32)  # no dim of config.json reads it: check_state's
    folder = write_checkpoint(tmp_path / "ckpt", cfg, state, shards=2)
    with pytest.raises(CheckpointError) as err:
        load_model(folder)
    msg = str(err.value)
    assert "\n" not in msg
    assert "2 missing" in msg and "model.norm.weight" in msg and "model.mm_projector.2.bias" in msg
    assert "1 unexpected" in msg and "vision_model.head.probe" in msg
    assert "1 mis-shaped" in msg and "model.layers.1.mlp.up_proj.weight: checkpoint [65, 32], model [64, 32]" in msg


def test_many_mismatches_are_counted_and_truncated(tmp_path: Path, cfg: DiffusionMLLMConfig, state: dict) -> None:
    kept = "model.layers.1.input_layernorm.weight"  # layer 1 stays a layer of the tensors: 2, as config.json says
    for name in [n for n in state if n.startswith("model.layers.1.") and n != kept]:
        del state[name]
    state.update({f"extra.{i}": torch.zeros(1) for i in range(10)})
    folder = write_checkpoint(tmp_path / "ckpt", cfg, state, shards=2)
    with pytest.raises(CheckpointError) as err:
        load_model(folder)
    msg = str(err.value)
    assert "8 missing" in msg and "10 unexpected" in msg and "(+2 more)" in msg  # 8 shown of each kind
    assert len(msg) < 1500


# config.json edits of the bundled fixture (8 decoder layers of width 128, 4 heads, MLP 384, 83 rows; a SigLIP of 3
# layers, the last dropped) -> what the refusal says: each disagreeing key, what it implies, what the tensors hold
CONFIG_PAST_TENSORS = {
    "a million layers": ({"num_hidden_layers": 1_000_000}, "num_hidden_layers 1000000 (decoder layers), the tensors "
                         "hold 8 (model.layers.N.*)"),
    "LLaDA-V's vocabulary": ({"vocab_size": 126464}, "vocab_size 126464, hidden_size 128 give "
                             "model.embed_tokens.weight [126464, 128], the checkpoint holds [83, 128]"),
    "a wider MLP": ({"intermediate_size": 10**9}, "intermediate_size 1000000000, hidden_size 128 give "
                    "model.layers.0.mlp.gate_proj.weight [1000000000, 128], the checkpoint holds [384, 128]"),
    "grouped heads": ({"num_key_value_heads": 2}, "num_key_value_heads 2, num_attention_heads 4, hidden_size 128 give "
                      "model.layers.0.self_attn.k_proj.weight [64, 128], the checkpoint holds [128, 128]"),
    "a deeper tower": ({"vision_config": {"num_hidden_layers": 10**6}}, "vision_config.num_hidden_layers 1000000 "
                       "(999999 encoder layers, the last one dropped), the tensors hold 2"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CONFIG_PAST_TENSORS))
def test_a_config_that_disagrees_with_its_tensors_is_refused_before_the_model_is_built(tmp_path: Path, case,
                                                                                     monkeypatch) -> None:  # fmt: skip
    """Layers, widths, heads and vocabulary of config.json against the tensors the safetensors headers list (issue 42:
    a config.json of a million layers built layers at 50 MB/s until killed): one line naming the key, what it implies
    and what the checkpoint holds, and no model built (the loader and the exporter's checks alike)."""
    from seer_export.models import mllm
    from seer_export.onnx.source import open_source

    change, message = CONFIG_PAST_TENSORS[case]
    folder = shutil.copytree(FIXTURE_DIR, tmp_path / "ckpt")
    data = json.loads((folder / "config.json").read_text())
    for key, value in change.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    (folder / "config.json").write_text(json.dumps(data))

    def never(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr(mllm, "DiffusionMLLM", never)
    for attempt in (lambda: load_model(folder), lambda: open_source("tiny-llada-v", folder)):
        with pytest.raises(CheckpointError) as err:
            attempt()
        assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
        assert str(err.value).startswith(f"{folder / 'config.json'} does not describe the tensors of {folder}")
        assert "restore the checkpoint's own config.json" in str(err.value)


def test_a_native_config_is_checked_under_its_own_keys_and_names(tmp_path: Path) -> None:
    """LLaDA's native (OLMo) config.json: its keys and its tensor names in the refusal."""
    from tiny_models import tiny_lavida_config

    from seer_export.models.random_checkpoint import write_random_checkpoint

    folder = write_random_checkpoint(tmp_path / "native", tiny_lavida_config(), dtype=torch.float32)
    data = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**data, "n_layers": 1000, "mlp_hidden_size": 96}))
    with pytest.raises(CheckpointError) as err:
        load_model(folder)
    assert "n_layers 1000 (decoder layers), the tensors hold 3 (model.transformer.blocks.N.*)" in str(err.value)
    assert ("mlp_hidden_size 96, d_model 32 give model.transformer.blocks.0.ff_proj.weight [96, 32], the checkpoint "
            "holds [64, 32]") in str(err.value)  # fmt: skip


def test_an_image_tokenizers_config_is_checked_against_its_tensors(tmp_path: Path) -> None:
    """MMaDA's image tokenizer: its levels and blocks per level against its own tensors' names."""
    from tiny_models import tiny_magvit, tiny_mmada_config

    from seer_export.models.random_checkpoint import write_random_checkpoint

    folder = write_random_checkpoint(tmp_path / "mmada", tiny_mmada_config(), dtype=torch.float32,
                                     image_tokenizer=tiny_magvit())  # fmt: skip
    config = folder / "image_tokenizer" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "num_res_blocks": [1, 100000]}))
    with pytest.raises(CheckpointError, match=re.escape("image_tokenizer/config.json num_res_blocks[1] 100000 "
                                                        "(blocks), the tensors hold 1")):  # fmt: skip
        load_model(folder)


@pytest.mark.parametrize("change", [{"hidden_size": 0}, {"num_attention_heads": -4}, {"num_hidden_layers": 2.5}])
def test_a_config_dim_that_is_no_whole_number_is_refused_by_key(tmp_path: Path, change) -> None:
    folder = shutil.copytree(FIXTURE_DIR, tmp_path / "ckpt")
    (folder / "config.json").write_text(json.dumps({**json.loads((folder / "config.json").read_text()), **change}))
    with pytest.raises(ConfigError, match=re.escape(f"config.json {change}: expected whole numbers >= 1")):
        load_model(folder)


def test_shard_named_in_index_but_absent(tmp_path: Path, cfg: DiffusionMLLMConfig, state: dict) -> None:
    folder = write_checkpoint(tmp_path / "ckpt", cfg, state, shards=2)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors") as err:
        load_state(folder)
    assert "missing" in str(err.value)
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors"):
        load_model(folder)


def test_corrupt_shard_is_named(tmp_path: Path, cfg: DiffusionMLLMConfig, state: dict) -> None:
    folder = write_checkpoint(tmp_path / "ckpt", cfg, state, shards=2)
    shard = folder / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-64])  # a truncated copy
    with pytest.raises(CheckpointError, match="model-00001-of-00002.safetensors.*corrupt"):
        load_model(folder)


def test_index_entry_its_shard_lacks(tmp_path: Path, cfg: DiffusionMLLMConfig, state: dict) -> None:
    folder = write_checkpoint(tmp_path / "ckpt", cfg, state, shards=2)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.ghost.weight"] = "model-00001-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="model.ghost.weight"):
        load_state(folder)


def test_folder_without_config_or_weights(tmp_path: Path, cfg: DiffusionMLLMConfig, state: dict) -> None:
    folder = write_checkpoint(tmp_path / "ckpt", cfg, state, shards=1)
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json.*model.safetensors"):
        load_model(folder)
    with pytest.raises(CheckpointError, match="no config.json"):
        resolve_checkpoint(folder, REPO_ID)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps(cfg.to_dict()))
    with pytest.raises(CheckpointError, match="no model.safetensors or model.safetensors.index.json"):
        load_model(empty)
    with pytest.raises(CheckpointError, match="does not exist.*--checkpoint"):
        resolve_checkpoint(tmp_path / "nowhere", REPO_ID)


def test_hf_cache_is_found_offline(hub: Path, cfg: DiffusionMLLMConfig, state: dict) -> None:
    snapshot = write_checkpoint(cache_snapshot(hub), cfg, state, shards=2)
    assert resolve("llada-v") == snapshot
    assert resolve_checkpoint(None, REPO_ID) == snapshot
    assert resolve_checkpoint(REPO_ID, "unused/repo") == snapshot  # a repo id in place of a folder
    model, folder = load("llada-v")
    assert folder == snapshot
    assert_loaded(model, state)


def test_hf_cache_without_refs_and_via_hf_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cfg: DiffusionMLLMConfig
) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    snapshot = cache_snapshot(tmp_path / "hf-home" / "hub", ref=False)  # a cache copied without refs/
    (snapshot / "config.json").write_text(json.dumps(cfg.to_dict()))
    assert resolve("llada-v") == snapshot


def test_empty_hf_cache_says_where_it_looked(hub: Path) -> None:
    with pytest.raises(CheckpointError) as err:
        resolve("llada-v")
    msg = str(err.value)
    assert "\n" not in msg
    assert "--checkpoint" in msg and str(hub) in msg and "huggingface-cli download GSAI-ML/LLaDA-V" in msg


def test_checkpoint_flag_overrides_registry(hub: Path, tmp_path: Path, cfg: DiffusionMLLMConfig, state: dict) -> None:
    folder = write_checkpoint(tmp_path / "mine", cfg, state, shards=1)
    assert resolve("llada-v", checkpoint=folder) == folder
    assert resolve("tiny-llada-v", checkpoint=folder) == folder
    model, where = load("llada-v", checkpoint=str(folder))
    assert where == folder
    assert_loaded(model, state)


def test_unknown_model_lists_known_names() -> None:
    with pytest.raises(ConfigError, match="unknown model 'llada-x'.*tiny-llada-v.*llada-v"):
        get_entry("llada-x")
    with pytest.raises(ConfigError, match="tiny-llada-v"):
        resolve("llada-x")


def test_registry_entries() -> None:
    assert set(MODELS) >= {"tiny-llada-v", "llada-v"}
    assert get_entry("llada-v").repo_id == REPO_ID and get_entry("llada-v").bundled is None
    assert get_entry("tiny-llada-v").bundled == FIXTURE_DIR.resolve()


def test_bundled_fixture_loads() -> None:
    model, folder = load("tiny-llada-v")
    assert folder == FIXTURE_DIR.resolve()
    assert model.config == DiffusionMLLMConfig.from_file(FIXTURE_DIR / "config.json")
    assert all(not t.is_meta for t in model.state_dict().values())
