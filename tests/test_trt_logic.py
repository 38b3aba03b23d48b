"""The TensorRT backend's own logic on a machine without a GPU (issue 16): TensorRT and the CUDA driver replaced by
fakes that keep device memory in numpy and compute a known function of the inputs, so what is tested is the
backend's bookkeeping: one buffer pool per engine, loop-invariant inputs uploaded once per group through page-locked
staging, a refused input shape named with its profile, CUDA-graph replay, and buckets from the built profiles. The
real thing runs in tests/test_gpu.py on a GPU."""

from __future__ import annotations

import ctypes
import dataclasses
import threading
import types

import numpy as np
import pytest
from test_manifest import make_manifest

from seer_trt.backends import tensorrt as trt_backend
from seer_trt.backends.base import HostMemory, host_view
from seer_trt.backends.cuda import Device
from seer_trt.backends.tensorrt import TrtBackend, buckets_of
from seer_trt.contracts.backend import DeviceArray, Transfers
from seer_trt.contracts.config import GenerationConfig
from seer_trt.contracts.errors import EngineError, InputError
from seer_trt.contracts.manifest import EngineBuild, EngineFile, Manifest
from seer_trt.contracts.policies import CacheConfig
from seer_trt.contracts.profiles import LengthBuckets, plan_profiles, select_profile
from seer_trt.runtime.decoding import choose
from seer_trt.runtime.denoise import Loop, LoopSettings, make_rows
from seer_trt.runtime.kv_cache import KVPool, no_cache
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request
from seer_trt.runtime.schedule import plan_schedule

BUCKETS = LengthBuckets(batch=(1, 4), prompt=(32, 64), answer=(16, 32, 64))


