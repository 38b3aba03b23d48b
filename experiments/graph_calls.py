"""The graph calls of default requests on easy-vqa, one at a time: calls per request, milliseconds per call and the
prompt and window shapes each graph saw (docs/results.md, "easy-vqa: against upstream LLaDA-V with its Fast-dLLM
hook"). A one-off measurement:

    python experiments/graph_calls.py EXPORT [N]
"""

import collections
import sys
import time

from seer_trt.eval import easy_vqa
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request

pipe = SeerPipeline.from_manifest(sys.argv[1], threads=1)
requests = [Request(s.question, image=s.image) for s in easy_vqa.load("test", int(sys.argv[2]) if sys.argv[2:] else 60)]
for r in requests[:5]:  # warm
    pipe.generate([r])
real, seen = pipe.backend.run, collections.defaultdict(lambda: [0, 0.0, collections.Counter()])


def timed(graph, feeds, *args, **kwargs):
    start = time.perf_counter()
    out = real(graph, feeds, *args, **kwargs)
    entry = seen[graph]
    entry[0], entry[1] = entry[0] + 1, entry[1] + time.perf_counter() - start
    if "prefix_embeds" in feeds and "gen_ids" in feeds:
        entry[2][(feeds["prefix_embeds"].shape[1], feeds["gen_ids"].shape[1])] += 1
    return out


pipe.backend.run = timed
start = time.perf_counter()
for r in requests:
    pipe.generate([r])
print(
    f"{(time.perf_counter() - start) / len(requests) * 1000:.1f} ms a request, decoding {pipe.manifest.generation.decoding}"
)
for graph, (n, seconds, shapes) in seen.items():
    common = ", ".join(f"{p}+{g} x{c}" for (p, g), c in shapes.most_common(4))
    print(
        f"{graph:10s} {n / len(requests):.1f} calls a request, {seconds / n * 1000:.2f} ms a call; prompt+window: {common}"
    )
