"""Cost calibration of the ``cost_model`` dispatch policy: time the denoising step on this backend, fit a
``CostModel`` (docs/DESIGN.md "Seer, exactly", hybrid execution).

In:  a backend with the ``denoise`` graph, the export's manifest and the buckets calls are padded to.
Out: ``CostModel``: seconds of one step over b rows x s tokens, with the fit's own error.

An explicit step: ``SeerPipeline.calibrate_costs`` runs it at open (``from_manifest(..., calibrate=True)``) or,
when a call's plan first needs it, before that call executes; never inside a request's own work.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from seer_trt.contracts.backend import Backend
from seer_trt.contracts.manifest import Manifest
from seer_trt.contracts.profiles import LengthBuckets
from seer_trt.runtime.decoding import Greedy
from seer_trt.runtime.denoise import denoise
from seer_trt.runtime.dispatch import CostModel
from seer_trt.runtime.layout import padded_layout
from seer_trt.runtime.schedule import Schedule

# (rows, prompt, answer) of the timed calls: single rows from short to long prompts, small and full batches of
# short rows, and one long sequence like a packed group, so the fit sees launch, per-slot and attention costs.
CALIBRATION_SHAPES = ((1, 16, 4), (1, 32, 16), (1, 128, 32), (1, 384, 64), (1, 640, 128), (4, 32, 8),
                      (4, 128, 32), (8, 32, 8), (16, 32, 16), (16, 64, 32))  # fmt: skip


def calibrate(backend: Backend, manifest: Manifest, buckets: LengthBuckets,
              shapes: Sequence[tuple[int, int, int]] = CALIBRATION_SHAPES, repeats: int = 5) -> CostModel:  # fmt: skip
    """Time one denoising step (the loop's host work and the graph call) at ``shapes`` and fit ``CostModel``.
    About two seconds on a 2-core CPU with the fixture.

    Args:
        shapes: (rows, prompt length, answer length) of the timed calls, clipped to the buckets and to the
            backend's largest shape (engine profiles).
        repeats: timed steps per shape after one warm-up; the fastest is the shape's time (other load on the
            machine only ever adds time, so the minimum is the least disturbed estimate).
    """
    dim = manifest.model.hidden_size
    mask = manifest.special_tokens.mask_id
    limits = backend.max_shape("denoise") or {}
    fitting = []
    for b, p, g in shapes:
        b, p, g = min(b, buckets.batch[-1]), min(p, buckets.prompt[-1]), min(g, buckets.answer[-1])
        p = max(1, min(p, limits.get("prompt", p), limits.get("seq", p + g) - g))
        fitting.append((b, p, g))
    sizes, seconds = [], []
    for b, p, g in dict.fromkeys(fitting):
        prompts = [np.zeros((p, dim), dtype=manifest.precision)] * b
        kept = np.full(b, g, dtype=np.int64)
        layout = padded_layout(prompts, kept, p, g)
        one_step = Schedule(kept, np.ones(b, np.int64), np.zeros((b, 1), np.int64), np.full((b, 1), g))
        times = []
        for _ in range(repeats + 1):  # the first binds buffers and warms the session
            start = time.perf_counter()
            denoise(backend, layout, one_step, Greedy(), mask)
            times.append(time.perf_counter() - start)
        sizes.append((b, p + g))
        seconds.append(min(times[1:]))
    return CostModel.fit(sizes, seconds)
