"""seer-serve's memory under the largest bodies at once and over many requests, through a real server on loopback.

    python3 tools/serve_memory.py --engines E [--bodies 64] [--requests 1000] [--clients 16] [--json OUT]

Starts ``seer-serve --engines E --port 0 --threads 1`` and reads its process's VmRSS from /proc every 20 ms while:
1. ``--bodies`` clients at once each send one body of the largest size the server accepts (``body_limit`` of the
   export's bounds: a chat request with the largest noise PNG the server decodes as a data: URL, padded with spaces
   to the limit); reports the statuses (200,
   or 429 with Retry-After past the held-bytes budget, ``max_held_bytes`` = 8 bodies), RSS before, the peak, after;
2. ``--requests`` text requests from ``--clients`` clients; reports RSS after every tenth of them (flat: no leak).
Prints one JSON object (and writes it to ``--json``). The server is stopped on the way out.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from seer_trt.eval.report import print_report


def rss_mb(pid: int) -> float:
    return int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1)) / 1024


class Sampler:
    """The server's VmRSS every 20 ms, in a thread, and its peak."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb(self.pid))
            time.sleep(0.02)

    def __enter__(self) -> Sampler:
        self.peak = rss_mb(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def largest_body(engines: Path, model: str) -> tuple[bytes, int]:
    """A chat request with a noise PNG (incompressible) as a data: URL, padded with spaces to the server's body limit,
    and that limit."""
    import numpy as np
    from PIL import Image

    from seer_trt.runtime.pipeline import SeerPipeline
    from seer_trt.serving.openai.middleware import body_limit

    pipe = SeerPipeline.from_manifest(engines, threads=1)
    limit = body_limit(pipe.prompts.max_chars, pipe.image_limits.bytes)
    image_bytes, decoded = pipe.image_limits.bytes, pipe.image_limits.decoded or pipe.image_limits.pixels
    pipe.close()
    side = int(min(image_bytes * 0.9 / 3, decoded) ** 0.5)  # the largest noise picture the server decodes
    while True:
        buf = io.BytesIO()
        Image.fromarray(np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buf, "PNG")
        if len(buf.getvalue()) <= image_bytes:
            break
        side = int(side * 0.95)
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    content = [{"type": "text", "text": "what is in the picture ?"}, {"type": "image_url", "image_url": {"url": url}}]
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 16})
    return body.encode() + b" " * max(0, limit - len(body) - 1), limit


def main() -> int:
    import httpx

    from seer_trt.serving.openai import http

    held_bodies = getattr(http, "HELD_BODIES", 8)  # the default budget (8 bodies before it was named)

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", required=True, type=Path)
    ap.add_argument("--bodies", type=int, default=64)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    model = "m"
    server = subprocess.Popen([sys.executable, "-m", "seer_trt.cli.serve", "--engines", str(args.engines), "--port",
                               "0", "--threads", "1", "--model-name", model], stderr=subprocess.PIPE, text=True)  # fmt: skip
    report: dict = {}
    try:
        line = server.stderr.readline()
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/v1", line).group(1))
        threading.Thread(target=server.stderr.read, daemon=True).start()  # drain the log
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        body, limit = largest_body(args.engines, model)
        text = {"model": model, "messages": [{"role": "user", "content": "count to 3 ."}]}
        with httpx.Client(timeout=120) as c:  # warm: the first answer opens the sessions
            assert c.post(url, json=text).status_code == 200
        report["body_bytes"], report["started_rss_mb"] = len(body), rss_mb(server.pid)

        def big(_) -> str:
            with httpx.Client(timeout=300) as c:
                r = c.post(url, content=body, headers={"content-type": "application/json"})
                return f"{r.status_code}" + (" retry-after" if "retry-after" in r.headers else "")

        before = rss_mb(server.pid)
        with Sampler(server.pid) as s, ThreadPoolExecutor(args.bodies) as pool:
            statuses = Counter(pool.map(big, range(args.bodies)))
        time.sleep(1.0)
        report["bodies"] = {"sent": args.bodies, "limit_bytes": limit, "held_budget_bytes": held_bodies * limit,
                            "statuses": dict(statuses),
                            "rss_before_mb": before, "rss_peak_mb": s.peak, "rss_after_mb": rss_mb(server.pid)}  # fmt: skip

        done, curve, lock = [0], [], threading.Lock()

        def small(_) -> int:
            with httpx.Client(timeout=120) as c:
                status = c.post(url, json=text).status_code
            with lock:
                done[0] += 1
                if done[0] % max(1, args.requests // 10) == 0:
                    curve.append((done[0], rss_mb(server.pid)))
            return status

        start = time.monotonic()
        with ThreadPoolExecutor(args.clients) as pool:
            statuses = Counter(pool.map(small, range(args.requests)))
        report["requests"] = {"sent": args.requests, "clients": args.clients, "statuses": dict(statuses),
                              "seconds": time.monotonic() - start, "rss_mb_after_each_tenth": curve}  # fmt: skip
    finally:
        server.terminate()
        server.wait(60)
    with open("/proc/loadavg") as f:
        report["loadavg"] = f.read().split()[:3]
    print_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
