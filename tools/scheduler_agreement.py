"""How often the step scheduler's answers differ from ``SeerPipeline.generate`` alone.

    python tools/scheduler_agreement.py EXPORT N

A row batched with others is not bitwise the row alone (ONNX Runtime sums in another order), so an answer can
flip where a threshold, factor bound or tie sits at its border. N mixed requests (every rule, early stop, the
padded baseline, images) go through one scheduler, arriving a few milliseconds apart; the differing ones are
printed.
"""

from __future__ import annotations

import sys
import time

from seer_trt.eval.tasks import make_samples
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request
from seer_trt.runtime.scheduler import StepScheduler

FIELDS = ("text", "token_ids", "kept", "steps")


def main(folder: str, n: int) -> int:
    pipe = SeerPipeline.from_manifest(folder, threads=1)
    requests = [Request(s.question, s.image if i % 6 else None, decoding=["fixed", "threshold:0.9", "factor:1",
                        None][i % 4], early_stop=i % 3 == 0, seer=i % 5 != 4, cache="none")
                for i, s in enumerate(make_samples(11, n))]  # fmt: skip
    alone = [pipe.generate([r])[0] for r in requests]
    scheduler = StepScheduler(pipe).start()
    tickets = []
    for i, r in enumerate(requests):
        tickets.append(scheduler.submit(r))
        time.sleep(0.002 * (i % 5))
    got = [t.result(300) for t in tickets]
    scheduler.close()
    pairs = list(zip(alone, got, strict=True))
    bad = [i for i, (a, g) in enumerate(pairs) if any(getattr(a, f) != getattr(g, f) for f in FIELDS)]
    print(f"{n} requests, {len(bad)} differ from generate alone; at most {max(scheduler.rows_per_step)} rows per step")
    for i in bad[:10]:
        a, g = pairs[i]
        print(i, requests[i].decoding, "alone", a.kept, a.steps, repr(a.text[:40]), "| scheduler", g.kept, g.steps,
              repr(g.text[:40]))  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
