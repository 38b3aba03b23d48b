"""Counted, not guessed: a run's window-graph calls, counted as they are made, projected onto LLaDA-V 8B on one H200.

In:  any backend (old or new: duck-typed ``run(graph, feeds, outputs=None, **kw)``) wrapped by a ``Recorder`` for a run,
     with a callable that names the engine step a call belongs to (``lambda: engine.steps``; None for ``generate``).
Out: a ``WindowCall`` per ``denoise`` / ``denoise_logits`` call (its shapes, the host<->device bytes it moved by kind,
     the device-to-device bytes copied for it), an ``OtherCall`` per other graph call (embed, vision, step_zero);
     ``project_h200``: the seconds each window call takes on the roofline below; ``summary``: steps, calls per step,
     rows per call, bytes per step by kind, projected seconds; ``ratio`` of two runs' projections.

Bytes: a backend with a ``transfers`` counter (``seer_trt.contracts.backend.Transfers``) counts its own; a call's bytes
are the counter's difference around it, and the device copies made since the previous window call (the K/V slots
gathered into its buffers before it, the previous refresh's K/V stored after that one) are given to it. A backend
without one (293d5a7's) is charged the rule of the ONNX Runtime CUDA path ("up at every cached call, down at every
refresh whose K/V the runtime asks back"): every numpy feed crosses to the device, every output returned crosses back;
a non-numpy feed (a ``DeviceArray``) crosses nothing. Kinds: ``past_key_values.*`` / ``present.*`` are ``kv``,
``prefix_embeds`` (and embed's and vision's outputs) ``embeddings``, pixels ``images``, other inputs ``ids``, other
outputs ``outputs``. The recorder serialises the backend's calls so that each difference is one call's: counts, not
timings, are what it is for.

The roofline, per window call (gpu-limits.md §6.5, with the numbers of §6.1):

    n     = sequences in the call: its batch entries b (a packed entry of k rows counts k, each its share of the axes)
    P'    = P (793, one 384-px tile) when the call computes a prompt, else 0     (positions scaled to LLaDA-V, below)
    past' = P when it reads cached K/V, else 0
    L_q   = P' + A                                   positions computed per sequence (A: answer positions)
    L_kv  = past' + L_q                              positions attended
    FLOPs = n (13.96e9 L_q + 32 * 4 * 4096 L_q L_kv + 1.04e9 A)
    HBM   = 15.0e9 + n past' M 512 KiB               weights once per call, the cached K/V (M snapshots) read
    t     = max(FLOPs / 989e12, HBM / 4.8e12)        compute or memory bound, 100 % of peak
          + bus' / 50e9                              host<->device bytes, both ways, scaled to LLaDA-V
          + 2 copies' / 4.8e12                       device-to-device K/V copies (read and write), scaled

Scaling to LLaDA-V: with ``prompt`` given (the fixture, whose prompts are 12-33 embeddings) every sequence's prompt is
P positions whether computed or cached, as §6.5 counts it, and a call's K/V and embedding bytes are scaled by P over
the positions its tensors hold per sequence (device copies, which move a row's valid columns only, by P over its
valid positions). With ``prompt`` None (the ``llada-v`` shape, prompts of ~776 already) positions are kept as the
call had them and only bytes are scaled. K/V bytes per position go from the export's (2 layers kv_heads head_dim
itemsize, from the window graph's contract) to LLaDA-V's 512 KiB, embedding bytes from the export's (hidden
itemsize) to 4096 x 2 B. Ids and outputs are not scaled (per answer position, as LLaDA-V's). M is 1 under the
default reuse cache, where this is §6.5's formula as written.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

# --- LLaDA-V 8B and the H200 (each written once, with its source) ------------------------------------------------
LINEAR_FLOPS = 13.96e9  # per position computed: 2 x 6.979 B parameters of the 32 layers (gpu-limits.md §6.1)
ATTENTION_FLOPS = 32 * 4 * 4096  # per (query, key) pair: 4 H per layer (QK^T and PV), 32 layers (§6.1)
LM_HEAD_FLOPS = 1.04e9  # per position whose logits are needed: the answer positions (§6.1)
WEIGHT_BYTES = 15.0e9  # the 32 layers and lm_head in bf16, read once per call (§6.1)
KV_BYTES_PER_POSITION = 32 * 2 * 4096 * 2  # 512 KiB: 32 layers x K and V x 32 heads x 128 x bf16, no GQA (§6.1)
EMBED_BYTES_PER_POSITION = 4096 * 2  # one prompt embedding: hidden 4096 x bf16 (§6.1)
PROMPT = 793  # positions of a one-tile prompt: 729 image tokens + 64 text and template (§6.1)
PEAK_FLOPS = 989e12  # H200 SXM dense BF16 (§6.1)
HBM_BYTES_PER_S = 4.8e12  # H200 HBM3e (§6.1)
BUS_BYTES_PER_S = 50e9  # PCIe 5 x16 in practice, per direction (§6.5)

WINDOW_GRAPHS = ("denoise", "denoise_logits")  # the graphs a denoising step calls (CACHED_GRAPHS)
KINDS = ("kv", "embeddings", "images", "ids", "outputs")  # as seer_trt.contracts.backend.TRANSFER_KINDS


def kind(name: str, output: bool = False) -> str:
    """The kind of a graph input or output (the new code's ``transfer_kind``, restated for 293d5a7, which has none)."""
    if name.startswith(("past_key_values.", "present.")):
        return "kv"
    if name in ("prefix_embeds", "embeds", "image_features", "image_newline"):
        return "embeddings"
    if name == "pixel_values":
        return "images"
    return "outputs" if output else "ids"


@dataclasses.dataclass(frozen=True)
class Bytes:
    """Bytes by kind, one direction."""

    kv: int = 0  # prompt K/V (past_key_values.*, present.*)
    embeddings: int = 0  # prefix_embeds; embed's and vision's outputs
    images: int = 0  # pixel_values
    ids: int = 0  # gen_ids, segment_ids, position_ids, past_weights, input_ids
    outputs: int = 0  # x0, confidences, top ids, ...

    @classmethod
    def of(cls, counts: Mapping[str, int]) -> Bytes:
        return cls(**{k: int(counts.get(k, 0)) for k in KINDS})

    def __add__(self, other: Bytes) -> Bytes:
        return Bytes(*(getattr(self, k) + getattr(other, k) for k in KINDS))

    def __sub__(self, other: Bytes) -> Bytes:
        return Bytes(*(getattr(self, k) - getattr(other, k) for k in KINDS))

    @property
    def total(self) -> int:
        return sum(getattr(self, k) for k in KINDS)

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in KINDS}


