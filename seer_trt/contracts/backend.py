"""The ``Backend`` protocol: what the runtime needs from whatever runs the graphs (docs/DESIGN.md "Graphs and their contract", "Prompt K/V cache").

Every backend (``seer_trt.backends``: ONNX Runtime, TensorRT; the Triton orchestrator's BLS backend) offers the
same small interface, so the pipeline, the router and the Triton model never know which one runs.

What a step reads every time stays where the graphs run (docs/DESIGN.md "Prompt K/V cache"): a backend has device
memory (``DeviceMemory``: the GPU under CUDA and TensorRT, host memory under ONNX Runtime's CPU provider and Triton's
BLS), a feed may be a ``DeviceArray`` in it (bound where it lies, nothing copied), and an output may be written into one
(``run(..., into=...)``) instead of coming back to the host. Every backend counts what it moves between the caller's
host arrays and its device, by kind (``Transfers``): a numpy feed is a host-to-device copy under CUDA and TensorRT, so
it is counted on every backend, the CPU provider included, where the same code path binds it in place; a
``DeviceArray`` feed is not.

    numpy feeds ──(counted: host -> device)──┐
    DeviceArray feeds (K/V call buffers) ────┼─► graph ─► outputs asked for ──(counted: device -> host)──► numpy
                                             └─► into: DeviceArray outputs (present.*: a refresh's K/V), not counted
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Collection, Mapping
from typing import Any, Protocol

import numpy as np

from seer_trt.contracts.graphs import GraphSpec
from seer_trt.contracts.manifest import Manifest
from seer_trt.contracts.profiles import LengthBuckets

TRANSFER_KINDS = ("kv", "embeddings", "images", "ids", "outputs")  # what crosses between host and device, by kind


def transfer_kind(name: str, output: bool = False) -> str:
    """The kind of a graph input or output for ``Transfers``: the prompt K/V (``past_key_values.*``, ``present.*``),
    embeddings (``prefix_embeds``, embed's and vision's outputs), image pixels, ids and small inputs (``gen_ids``,
    ``segment_ids``, ``position_ids``, ``past_weights``, ``input_ids``), or a step's outputs (``x0``, confidences, ...)."""
    if name.startswith(("past_key_values.", "present.")):
        return "kv"
    if name in ("prefix_embeds", "embeds", "image_features", "image_newline"):
        return "embeddings"
    if name == "pixel_values":
        return "images"
    return "outputs" if output else "ids"


@dataclasses.dataclass(frozen=True, eq=False)
class DeviceArray:
    """A C-contiguous array in a backend's device memory: the address of its first element, its shape and dtype.

    Only ``DeviceMemory`` makes them; ``block`` views a sub-array at leading indices (still contiguous).
    """

    device: str  # "cpu" (host memory, ONNX Runtime's CPU provider, Triton's BLS) | "cuda"
    ptr: int  # address of element 0: a host address or a CUDA device pointer
    shape: tuple[int, ...]
    dtype: np.dtype
    owner: Any  # what keeps the memory alive (a numpy array on the host; the allocation under CUDA)
    host: np.ndarray | None = None  # in host memory: the numpy view of these elements (None on a device)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def block(self, *lead: int) -> DeviceArray:
        """The sub-array at leading indices ``lead`` (``a.block(m, b)`` is ``a[m, b]``), contiguous like its parent."""
        offset, stride = 0, self.nbytes
        for axis, i in enumerate(lead):
            stride //= self.shape[axis]
            if not 0 <= i < self.shape[axis]:
                raise IndexError(f"index {i} out of range for axis {axis} of {self.shape}")
            offset += i * stride
        host = None if self.host is None else self.host[lead]
        return DeviceArray(self.device, self.ptr + offset, self.shape[len(lead) :], self.dtype, self.owner, host)

    def reshape(self, *shape: int) -> DeviceArray:
        """The same memory under another shape of as many elements."""
        if math.prod(shape) != math.prod(self.shape):
            raise ValueError(f"cannot view {self.shape} as {shape}")
        host = None if self.host is None else self.host.reshape(shape)
        return DeviceArray(self.device, self.ptr, tuple(shape), self.dtype, self.owner, host)

    def first(self, count: int) -> DeviceArray:
        """The first ``count`` entries of axis 0 (contiguous): a call's rows of a buffer sized for more."""
        if not 0 <= count <= self.shape[0]:
            raise IndexError(f"{count} entries of an axis of {self.shape[0]}")
        host = None if self.host is None else self.host[:count]
        return DeviceArray(self.device, self.ptr, (count, *self.shape[1:]), self.dtype, self.owner, host)


