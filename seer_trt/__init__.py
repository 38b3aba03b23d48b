"""seer-trt runtime: Seer early-exit truncation for diffusion multimodal LLMs.

Imports only numpy at module level (onnxruntime, tokenizers and PIL once a pipeline opens); torch,
transformers and seer_export are never imported here.
"""

from seer_trt.boundary import find_boundaries
from seer_trt.config import GenerationConfig, SeerConfig, SpecialTokens
from seer_trt.errors import CheckpointError, ConfigError, InputError, ManifestError, SeerError
from seer_trt.pipeline import Request, Result, SeerPipeline

__version__ = "0.1.0"

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