@dataclasses.dataclass(frozen=True)
class Moved:
    """What crossed for a call: host to device, device to host, device to device."""

    to_device: Bytes = Bytes()
    to_host: Bytes = Bytes()
    copies: int = 0  # bytes copied device to device (K/V slots <-> a call's buffers)

    def __add__(self, other: Moved) -> Moved:
        return Moved(self.to_device + other.to_device, self.to_host + other.to_host, self.copies + other.copies)

    def __sub__(self, other: Moved) -> Moved:
        return Moved(self.to_device - other.to_device, self.to_host - other.to_host, self.copies - other.copies)


@dataclasses.dataclass(frozen=True)
class WindowCall:
    """One ``denoise`` / ``denoise_logits`` call as it was made."""

    step: int | None  # the engine step it belonged to (None: no step counter, e.g. ``generate``)
    graph: str
    batch: int  # b: gen_ids.shape[0]
    rows: int  # rows it computes: distinct answer segments over its entries (> b when packed)
    answer: int  # A: gen_ids.shape[1], answer positions per entry (padding included)
    prompt: int  # prompt positions computed per entry: prefix_embeds.shape[1] (0 in a cached call)
    past: int  # cached prompt positions read per entry: past_key_values.0.key.shape[3] (0: none)
    history: int  # M: past_key_values.0.key.shape[0], snapshots read (0: none fed)
    valid: int  # prompt positions of its rows' own, computed or cached (segment ids != 0 before the answer)
    moved: Moved  # bytes it moved (and the device copies made for it)

    @property
    def sequences(self) -> int:
        """Sequences the roofline counts: b entries, or a packed entry's rows."""
        return max(self.batch, self.rows)


@dataclasses.dataclass(frozen=True)
class OtherCall:
    """A call of another graph (embed, vision, step_zero, image_tokens): counted, not projected."""

    step: int | None
    graph: str
    moved: Moved


