"""The one model of every family in plain PyTorch (``DiffusionMLLM``), with the official checkpoints' parameter
names, and its checkpoint loading."""

from seer_export.models.config import DiffusionMLLMConfig, TextConfig, VisionConfig
from seer_export.models.loading import (
    CheckpointTensors,
    check_state,
    hf_cache_dir,
    load_model,
    load_state,
    resolve_checkpoint,
)
from seer_export.models.mllm import DiffusionMLLM
from seer_export.models.registry import MODELS, ModelEntry, get_entry, load, resolve

__all__ = [
    "MODELS",
    "CheckpointTensors",
    "DiffusionMLLM",
    "DiffusionMLLMConfig",
    "ModelEntry",
    "TextConfig",
    "VisionConfig",
    "check_state",
    "get_entry",
    "hf_cache_dir",
    "load",
    "load_model",
    "load_state",
    "resolve",
    "resolve_checkpoint",
]
