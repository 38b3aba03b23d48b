"""TensorRT backend: the export's graphs as TensorRT plans built by ``seer-build`` (docs/DESIGN.md "Layout and dependency direction", "Engines and profiles", "Toolchain facts").

In:  an export folder whose manifest records a build (``Manifest.builds``: TensorRT version, GPU, one plan per
     graph with its optimization profiles); per call a graph name and a feed dict of numpy arrays.
Out: the ``Backend`` interface of ``seer_trt.contracts.backend``, so the pipeline, the router and the Triton model run
     unchanged on it: ``run`` returns the graph's outputs by name as numpy arrays.

    feeds ─► axis sizes ─► nearest covering profile (seer_trt.contracts.profiles) ─► that profile's execution context
          ─► a buffer set of the engine's pool ─► inputs staged in page-locked memory and copied to the device
             (a frozen loop-invariant input already there is not copied again) ─► execute (or replay the CUDA
             graph of a static bucket) ─► outputs copied into this thread's host arrays

TensorRT binds a profile to one live execution context (DESIGN "Toolchain facts"), so each profile gets its own context, created on
first use. Device buffers are per engine, not per profile: one set at each tensor's largest shape over all
profiles, plus one more only while calls run at once; a profile's context points at whichever set its call
takes. The denoising loop feeds the same ``prefix_embeds``, ``segment_ids`` and ``position_ids`` arrays at
every step (``seer_trt.runtime.layout`` makes them read-only), so they cross to the device once per group and only
``gen_ids`` per step. The dispatcher's buckets are the ones the plans' profiles were built for (``buckets``).
Plans are valid only under the TensorRT
version and on the GPU they were built for: both are compared with the manifest's record before any plan is
read, and a mismatch is one error naming the rebuild command. ``tensorrt`` (or ``tensorrt_rtx``) is imported
only when a backend opens; CUDA is reached through the driver library (``libcuda.so.1``) with ctypes, so the
runtime needs no CUDA Python package.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib
import threading
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from seer_trt.backends.base import axis_sizes, selected
from seer_trt.backends.cuda import Cuda, CudaMemory, Device, cuda_device
from seer_trt.contracts.backend import DeviceArray, DeviceMemory, Transfers
from seer_trt.contracts.confined import export_file, inside
from seer_trt.contracts.errors import ConfigError, EngineError
from seer_trt.contracts.graphs import GraphSpec
from seer_trt.contracts.manifest import EngineBuild, Manifest
from seer_trt.contracts.profiles import LengthBuckets, Profile, max_sizes, select_profile

BUILDERS = {"tensorrt": "tensorrt", "tensorrt-rtx": "tensorrt_rtx"}  # builder / backend name -> Python module


INSTALL = {
    "tensorrt": "pip install tensorrt-cu12 (or tensorrt-cu13) --extra-index-url https://pypi.nvidia.com",
    "tensorrt-rtx": "pip install tensorrt-rtx-cu12",
}


WINDOW_AXES = ("prompt", "answer")  # a call whose sizes on these are buckets is a static bucket (CUDA graphs)


def import_tensorrt(builder: str):
    """The TensorRT module of ``builder`` ("tensorrt" or "tensorrt-rtx").

    Raises:
        ConfigError: an unknown builder.
        EngineError: the module is not installed; the message names the pip command.
    """
    if builder not in BUILDERS:
        raise ConfigError(f"unknown TensorRT flavour {builder!r}; choose from {sorted(BUILDERS)}")
    try:
        return importlib.import_module(BUILDERS[builder])
    except ImportError as err:
        raise EngineError(
            f"{builder} is not importable ({err}); install it with `{INSTALL[builder]}`, or use the onnxruntime backend"
        ) from None


def rebuild_command(folder: str | Path, builder: str) -> str:
    """The command that (re)builds ``builder``'s engines of an export folder."""
    return f"seer-build --engines {folder}" + ("" if builder == "tensorrt" else f" --builder {builder}")


