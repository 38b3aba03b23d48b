"""How often the step scheduler's answers differ from ``SeerPipeline.generate`` alone.

    python tools/scheduler_agreement.py EXPORT N

A row batched with others is not bitwise the row alone (ONNX Runtime sums in another order), so an answer can
flip where a threshold, factor bound or tie sits at its border. N mixed requests (every rule, early stop, the
padded baseline, images) go through one scheduler, arriving a few milliseconds apart; the differing ones are
printed. For comparison, the same requests through ``generate``, 16 per call (its own batching,
which rounds the same way).
"""

from __future__ import annotations

import sys
import time

from seer_trt.eval.tasks import make_samples
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request
from seer_trt.runtime.scheduler import StepScheduler

FIELDS = ("text", "token_ids", "kept", "steps")


def _prompt(i: int, sample) -> tuple[str, object]:
    """Every sixth request text only: its question without the image placeholder."""
    return (sample.question, sample.image) if i % 6 else (sample.question.replace("<image>\n", ""), None)


def differ(alone, got) -> list[int]:
    return [i for i, (a, g) in enumerate(zip(alone, got, strict=True)) if any(getattr(a, f) != getattr(g, f)
                                                                             for f in FIELDS)]  # fmt: skip


def main(folder: str, n: int) -> int:
    pipe = SeerPipeline.from_manifest(folder, threads=1)
    requests = [Request(*_prompt(i, s), decoding=["fixed", "threshold:0.9", "factor:1",
                        None][i % 4], early_stop=i % 3 == 0, seer=i % 5 != 4, cache="none")
                for i, s in enumerate(make_samples(11, n))]  # fmt: skip
    alone = [pipe.generate([r])[0] for r in requests]
    scheduler = StepScheduler(pipe, max_queue=max(256, n)).start()
    tickets = []
    for i, r in enumerate(requests):
        tickets.append(scheduler.submit(r))
        time.sleep(0.002 * (i % 5))
    got = [t.result(300) for t in tickets]
    scheduler.close()
    pairs = list(zip(alone, got, strict=True))
    bad = differ(alone, got)
    batched = [r for i in range(0, n, 16) for r in pipe.generate(requests[i : i + 16])]  # generate's own batching
    failed = sum(not a.ok for a in alone)
    print(
        f"{n} requests ({failed} refused alike): {len(bad)} differ from generate alone through the scheduler "
        f"(at most {max(scheduler.rows_per_step)} rows per step); {len(differ(alone, batched))} through "
        "generate called with 16 at a time"
    )
    for i in bad[:10]:
        a, g = pairs[i]
        print(i, requests[i].decoding, "alone", a.kept, a.steps, repr(a.text[:40]), "| scheduler", g.kept, g.steps,
              repr(g.text[:40]))  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
