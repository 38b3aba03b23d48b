"""The one model of every family in plain PyTorch (``DiffusionMLLM``), with the official checkpoints' parameter
names, and its checkpoint loading.

Names are imported on first use (PEP 562): ``seer_export.models.config`` and the checkpoint index are read without
torch, so a checkpoint's config.json is checked against its tensors before torch is imported (``seer-export``'s
one-line refusals come within a second).
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "DiffusionMLLMConfig": "config",
    "TextConfig": "config",
    "VisionConfig": "config",
    "CheckpointTensors": "loading",
    "check_config": "loading",
    "check_state": "loading",
    "hf_cache_dir": "loading",
    "load_model": "loading",
    "load_state": "loading",
    "resolve_checkpoint": "loading",
    "DiffusionMLLM": "mllm",
    "MODELS": "registry",
    "ModelEntry": "registry",
    "get_entry": "registry",
    "load": "registry",
    "resolve": "registry",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
