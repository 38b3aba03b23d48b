"""One long request alone (the fixed loop over 128 positions, Seer off, 128 steps, the default cache), best of 3
after a warm-up, through SeerPipeline.generate: python experiments/long_request.py EXPORT (with SEER_TREE=... to time
another tree). A one-off measurement (docs/results.md, "Triton: one engine, streaming").
"""

import sys
import time

import seer_trt
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request

pipe = SeerPipeline.from_manifest(sys.argv[1])
r = Request("count to 3 .", gen_length=128, steps=128, seer=False, decoding="fixed")
pipe.generate([r])
ts = []
for _ in range(3):
    t = time.perf_counter()
    out = pipe.generate([r])[0]
    ts.append(time.perf_counter() - t)
print(seer_trt.__file__, "best", round(min(ts), 3), "steps", out.steps, "refreshes", out.refreshes)