def check_build(build: EngineBuild | None, builder: str, version: str, device: Device | None,
                folder: str | Path) -> None:  # fmt: skip
    """Refuse plans this machine cannot run: none built, another TensorRT version, another GPU.

    Args:
        build: the manifest's record for ``builder`` (``Manifest.builds``), None when it has none.
        builder: "tensorrt" or "tensorrt-rtx".
        version: the TensorRT version installed here.
        device: this machine's GPU, None when it has none.
        folder: the export folder, for the rebuild command.

    Raises:
        EngineError: one line naming what the plans were built for, what this machine has, and the fix.
    """
    fix = rebuild_command(folder, builder)
    if build is None:
        raise EngineError(f"{folder} has no {builder} engines (its manifest records none); build them with `{fix}`")
    if device is None:
        raise EngineError(
            f"{builder} engines need a CUDA GPU and this machine has none (no NVIDIA driver or no device visible); "
            f"run on the GPU they were built for, or use the onnxruntime backend"
        )
    problems = []
    if build.version != version:
        problems.append(f"were built by {builder} {build.version}, this machine has {version}")
    # A plan built ahead of time without a GPU (TensorRT-RTX) records no device and runs on any supported one.
    if build.compute_capability and (build.device, build.compute_capability) != (
        device.name,
        device.compute_capability,
    ):
        problems.append(
            f"were built for {build.device} (compute capability {build.compute_capability}), this machine has {device}"
        )
    if problems:
        raise EngineError(f"the {builder} engines in {folder} {' and '.join(problems)}; rebuild them here with `{fix}`")


def frozen(array: np.ndarray) -> bool:
    """True when nothing can change ``array``'s contents: it and the array it views are read-only.

    The pipeline's layouts (``seer_trt.runtime.layout``) freeze their loop-invariant inputs, so a step that passes the same
    array object again passes the same values, and its device copy is still good.
    """
    base = array
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return False
        base = base.base
    return True


@dataclasses.dataclass
class _Buffers:
    """One set of an engine's I/O buffers, at each tensor's largest shape over all the engine's profiles: device
    memory, and page-locked host staging for the inputs."""

    device: dict[str, int]  # tensor name -> device pointer
    staging: dict[str, np.ndarray]  # input name -> flat page-locked array, the source of its host-to-device copy
    uploaded: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # input -> the frozen array on device


@dataclasses.dataclass
class _Context:
    """One profile's execution context: its stream, the buffer set its tensor addresses point at, and at most one
    CUDA graph, of the static shape it last ran."""

    context: Any  # tensorrt.IExecutionContext bound to this profile
    stream: ctypes.c_void_p  # its own stream: a capture records only this context's work
    lock: threading.Lock  # a context runs one call at a time
    shapes: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)  # input shapes last set
    addresses: dict[str, int] = dataclasses.field(default_factory=dict)  # tensor -> the address it is set to
    graph_key: tuple | None = None  # the input shapes ``graph`` was captured at (with ``addresses``)
    graph: ctypes.c_void_p | None = None  # instantiated CUDA graph of one execution at ``graph_key``
    capturable: bool = True  # False once TensorRT could not be captured for this engine


@dataclasses.dataclass
class _Engine:
    """One plan: its contexts (one per profile) and its buffer pool. Contexts of different profiles share the
    pool, so memory is one buffer set per call running at once, not one per profile."""

    engine: Any  # tensorrt.ICudaEngine
    profiles: tuple[Profile, ...]  # as recorded by seer-build, in profile-index order
    sizes: dict[str, tuple[int, np.dtype]]  # tensor -> (elements at its largest shape over the profiles, dtype)
    inputs: frozenset[str]  # which of them are inputs (staged through page-locked memory)
    contexts: dict[int, _Context] = dataclasses.field(default_factory=dict)  # profile index -> its context
    free: list[_Buffers] = dataclasses.field(default_factory=list)  # buffer sets no call is using
    pool: list[_Buffers] = dataclasses.field(default_factory=list)  # every buffer set allocated
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


