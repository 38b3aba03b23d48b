"""The ONNX Runtime backend: run the graphs a manifest names, by name, with named inputs and outputs (docs/DESIGN.md "Layout and dependency direction", "Graphs and their contract").

In:  an export folder and its ``Manifest``; per call a graph name and a feed dict of numpy arrays.
Out: the graph's outputs by name, as numpy arrays.

Every backend offers the same small interface (``Backend``), so the pipeline, the router and the Triton model
never know which one runs: ``run(graph, feeds)``, ``spec(graph)`` (names, dtypes, axes from the manifest),
``max_shape(graph)`` (the largest lengths it accepts) and ``buckets()`` (the shapes its engines were built for).
``OrtBackend`` is ONNX Runtime: the CPU execution provider by default, CUDA or TensorRT on request; a requested
provider that ONNX Runtime does not actually use is an error, never a silent CPU fallback. It binds outputs to
buffers allocated once per (graph, shape), per thread, so a loop over a static bucket allocates nothing per
step; those bindings are kept least recently used first out within ``cache_bytes`` of outputs per thread, so a
long-running server that sees every length stays bounded. Sessions are shared between threads (ONNX Runtime's
``run`` is thread-safe), bindings are not.

Weights are loaded once across sessions (docs/DESIGN.md "Graphs and their contract"): every graph of an export reads its tensors from one shared
file, which ``OrtBackend`` memory-maps and hands to each session as shared initializers
(``SessionOptions.add_initializer``), one ``OrtValue`` per tensor; its pages are read once, on first use, and
shared with other processes mapping the same file. That needs ONNX Runtime's weight prepacking off: a session
would otherwise keep its own packed copy of every MatMul weight (on the CPU: a few to 30 % slower steps on the
fixture, for one copy of the weights instead of one per session). The loop graphs (``denoise``, ``denoise_logits``)
keep prepacking, over the shared tensors, where their packed copies take at most ``PREPACK_MEMORY_SHARE`` of the
machine's memory: one packed copy of what the steps read, for 8-20 % faster steps on the fixture.
``share_weights=False`` restores per-session loading and prepacking for every graph. CPU provider only: CUDA / TensorRT sessions load their own copy onto the device.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

import numpy as np

from seer_trt.backends.base import HostMemory, axis_sizes, selected
from seer_trt.contracts.backend import DeviceArray, DeviceMemory, Transfers
from seer_trt.contracts.confined import MAX_INDEX_BYTES, export_file, inside, regular
from seer_trt.contracts.errors import ConfigError, ManifestError
from seer_trt.contracts.graphs import GraphSpec
from seer_trt.contracts.manifest import Manifest, read_weights_index
from seer_trt.contracts.profiles import LengthBuckets

PROVIDERS = {  # --provider value -> ONNX Runtime execution provider
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}


BINDING_CACHE_BYTES = 512 * 2**20  # output bytes of bindings kept per thread: every bucket of a fixture, a few at 8B


# Graphs called step after step in the denoising loop: their thread pools may spin between calls. The others run
# once per request (embed, vision, step_zero), and a spinning idle pool of theirs slowed the denoising steps right
# after it by ~20 % on a 2-core machine.
LOOP_GRAPHS = ("denoise", "denoise_logits")

# With shared weights, the loop graphs still get a packed copy of their MatMul weights (8-20 % faster steps on the
# fixture, docs/results.md) when those copies take at most this share of the machine's memory.
PREPACK_MEMORY_SHARE = 0.25


def loop_prepack_fits(manifest: Manifest, memory_bytes: int | None = None) -> bool:
    """Whether packed copies of the loop graphs' weights fit in ``PREPACK_MEMORY_SHARE`` of memory (physical by
    default; False where the platform does not say)."""
    if memory_bytes is None:
        try:
            memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):
            return False
    packed = sum(e.size_bytes for g, e in manifest.graphs.items() if g in LOOP_GRAPHS and e.quantization is None)
    return packed <= PREPACK_MEMORY_SHARE * memory_bytes


ONNX_TYPES = {  # ONNX Runtime's type strings -> manifest dtypes
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
}


class OrtBackend:
    """ONNX Runtime over an export folder; sessions open on first use of each graph."""

    def __init__(self, folder: str | Path, manifest: Manifest, provider: str = "cpu", threads: int = 0,
                 cache_bytes: int = BINDING_CACHE_BYTES, share_weights: bool = True) -> None:  # fmt: skip
        """
        Args:
            folder: the export folder (``manifest.json`` and the graphs).
            manifest: its manifest.
            provider: "cpu", "cuda" or "tensorrt".
            threads: intra-op threads per session, 0 for ONNX Runtime's default.
            cache_bytes: output bytes of the bindings kept per thread (the most recent one is always kept).
            share_weights: load each tensor of the shared weights file once for every session (CPU provider).

        Raises:
            ConfigError: an unknown provider, or one this ONNX Runtime build does not offer; negative threads.
            ManifestError: a graph file the manifest names is missing.
        """
        import onnxruntime as ort

        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
            raise ConfigError(f"threads is {threads!r}; expected a whole number >= 0 (0: ONNX Runtime's default)")
        if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
            raise ConfigError(f"cache_bytes is {cache_bytes!r}; expected a whole number of bytes >= 0")
        if provider not in PROVIDERS:
            raise ConfigError(f"unknown provider {provider!r}; choose from {sorted(PROVIDERS)}")
        self.provider = PROVIDERS[provider]
        available = ort.get_available_providers()
        if self.provider not in available:
            raise ConfigError(
                f"ONNX Runtime {ort.__version__} offers {available}, not {self.provider}; install onnxruntime-gpu "
                f"(with CUDA / TensorRT libraries) for --provider {provider}, or use --provider cpu"
            )
        self.name = f"onnxruntime-{provider}"
        self.folder = Path(folder)
        self.manifest = manifest
        self.threads = threads
        self.cache_bytes = cache_bytes
        for name, entry in manifest.graphs.items():
            try:
                export_file(folder, entry.file, f"graphs.{name}.file")
            except FileNotFoundError:
                raise ManifestError(
                    f"graph {name!r}: {self.folder / entry.file} is missing; re-export with seer-export --out {folder}"
                ) from None
        if manifest.weights is not None:  # checked at open, not at the first call: a damaged export fails alone
            for entry, name, limit in (("weights.file", manifest.weights.file, None),
                                       ("weights.index", manifest.weights.index, MAX_INDEX_BYTES)):  # fmt: skip
                with contextlib.suppress(FileNotFoundError):  # missing: said with the sizes when mapped
                    export_file(folder, name, entry, limit)
        self.share_weights = share_weights and provider == "cpu" and manifest.weights is not None
        self.prepack_loop = self.share_weights and loop_prepack_fits(manifest)
        self._shared: dict[str, tuple[np.ndarray, object]] | None = None  # name -> (mapped array, its OrtValue)
        self.transfers = Transfers()
        # where the graphs run: host memory under the CPU provider, the GPU under CUDA and TensorRT (the prompt K/V
        # pool and the calls' K/V buffers live there, bound to the sessions in place)
        self.device_id = 0
        self.memory: DeviceMemory = HostMemory(self.transfers) if provider == "cpu" else _cuda_memory(self.transfers)
        self._sessions: dict[str, object] = {}
        self._lock = threading.Lock()
        self._local = threading.local()  # per thread: a BindingCache

    def _session(self, graph: str):
        with self._lock:
            if graph not in self._sessions:
                self._sessions[graph] = self._open(graph)
            return self._sessions[graph]

    def _open(self, graph: str):
        import onnxruntime as ort

        entry = self.manifest.graph(graph)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if self.threads:
            options.intra_op_num_threads = self.threads
        if graph not in LOOP_GRAPHS:  # its idle threads would spin, stealing the cores of the steps that follow
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # a quantized graph (seer-quantize) holds its own weights, and its kernels need prepacking (MatMulNBits
        # without it: 5x slower on the wide checkpoint); sharing is for the graphs that read the shared file, and
        # the loop graphs also pack their own copy where it fits (loop_prepack_fits)
        if self.share_weights and entry.quantization is None:
            if not (graph in LOOP_GRAPHS and self.prepack_loop):
                options.add_session_config_entry("session.disable_prepacking", "1")  # a packed copy otherwise
            for name, (_, value) in self._shared_weights().items():
                options.add_initializer(name, value)  # a name the graph lacks is ignored by ONNX Runtime
        path = export_file(self.folder, entry.file, f"graphs.{graph}.file")
        try:
            sess = ort.InferenceSession(str(path), options, providers=[self.provider])
        except Exception as err:  # onnxruntime raises its own exception types for corrupt files
            raise ManifestError(f"graph {graph!r}: {path} does not load ({err}); re-export with seer-export") from None
        if sess.get_providers()[0] != self.provider:
            raise ConfigError(
                f"graph {graph!r}: ONNX Runtime runs it on {sess.get_providers()}, not the requested {self.provider}; "
                f"check the CUDA / TensorRT libraries (onnxruntime logs why), or use --provider cpu"
            )
        check_io(graph, entry.spec, sess)
        return sess

    def _shared_weights(self) -> dict[str, tuple[np.ndarray, object]]:
        """The shared weights file, memory-mapped, as one OrtValue per tensor (made once; called under the lock).

        Raises:
            ManifestError: the file or its index is missing, or the file's size is not the manifest's.
        """
        if self._shared is None:
            import onnxruntime as ort

            info = self.manifest.weights
            path = inside(self.folder, info.file, "weights.file")
            try:
                size = regular(path, self.folder, "weights.file").st_size
            except FileNotFoundError:
                size = None
            if size != info.size_bytes:
                found = "missing" if size is None else f"{size} bytes"
                raise ManifestError(f"{path} is {found}, the manifest says {info.size_bytes} bytes; re-export with "
                                    f"seer-export --out {self.folder}")  # fmt: skip
            data = np.memmap(path, dtype=np.uint8, mode="r")
            shared = {}
            for name, t in read_weights_index(self.folder, info).items():
                array = data[t.offset : t.offset + t.length].view(t.dtype).reshape(t.shape)
                shared[name] = (array, ort.OrtValue.ortvalue_from_numpy(array))  # no copy: the array stays mapped
            self._shared = shared
        return self._shared

    def spec(self, graph: str) -> GraphSpec:
        return self.manifest.graph(graph).spec

    def max_shape(self, graph: str) -> dict[str, int] | None:
        return None

    def buckets(self) -> LengthBuckets | None:
        return None

    def bindings(self) -> BindingCache:
        """This thread's bindings."""
        cache = self._local.__dict__.get("bindings")
        if cache is None:
            cache = self._local.bindings = BindingCache(self.cache_bytes)
        return cache

    def run(self, graph: str, feeds: Mapping[str, np.ndarray | DeviceArray], outputs: Collection[str] | None = None,
            into: Mapping[str, DeviceArray] | None = None) -> dict[str, np.ndarray]:  # fmt: skip
        """The ``Backend`` call: numpy feeds are copied in (bound in place on the CPU provider), ``DeviceArray`` feeds
        and ``into`` outputs are bound where they lie, in ``memory``."""
        sess = self._session(graph)
        into = into or {}
        wanted = selected(self.spec(graph), outputs, into)
        shapes = tuple((k, v.shape if isinstance(v, DeviceArray) else np.shape(v)) for k, v in feeds.items())
        key = (graph, shapes, wanted, tuple(sorted(into)))
        binding, result = self.bindings().get(key, lambda: self._bind(sess, graph, feeds, wanted))
        for name, value in feeds.items():
            if isinstance(value, DeviceArray):
                binding.bind_input(name, value.device, self.device_id, value.dtype, list(value.shape), value.ptr)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for name, value in into.items():
            binding.bind_output(name, value.device, self.device_id, value.dtype, list(value.shape), value.ptr)
        sess.run_with_iobinding(binding)
        self.transfers.count(feeds, result)
        return result

    def _bind(self, sess, graph: str, feeds: Mapping[str, np.ndarray], wanted: tuple[str, ...]):
        """An IOBinding whose outputs ``wanted`` live in arrays allocated here, once for these input shapes; the
        graph's other outputs are not bound, so ONNX Runtime keeps them in its own arena, never copied out."""
        import onnxruntime as ort

        spec = self.spec(graph)
        sizes = axis_sizes(spec, feeds)
        binding = sess.io_binding()
        outputs: dict[str, np.ndarray] = {}
        for out in (t for t in spec.outputs if t.name in wanted):
            shape = tuple(sizes[a] if isinstance(a, str) else a for a in out.shape)
            outputs[out.name] = np.empty(shape, dtype=out.dtype)
            binding.bind_ortvalue_output(out.name, ort.OrtValue.ortvalue_from_numpy(outputs[out.name]))
        return binding, outputs

    def close(self) -> None:
        with self._lock:
            self._sessions.clear()
            self._shared = None  # after the sessions that use them
        self._local = threading.local()