@dataclasses.dataclass(frozen=True)
class ExportDims:
    """Bytes per prompt position of an export, read from its window graph's contract."""

    kv_per_position: int  # 2 (K and V) x layers x kv_heads x head_dim x itemsize
    embed_per_position: int  # hidden x itemsize of prefix_embeds

    @classmethod
    def of(cls, spec: Any) -> ExportDims:
        """From a ``GraphSpec`` (or anything with ``inputs`` of ``name``, ``dtype``, ``shape``) of a window graph."""
        inputs = {t.name: t for t in spec.inputs}
        keys = [t for name, t in inputs.items() if name.startswith("past_key_values.") and name.endswith(".key")]
        if not keys or "prefix_embeds" not in inputs:
            raise ValueError(f"graph {spec.name!r} takes no past_key_values.*.key or prefix_embeds; expected a window "
                             f"graph of schema 2.1 or later (denoise)")  # fmt: skip
        key, embeds = keys[0], inputs["prefix_embeds"]
        heads, head_dim = key.shape[2], key.shape[4]  # [history, batch, kv_heads, past, head_dim]
        kv = 2 * len(keys) * heads * head_dim * np.dtype(key.dtype).itemsize
        return cls(kv, embeds.shape[2] * np.dtype(embeds.dtype).itemsize)


def _shape(value: Any) -> tuple[int, ...]:
    shape = getattr(value, "shape", None)
    return tuple(int(s) for s in shape) if shape is not None else ()


def _counted(feeds: Mapping[str, Any], returned: Mapping[str, Any]) -> Moved:
    """293d5a7's bytes of a call: every numpy feed up, every output returned down."""
    up, down = dict.fromkeys(KINDS, 0), dict.fromkeys(KINDS, 0)
    for name, value in feeds.items():
        if isinstance(value, np.ndarray):
            up[kind(name)] += value.nbytes
    for name, value in returned.items():
        if isinstance(value, np.ndarray):
            down[kind(name, output=True)] += value.nbytes
    return Moved(Bytes.of(up), Bytes.of(down))


def _snapshot(transfers: Any) -> Moved:
    s = transfers.snapshot()
    return Moved(Bytes.of(s["to_device"]), Bytes.of(s["to_host"]), int(s.get("device_copies", 0)))


def _window_shapes(feeds: Mapping[str, Any]) -> tuple[int, int, int, int, int, int, int]:
    """(b, rows, A, prompt, past, M, valid) of a window call's feeds."""
    b, a = _shape(feeds["gen_ids"])[:2]
    prompt = _shape(feeds["prefix_embeds"])[1] if "prefix_embeds" in feeds else 0
    key = _shape(feeds.get("past_key_values.0.key"))
    past, history = (key[3], key[0]) if len(key) == 5 and key[3] > 0 else (0, 0)
    seg = feeds.get("segment_ids")
    if not isinstance(seg, np.ndarray):  # no segments to read: one row per entry, every prompt column its own
        return b, b, a, prompt, past, history, b * (prompt + past)
    answer = seg[:, seg.shape[1] - a :]  # [b, A]
    rows = sum(len(np.unique(e[e != 0])) for e in answer)
    valid = int(np.count_nonzero(seg[:, : seg.shape[1] - a]))
    return b, rows, a, prompt, past, history, valid


class Recorder:
    """Wraps a backend's ``run`` and records every call (``attach`` puts it on the backend object itself, so every
    holder of the backend, the pipeline's stages included, calls through it; ``detach`` takes it off).

    Args:
        backend: the backend to wrap (duck-typed: ``run(graph, feeds, outputs=None, **kw)``; ``transfers`` if it
            counts its own bytes).
        step: the engine step a call belongs to, read at each call (``lambda: engine.steps``); None: not known.
    """

    def __init__(self, backend: Any, step: Callable[[], int] | None = None) -> None:
        self.backend = backend
        self.step = step
        self.calls: list[WindowCall] = []
        self.others: list[OtherCall] = []
        self._run = backend.run
        self._own = vars(backend).get("run") if hasattr(backend, "__dict__") else None
        self._transfers = getattr(backend, "transfers", None)
        self._lock = threading.RLock()  # one call at a time: each counter difference is that call's alone
        self._mark = _snapshot(self._transfers) if self._transfers is not None else Moved()
        self._pending = Moved()  # moved outside any call since the last window call (device copies, fetches)

    def attach(self) -> Recorder:
        self.backend.run = self.run
        return self

    def detach(self) -> None:
        if self._own is not None:
            self.backend.run = self._own
        else:
            vars(self.backend).pop("run", None)

    def __enter__(self) -> Recorder:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def __getattr__(self, name: str) -> Any:  # a proxy for whatever else the backend offers
        if name == "backend":  # not set yet (a copy, an unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.backend, name)

    def reset(self) -> None:
        """Forget the calls so far (a warm-up, a calibration)."""
        with self._lock:
            self.calls, self.others, self._pending = [], [], Moved()
            if self._transfers is not None:
                self._mark = _snapshot(self._transfers)

    @property
    def outside(self) -> Moved:
        """Bytes moved since the last window call outside any call (given to the next window call when one comes)."""
        with self._lock:
            if self._transfers is None:
                return self._pending
            return self._pending + (_snapshot(self._transfers) - self._mark)

    def run(self, graph: str, feeds: Mapping[str, Any], outputs: Any = None, *args: Any, **kw: Any) -> dict[str, Any]:
        with self._lock:
            step = self.step() if self.step is not None else None
            if self._transfers is not None:
                before = _snapshot(self._transfers)
                self._pending = self._pending + (before - self._mark)
            out = self._run(graph, feeds, outputs, *args, **kw)
            if self._transfers is not None:
                self._mark = _snapshot(self._transfers)
                moved = self._mark - before
            else:
                moved = _counted(feeds, out)
            if graph in WINDOW_GRAPHS:
                moved, self._pending = moved + self._pending, Moved()
                b, rows, a, prompt, past, history, valid = _window_shapes(feeds)
                self.calls.append(WindowCall(step, graph, b, rows, a, prompt, past, history, valid, moved))
            else:
                self.others.append(OtherCall(step, graph, moved))
            return out


