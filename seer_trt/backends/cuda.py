"""The CUDA driver from Python with ctypes: the device, streams, memory and CUDA graphs the TensorRT backend uses, and
the GPU as a ``DeviceMemory`` (the prompt K/V pool of the TensorRT backend and of ONNX Runtime's CUDA provider).

The runtime needs no CUDA Python package: ``libcuda.so.1`` is loaded when a GPU backend opens.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from seer_trt.contracts.backend import DeviceArray, Transfers
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

    def free_one(self, ptr: int) -> None:
        self.lib.cuMemFree_v2(ctypes.c_uint64(ptr))

    def memset0(self, ptr: int, nbytes: int, stream: ctypes.c_void_p) -> None:
        self.check(self.lib.cuMemsetD8Async(ctypes.c_uint64(ptr), ctypes.c_ubyte(0), ctypes.c_size_t(max(nbytes, 1)),
                                            stream), "cuMemsetD8Async")  # fmt: skip

    def copy2d(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int,
               stream: ctypes.c_void_p) -> None:  # fmt: skip
        """``height`` rows of ``width`` bytes, device to device, each row ``*_pitch`` bytes after the one before."""
        copy = _Memcpy2D(srcMemoryType=CU_MEMORYTYPE_DEVICE, srcDevice=src, srcPitch=src_pitch,
                         dstMemoryType=CU_MEMORYTYPE_DEVICE, dstDevice=dst, dstPitch=dst_pitch, WidthInBytes=width,
                         Height=height)  # fmt: skip
        self.check(self.lib.cuMemcpy2DAsync_v2(ctypes.byref(copy), stream), "cuMemcpy2DAsync")

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of the device."""
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.check(self.lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
        return free.value, total.value

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


class _Memcpy2D(ctypes.Structure):
    """CUDA_MEMCPY2D (cuda.h), for cuMemcpy2DAsync_v2."""

    _fields_ = [("srcXInBytes", ctypes.c_size_t), ("srcY", ctypes.c_size_t), ("srcMemoryType", ctypes.c_int),
                ("srcHost", ctypes.c_void_p), ("srcDevice", ctypes.c_uint64), ("srcArray", ctypes.c_void_p),
                ("srcPitch", ctypes.c_size_t), ("dstXInBytes", ctypes.c_size_t), ("dstY", ctypes.c_size_t),
                ("dstMemoryType", ctypes.c_int), ("dstHost", ctypes.c_void_p), ("dstDevice", ctypes.c_uint64),
                ("dstArray", ctypes.c_void_p), ("dstPitch", ctypes.c_size_t), ("WidthInBytes", ctypes.c_size_t),
                ("Height", ctypes.c_size_t)]  # fmt: skip


CU_MEMORYTYPE_DEVICE = 2


class _Allocation:
    """One device allocation, freed when the last ``DeviceArray`` over it goes."""

    def __init__(self, cuda: Cuda, nbytes: int) -> None:
        self.cuda, self.ptr = cuda, cuda.alloc(nbytes)

    def __del__(self) -> None:
        try:
            self.cuda.free_one(self.ptr)
        except Exception:  # noqa: BLE001 - interpreter shutdown: the driver may be gone
            pass


class CudaMemory:
    """``DeviceMemory`` on one GPU: allocations, and column copies as one 2-D copy each (a row per leading element,
    ``count`` columns wide) queued on a stream of its own; ``synchronize`` waits for them before the graph call that
    reads them (which runs on the backend's own stream)."""

    device = "cuda"

    def __init__(self, cuda: Cuda, transfers: Transfers) -> None:
        self.cuda, self.transfers = cuda, transfers
        self.stream = cuda.new_stream()

    def zeros(self, shape: tuple[int, ...], dtype) -> DeviceArray:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.cuda.make_current()
        block = _Allocation(self.cuda, nbytes)
        self.cuda.memset0(block.ptr, nbytes, self.stream)
        self.cuda.sync(self.stream)
        return DeviceArray("cuda", block.ptr, tuple(shape), dtype, block)

    def copy_columns(self, dst: DeviceArray, dst_col: int, src: DeviceArray, src_col: int, count: int) -> int:
        item = dst.dtype.itemsize
        d_cols, s_cols, width = dst.shape[-2], src.shape[-2], dst.shape[-1]
        rows = dst.nbytes // (d_cols * width * item)
        self.cuda.make_current()
        self.cuda.copy2d(dst.ptr + dst_col * width * item, d_cols * width * item, src.ptr + src_col * width * item,
                         s_cols * width * item, count * width * item, rows, self.stream)  # fmt: skip
        nbytes = rows * count * width * item
        self.transfers.copied(nbytes)
        return nbytes

    def synchronize(self) -> None:
        """Wait for the copies made so far: the graph call that reads them runs on another stream."""
        self.cuda.sync(self.stream)

    def free_bytes(self) -> int:
        """The GPU's free memory now."""
        self.cuda.make_current()
        return self.cuda.mem_info()[0]

    def to_host(self, array: DeviceArray) -> np.ndarray:
        out = np.empty(array.shape, dtype=array.dtype)
        self.cuda.make_current()
        self.cuda.to_host(out, array.ptr, self.stream)
        self.cuda.sync(self.stream)
        return out

    def free(self, array: DeviceArray) -> None:
        pass  # the allocation goes with its last DeviceArray