def model(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What the fake engine computes: every input moves the outputs, so a stale device buffer shows."""
    g = feeds["gen_ids"].shape[1]  # the answer: the last g positions (after the cached and the computed prompt)
    seg, pos = feeds["segment_ids"][:, -g:], feeds["position_ids"][:, -g:]
    x0 = (feeds["gen_ids"] * 7 + seg * 3 + pos) % 50
    confidence = (feeds["prefix_embeds"].astype(np.float64).sum(axis=(1, 2))[:, None] + pos + seg) % 97 / 97
    out = {"x0": x0.astype(np.int64), "log_confidence": np.log(confidence + 1e-3).astype(np.float32)}
    b, p = feeds["prefix_embeds"].shape[:2]
    for name in (n for n in feeds if n.startswith("past_key_values.")):  # the prompt's K/V: [B, H_kv, P, hd]
        _, _, heads, _, head_dim = feeds[name].shape
        out[name.replace("past_key_values", "present")] = np.full((b, heads, p, head_dim), p, dtype=np.float32)
    return out


class FakeCuda:
    """Device memory as numpy arrays behind integer "pointers"; page-locked host memory is remembered by address."""

    def __init__(self, index: int) -> None:
        self.memory: dict[int, np.ndarray] = {}
        self.pinned: list[np.ndarray] = []
        self.uploads: list[tuple[int, int]] = []  # (device pointer, bytes)
        self.downloads: list[int] = []  # device pointers copied to the host
        self.copies: list[int] = []  # bytes of each device-to-device copy
        self.next_ptr = 1 << 20
        self.launches = 0

    def make_current(self) -> None:
        pass

    def new_stream(self):
        return ctypes.c_void_p(7)

    def alloc(self, nbytes: int) -> int:
        ptr, self.next_ptr = self.next_ptr, self.next_ptr + max(nbytes, 1) + 256
        self.memory[ptr] = np.zeros(max(nbytes, 1), dtype=np.uint8)
        return ptr

    def host_alloc(self, nbytes: int, dtype) -> np.ndarray:
        array = np.zeros(max(nbytes, 1), dtype=np.uint8)[:nbytes].view(dtype)
        self.pinned.append(array)
        return array

    def is_pinned(self, array: np.ndarray) -> bool:
        return any(np.shares_memory(array, p) for p in self.pinned)

    def at(self, ptr: int) -> np.ndarray:
        """The bytes from ``ptr`` to the end of its allocation (a pointer may point inside one: a block of it)."""
        base = max(b for b in self.memory if b <= ptr)
        assert ptr < base + len(self.memory[base]), "a pointer into freed or unallocated memory"
        return self.memory[base][ptr - base :]

    def free(self, device, host) -> None:
        for ptr in device.values():
            del self.memory[ptr]

    def free_one(self, ptr: int) -> None:
        self.memory.pop(ptr, None)

    def memset0(self, ptr: int, nbytes: int, stream) -> None:
        self.at(ptr)[:nbytes] = 0

    def copy2d(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int, stream) -> None:
        source, target = self.at(src), self.at(dst)
        for row in range(height):
            target[row * dst_pitch : row * dst_pitch + width] = source[row * src_pitch : row * src_pitch + width]
        self.copies.append(height * width)

    def mem_info(self) -> tuple[int, int]:
        return 1 << 34, 1 << 35

    def to_device(self, ptr: int, array: np.ndarray, stream) -> None:
        assert self.is_pinned(array), "uploads go through page-locked staging"
        self.at(ptr)[: array.nbytes] = array.reshape(-1).view(np.uint8)
        self.uploads.append((ptr, array.nbytes))

    def to_host(self, array: np.ndarray, ptr: int, stream) -> None:
        array.reshape(-1).view(np.uint8)[:] = self.at(ptr)[: array.nbytes]
        self.downloads.append(ptr)

    def sync(self, stream) -> None:
        pass

    def capture(self, stream, enqueue):
        return types.SimpleNamespace(enqueue=enqueue)

    def launch(self, exe, stream) -> None:
        self.launches += 1
        exe.enqueue()

    def drop_graph(self, exe) -> None:
        pass

    def release(self, stream, graph) -> None:
        pass


class FakeContext:
    def __init__(self, engine: FakeEngine) -> None:
        self.engine, self.shapes, self.addresses, self.profile = engine, {}, {}, None

    def set_optimization_profile_async(self, index: int, stream) -> None:
        self.profile = index

    def set_input_shape(self, name: str, shape) -> bool:
        if self.engine.refuse(name, tuple(shape)):
            return False
        self.shapes[name] = tuple(shape)
        return True

    def set_tensor_address(self, name: str, ptr: int) -> None:
        self.addresses[name] = ptr

    def execute_async_v3(self, stream) -> bool:
        self.engine.executions += 1
        cuda = self.engine.cuda()
        feeds = {}
        for name, dtype in self.engine.inputs.items():
            shape = self.shapes[name]
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            feeds[name] = cuda.at(self.addresses[name])[:nbytes].view(dtype).reshape(shape)
        for name, value in model(feeds).items():
            cuda.at(self.addresses[name])[: value.nbytes] = value.reshape(-1).view(np.uint8)
        return True


class FakeEngine:
    def __init__(self, spec, profiles: int, cuda) -> None:
        self.inputs = {t.name: t.dtype for t in spec.inputs}
        self.tensors = {t.name: t.dtype for t in (*spec.inputs, *spec.outputs)}
        self.num_io_tensors = len(self.tensors)
        self.num_optimization_profiles = profiles
        self.cuda = cuda
        self.executions = 0
        self.refuse = lambda name, shape: False
        self.contexts: list[FakeContext] = []

    def get_tensor_name(self, i: int) -> str:
        return list(self.tensors)[i]

    def get_tensor_dtype(self, name: str):
        return self.tensors[name]

    def create_execution_context(self, strategy=None) -> FakeContext:
        self.contexts.append(FakeContext(self))
        return self.contexts[-1]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A TensorRT build of the fixture's denoise graph (3 profiles, one per answer bucket) on fake TensorRT/CUDA,
    from a manifest made by hand with the fixture's dimensions (its denoise spec is the export's: checked below)."""
    return fake_build(make_manifest("float32"), tmp_path, monkeypatch)


@pytest.fixture
def fake_export(fixture_export, tmp_path, monkeypatch):
    """The same build recorded in the fixture export's own manifest (for a pipeline on the export folder)."""
    return fake_build(fixture_export[1], tmp_path, monkeypatch)


@pytest.mark.slow
def test_the_hand_made_manifest_has_the_exports_denoise_spec(fixture_export):
    manifest = make_manifest("float32")

    def vocab_free(spec):  # the hand-made vocabulary (103) is not the fixture's (83): the top ids' count follows it
        return dataclasses.replace(spec, outputs=tuple(dataclasses.replace(t, shape=t.shape[:2])
                                                       if t.name.startswith("top_") else t for t in spec.outputs))  # fmt: skip

    assert vocab_free(manifest.graph("denoise").spec) == vocab_free(fixture_export[1].graph("denoise").spec)
    assert manifest.model.hidden_size == fixture_export[1].model.hidden_size


def fake_build(manifest: Manifest, tmp_path, monkeypatch):
    """``manifest`` with a recorded TensorRT build of its denoise graph, TensorRT and CUDA replaced by the fakes."""
    spec = manifest.graph("denoise").spec
    profiles = plan_profiles({"denoise": [(t.name, t.shape) for t in spec.inputs]}, BUCKETS).graphs["denoise"]
    (tmp_path / "tensorrt").mkdir()
    (tmp_path / "tensorrt" / "denoise.plan").write_bytes(b"plan")
    build = EngineBuild("tensorrt", "10.0-fake", "NVIDIA H200", "9.0", None, "2026-12-01T00:00:00Z",
                        {"denoise": EngineFile("tensorrt/denoise.plan", "0" * 64, profiles, 4, 0.0)}, BUCKETS)  # fmt: skip
    manifest = dataclasses.replace(manifest, builds={"tensorrt": build})
    state = types.SimpleNamespace(cuda=None, engines=[])

    def make_cuda(index):
        state.cuda = FakeCuda(index)
        return state.cuda

    class Runtime:
        def __init__(self, logger) -> None:
            pass

        def deserialize_cuda_engine(self, data: bytes):
            state.engines.append(FakeEngine(spec, len(profiles), lambda: state.cuda))
            return state.engines[-1]

    trt = types.SimpleNamespace(__version__="10.0-fake", Logger=type("Logger", (), {"WARNING": 1, "__init__":
                                lambda self, level: None}), Runtime=Runtime, nptype=lambda dtype: np.dtype(dtype),
                                ExecutionContextAllocationStrategy=types.SimpleNamespace(ON_PROFILE_CHANGE=1))  # fmt: skip
    monkeypatch.setattr(trt_backend, "import_tensorrt", lambda builder: trt)
    monkeypatch.setattr(trt_backend, "cuda_device", lambda index=0: Device("NVIDIA H200", "9.0"))
    monkeypatch.setattr(trt_backend, "Cuda", make_cuda)
    state.manifest, state.folder, state.profiles, state.spec = manifest, tmp_path, profiles, spec
    return state


def feeds_for(manifest: Manifest, batch: int, prompt: int, answer: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    seq = prompt + answer
    return {
        "prefix_embeds": rng.standard_normal((batch, prompt, manifest.model.hidden_size)).astype(np.float32),
        "gen_ids": rng.integers(0, 80, (batch, answer)),
        "segment_ids": np.ones((batch, seq), dtype=np.int32),
        "position_ids": np.tile(np.arange(seq, dtype=np.int64), (batch, 1)),
        **no_cache(manifest.graph("denoise").spec, batch),  # the prompt computed: an empty K/V cache
    }


def test_outputs_are_the_engines_and_one_buffer_set_serves_every_profile(fake):
    backend = TrtBackend(fake.folder, fake.manifest)
    used = set()
    for batch, prompt, answer in ((1, 20, 10), (4, 64, 64), (2, 33, 20), (1, 5, 16), (3, 40, 50)):
        feeds = feeds_for(fake.manifest, batch, prompt, answer, seed=answer)
        got = backend.run("denoise", feeds)
        want = model(feeds)
        assert all(np.array_equal(got[k], want[k]) for k in want)
        used.add(select_profile(fake.profiles, {"batch": batch, "prompt": prompt, "answer": answer}))
    assert used == {0, 1, 2}  # every profile ran, each in its own context
    engine = backend._engines["denoise"]
    assert len(engine.contexts) == 3 and len(engine.pool) == 1  # one buffer set for all three profiles
    largest = {"batch": 4, "prompt": 64, "answer": 64, "seq": 128, "past": 64, "history": 3}  # the cached profiles
    expected = sum(int(np.prod([largest[a] if isinstance(a, str) else a for a in t.shape])) * np.dtype(t.dtype).itemsize
                   for t in (*fake.spec.inputs, *fake.spec.outputs))  # fmt: skip
    assert sum(len(m) for m in fake.cuda.memory.values()) == expected  # at the engine's largest shape, once
    backend.close()
    assert not fake.cuda.memory


class Reference:
    """The fake engine's function on the host: what the TensorRT backend must compute, in host memory."""

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self.transfers = Transfers()
        self.memory = HostMemory(self.transfers)

    def spec(self, graph):
        return self.manifest.graph(graph).spec

    def max_shape(self, graph):
        return None

    def run(self, graph, feeds, outputs=None, into=None):
        out = model({k: host_view(v) if isinstance(v, DeviceArray) else v for k, v in feeds.items()})
        for name, target in (into or {}).items():
            np.copyto(host_view(target), out[name])
        return {k: v for k, v in out.items() if (outputs is None or k in outputs) and k not in (into or {})}


def run_rows(backend, prompts, kept, gen, cache=None, policy="static"):
    """The rows through one loop on ``backend`` to the end; also the row sets of its calls, in order."""
    manifest = backend.manifest
    cache = cache or CacheConfig()
    rows = make_rows(prompts, plan_schedule(gen, kept), choose(gen, manifest), manifest.special_tokens.mask_id, True,
                     cache=cache)  # fmt: skip
    pool = KVPool(backend.memory, backend.spec("denoise"), 2**30)
    settings = LoopSettings(backend, manifest.special_tokens.mask_id, BUCKETS, policy, pool=pool)
    calls = []
    loop = Loop(settings)
    loop.on_call = lambda call: calls.append(call)
    assert loop.add(rows) == len(rows)
    while loop.step():
        loop.retire()
    loop.close()
    return rows, calls


def test_loop_invariant_inputs_cross_once_per_call_shape(fake):
    """A call's prefix, segment and position ids cross once while its rows stay the same: the loop keeps the same
    read-only arrays for as long as a call's rows do; only the answer ids cross at every call."""
    manifest = fake.manifest
    backend = TrtBackend(fake.folder, manifest)
    rng = np.random.default_rng(1)
    prompts = [rng.standard_normal((p, manifest.model.hidden_size)).astype(np.float32) for p in (12, 30, 7)]
    kept = np.array([10, 16, 5])
    gen = GenerationConfig(gen_length=16, steps=8, block_length=16)
    for policy in ("static", "packed"):
        fake.cuda.uploads.clear()
        got, calls = run_rows(backend, prompts, kept, gen, policy=policy)
        want, _ = run_rows(Reference(manifest), prompts, kept, gen, policy=policy)
        assert [r.x.tolist() for r in got] == [r.x.tolist() for r in want] and [r.used for r in got] == [
            r.used for r in want
        ]
        buffers = backend._engines["denoise"].pool[0].device
        count = {name: sum(ptr == buffers[name] for ptr, _ in fake.cuda.uploads) for name in fake.engines[0].inputs}
        shapes = 1 + sum(a.rows != b.rows or a.batch != b.batch for a, b in zip(calls, calls[1:], strict=False))
        assert count["gen_ids"] == len(calls) and count["prefix_embeds"] == count["segment_ids"] == shapes
        assert count["past_weights"] <= 1  # the no-cache weight [1]: the same array throughout (and both loops)
    # a writeable array passed again may have changed: it is uploaded again, and the change shows
    feeds = feeds_for(manifest, 2, 20, 16)
    first = backend.run("denoise", feeds)["log_confidence"].copy()
    feeds["prefix_embeds"] += 1.0
    assert not np.array_equal(backend.run("denoise", feeds)["log_confidence"], first)
    assert np.array_equal(backend.run("denoise", feeds)["log_confidence"], model(feeds)["log_confidence"])


def test_the_prompt_k_v_stays_on_the_device(fake):
    """docs/DESIGN.md "Prompt K/V cache": a refresh writes its K/V into device buffers and a cached step reads them
    there; no K/V byte crosses between host and device, and the answers are the host reference's."""
    manifest = fake.manifest
    backend = TrtBackend(fake.folder, manifest)
    rng = np.random.default_rng(2)
    prompts = [rng.standard_normal((p, manifest.model.hidden_size)).astype(np.float32) for p in (12, 30)]
    kept = np.array([16, 9])
    gen = GenerationConfig(16, 16, 16)
    cache = CacheConfig("reuse", 4)
    fake.cuda.uploads.clear()
    fake.cuda.downloads.clear()
    got, calls = run_rows(backend, prompts, kept, gen, cache)
    want, _ = run_rows(Reference(manifest), prompts, kept, gen, cache)
    assert [r.x.tolist() for r in got] == [r.x.tolist() for r in want]
    assert [r.refreshes for r in got] == [4, 3]  # steps 0, 4, 8, 12 (row 1 done after 9)
    buffers = backend._engines["denoise"].pool[0].device
    kv_inputs = [n for n in fake.engines[0].inputs if n.startswith("past_key_values.")]
    assert not any(ptr == buffers[n] for ptr, _ in fake.cuda.uploads for n in kv_inputs)  # never uploaded
    assert not any(ptr == buffers[n] for ptr in fake.cuda.downloads for n in buffers if n.startswith("present."))
    assert backend.transfers.to_device["kv"] == 0 and backend.transfers.to_host["kv"] == 0
    assert backend.transfers.device_copies > 0 and fake.cuda.copies  # the K/V moved on the device only
    refreshes = [c for c in calls if c.kind == "prompt"]
    assert len(refreshes) == 4 and all(c.stored == c.rows for c in refreshes)
    assert len(backend._engines["denoise"].contexts) == 2  # a profile computing the prompt, and a cached one


def test_a_refused_input_shape_names_the_shape_and_the_profile(fake):
    backend = TrtBackend(fake.folder, fake.manifest)
    backend.run("denoise", feeds_for(fake.manifest, 1, 20, 10))
    fake.engines[0].refuse = lambda name, shape: name == "segment_ids"
    with pytest.raises(EngineError) as err:
        backend.run("denoise", feeds_for(fake.manifest, 2, 20, 20))
    message = str(err.value)
    assert "TensorRT refused shape (2, 40) for input 'segment_ids' under profile 1" in message
    assert "answer 17..32 (opt 32)" in message and "\n" not in message
    fake.engines[0].refuse = lambda name, shape: False
    feeds = feeds_for(fake.manifest, 2, 20, 20)
    assert np.array_equal(backend.run("denoise", feeds)["x0"], model(feeds)["x0"])  # the context recovers


def test_cuda_graphs_replay_static_buckets_only(fake):
    backend = TrtBackend(fake.folder, fake.manifest, cuda_graphs=True)
    engine = fake.engines
    static = feeds_for(fake.manifest, 2, 32, 16)  # prompt and answer both buckets
    for step in range(4):
        static["gen_ids"] = static["gen_ids"] + step  # a new gen_ids every step, as the loop gives
        assert np.array_equal(backend.run("denoise", static)["x0"], model(static)["x0"])
    assert fake.cuda.launches == 3 and engine[0].executions == 4  # run, captured, then three replays
    odd = feeds_for(fake.manifest, 2, 30, 16)
    backend.run("denoise", odd)
    backend.run("denoise", odd)
    assert fake.cuda.launches == 3  # not a bucket shape: never replayed


def test_concurrent_calls_take_separate_buffer_sets(fake):
    backend = TrtBackend(fake.folder, fake.manifest)
    barrier = threading.Barrier(2)
    results, errors = {}, []
    original = FakeContext.execute_async_v3

    def slow(self, stream):
        barrier.wait(timeout=10)  # both calls inside the engine at once
        return original(self, stream)

    FakeContext.execute_async_v3 = slow
    try:

        def call(k, answer):
            try:
                feeds = feeds_for(fake.manifest, 1, 20, answer, seed=k)
                results[k] = (backend.run("denoise", feeds)["x0"].copy(), model(feeds)["x0"])
            except Exception as err:  # noqa: BLE001
                errors.append(err)

        threads = [threading.Thread(target=call, args=(0, 10)), threading.Thread(target=call, args=(1, 40))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    finally:
        FakeContext.execute_async_v3 = original
    assert not errors and all(np.array_equal(a, b) for a, b in results.values())
    assert len(backend._engines["denoise"].pool) == 2  # the pool grew for the second concurrent call only


@pytest.mark.slow
def test_dispatch_buckets_are_the_built_profiles(fake_export, fixture_export):
    backend = TrtBackend(fake_export.folder, fake_export.manifest)
    assert backend.buckets() == BUCKETS != fake_export.manifest.buckets
    pipe = SeerPipeline(fixture_export[0], fake_export.manifest, backend)
    assert pipe.buckets == BUCKETS
    with pytest.raises(InputError, match="exceeds the largest answer bucket 64"):
        pipe.generation(Request("count to 3 .", gen_length=128))  # the manifest's buckets go to 256
    record = dataclasses.replace(fake_export.manifest.builds["tensorrt"], buckets=None)  # a build from before 1.2
    derived = buckets_of(record)  # read back from the profiles: the answer axis split per bucket, the others spanned
    assert derived.answer == (16, 32, 64) and derived.prompt == (32, 64) and derived.batch == (1, 4)


def test_frozen_means_nothing_can_write_it():
    a = np.zeros(4)
    assert not trt_backend.frozen(a)
    a.setflags(write=False)
    assert trt_backend.frozen(a) and trt_backend.frozen(a[1:])
    b = np.zeros(4)
    view = b[1:]
    view.setflags(write=False)
    assert not trt_backend.frozen(view)  # its base can still be written
