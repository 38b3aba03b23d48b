"""``seer-bench --workload serving``: seer-serve on loopback, continuous batching against one request at a time on
the same server, and the server's overhead against calling ``SeerPipeline.generate`` directly (docs/DESIGN.md
"Measuring", "Serving").

In:  an export of the fixture; concurrency levels; requests per level; rounds.
Out: per concurrency, for each server (``continuous``: the step scheduler's default ``max_rows``; ``one_at_a_time``:
     ``max_rows`` 1, every request alone), requests/s and p50 / p99 latency, medians over rounds that alternate the
     two servers; ``continuous_over_one_at_a_time``: the ratio of their requests/s per round; and ``overhead``: one
     client, one request after another, through HTTP against ``SeerPipeline.generate`` on the same requests
     (interleaved request by request), the median relative difference and the fixed cost in seconds;
     ``overhead_long``: the same on longer requests (the padded loop, the fixed rule, ``LONG_WINDOW`` steps).

Both servers run in this process (uvicorn in threads, one port each) over one pipeline, so they share the
backend's sessions and the measuring clients share the machine's two cores with them: figures are of the whole
loopback system, as a user on one machine would see it. Requests are held-out fixture prompts with their images
as ``data:`` URLs (text alone where a task has none), greedy, the exact loop.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import os
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

Progress = Callable[[str], None]
LONG_WINDOW = 64  # the overhead's longer requests: seer off, the fixed rule, one step per position of this window


@dataclasses.dataclass(frozen=True)
class Settings:
    concurrency: tuple[int, ...] = (1, 4, 16)
    requests: int = 48  # per concurrency level and server, per round
    rounds: int = 3
    overhead_requests: int = 24

    @classmethod
    def quick(cls) -> Settings:
        return cls(concurrency=(1, 4, 16), requests=16, rounds=2, overhead_requests=8)


class _Server:
    """seer-serve's app over its own scheduler, in a thread of this process."""

    def __init__(self, pipe, max_rows: int | None, name: str) -> None:
        import uvicorn

        from seer_trt.cli.serve import listen
        from seer_trt.runtime.scheduler import StepScheduler
        from seer_trt.serving.http import create_app

        self.scheduler = StepScheduler(pipe, max_rows=max_rows, max_queue=1024).start()
        self.sock = listen("127.0.0.1", 0)  # seer-serve's own socket (TCP_NODELAY on its connections)
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(create_app(self.scheduler, name), log_level="error")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started and time.time() < deadline:
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}/v1/chat/completions"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()
        self.scheduler.close()


def _body(sample, name: str) -> dict[str, Any]:
    from PIL import Image

    if sample.image is None:
        return {"model": name, "messages": [{"role": "user", "content": sample.question}], "temperature": 0}
    buf = io.BytesIO()
    Image.fromarray(sample.image).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    content = [{"type": "text", "text": sample.question}, {"type": "image_url", "image_url": {"url": url}}]
    return {"model": name, "messages": [{"role": "user", "content": content}], "temperature": 0}


def _burst(url: str, bodies: list[dict], concurrency: int) -> tuple[float, list[float], list[str]]:
    """``bodies`` sent by ``concurrency`` clients, each one request after another: wall seconds, latencies, texts."""
    import httpx

    latencies: list[float] = [0.0] * len(bodies)
    texts: list[str] = [""] * len(bodies)
    clients = [httpx.Client(timeout=300) for _ in range(concurrency)]

    def one(i: int) -> None:
        client = clients[i % concurrency]
        t = time.perf_counter()
        r = client.post(url, json=bodies[i])
        latencies[i] = time.perf_counter() - t
        r.raise_for_status()
        texts[i] = r.json()["choices"][0]["message"]["content"]

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(len(bodies))))
    wall = time.perf_counter() - start
    for c in clients:
        c.close()
    return wall, latencies, texts


def _overhead(pipe, url: str, pairs: list) -> dict[str, Any]:
    """One client, one request after another, each sent both ways in alternating order: ``SeerPipeline.generate``
    directly and through HTTP; the medians, their difference (the server's fixed cost) and its share."""
    import httpx

    direct, http = [], []
    with httpx.Client(timeout=300) as client:
        for i, (request, body) in enumerate(pairs):
            for way in ("direct", "http") if i % 2 == 0 else ("http", "direct"):
                t = time.perf_counter()
                if way == "direct":
                    pipe.generate([request])
                    direct.append(time.perf_counter() - t)
                else:
                    client.post(url, json=body).raise_for_status()
                    http.append(time.perf_counter() - t)
    d, h = statistics.median(direct), statistics.median(http)
    return {"direct_median_s": d, "http_median_s": h, "fixed_cost_s": h - d, "relative": h / d - 1.0,
            "requests": len(direct)}  # fmt: skip


