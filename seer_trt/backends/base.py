"""What every backend checks before it executes a graph: the feeds against the graph's contract.

In:  a ``GraphSpec`` and a feed dict.  Out: the size of every named axis, or one error naming the bad input.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np

from seer_trt.contracts.errors import ConfigError
from seer_trt.contracts.graphs import GraphSpec


def axis_sizes(spec: GraphSpec, feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Size of every named axis from the feeds; a missing input or a size that disagrees is an error."""
    missing = [t.name for t in spec.inputs if t.name not in feeds]
    if missing:
        raise ConfigError(f"graph {spec.name!r}: inputs {_short(missing)} not fed; it takes "
                          f"{_short([t.name for t in spec.inputs])} (no cache: seer_trt.runtime.kv_cache.no_cache)")  # fmt: skip
    sizes: dict[str, int] = {}
    for t in spec.inputs:
        shape = np.shape(feeds[t.name])
        if len(shape) != len(t.shape):
            raise ConfigError(f"graph {spec.name!r}: input {t.name} has shape {shape}, expected axes {t.shape}")
        for axis, size in zip(t.shape, shape, strict=True):
            if isinstance(axis, int):
                if size != axis:
                    raise ConfigError(f"graph {spec.name!r}: input {t.name} has shape {shape}, expected {t.shape}")
            elif sizes.setdefault(axis, size) != size:
                raise ConfigError(
                    f"graph {spec.name!r}: axis {axis!r} is {sizes[axis]} in one input, {size} in {t.name}"
                )
    if "prompt" in sizes and "answer" in sizes:
        sizes.setdefault("seq", sizes.get("past", 0) + sizes["prompt"] + sizes["answer"])
    return sizes


def selected(spec: GraphSpec, outputs: Collection[str] | None) -> tuple[str, ...]:
    """The output names a call returns, in the spec's order: ``outputs`` (None: every output).

    Raises:
        ConfigError: a name the graph does not output.
    """
    names = tuple(t.name for t in spec.outputs)
    if outputs is None:
        return names
    unknown = sorted(set(outputs) - set(names))
    if unknown:
        raise ConfigError(f"graph {spec.name!r} has no output(s) {unknown}; it outputs {_short(list(names))}")
    return tuple(n for n in names if n in outputs)


def _short(names: list[str]) -> list[str]:
    """Names with the per-layer cache tensors folded: ``past_key_values.*.key/value (16)``."""
    layered = [n for n in names if n.startswith("past_key_values.")]
    if not layered:
        return names
    return [n for n in names if n not in layered] + [f"past_key_values.*.key/value ({len(layered)})"]