class DeviceMemory(Protocol):
    """A backend's device memory: allocation and device-to-device copies of column ranges, counted."""

    device: str  # "cpu" | "cuda"

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype | str) -> DeviceArray:
        """A new array of zeros (every byte finite: a padded attention column never reads NaN garbage)."""
        ...

    def copy_columns(self, dst: DeviceArray, dst_col: int, src: DeviceArray, src_col: int, count: int) -> int:
        """Copy columns (axis -2) ``src_col .. src_col + count`` of ``src`` [..., C, d] into ``dst`` [..., C', d]
        from ``dst_col``; the leading axes must hold the same number of elements. Returns the bytes copied. May be
        asynchronous: ``synchronize`` before a graph call reads ``dst``."""
        ...

    def synchronize(self) -> None:
        """Wait for the copies made so far."""
        ...

    def free_bytes(self) -> int:
        """Bytes this memory could still give: the machine's physical memory for host memory, the GPU's free
        memory under CUDA (the K/V pool's default budget is a share of it)."""
        ...

    def to_host(self, array: DeviceArray) -> np.ndarray:
        """A host copy (the cache's drift gate and tests); counted as K/V sent to the host by the caller."""
        ...

    def free(self, array: DeviceArray) -> None: ...


@dataclasses.dataclass
class Transfers:
    """Bytes a backend moved between host arrays and its device since it opened, by kind (``TRANSFER_KINDS``), and
    bytes copied device to device (K/V slots into a call's buffers); thread-safe."""

    to_device: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(TRANSFER_KINDS, 0))
    to_host: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(TRANSFER_KINDS, 0))
    device_copies: int = 0  # bytes
    calls: int = 0  # graph calls counted
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, feeds: Mapping[str, Any], returned: Mapping[str, np.ndarray]) -> None:
        """One call: its numpy feeds went to the device, ``returned`` came back; ``DeviceArray`` feeds did not move."""
        with self.lock:
            self.calls += 1
            for name, value in feeds.items():
                if isinstance(value, np.ndarray):
                    self.to_device[transfer_kind(name)] += value.nbytes
            for name, value in returned.items():
                self.to_host[transfer_kind(name, output=True)] += value.nbytes

    def sent(self, name: str, nbytes: int) -> None:
        """Bytes of input ``name`` copied to the device (a backend that skips inputs already there counts itself)."""
        with self.lock:
            self.to_device[transfer_kind(name)] += nbytes

    def call(self, returned: Mapping[str, np.ndarray]) -> None:
        """One call whose inputs were counted by ``sent``; ``returned`` came back to the host."""
        with self.lock:
            self.calls += 1
            for name, value in returned.items():
                self.to_host[transfer_kind(name, output=True)] += value.nbytes

    def copied(self, nbytes: int) -> None:
        with self.lock:
            self.device_copies += nbytes

    def fetched(self, kind: str, nbytes: int) -> None:
        """Bytes of device memory read back to the host outside a call (``DeviceMemory.to_host``)."""
        with self.lock:
            self.to_host[kind] += nbytes

    def snapshot(self) -> dict[str, Any]:
        """The counters now, as plain data."""
        with self.lock:
            return {"to_device": dict(self.to_device), "to_host": dict(self.to_host),
                    "device_copies": self.device_copies, "calls": self.calls}  # fmt: skip


class Backend(Protocol):
    """What the pipeline needs from an inference backend."""

    name: str  # "onnxruntime-cpu", "tensorrt", ...
    manifest: Manifest
    memory: DeviceMemory  # where the graphs run: the prompt K/V pool and the calls' K/V buffers live here
    transfers: Transfers  # bytes moved between host and device, by kind

    def run(self, graph: str, feeds: Mapping[str, np.ndarray | DeviceArray], outputs: Collection[str] | None = None,
            into: Mapping[str, DeviceArray] | None = None) -> dict[str, np.ndarray]:  # fmt: skip
        """Outputs of ``graph`` by name: those named in ``outputs`` (None: all but those written ``into``), in the
        spec's order; the backend need not compute a transfer for the others (a step that refreshes no cache skips
        the prompt's K/V). ``into``: outputs written into device arrays of ``memory`` (a refresh's ``present.*``),
        never returned. A ``DeviceArray`` feed is bound where it lies. Returned arrays may be reused by the next call
        on this thread."""
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