class TrtBackend:
    """TensorRT plans of an export folder; engines load on first use of each graph, contexts per profile."""

    def __init__(self, folder: str | Path, manifest: Manifest, builder: str = "tensorrt", cuda_graphs: bool = False,
                 device: int = 0) -> None:  # fmt: skip
        """
        Args:
            folder: the export folder (``manifest.json``, and the plans ``seer-build`` wrote).
            manifest: its manifest.
            builder: whose plans: "tensorrt" (any CUDA GPU) or "tensorrt-rtx" (RTX GPUs).
            cuda_graphs: replay a captured CUDA graph for calls at a static bucket shape (prompt and answer sizes
                both buckets of the build, as the dispatcher's static path makes them).
            device: CUDA device index.

        Raises:
            EngineError: no build recorded, TensorRT missing or of another version, no GPU or another one, a plan
                file missing.
        """
        self.folder = Path(folder)
        self.manifest = manifest
        self.name = builder
        self.cuda_graphs = cuda_graphs
        self.record = manifest.builds.get(builder)
        if self.record is None:  # before importing anything: the fix is a build, not an install
            check_build(None, builder, "", None, folder)
        trt = import_tensorrt(builder)
        check_build(self.record, builder, trt.__version__, cuda_device(device), folder)
        for graph, entry in self.record.engines.items():
            if not inside(self.folder, entry.file, f"builds.{builder}.engines.{graph}.file").exists():
                raise EngineError(f"graph {graph!r}: plan {self.folder / entry.file} is missing; rebuild with "
                                  f"`{rebuild_command(folder, builder)}`")  # fmt: skip
        self.trt = trt
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        self.cuda = Cuda(device)
        self.transfers = Transfers()
        self.memory: DeviceMemory = CudaMemory(self.cuda, self.transfers)  # the prompt K/V pool lives here
        self._buckets = self.record.buckets or buckets_of(self.record)
        self._engines: dict[str, _Engine] = {}
        self._lock = threading.Lock()
        self._local = threading.local()  # per thread: {(graph, profile): {output: host array at the largest shape}}

    # --- the Backend interface -------------------------------------------------------------------------------

    def spec(self, graph: str) -> GraphSpec:
        return self.manifest.graph(graph).spec

    def max_shape(self, graph: str) -> dict[str, int] | None:
        return max_sizes(self._entry(graph).profiles)

    def buckets(self) -> LengthBuckets:
        """The buckets the plans' profiles were planned from (``seer-build --profiles`` included)."""
        return self._buckets

    def run(self, graph: str, feeds: Mapping[str, np.ndarray | DeviceArray], outputs: Collection[str] | None = None,
            into: Mapping[str, DeviceArray] | None = None) -> dict[str, np.ndarray]:  # fmt: skip
        spec = self.spec(graph)
        into = into or {}
        # every output has a device buffer (or is written ``into`` a device array); only these come back to the host
        wanted = selected(spec, outputs, into)
        sizes = axis_sizes(spec, feeds)
        engine = self._engine(graph)
        index = select_profile(engine.profiles, sizes, graph)
        ctx = self._context(graph, engine, index)
        host = self._outputs(graph, spec, engine)
        static = is_static(sizes, self._buckets)
        with ctx.lock:
            buffers = self._acquire(engine)
            try:
                self.cuda.make_current()
                for t in spec.inputs:
                    value = feeds[t.name]
                    if not isinstance(value, DeviceArray):
                        value = np.ascontiguousarray(value)
                    if value.dtype != np.dtype(t.dtype):
                        raise ConfigError(f"graph {graph!r}: input {t.name} is {value.dtype}, expected {t.dtype}")
                    self._set_shape(ctx, graph, t.name, tuple(value.shape), index, engine.profiles[index])
                    if isinstance(value, DeviceArray):  # bound where it lies (the K/V pool's call buffers)
                        self._address(ctx, t.name, value.ptr)
                    else:
                        self._address(ctx, t.name, buffers.device[t.name])
                        self._upload(buffers, t.name, value, ctx.stream)
                for t in spec.outputs:
                    self._address(ctx, t.name, into[t.name].ptr if t.name in into else buffers.device[t.name])
                self.memory.synchronize()  # the K/V copies this call reads are done
                self._execute(ctx, graph, tuple(ctx.shapes[t.name] for t in spec.inputs) if static else None)
                result = {}
                for t in (t for t in spec.outputs if t.name in wanted):
                    shape = tuple(sizes[a] if isinstance(a, str) else a for a in t.shape)
                    view = host[t.name][: int(np.prod(shape))].reshape(shape)
                    self.cuda.to_host(view, buffers.device[t.name], ctx.stream)
                    result[t.name] = view
                self.cuda.sync(ctx.stream)
                self.transfers.call(result)
            finally:
                with engine.lock:
                    engine.free.append(buffers)
        return result

    def close(self) -> None:
        with self._lock:
            if self._engines:
                self.cuda.make_current()
            for engine in self._engines.values():
                for ctx in engine.contexts.values():
                    with ctx.lock:
                        self.cuda.release(ctx.stream, ctx.graph)
                engine.contexts.clear()  # contexts go before their engine (TensorRT's order)
                for buffers in engine.pool:
                    self.cuda.free(buffers.device, buffers.staging)
                engine.pool.clear()
                engine.free.clear()
            self._engines.clear()
        self._local = threading.local()

    # --- engines, contexts, buffers --------------------------------------------------------------------------

    def _entry(self, graph: str):
        self.manifest.graph(graph)  # an unknown graph: the manifest's error, with the re-export command
        if graph not in self.record.engines:
            raise EngineError(f"graph {graph!r} has no {self.name} plan (built: {sorted(self.record.engines)}); "
                              f"rebuild with `{rebuild_command(self.folder, self.name)}`")  # fmt: skip
        return self.record.engines[graph]

    def _engine(self, graph: str) -> _Engine:
        with self._lock:
            if graph not in self._engines:
                entry = self._entry(graph)
                self.cuda.make_current()
                plan = export_file(self.folder, entry.file, f"engines.{graph}")
                engine = self.runtime.deserialize_cuda_engine(plan.read_bytes())
                if engine is None:
                    raise EngineError(f"graph {graph!r}: {self.folder / entry.file} does not deserialize (TensorRT "
                                      f"logged why); rebuild with `{rebuild_command(self.folder, self.name)}`")  # fmt: skip
                self._check_io(graph, engine, len(entry.profiles))
                spec = self.spec(graph)
                sizes = {t.name: (largest(t.shape, entry.profiles), np.dtype(t.dtype)) for t in (*spec.inputs,
                                                                                              *spec.outputs)}  # fmt: skip
                self._engines[graph] = _Engine(engine, entry.profiles, sizes, frozenset(t.name for t in spec.inputs))
            return self._engines[graph]

    def _check_io(self, graph: str, engine, profiles: int) -> None:
        """The plan's tensors and profile count are the manifest's."""
        spec = self.spec(graph)
        found = {}
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            found[name] = np.dtype(self.trt.nptype(engine.get_tensor_dtype(name))).name
        expected = {t.name: t.dtype for t in (*spec.inputs, *spec.outputs)}
        if found != expected or engine.num_optimization_profiles != profiles:
            raise EngineError(
                f"graph {graph!r}: the plan has tensors {found} and {engine.num_optimization_profiles} profile(s), "
                f"the manifest {expected} and {profiles}; rebuild with `{rebuild_command(self.folder, self.name)}`"
            )

    def _context(self, graph: str, engine: _Engine, index: int) -> _Context:
        with self._lock:
            if index not in engine.contexts:
                self.cuda.make_current()
                strategy = getattr(self.trt, "ExecutionContextAllocationStrategy", None)
                # One context per profile: each needs only its own profile's activation memory.
                context = (engine.engine.create_execution_context(strategy.ON_PROFILE_CHANGE) if strategy
                           else engine.engine.create_execution_context())  # fmt: skip
                if context is None:
                    raise EngineError(f"graph {graph!r}: TensorRT could not create an execution context (device "
                                      f"memory?); close other GPU work or build fewer profiles")  # fmt: skip
                stream = self.cuda.new_stream()
                context.set_optimization_profile_async(index, stream.value or 0)
                self.cuda.sync(stream)
                engine.contexts[index] = _Context(context, stream, threading.Lock())
            return engine.contexts[index]

    def _acquire(self, engine: _Engine) -> _Buffers:
        """A buffer set of the engine's pool no call is using; a new one only when every set is busy (threads)."""
        with engine.lock:
            if engine.free:
                return engine.free.pop()
        self.cuda.make_current()
        device = {name: self.cuda.alloc(n * dtype.itemsize) for name, (n, dtype) in engine.sizes.items()}
        staging = {name: self.cuda.host_alloc(n * dtype.itemsize, dtype) for name, (n, dtype) in engine.sizes.items()
                   if name in engine.inputs}  # fmt: skip
        buffers = _Buffers(device, staging)
        with engine.lock:
            engine.pool.append(buffers)
        return buffers

    def _set_shape(self, ctx: _Context, graph: str, name: str, shape: tuple[int, ...], index: int,
                   profile: Profile) -> None:  # fmt: skip
        if ctx.shapes.get(name) == shape:
            return
        try:
            accepted = ctx.context.set_input_shape(name, shape)
        except Exception as err:  # noqa: BLE001 - TensorRT's bindings raise their own types on some versions
            accepted, why = False, f" ({err})"
        else:
            why = ""
        if not accepted:
            ctx.shapes.pop(name, None)
            raise EngineError(f"graph {graph!r}: TensorRT refused shape {tuple(shape)} for input {name!r} under profile "
                              f"{index} ({profile.label()}){why}; rebuild with profiles covering it, e.g. "
                              f"`{rebuild_command(self.folder, self.name)} --profiles ...`")  # fmt: skip
        ctx.shapes[name] = shape

    def _address(self, ctx: _Context, name: str, ptr: int) -> None:
        """Point the context's tensor ``name`` at ``ptr`` (a buffer of the engine's pool, or a device array fed or
        written into); a CUDA graph captured with the old address is dropped."""
        if ctx.addresses.get(name) != ptr:
            ctx.context.set_tensor_address(name, ptr)
            ctx.addresses[name] = ptr
            self._drop_graph(ctx)

    def _upload(self, buffers: _Buffers, name: str, value: np.ndarray, stream: ctypes.c_void_p) -> None:
        """Copy one input to the device through its page-locked staging buffer, unless the buffer holds it already:
        a frozen array uploaded by the previous call (a group's prefix, segment and position ids) stays bound."""
        if frozen(value) and buffers.uploaded.get(name) is value:
            return
        if (
            value.size == 0
        ):  # an empty cache or prompt (docs/DESIGN.md "Prompt K/V cache"): nothing to copy, the buffer keeps its
            return  # contents (a refresh after cached steps finds the group's prompt still there)
        buffers.uploaded.pop(name, None)
        staged = buffers.staging[name][: value.size].reshape(value.shape)
        np.copyto(staged, value)  # pageable -> pinned on the host; the device copy below is then DMA
        self.cuda.to_device(buffers.device[name], staged, stream)
        self.transfers.sent(name, value.nbytes)
        if frozen(value):
            buffers.uploaded[name] = value  # also keeps it alive: its id cannot be reused by another array

    def _outputs(self, graph: str, spec: GraphSpec, engine: _Engine) -> dict[str, np.ndarray]:
        """This thread's flat host arrays for a graph's outputs, at their largest shapes (allocated once)."""
        cache = self._local.__dict__.setdefault("outputs", {})
        if graph not in cache:
            cache[graph] = {t.name: np.empty(engine.sizes[t.name][0], dtype=t.dtype) for t in spec.outputs}
        return cache[graph]

    def _drop_graph(self, ctx: _Context) -> None:
        if ctx.graph is not None:
            self.cuda.sync(ctx.stream)
            self.cuda.drop_graph(ctx.graph)
            ctx.graph, ctx.graph_key = None, None

    def _execute(self, ctx: _Context, graph: str, static: tuple | None) -> None:
        """Run the context on its stream; with CUDA graphs, replay the graph of a static shape run just before.

        A context keeps one graph, of the last static shape it ran with its current buffer set: a denoising loop
        repeats one shape for all its steps, and TensorRT's state for a shape is what the capture recorded, so any
        other call on the context drops the graph (it is captured again when a static shape repeats).
        """
        stream = ctx.stream.value or 0

        def enqueue() -> None:
            if not ctx.context.execute_async_v3(stream):
                raise EngineError(f"graph {graph!r}: TensorRT failed to execute (it logged why)")

        if static is not None and static == ctx.graph_key and ctx.graph is not None:
            self.cuda.launch(ctx.graph, ctx.stream)
            return
        self._drop_graph(ctx)
        enqueue()  # outside any capture: TensorRT does its shape-dependent setup here; these are the call's outputs
        if self.cuda_graphs and static is not None and ctx.capturable:
            self.cuda.sync(ctx.stream)
            ctx.graph = self.cuda.capture(ctx.stream, enqueue)  # records the work for the next calls only
            ctx.graph_key = static if ctx.graph is not None else None
            ctx.capturable = ctx.graph is not None


