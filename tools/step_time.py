"""One window-graph step per export, interleaved: ``python tools/step_time.py SHAPE[,SHAPE...] EXPORT [EXPORT ...]``.

SHAPE is ``P+G`` (P prompt positions computed, G answer positions, cache none) or ``P+G/CxM`` (also C cached prompt
positions in M weighted snapshots, random K/V: a cached step of the prompt K/V cache is ``0+G/CxM``). Batch 1, one
ONNX Runtime thread, only the outputs a step reads, 5 rounds in rotated order; prints the median and range per export
and its speed-up over the first (an export and its ``seer-quantize`` copies, say). Issue 23's per-step figures
(docs/results.md).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from seer_trt.contracts.graphs import step_outputs
from seer_trt.runtime.kv_cache import no_cache
from seer_trt.runtime.layout import window_layout
from seer_trt.runtime.pipeline import SeerPipeline

ROUNDS = 5


def main(shapes: str, folders: list[str]) -> int:
    pipes = {f: SeerPipeline.from_manifest(f, threads=1) for f in folders}
    first = pipes[folders[0]].manifest
    dim, mask = first.model.hidden_size, first.special_tokens.mask_id
    for shape in shapes.split(","):
        window, _, cached = shape.partition("/")
        p, g = (int(v) for v in window.split("+"))
        c, m = (int(v) for v in cached.split("x")) if cached else (0, 1)
        seg, pos = window_layout(np.ones((1, c + p), bool), np.array([g]), g)
        rng = np.random.default_rng(1)
        prefix = (0.02 * rng.standard_normal((1, p, dim))).astype(np.float32)
        times: dict[str, list[float]] = {f: [] for f in folders}
        past: dict[str, np.ndarray] = {}  # the same cache for every export
        for r in range(ROUNDS + 1):  # round 0: warm-up
            for f in folders[r % len(folders) :] + folders[: r % len(folders)]:
                spec = pipes[f].backend.spec("denoise")
                feeds = {"prefix_embeds": prefix, "gen_ids": np.full((1, g), mask, np.int64), "segment_ids": seg,
                         "position_ids": pos, **no_cache(spec, 1)}  # fmt: skip
                if c:
                    feeds["past_weights"] = np.full(m, 1.0 / m, np.float32)
                    for t in spec.inputs:
                        if t.name.startswith("past_key_values."):
                            feeds[t.name] = past.setdefault(t.name, rng.standard_normal(
                                (m, 1, t.shape[2], c, t.shape[4])).astype(t.dtype))  # fmt: skip
                start = time.perf_counter()
                pipes[f].backend.run("denoise", feeds, step_outputs(spec))
                if r:
                    times[f].append(time.perf_counter() - start)
        base = float(np.median(times[folders[0]]))
        for f, v in times.items():
            m = float(np.median(v))
            print(f"{shape} {f}: {m * 1e3:.1f} ms [{min(v) * 1e3:.1f}-{max(v) * 1e3:.1f}], {base / m:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
