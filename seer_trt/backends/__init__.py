"""Backends: run the graphs a manifest names (docs/DESIGN.md "Graphs and their contract"). ``open_backend`` is the
one way in; ``onnxruntime`` (CPU, CUDA, TensorRT EP), ``tensorrt`` (plans from seer-build) and ``cuda`` (the few
driver calls the TensorRT backend makes, through ctypes) are the rooms. Imports contracts only; tensorrt lazily.
"""

from __future__ import annotations

from pathlib import Path

from seer_trt.backends.onnxruntime import OrtBackend
from seer_trt.contracts.backend import Backend
from seer_trt.contracts.errors import ConfigError
from seer_trt.contracts.manifest import Manifest


def open_backend(folder: str | Path, manifest: Manifest, backend: str = "onnxruntime", provider: str = "cpu",
                 threads: int = 0, cuda_graphs: bool = False, share_weights: bool = True) -> Backend:  # fmt: skip
    """The backend named ``backend`` over an export folder: "onnxruntime" (``provider``, ``threads``,
    ``share_weights``), or "tensorrt" / "tensorrt-rtx" (the plans ``seer-build`` recorded in the manifest;
    ``cuda_graphs``: replay CUDA graphs at static bucket shapes)."""
    if backend == "onnxruntime":
        if cuda_graphs:
            raise ConfigError("CUDA-graph replay is an option of the TensorRT backends; drop it, or pass --backend "
                              "tensorrt")  # fmt: skip
        return OrtBackend(folder, manifest, provider, threads, share_weights=share_weights)
    if backend in ("tensorrt", "tensorrt-rtx"):
        from seer_trt.backends.tensorrt import TrtBackend  # imports tensorrt only when it opens

        return TrtBackend(folder, manifest, backend, cuda_graphs=cuda_graphs)
    raise ConfigError(f"unknown backend {backend!r}; choose 'onnxruntime', 'tensorrt' or 'tensorrt-rtx'")
