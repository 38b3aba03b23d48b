"""The checkpoint an export reads: found, its config, tokenizer and tensor names and shapes checked, before a byte
of weights is read or a graph traced. Its config.json is checked against the tensors the checkpoint holds before the
model is built, and before torch is imported (``seer_export.models.loading.check_config``): a config that disagrees
is one line within a second, whatever it claims."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from seer_export.models.config import DiffusionMLLMConfig
from seer_export.models.families import special_tokens
from seer_export.models.loading import CheckpointTensors, check_config, check_state, model_state, read_config
from seer_export.models.registry import check_family, get_entry, resolve
from seer_trt.contracts.config import SpecialTokens
from seer_trt.contracts.errors import CheckpointError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")  # required; special_tokens_map.json if present


@dataclasses.dataclass(frozen=True)
class Source:
    """The checkpoint an export reads, checked before any graph is traced."""

    folder: Path  # config.json, safetensors, tokenizer files
    config: DiffusionMLLMConfig
    special: SpecialTokens  # resolved from the tokenizer by token string
    tensors: CheckpointTensors  # lazy: headers only


def open_source(model: str, checkpoint: Path | None) -> Source:
    """Find and check a checkpoint without reading a byte of weights.

    Raises:
        ConfigError: unknown model name or invalid config.json.
        CheckpointError: no checkpoint, no tokenizer, unreadable or mismatching tensors.
    """
    get_entry(model)  # unknown name: one line listing the known ones
    folder = resolve(model, checkpoint)
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder} has no config.json; pass --checkpoint DIR with a LLaDA-V checkpoint folder")
    missing = [f for f in TOKENIZER_FILES if not (folder / f).is_file()]
    if missing:
        raise CheckpointError(
            f"checkpoint {folder} lacks {missing}; the export copies the tokenizer and its chat template next to "
            f"the graphs: copy those files from the model's Hugging Face repo into {folder}"
        )
    cfg = read_config(folder)  # with its image tokenizer's, for MMaDA
    check_family(model, cfg, folder / "config.json")
    special = special_tokens(cfg.family, folder / "tokenizer.json")  # the family's strings: LLaDA's or Dream's
    tensors = model_state(folder, cfg)  # with an image tokenizer's encoder, for MMaDA
    check_config(cfg, tensors, folder / "config.json")  # layers, widths, vocabulary: before anything is built
    import torch

    from seer_export.models.mllm import DiffusionMLLM

    with torch.device("meta"):
        check_state(DiffusionMLLM(cfg), tensors, cfg.naming)  # names and shapes, all at once
    if max(special.to_dict().values()) >= cfg.text.vocab_size:
        raise CheckpointError(
            f"tokenizer ids {special.to_dict()} reach past vocab_size {cfg.text.vocab_size} of {folder / 'config.json'}"
            f"; the tokenizer and the weights come from different models"
        )
    return Source(folder, cfg, special, tensors)


def model_dims(cfg: DiffusionMLLMConfig) -> dict[str, int]:
    """Sizes of the model axes of ``seer_trt.contracts.graphs``."""
    return {
        "hidden": cfg.text.hidden_size,
        "vocab": cfg.text.vocab_size,
        "layers": cfg.text.num_hidden_layers,
        "kv_heads": cfg.text.num_key_value_heads,
        "head_dim": cfg.text.head_dim,
        "image_size": cfg.vision.image_size,
        "tile_tokens": cfg.features_per_tile,
    }