# --- the projection ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Projected:
    """Seconds of one call (or a run's calls) on the H200 roofline, by term."""

    roofline: float = 0.0  # max(compute, memory)
    compute: float = 0.0  # FLOPs / peak (a share of roofline when compute-bound)
    memory: float = 0.0  # HBM bytes / bandwidth
    bus: float = 0.0  # host<->device bytes / PCIe
    copies: float = 0.0  # device-to-device copies / HBM bandwidth (read and write)

    @property
    def total(self) -> float:
        return self.roofline + self.bus + self.copies

    def __add__(self, other: Projected) -> Projected:
        return Projected(*(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)))


def roofline(sequences: float, answer: float, prompt: float, past: float, history: int = 1) -> tuple[float, float]:
    """(compute s, memory s) of one call of ``sequences`` x (``prompt`` computed + ``answer``) positions, each reading
    ``past`` cached positions of ``history`` snapshots, LLaDA-V 8B on one H200 (gpu-limits.md §6.5)."""
    lq = prompt + answer
    lkv = past + lq
    flops = sequences * (LINEAR_FLOPS * lq + ATTENTION_FLOPS * lq * lkv + LM_HEAD_FLOPS * answer)
    hbm = WEIGHT_BYTES + sequences * past * max(history, 1) * KV_BYTES_PER_POSITION
    return flops / PEAK_FLOPS, hbm / HBM_BYTES_PER_S


@dataclasses.dataclass(frozen=True)
class Scaled:
    """A window call's axes per sequence at LLaDA-V's counts, and the factors its bytes take."""

    sequences: int  # n
    answer: float  # A per sequence
    prompt: float  # P' computed per sequence
    past: float  # past' cached per sequence
    kv: float  # K/V bytes crossing: LLaDA-V's bytes per export byte
    embeddings: float  # embedding bytes crossing: the same
    copies: float  # K/V bytes copied device to device: the same


def scaled(call: WindowCall, dims: ExportDims, prompt: int | None = PROMPT) -> Scaled:
    """``call`` at LLaDA-V's counts: positions P or 0 (``prompt``) or as they were (None); bytes per position."""
    n = call.sequences
    share = call.batch / n  # of an entry's axes per sequence (1; 1/k when k rows are packed in one entry)
    held = (call.prompt + call.past) * share  # prompt positions per sequence the call's tensors hold
    if prompt is None:
        computed, past, scale, copy_scale = call.prompt * share, call.past * share, 1.0, 1.0
    else:
        computed, past = (prompt if call.prompt else 0), (prompt if call.past else 0)
        scale = prompt / held if held else 1.0
        copy_scale = prompt * call.rows / call.valid if call.valid else 1.0
    kv = KV_BYTES_PER_POSITION / dims.kv_per_position
    embed = EMBED_BYTES_PER_POSITION / dims.embed_per_position
    return Scaled(n, call.answer * share, computed, past, kv * scale, embed * scale, kv * copy_scale)


