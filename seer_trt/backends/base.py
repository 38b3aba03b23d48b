"""What every backend shares: the feeds checked against the graph's contract, and host memory as a device.

In:  a ``GraphSpec`` and a feed dict.  Out: the size of every named axis, or one error naming the bad input.
``HostMemory`` is the ``DeviceMemory`` of backends whose graphs read host memory (ONNX Runtime's CPU provider, Triton's
BLS): the prompt K/V pool and the calls' K/V buffers live there, copied by numpy.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping

import numpy as np

from seer_trt.contracts.backend import DeviceArray, Transfers
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
        value = feeds[t.name]
        shape = value.shape if isinstance(value, DeviceArray) else np.shape(value)
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


def selected(spec: GraphSpec, outputs: Collection[str] | None, into: Collection[str] = ()) -> tuple[str, ...]:
    """The output names a call returns to the host, in the spec's order: ``outputs`` (None: every output but those
    written ``into`` device arrays).

    Raises:
        ConfigError: a name the graph does not output, or one asked both back and into a device array.
    """
    names = tuple(t.name for t in spec.outputs)
    unknown = sorted((set(outputs or ()) | set(into)) - set(names))
    if unknown:
        raise ConfigError(f"graph {spec.name!r} has no output(s) {unknown}; it outputs {_short(list(names))}")
    if outputs is None:
        return tuple(n for n in names if n not in into)
    both = sorted(set(outputs) & set(into))
    if both:
        raise ConfigError(f"graph {spec.name!r}: outputs {_short(both)} asked back and written into device arrays")
    return tuple(n for n in names if n in outputs)


def _short(names: list[str]) -> list[str]:
    """Names with the per-layer cache tensors folded: ``past_key_values.*.key/value (16)``."""
    layered = [n for n in names if n.startswith("past_key_values.")]
    if not layered:
        return names
    return [n for n in names if n not in layered] + [f"past_key_values.*.key/value ({len(layered)})"]


class HostMemory:
    """``DeviceMemory`` in host memory: ONNX Runtime's CPU provider (whose OrtValues bind host arrays in place) and
    Triton's BLS calls (which take host tensors). A copy is numpy's."""

    device = "cpu"

    def __init__(self, transfers: Transfers) -> None:
        self.transfers = transfers

    def zeros(self, shape: tuple[int, ...], dtype) -> DeviceArray:
        array = np.zeros(shape, dtype=dtype)
        return DeviceArray("cpu", array.ctypes.data, tuple(array.shape), array.dtype, array, array)

    def copy_columns(self, dst: DeviceArray, dst_col: int, src: DeviceArray, src_col: int, count: int) -> int:
        d, s = host_view(dst), host_view(src)
        d = d.reshape(-1, *d.shape[-2:])
        s = s.reshape(-1, *s.shape[-2:])
        d[:, dst_col : dst_col + count] = s[:, src_col : src_col + count]
        nbytes = d.shape[0] * count * d.shape[-1] * d.dtype.itemsize
        self.transfers.copied(nbytes)
        return nbytes

    def synchronize(self) -> None:
        pass  # numpy's copies are done when they return

    def free_bytes(self) -> int:
        """The machine's physical memory (0 where the platform does not say)."""
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):
            return 0

    def to_host(self, array: DeviceArray) -> np.ndarray:
        return host_view(array).copy()

    def free(self, array: DeviceArray) -> None:
        pass  # the owner array goes with its last reference


def host_view(array: DeviceArray) -> np.ndarray:
    """The numpy view of a host ``DeviceArray`` (a block of its owner's memory)."""
    if array.host is not None:
        return array.host
    owner = array.owner
    offset = array.ptr - owner.ctypes.data
    flat = owner.reshape(-1).view(np.uint8)
    return flat[offset : offset + array.nbytes].view(array.dtype).reshape(array.shape)
