"""Cost calibration of the ``cost_model`` dispatch policy: time the denoising step on this backend, fit a
``CostModel`` (docs/DESIGN.md "Seer, exactly", hybrid execution).

In:  a backend with the ``denoise`` graph, the export's manifest and the buckets calls are padded to.
Out: ``CostModel``: seconds of one step over b rows x s tokens, with the fit's own error.

An explicit step: ``SeerPipeline.calibrate_costs`` runs it at open (``from_manifest(..., calibrate=True)``) or,
when a call's plan first needs it, before that call executes; never inside a request's own work. What it times is
bounded before it starts: the manifest's shapes and repeats when the manifest is read (at most
``MAX_CALIBRATION_SHAPES`` shapes, ``MAX_CALIBRATION_REPEATS`` repeats), each shape clipped to the buckets here.
"""

from __future__ import annotations

import time

import numpy as np

from seer_trt.contracts.backend import Backend
from seer_trt.contracts.config import CostCalibration
from seer_trt.contracts.graphs import step_outputs
from seer_trt.contracts.manifest import Manifest
from seer_trt.contracts.profiles import LengthBuckets
from seer_trt.runtime.decoding import Greedy
from seer_trt.runtime.dispatch import CostModel
from seer_trt.runtime.kv_cache import no_cache
from seer_trt.runtime.layout import padded_layout


def calibrate(backend: Backend, manifest: Manifest, buckets: LengthBuckets,
              plan: CostCalibration | None = None) -> CostModel:  # fmt: skip
    """Time one denoising call (its feeds, the graph call and the greedy decode of its outputs) at the calibration's
    shapes and fit ``CostModel``. About two seconds on a 2-core CPU with the fixture.

    Args:
        plan: the (rows, prompt length, answer length) shapes of the timed calls, clipped to the buckets and to the
            backend's largest shape (engine profiles), and the timed steps per shape after one warm-up, of which
            the fastest is the shape's time (other load on the machine only ever adds time, so the minimum is the
            least disturbed estimate); None: the manifest's (``cost_calibration``, as the C++ runtime reads it).
    """
    plan = plan or manifest.cost_calibration
    dim = manifest.model.hidden_size
    mask = manifest.special_tokens.mask_id
    limits = backend.max_shape("denoise") or {}
    fitting = []
    for b, p, g in plan.shapes:
        b, p, g = min(b, buckets.batch[-1]), min(p, buckets.prompt[-1]), min(g, buckets.answer[-1])
        p = max(1, min(p, limits.get("prompt", p), limits.get("seq", p + g) - g))
        fitting.append((b, p, g))
    spec = backend.spec("denoise")
    decoder = Greedy()
    reads = decoder.reads(frozenset(step_outputs(spec)))
    sizes, seconds = [], []
    for b, p, g in dict.fromkeys(fitting):
        prompts = [np.zeros((p, dim), dtype=manifest.precision)] * b
        kept = np.full(b, g, dtype=np.int64)
        layout = padded_layout(prompts, kept, p, g)
        x = np.full((b, g), mask, dtype=np.int64)
        times = []
        for _ in range(plan.repeats + 1):  # the first binds buffers and warms the session
            start = time.perf_counter()
            feeds = {"prefix_embeds": layout.prefix_embeds, "gen_ids": layout.gen_ids(x, mask),
                     "segment_ids": layout.segment_ids, "position_ids": layout.position_ids, **no_cache(spec, b)}  # fmt: skip
            decoder(backend.run("denoise", feeds, reads), layout, 0, (b, g), mask)
            times.append(time.perf_counter() - start)
        sizes.append((b, p + g))
        seconds.append(min(times[1:]))
    return CostModel.fit(sizes, seconds)