def project_call(call: WindowCall, dims: ExportDims, prompt: int | None = PROMPT,
                 kv_resident: bool = False) -> Projected:  # fmt: skip
    """One window call's seconds on the roofline (the module's docstring); ``kv_resident``: no K/V crosses the bus."""
    s = scaled(call, dims, prompt)
    compute, memory = roofline(s.sequences, s.answer, s.prompt, s.past, call.history)
    bus = 0.0
    for side in (call.moved.to_device, call.moved.to_host):
        kv = 0.0 if kv_resident else side.kv * s.kv
        bus += kv + side.embeddings * s.embeddings + side.images + side.ids + side.outputs
    copies = call.moved.copies * s.copies
    return Projected(max(compute, memory), compute, memory, bus / BUS_BYTES_PER_S, 2 * copies / HBM_BYTES_PER_S)


def project_h200(calls: Iterable[WindowCall], dims: ExportDims, prompt: int | None = PROMPT,
                 kv_resident: bool = False) -> Projected:  # fmt: skip
    """A run's window calls on the roofline, summed (``project_call`` each)."""
    total = Projected()
    for call in calls:
        total = total + project_call(call, dims, prompt, kv_resident)
    return total


def summary(recorder: Recorder | Sequence[WindowCall], dims: ExportDims, steps: int | None = None,
            prompt: int | None = PROMPT, kv_resident: bool = False) -> dict[str, Any]:  # fmt: skip
    """A run's figures: engine steps (``steps``, else the recorded steps' count), window calls per step, rows per call,
    host<->device bytes per step by kind (the export's own, and scaled to LLaDA-V for K/V), projected seconds.

    Args:
        recorder: a ``Recorder`` after the run, or its window calls.
        steps: the engine's step count after the run; None: the distinct steps the calls name (None when they name
            none: ``generate``, whose per-step figures are then left out).
    """
    calls = list(recorder.calls if isinstance(recorder, Recorder) else recorder)
    others = recorder.others if isinstance(recorder, Recorder) else []
    if steps is None:
        named = {c.step for c in calls if c.step is not None}
        steps = len(named) or None
    up = sum((c.moved.to_device for c in calls), Bytes())
    down = sum((c.moved.to_host for c in calls), Bytes())
    kv_llada = sum((c.moved.to_device.kv + c.moved.to_host.kv) * scaled(c, dims, prompt).kv for c in calls)
    per = (lambda x: x / steps) if steps else (lambda x: None)  # noqa: E731 - per engine step, when known
    projected = project_h200(calls, dims, prompt, kv_resident)
    by_graph: dict[str, dict[str, int]] = {}
    for c in others:
        g = by_graph.setdefault(c.graph, {"calls": 0, "to_device": 0, "to_host": 0})
        g["calls"] += 1
        g["to_device"] += c.moved.to_device.total
        g["to_host"] += c.moved.to_host.total
    return {
        "steps": steps,
        "window_calls": len(calls),
        "calls_per_step": per(len(calls)),
        "rows_per_call": float(np.mean([c.rows for c in calls])) if calls else 0.0,
        "entries_per_call": float(np.mean([c.batch for c in calls])) if calls else 0.0,
        "prompt_calls": sum(1 for c in calls if c.prompt > 0),
        "cached_calls": sum(1 for c in calls if c.past > 0),
        "host_bytes_per_step": {
            "to_device": {k: per(v) for k, v in up.as_dict().items()},
            "to_host": {k: per(v) for k, v in down.as_dict().items()},
        },
        "host_bytes": {"to_device": up.as_dict(), "to_host": down.as_dict()},  # the run's, by kind
        "kv_host_bytes_per_step": per(up.kv + down.kv),
        "kv_host_bytes_per_step_llada_v": per(0 if kv_resident else kv_llada),  # scaled as the projection is
        "device_copy_bytes": sum(c.moved.copies for c in calls),
        "device_copy_bytes_per_step": per(sum(c.moved.copies for c in calls)),
        "kv_resident": kv_resident,
        "prompt_scaled_to": prompt,
        "projected_h200_s": projected.total,
        "projected_terms_s": dataclasses.asdict(projected),
        "other_graphs": by_graph,
        # moved after the last window call outside any call (its last refresh's K/V stored): in no call's figures
        "unattributed": dataclasses.asdict(recorder.outside) if isinstance(recorder, Recorder) else None,
    }


def ratio(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """``a``'s projected seconds over ``b``'s (two ``summary`` results)."""
    return a["projected_h200_s"] / b["projected_h200_s"]


__all__ = ["PROMPT", "Bytes", "ExportDims", "Moved", "OtherCall", "Projected", "Recorder", "WindowCall", "kind",
           "Scaled", "project_call", "project_h200", "ratio", "roofline", "scaled", "summary"]  # fmt: skip
