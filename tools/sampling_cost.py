"""Per-step cost of sampling against greedy decoding on one export, through ``SeerPipeline.generate``.

    python tools/sampling_cost.py EXPORT

One request ("count to 9 .") over the padded loop, the fixed rule, 64 positions, cache none, one thread: greedy, then
sampled at temperature 0.8 (from the window graph's top ids on an export without denoise_logits, over the whole
vocabulary with one), 7 rounds alternating the order, the first dropped; prints the median milliseconds per step of
each and the sampler the pipeline chose.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np

from seer_trt.runtime.decoding import choose
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request


def main(folder: str) -> int:
    pipe = SeerPipeline.from_manifest(folder, threads=1)
    base = {"seer": False, "decoding": "fixed", "gen_length": 64, "cache": "none"}
    modes = {"greedy": {}, "sampled": {"temperature": 0.8, "seed": 1}}
    times: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(7):
        for mode, extra in list(modes.items())[:: 1 if r % 2 == 0 else -1]:
            start = time.perf_counter()
            result = pipe.generate([Request("count to 9 .", **base, **extra)])[0]
            times[mode].append((time.perf_counter() - start) / result.steps)
    sampler = choose(pipe.generation(Request("x", temperature=0.8)), pipe.manifest).decoder(np.array([1]))
    print(json.dumps({f"{m}_ms_per_step": statistics.median(v[1:]) * 1e3 for m, v in times.items()}
                     | {"sampler": type(sampler).__name__}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
