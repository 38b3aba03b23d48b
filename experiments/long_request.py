"""One long request alone (the fixed loop over 128 positions, Seer off, 128 steps, the default cache), best of 7
after a warm-up, through SeerPipeline.generate: python experiments/long_request.py EXPORT [THREADS] [wall|cpu]
(with SEER_TREE=... to time another tree). ``cpu`` times the process's CPU seconds, which other work on a shared
machine inflates far less than the wall clock. A one-off measurement (docs/results.md, "Triton: one engine,
streaming").
"""

import sys
import time

import seer_trt
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request

threads = int(sys.argv[2]) if len(sys.argv) > 2 else 0
clock = time.process_time if sys.argv[3:] == ["cpu"] else time.perf_counter
pipe = SeerPipeline.from_manifest(sys.argv[1], threads=threads)
r = Request("count to 3 .", gen_length=128, steps=128, seer=False, decoding="fixed")
pipe.generate([r])
ts = []
for _ in range(7):
    t = clock()
    out = pipe.generate([r])[0]
    ts.append(clock() - t)
print(seer_trt.__file__, "best", round(min(ts), 3), "steps", out.steps, "refreshes", out.refreshes)
