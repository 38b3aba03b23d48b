"""Does anything wait behind one sampled request? Greedy clients' latency with and without a sampled neighbour.

    python3 tools/sampled_neighbour.py --engines E [--clients 4] [--requests 12] [--rounds 3] [--json OUT]

Starts ``seer-serve --engines E`` on loopback. Each round runs twice, in alternating order: ``--clients`` greedy
clients each sending ``--requests`` short requests one after another ("count to 3 ." and the like), alone, and the
same with one more client sending, back to back, sampled requests (temperature 0.8, a long padded answer: the
export's whole window, no early stop, the fixed rule: one token a step) until the greedy clients are done. Reports per round the greedy requests'
longest and median latency in both, and the ratio of the longest (issue 36's bar: at most 2x), with the load
average. On a default export (no ``denoise_logits``) the sampled requests draw from the top ids (``TopK``).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from seer_trt.eval.report import print_report

PROMPTS = ("count to 3 .", "count to 4 .", "count to 5 .", "count to 2 .")


def main() -> int:
    import httpx

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", required=True, type=Path)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    server = subprocess.Popen([sys.executable, "-m", "seer_trt.cli.serve", "--engines", str(args.engines), "--port",
                               "0", "--threads", "1", "--model-name", "m"], stderr=subprocess.PIPE, text=True)  # fmt: skip
    report: dict = {"clients": args.clients, "requests": args.requests, "rounds": []}
    try:
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/v1", server.stderr.readline()).group(1))
        threading.Thread(target=server.stderr.read, daemon=True).start()
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        greedy_body = lambda i: {"model": "m", "messages": [{"role": "user", "content": PROMPTS[i % 4]}]}  # noqa: E731
        sampled_body = {"model": "m", "messages": [{"role": "user", "content": "count to 9 ."}], "temperature": 0.8,
                        "seed": 7, "seer": False, "early_stop": False, "decoding": "fixed"}  # fmt: skip
        with httpx.Client(timeout=300) as c:  # warm both paths
            assert c.post(url, json=greedy_body(0)).status_code == 200
            r = c.post(url, json=sampled_body)
            assert r.status_code == 200, r.text

        def greedy(k: int) -> list[float]:
            out = []
            with httpx.Client(timeout=300) as c:
                for i in range(args.requests):
                    t = time.monotonic()
                    assert c.post(url, json=greedy_body(k + i)).status_code == 200
                    out.append(time.monotonic() - t)
            return out

        def run(neighbour: bool) -> dict:
            done = threading.Event()
            sampled: list[float] = []

            def sampler() -> None:
                with httpx.Client(timeout=300) as c:
                    while not done.is_set():
                        t = time.monotonic()
                        assert c.post(url, json=sampled_body).status_code == 200
                        sampled.append(time.monotonic() - t)

            thread = threading.Thread(target=sampler) if neighbour else None
            if thread is not None:
                thread.start()
                time.sleep(0.2)
            with ThreadPoolExecutor(args.clients) as pool:
                lat = [s for part in pool.map(greedy, range(args.clients)) for s in part]
            done.set()
            if thread is not None:
                thread.join()
            return {"max_s": max(lat), "p50_s": statistics.median(lat), "sampled": len(sampled),
                    "sampled_p50_s": statistics.median(sampled) if sampled else None}  # fmt: skip

        for i in range(args.rounds):
            order = (False, True) if i % 2 == 0 else (True, False)
            got = {("with" if n else "without"): run(n) for n in order}
            got["ratio_of_max"] = got["with"]["max_s"] / got["without"]["max_s"]
            with open("/proc/loadavg") as f:
                got["loadavg"] = f.read().split()[:3]
            report["rounds"].append(got)
            print(json.dumps(got), flush=True)
    finally:
        server.terminate()
        server.wait(60)
    ratios = sorted(r["ratio_of_max"] for r in report["rounds"])
    report["ratio_of_max_median"] = statistics.median(ratios)
    report["ratio_of_max_range"] = [ratios[0], ratios[-1]]
    print_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
