"""LLaDA-V in plain PyTorch, with the official checkpoint's parameter names, and its checkpoint loading."""

from seer_export.models.config import LLaDAVConfig, TextConfig, VisionConfig
from seer_export.models.llada_v import LLaDAV
from seer_export.models.loading import (
    CheckpointTensors,
    check_state,
    hf_cache_dir,
    load_model,
    load_state,
    resolve_checkpoint,
)
from seer_export.models.registry import MODELS, ModelEntry, get_entry, load, resolve

__all__ = [
    "MODELS",
    "CheckpointTensors",
    "LLaDAV",
    "LLaDAVConfig",
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