def _spread(values: list[float]) -> dict[str, Any]:
    return {"value": float(np.median(values)), "min": min(values), "max": max(values), "rounds": len(values)}


def bench(folder, settings: Settings, seed: int, progress: Progress, command: str, threads: int = 1) -> dict:
    from seer_trt.eval.tasks import held_out
    from seer_trt.runtime.pipeline import SeerPipeline
    from seer_trt.runtime.request import Request

    pipe = SeerPipeline.from_manifest(folder, threads=threads, calibrate=True)
    name = "bench"
    samples = held_out(max(settings.requests, settings.overhead_requests), seed)
    bodies = [_body(s, name) for s in samples]
    expected = [pipe.generate([Request(s.question, s.image, cache="none")])[0].text for s in samples]
    servers = {"continuous": _Server(pipe, None, name), "one_at_a_time": _Server(pipe, 1, name)}
    report: dict[str, Any] = {"command": command, "requests_per_level": settings.requests, "rounds": settings.rounds,
                              "machine": {"cpus": os.cpu_count(), "threads": threads}, "levels": {}}  # fmt: skip
    try:
        for srv in servers.values():  # warm-up: sessions, the cost model, uvicorn
            _burst(srv.url, bodies[:4], 4)
        for c in settings.concurrency:
            per: dict[str, dict[str, list]] = {k: {"rps": [], "lat": []} for k in servers}
            for r in range(settings.rounds):
                order = list(servers) if r % 2 == 0 else list(servers)[::-1]
                for key in order:
                    progress(f"serving: {c} client(s), round {r + 1}/{settings.rounds}, {key}")
                    wall, lat, texts = _burst(servers[key].url, bodies[: settings.requests], c)
                    if texts != expected[: settings.requests]:
                        raise AssertionError(f"{key} at {c} clients answered differently from SeerPipeline.generate")
                    per[key]["rps"].append(settings.requests / wall)
                    per[key]["lat"].extend(lat)
            ratios = [a / b for a, b in zip(per["continuous"]["rps"], per["one_at_a_time"]["rps"], strict=True)]
            report["levels"][str(c)] = {
                key: {"requests_per_s": _spread(v["rps"]),
                      "p50_s": float(np.percentile(v["lat"], 50)), "p99_s": float(np.percentile(v["lat"], 99))}
                for key, v in per.items()
            } | {"continuous_over_one_at_a_time": _spread(ratios)}  # fmt: skip
        url = servers["continuous"].url
        short = [(Request(x.question, x.image, cache="none"), body) for x, body in zip(samples, bodies, strict=True)]
        slow = {"seer": False, "decoding": "fixed", "gen_length": LONG_WINDOW}  # a step per position, all N
        long = [(Request(x.question, x.image, cache="none", **slow),
                 {**body, "seer": False, "decoding": "fixed", "max_tokens": LONG_WINDOW})
                for x, body in zip(samples, bodies, strict=True)]  # fmt: skip
        progress("serving: overhead, one client, HTTP vs SeerPipeline.generate, request by request")
        report["overhead"] = _overhead(pipe, url, short[: settings.overhead_requests])
        progress(f"serving: overhead on longer requests (the padded loop, the fixed rule, {LONG_WINDOW} positions)")
        report["overhead_long"] = _overhead(pipe, url, long[: max(4, settings.overhead_requests // 3)])
    finally:
        for srv in servers.values():
            srv.close()
    report["load_average"] = os.getloadavg()
    return report


def table(report: dict) -> str:
    lines = ["| clients | server | requests/s [min-max] | p50 s | p99 s |", "|---|---|---|---|---|"]
    for c, level in report["levels"].items():
        for key in ("continuous", "one_at_a_time"):
            v = level[key]
            r = v["requests_per_s"]
            lines.append(f"| {c} | {key} | {r['value']:.1f} [{r['min']:.1f}-{r['max']:.1f}] | {v['p50_s']:.3f} | "
                         f"{v['p99_s']:.3f} |")  # fmt: skip
        x = level["continuous_over_one_at_a_time"]
        lines.append(f"| {c} | continuous / one at a time | {x['value']:.2f}x [{x['min']:.2f}-{x['max']:.2f}] | | |")
    lines.append("")
    for key, what in (("overhead", "the requests above"),
                      ("overhead_long", f"padded fixed-rule requests at {LONG_WINDOW} positions")):  # fmt: skip
        o = report[key]
        lines.append(f"server overhead, {what} (one client, HTTP vs SeerPipeline.generate, {o['requests']} "
                     f"requests): {o['http_median_s'] * 1e3:.1f} ms vs {o['direct_median_s'] * 1e3:.1f} ms median, "
                     f"{o['fixed_cost_s'] * 1e3:+.1f} ms, {o['relative'] * 100:+.1f} %")  # fmt: skip
    lines.append(f"load average {report['load_average'][0]:.2f}")
    return "\n".join(lines)
