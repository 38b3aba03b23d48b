"""The H200 projection of a run (``seer_export.bench.projection``): the roofline gives gpu-limits.md §6.2's worked
examples, and the recorder counts a call's bytes by kind as the issue states (numpy feeds up, outputs returned down,
a device array nothing). Counts and arithmetic only: no timing."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from seer_export.bench.projection import (
    PROMPT,
    ExportDims,
    Moved,
    Recorder,
    WindowCall,
    project_call,
    roofline,
    summary,
)

# the fixture's window graph: 8 layers, 4 K/V heads x 32, fp32, hidden 128
SPEC = SimpleNamespace(
    name="denoise",
    inputs=[SimpleNamespace(name="prefix_embeds", dtype="float32", shape=("batch", "prompt", 128))]
    + [
        SimpleNamespace(name=f"past_key_values.{i}.{kv}", dtype="float32", shape=("history", "batch", 4, "past", 32))
        for i in range(8)
        for kv in ("key", "value")
    ],  # fmt: skip
)


@pytest.mark.parametrize(("answer", "prompt", "past", "ms"), [
    (16, PROMPT, 0, 11.8), (16, 0, PROMPT, 3.2),  # the worked examples: full, cached
    (128, PROMPT, 0, 13.6), (256, PROMPT, 0, 15.7), (256, 0, PROMPT, 4.0),  # §6.2's compute-bound rows
])  # fmt: skip
def test_roofline_gives_the_worked_examples(answer, prompt, past, ms):
    """§6.2, 729 image tokens (P = 793), batch 1. (§6.2's memory-bound rows at A >= 128 add activation and logits
    bytes that §6.5's formula leaves out: 3.3 ms there, 3.2 here.)"""
    assert max(roofline(1, answer, prompt, past)) * 1e3 == pytest.approx(ms, rel=0.02)


def test_a_fixture_call_is_projected_at_llada_v_prompt():
    """A fixture call of a 30-position prompt counts as P = 793: its seconds are the worked example's."""
    dims = ExportDims.of(SPEC)
    assert (dims.kv_per_position, dims.embed_per_position) == (2 * 8 * 4 * 32 * 4, 128 * 4)
    full = WindowCall(None, "denoise", 1, 1, 16, 30, 0, 0, 30, Moved())
    cached = WindowCall(None, "denoise", 1, 1, 16, 0, 30, 1, 30, Moved())
    assert project_call(full, dims).total * 1e3 == pytest.approx(11.8, rel=0.02)
    assert project_call(cached, dims).total * 1e3 == pytest.approx(3.2, rel=0.02)
    packed = WindowCall(None, "denoise", 1, 4, 64, 120, 0, 0, 120, Moved())  # 4 rows of 30 + 16 in one entry
    assert project_call(packed, dims).total == pytest.approx(4 * project_call(full, dims).total, rel=0.02)


class FakeBackend:
    """Returns zeros of the asked outputs; no ``transfers``: the recorder counts the call itself."""

    def run(self, graph, feeds, outputs=None, into=None):
        b, a = feeds["gen_ids"].shape if "gen_ids" in feeds else (1, 1)
        out = {"x0": np.zeros((b, a), np.int64), "log_confidence": np.zeros((b, a), np.float32)}
        if graph == "denoise" and outputs is None:  # a refresh asks its K/V back
            out["present.0.key"] = np.zeros((b, 4, 10, 32), np.float32)
        return out


def _feeds(b: int, a: int, past: int, kv) -> dict:
    seg = np.ones((b, past + a), np.int32)
    seg[0, :2] = 0  # entry 0's prompt is 2 positions shorter
    return {"prefix_embeds": np.zeros((b, 0, 128), np.float32), "gen_ids": np.zeros((b, a), np.int64),
            "segment_ids": seg, "position_ids": np.zeros((b, past + a), np.int64),
            "past_weights": np.ones(1, np.float32), "past_key_values.0.key": kv}  # fmt: skip


def test_recorder_counts_numpy_feeds_and_outputs_by_kind():
    backend = FakeBackend()
    steps = iter(range(100))
    with Recorder(backend, step=lambda: next(steps)) as rec:
        kv = np.zeros((1, 2, 4, 10, 32), np.float32)
        feeds = _feeds(2, 16, 10, kv)
        backend.run("denoise", feeds, outputs=None)
        backend.run("embed", {"input_ids": np.zeros((1, 7), np.int64)})
    assert "run" not in vars(backend)  # detached
    (call,) = rec.calls
    assert (call.step, call.batch, call.rows, call.answer, call.prompt, call.past, call.history, call.valid) == (
        0, 2, 2, 16, 0, 10, 1, 18)  # fmt: skip
    up, down = call.moved.to_device, call.moved.to_host
    assert up.kv == kv.nbytes and up.embeddings == 0  # [2, 0, 128]: none
    assert up.ids == sum(feeds[k].nbytes for k in ("gen_ids", "segment_ids", "position_ids", "past_weights"))
    assert down.kv == 2 * 4 * 10 * 32 * 4 and down.outputs == 2 * 16 * (8 + 4)
    (other,) = rec.others
    assert (other.step, other.graph, other.moved.to_device.ids) == (1, "embed", 7 * 8)
    s = summary(rec, ExportDims.of(SPEC))
    assert s["steps"] == 1 and s["window_calls"] == 1 and s["kv_host_bytes_per_step"] == up.kv + down.kv
    assert s["other_graphs"]["embed"]["calls"] == 1


def test_a_device_array_feed_counts_nothing():
    """A feed that is not a numpy array (a ``DeviceArray`` in the backend's memory) crosses nothing; its shape still
    names the call's past."""
    backend = FakeBackend()
    device = SimpleNamespace(shape=(1, 2, 4, 10, 32), nbytes=2 * 4 * 10 * 32 * 4, dtype=np.dtype("float32"))
    with Recorder(backend) as rec:
        backend.run("denoise", _feeds(2, 16, 10, device), ("x0", "log_confidence"), None)  # into, positional
    (call,) = rec.calls
    assert call.past == 10 and call.moved.to_device.kv == 0 and call.moved.to_host.kv == 0


class CountingBackend(FakeBackend):
    """Counts its own bytes (the new backends' ``transfers``), and copies K/V on the device between calls."""

    def __init__(self) -> None:
        self.counts = {"to_device": {"kv": 0, "ids": 0}, "to_host": {"outputs": 0}, "device_copies": 0}
        self.transfers = SimpleNamespace(snapshot=lambda: {k: v if isinstance(v, int) else dict(v)
                                                           for k, v in self.counts.items()})  # fmt: skip

    def run(self, graph, feeds, outputs=None, into=None):
        self.counts["to_device"]["ids"] += 100
        self.counts["to_host"]["outputs"] += 10
        return super().run(graph, feeds, ("x0",))


def test_a_counting_backend_is_read_by_its_own_counter():
    backend = CountingBackend()
    with Recorder(backend) as rec:
        backend.counts["device_copies"] += 4096  # a slot gathered into the call's buffer before the call
        backend.run("denoise", _feeds(2, 16, 10, np.zeros((1, 2, 4, 10, 32), np.float32)))
        backend.counts["device_copies"] += 512  # the next call's
    (call,) = rec.calls
    assert call.moved.to_device.ids == 100 and call.moved.to_device.kv == 0 and call.moved.to_host.outputs == 10
    assert call.moved.copies == 4096 and rec.outside.copies == 512
