"""seer-trt runtime: Seer early-exit truncation for diffusion multimodal LLMs.

Imports only numpy at module level; torch, transformers and seer_export are never imported here.
"""

from seer_trt.boundary import find_boundaries
from seer_trt.config import GenerationConfig, SeerConfig, SpecialTokens
from seer_trt.errors import CheckpointError, ConfigError, InputError, ManifestError, SeerError

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "ConfigError",
    "GenerationConfig",
    "InputError",
    "ManifestError",
    "SeerConfig",
    "SeerError",
    "SpecialTokens",
    "find_boundaries",
]
