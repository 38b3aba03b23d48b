"""Interleaved rounds and what a ratio of them means: medians, per-round spread, rotation, the machine's state.

A ratio is the ratio of the medians over rounds; its spread is the smallest and largest ratio of a single round.
Rounds rotate the order of what they time, so a burst of machine load hits every mode alike.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from typing import Any

import numpy as np


def ratio(num: Sequence[float], den: Sequence[float]) -> dict[str, float]:
    """median(num) / median(den) over rounds, with the smallest and largest single-round ratio."""
    per_round = [a / b for a, b in zip(num, den, strict=True)]
    return {"value": float(np.median(num) / np.median(den)), "min": float(min(per_round)),
            "max": float(max(per_round)), "rounds": len(per_round)}  # fmt: skip


def rotated(items: Sequence[str], k: int) -> list[str]:
    k %= len(items)
    return [*items[k:], *items[:k]]


def machine(threads: int) -> dict[str, Any]:
    import os

    import onnxruntime
    import torch

    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "onnxruntime": onnxruntime.__version__,
            "torch": torch.__version__, "threads": threads, "ort_intra_op_threads": threads,
            "torch_threads": torch.get_num_threads(), "torch_interop_threads": torch.get_num_interop_threads(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}  # fmt: skip
