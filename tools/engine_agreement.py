"""How often the engine's answers differ from ``SeerPipeline.generate`` alone.

    python tools/engine_agreement.py EXPORT N

A row batched with others is not bitwise the row alone (ONNX Runtime sums in another order), so an answer can
flip where a threshold, factor bound or tie sits at its border. N mixed requests (``mixed_requests``: every rule,
early stop, the padded baseline, sampled with seeds, every cache policy, images) go through one engine, arriving a few milliseconds apart; the differing ones are
printed. For comparison, the same requests through ``generate``, 16 per call (its own batching,
which rounds the same way).
"""

from __future__ import annotations

import sys
import time

from seer_trt.eval.tasks import mixed_requests
from seer_trt.runtime.engine import Engine
from seer_trt.runtime.pipeline import SeerPipeline

FIELDS = ("text", "token_ids", "kept", "steps")


def differ(alone, got) -> list[int]:
    return [i for i, (a, g) in enumerate(zip(alone, got, strict=True)) if any(getattr(a, f) != getattr(g, f)
                                                                             for f in FIELDS)]  # fmt: skip


def main(folder: str, n: int) -> int:
    pipe = SeerPipeline.from_manifest(folder, threads=1)
    requests = mixed_requests(11, n)
    alone = [pipe.generate([r])[0] for r in requests]
    engine = Engine(pipe, max_queue=max(256, n)).start()
    tickets = []
    for i, r in enumerate(requests):
        tickets.append(engine.submit(r))
        time.sleep(0.002 * (i % 5))
    got = [t.result(300) for t in tickets]
    engine.close()
    pairs = list(zip(alone, got, strict=True))
    bad = differ(alone, got)
    batched = [r for i in range(0, n, 16) for r in pipe.generate(requests[i : i + 16])]  # generate's own batching
    failed = sum(not a.ok for a in alone)
    print(
        f"{n} requests ({failed} refused alike): {len(bad)} differ from generate alone through the engine "
        f"(at most {max(engine.rows_per_step)} rows per step); {len(differ(alone, batched))} through "
        "generate called with 16 at a time"
    )
    for i in bad[:10]:
        a, g = pairs[i]
        print(i, requests[i].decoding, "alone", a.kept, a.steps, repr(a.text[:40]), "| engine", g.kept, g.steps,
              repr(g.text[:40]))  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
