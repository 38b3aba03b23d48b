"""The CUDA driver from Python with ctypes: the device, streams, memory and CUDA graphs the TensorRT backend uses.

The runtime needs no CUDA Python package: ``libcuda.so.1`` is loaded when a TensorRT backend opens.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from seer_trt.contracts.errors import EngineError


@dataclasses.dataclass(frozen=True)
class Device:
    """A CUDA GPU as the driver names it."""

    name: str  # e.g. "NVIDIA H200"
    compute_capability: str  # "MAJOR.MINOR", e.g. "9.0"

    def __str__(self) -> str:
        return f"{self.name} (compute capability {self.compute_capability})"


def cuda_device(index: int = 0) -> Device | None:
    """The CUDA GPU ``index`` (after CUDA_VISIBLE_DEVICES), or None when there is no driver or no such GPU."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count, dev, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value <= index:
        return None
    name = ctypes.create_string_buffer(256)
    if (
        lib.cuDeviceGet(ctypes.byref(dev), index) != 0
        or lib.cuDeviceGetName(name, 256, dev) != 0
        or lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev) != 0  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
        or lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev) != 0  # ..._MINOR
    ):
        return None
    return Device(name.value.decode(errors="replace"), f"{major.value}.{minor.value}")


class Cuda:
    """The few CUDA driver calls the backend needs, on the device's primary context (the one TensorRT uses)."""

    def __init__(self, index: int) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.check(self.lib.cuInit(0), "cuInit")
        self.device = ctypes.c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(self.device), index), "cuDeviceGet")
        self.context = ctypes.c_void_p()
        self.check(
            self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), self.device), "cuDevicePrimaryCtxRetain"
        )
        self.make_current()

    def check(self, code: int, call: str) -> None:
        if code != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(code, ctypes.byref(text))
            raise EngineError(f"CUDA {call} failed with error {code} ({(text.value or b'?').decode()})")

    def make_current(self) -> None:
        self.check(self.lib.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def new_stream(self) -> ctypes.c_void_p:
        stream = ctypes.c_void_p()
        self.check(self.lib.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")  # CU_STREAM_NON_BLOCKING
        return stream

    def alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(max(nbytes, 1))), "cuMemAlloc")
        return ptr.value

    def host_alloc(self, nbytes: int, dtype: np.dtype) -> np.ndarray:
        """A flat array in page-locked host memory: copies from it to the device are DMA, truly asynchronous."""
        ptr = ctypes.c_void_p()
        self.check(self.lib.cuMemHostAlloc(ctypes.byref(ptr), ctypes.c_size_t(max(nbytes, 1)), 0), "cuMemHostAlloc")
        raw = (ctypes.c_uint8 * max(nbytes, 1)).from_address(ptr.value)
        return np.frombuffer(raw, dtype=np.uint8)[:nbytes].view(dtype)

    def free(self, device: Mapping[str, int], host: Mapping[str, np.ndarray]) -> None:
        for ptr in device.values():
            self.lib.cuMemFree_v2(ctypes.c_uint64(ptr))
        for array in host.values():
            self.lib.cuMemFreeHost(ctypes.c_void_p(array.ctypes.data))

    def to_device(self, ptr: int, array: np.ndarray, stream: ctypes.c_void_p) -> None:
        self.check(self.lib.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(ptr), ctypes.c_void_p(array.ctypes.data),
                                                 ctypes.c_size_t(array.nbytes), stream), "cuMemcpyHtoDAsync")  # fmt: skip

    def to_host(self, array: np.ndarray, ptr: int, stream: ctypes.c_void_p) -> None:
        self.check(self.lib.cuMemcpyDtoHAsync_v2(ctypes.c_void_p(array.ctypes.data), ctypes.c_uint64(ptr),
                                                 ctypes.c_size_t(array.nbytes), stream), "cuMemcpyDtoHAsync")  # fmt: skip

    def sync(self, stream: ctypes.c_void_p) -> None:
        self.check(self.lib.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def capture(self, stream: ctypes.c_void_p, enqueue: Callable[[], None]) -> ctypes.c_void_p | None:
        """An instantiated CUDA graph of what ``enqueue`` puts on ``stream``; None when it cannot be captured."""
        if self.lib.cuStreamBeginCapture_v2(stream, 1) != 0:  # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            return None
        graph, exe = ctypes.c_void_p(), ctypes.c_void_p()
        try:
            enqueue()
            failed = False
        except EngineError:
            failed = True
        ended = self.lib.cuStreamEndCapture(stream, ctypes.byref(graph))
        if failed or ended != 0 or not graph.value:
            if graph.value:
                self.lib.cuGraphDestroy(graph)
            return None
        made = self.lib.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, ctypes.c_ulonglong(0))
        self.lib.cuGraphDestroy(graph)
        return exe if made == 0 else None

    def launch(self, exe: ctypes.c_void_p, stream: ctypes.c_void_p) -> None:
        self.check(self.lib.cuGraphLaunch(exe, stream), "cuGraphLaunch")

    def drop_graph(self, exe: ctypes.c_void_p) -> None:
        self.lib.cuGraphExecDestroy(exe)

    def release(self, stream: ctypes.c_void_p, graph: ctypes.c_void_p | None) -> None:
        """Free one context's CUDA graph and stream."""
        self.lib.cuStreamSynchronize(stream)
        if graph is not None:
            self.lib.cuGraphExecDestroy(graph)
        self.lib.cuStreamDestroy_v2(stream)
