"""The ``Backend`` protocol: what the runtime needs from whatever runs the graphs (docs/DESIGN.md "Graphs and their contract").

Every backend (``seer_trt.backends``: ONNX Runtime, TensorRT; the Triton orchestrator's BLS backend) offers the
same small interface, so the pipeline, the router and the Triton model never know which one runs.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol

import numpy as np

from seer_trt.contracts.graphs import GraphSpec
from seer_trt.contracts.manifest import Manifest
from seer_trt.contracts.profiles import LengthBuckets


class Backend(Protocol):
    """What the pipeline needs from an inference backend."""

    name: str  # "onnxruntime-cpu", "tensorrt", ...
    manifest: Manifest

    def run(self, graph: str, feeds: Mapping[str, np.ndarray],
            outputs: Collection[str] | None = None) -> dict[str, np.ndarray]:  # fmt: skip
        """Outputs of ``graph`` by name: those named in ``outputs`` (None: all), in the spec's order; the backend
        need not fetch the others (a step that refreshes no cache skips the prompt's K/V). Returned arrays may be
        reused by the next call on this thread."""
        ...

    def spec(self, graph: str) -> GraphSpec:
        """The graph's contract: input/output names, dtypes, axes."""
        ...

    def max_shape(self, graph: str) -> dict[str, int] | None:
        """The largest size per dynamic axis the graph accepts (engine profiles); None: any size."""
        ...

    def buckets(self) -> LengthBuckets | None:
        """The bucket sizes its engines' profiles were built for, which calls are padded to; None: the manifest's."""
        ...

    def close(self) -> None: ...
