"""seer-trt runtime: Seer early-exit truncation for diffusion multimodal LLMs.

Imports only numpy at module level (onnxruntime, tokenizers and PIL once a pipeline opens); torch,
transformers and seer_export are never imported here.
"""

from seer_trt.contracts.config import GenerationConfig, SeerConfig, SpecialTokens
from seer_trt.contracts.errors import CheckpointError, ConfigError, InputError, ManifestError, SeerError
from seer_trt.runtime.boundary import find_boundaries
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request, Result

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