def is_static(sizes: Mapping[str, int], buckets: LengthBuckets) -> bool:
    """A call at a static bucket shape: prompt and answer sizes are buckets (a cached step's prompt is its past)."""
    window = {**sizes, "prompt": sizes.get("past") or sizes.get("prompt")}
    return all(window.get(a) in getattr(buckets, a) for a in WINDOW_AXES)


def largest(shape: tuple[str | int, ...], profiles: tuple[Profile, ...]) -> int:
    """Elements of a tensor at its largest shape over ``profiles`` (fixed axes as they are)."""
    return max(int(np.prod([p.range(a).max if isinstance(a, str) else a for a in shape])) for p in profiles)


def buckets_of(build: EngineBuild) -> LengthBuckets:
    """Buckets read back from a build's profiles, for a record made before builds stored them: per axis, every
    profile range's opt and max (an axis split per bucket gives its buckets; one range gives its middle and top)."""
    sizes: dict[str, set[int]] = {"batch": set(), "prompt": set(), "answer": set()}
    for engine in build.engines.values():
        for profile in engine.profiles:
            for axis, r in profile.ranges:
                if axis in sizes:
                    sizes[axis].update(v for v in (r.opt, r.max) if v > 0)  # a cached profile's empty prompt
    default = LengthBuckets()
    return LengthBuckets(**{a: tuple(sorted(v)) or getattr(default, a) for a, v in sizes.items()})
