"""seer-trt runtime: Seer early-exit truncation for diffusion multimodal LLMs.

Importing the package imports nothing else: each name below is imported on first use (PEP 562), so a command
starts, and answers Ctrl-C during start-up, at once. The runtime imports numpy (onnxruntime, tokenizers and PIL
once a pipeline opens); torch, transformers and seer_export are never imported here.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

# ONNX Runtime's telemetry (from 1.2x on Linux: a device id and an event queue under ~/.cache/Microsoft, written at its
# import) is off in every session the project opens, unless the user set it: ORT_DISABLE_TELEMETRY=0 turns it on
# (docs/DESIGN.md "Telemetry"). Set here, before anything of ours can import onnxruntime.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

__version__ = "0.1.0"

_EXPORTS = {
    "GenerationConfig": "seer_trt.contracts.config",
    "SeerConfig": "seer_trt.contracts.config",
    "SpecialTokens": "seer_trt.contracts.config",
    "CheckpointError": "seer_trt.contracts.errors",
    "ConfigError": "seer_trt.contracts.errors",
    "InputError": "seer_trt.contracts.errors",
    "ManifestError": "seer_trt.contracts.errors",
    "SeerError": "seer_trt.contracts.errors",
    "find_boundaries": "seer_trt.runtime.boundary",
    "SeerPipeline": "seer_trt.runtime.pipeline",
    "Request": "seer_trt.runtime.request",
    "Result": "seer_trt.runtime.request",
}

__all__ = [
    "CheckpointError",
    "ConfigError",
    "GenerationConfig",
    "InputError",
    "ManifestError",
    "Request",
    "Result",
    "SeerConfig",
    "SeerError",
    "SeerPipeline",
    "SpecialTokens",
    "find_boundaries",
]

if TYPE_CHECKING:
    from seer_trt.contracts.config import GenerationConfig, SeerConfig, SpecialTokens
    from seer_trt.contracts.errors import CheckpointError, ConfigError, InputError, ManifestError, SeerError
    from seer_trt.runtime.boundary import find_boundaries
    from seer_trt.runtime.pipeline import SeerPipeline
    from seer_trt.runtime.request import Request, Result


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'seer_trt' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