def _cuda_memory(transfers: Transfers) -> DeviceMemory:
    """The GPU's memory for the CUDA and TensorRT providers (device 0, the primary context ONNX Runtime uses)."""
    from seer_trt.backends.cuda import Cuda, CudaMemory

    return CudaMemory(Cuda(0), transfers)


class BindingCache:
    """One thread's IOBindings and their output arrays by (graph, feed shapes), least recently used first out once
    their outputs pass ``max_bytes`` (the most recent entry always stays: it is the call being made)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple, tuple[object, dict[str, np.ndarray], int]] = OrderedDict()
        self.nbytes = 0  # output bytes held

    def get(self, key: tuple, make: Callable[[], tuple[object, dict[str, np.ndarray]]]):
        """(binding, outputs) of ``key``, made by ``make`` on a miss."""
        if key in self.entries:
            self.entries.move_to_end(key)
        else:
            binding, outputs = make()
            size = sum(a.nbytes for a in outputs.values())
            self.entries[key] = (binding, outputs, size)
            self.nbytes += size
            while self.nbytes > self.max_bytes and len(self.entries) > 1:
                _, (_, _, dropped) = self.entries.popitem(last=False)
                self.nbytes -= dropped
        binding, outputs, _ = self.entries[key]
        return binding, outputs


def check_io(graph: str, spec: GraphSpec, sess) -> None:
    """The session's inputs and outputs are the manifest's, by name and dtype."""

    def io(args: Sequence) -> list[tuple[str, str]]:
        return [(a.name, ONNX_TYPES.get(a.type, a.type)) for a in args]

    found = (io(sess.get_inputs()), io(sess.get_outputs()))
    expected = ([(t.name, t.dtype) for t in spec.inputs], [(t.name, t.dtype) for t in spec.outputs])
    if found != expected:
        raise ManifestError(
            f"graph {graph!r} does not match the manifest: the file has inputs/outputs {found}, the manifest "
            f"{expected}; the export folder was modified, re-export with seer-export"
        )
