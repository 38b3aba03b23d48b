"""``seer-bench --workload serving``: seer-serve on loopback against what a user would run instead: the same server
with the prompt cache off (greedy, ``cache none``: the served path before the one engine), one request at a time, and
``SeerPipeline.generate`` of every request at once; and the server's overhead over ``generate`` (docs/DESIGN.md
"Measuring", "Serving and embedding").

In:  an export (``shape`` "fixture": of the fixture, held-out prompts with their images; "llada-v": the random
     LLaDA-V-shaped model of ``--workload llada-v-shaped``, written to the folder when it is new, prompts of 729
     stand-in image tokens plus the question, answer windows of ``WINDOW``); concurrency levels; requests per level;
     rounds.
Out: per concurrency, for each way (``default``: the server's defaults, the engine's ``max_rows``; ``cache_none``: the
     same server, each body asking ``cache: none``; ``one_at_a_time``: a server of ``max_rows`` 1; ``generate_batch``:
     ``SeerPipeline.generate`` of all the level's requests in one call), requests/s and p50 / p99 latency, medians
     over rounds that rotate the ways; the ratios of ``default`` over each other way, per round; ``overhead``: one
     client, one request after another, through HTTP against ``SeerPipeline.generate`` on the same requests
     (interleaved request by request), the median relative difference and the fixed cost in seconds;
     ``overhead_long``: the same on longer requests (the padded loop, the fixed rule, ``LONG_WINDOW`` steps);
     ``counted``, per concurrency: one more burst of the ``default`` way and one ``generate`` of the same requests at
     once, their window-graph calls recorded by the backend (``seer_export.bench.projection``): engine steps, calls
     per step, rows per call, host<->device bytes per step by kind, and each run's calls projected onto LLaDA-V 8B on
     one H200 (the roofline of ../shared/reference/gpu-limits.md §6.5; the fixture's prompts scaled to LLaDA-V's 793
     positions, the ``llada-v`` shape's kept), the at-once run with its K/V resident; and at the top level the
     headline ratios ``serving_over_cache_none_16``, ``serving_over_generate_batch_16`` (at the largest level),
     ``overhead_1``, ``rows_per_call_16``, ``kv_host_bytes_per_step_16`` and ``projected_h200_over_at_once_16`` (the
     projection of ``generate`` at once over the served calls' projection: 1 when serving loses nothing to arrivals).

The servers run in this process (uvicorn in threads, one port each) over one pipeline, so they share the backend's
sessions and the measuring clients share the machine's cores with them: figures are of the whole loopback system, as a
user on one machine would see it. Answers are compared with ``generate``'s for each request alone and the differing
ones counted (equal up to float rounding: docs/DESIGN.md "Serving and embedding").
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
    requests: int = 48  # per concurrency level and way, per round
    rounds: int = 3
    overhead_requests: int = 24
    shape: str = "fixture"  # SHAPES
    long_requests: int = 8  # of the overhead on longer requests

    @classmethod
    def quick(cls, shape: str = "fixture") -> Settings:
        return cls(concurrency=(1, 4, 16), requests=16, rounds=2, overhead_requests=8, shape=shape, long_requests=4)


SHAPES = ("fixture", "llada-v")
WAYS = ("default", "cache_none", "one_at_a_time", "generate_batch")
IMAGE_TOKENS = 729  # shape llada-v: one 384-px tile of LLaDA-V's SigLIP, as stand-in words
# shape llada-v: the answer window, what Seer keeps of LLaDA-V's 128 for a short answer (the random model's detector
# cannot cut, so the window is given; every way runs the same one)
WINDOW = 32


class _Server:
    """seer-serve's app over its own engine, in a thread of this process."""

    def __init__(self, pipe, max_rows: int | None, name: str) -> None:
        import uvicorn

        from seer_trt.runtime.engine import Engine
        from seer_trt.serving.openai.http import create_app
        from seer_trt.serving.openai.server import config as server_config
        from seer_trt.serving.openai.server import listen

        self.engine = Engine(pipe, max_rows=max_rows, max_queue=1024).start()
        self.sock = listen("127.0.0.1", 0)  # seer-serve's own socket (TCP_NODELAY on its connections)
        self.port = self.sock.getsockname()[1]
        config = server_config(create_app(self.engine, name), log_level="error")
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
        self.engine.close()


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


def _workload(folder, settings: Settings, seed: int, threads: int, progress: Progress):
    """The pipeline, its requests and their chat bodies for ``settings.shape``."""
    from seer_trt.eval.tasks import held_out
    from seer_trt.runtime.pipeline import SeerPipeline
    from seer_trt.runtime.request import Request

    n = max(settings.requests, settings.overhead_requests)
    if settings.shape == "llada-v":
        from pathlib import Path

        from seer_export.bench.cache import ensure_export, prompt_text

        pipe = SeerPipeline.from_manifest(ensure_export(Path(folder), progress), threads=threads, calibrate=True)
        rng = np.random.default_rng(seed)
        texts = [prompt_text(pipe, IMAGE_TOKENS, rng) for _ in range(n)]
        requests = [Request(t, gen_length=WINDOW) for t in texts]
        bodies = [{"model": "bench", "messages": [{"role": "user", "content": t}], "max_tokens": WINDOW}
                  for t in texts]  # fmt: skip
        return pipe, requests, bodies
    pipe = SeerPipeline.from_manifest(folder, threads=threads, calibrate=True)
    samples = held_out(n, seed)
    return pipe, [Request(s.question, s.image) for s in samples], [_body(s, "bench") for s in samples]


def bench(folder, settings: Settings, seed: int, progress: Progress, command: str, threads: int = 1) -> dict:
    import dataclasses as dc

    from seer_export.bench.rounds import ratio, rotated

    pipe, requests, bodies = _workload(folder, settings, seed, threads, progress)
    greedy = [{k: v for k, v in b.items() if k != "temperature"} for b in bodies]  # the server's defaults
    uncached = [{**b, "temperature": 0, "cache": "none"} for b in greedy]  # the served path before the one engine
    progress("serving: each request alone through SeerPipeline.generate (the answers to compare with)")
    expected = [pipe.generate([r])[0].text for r in requests]
    uncached_expected = [pipe.generate([dc.replace(r, cache="none")])[0].text for r in requests]
    servers = {"default": _Server(pipe, None, "bench"), "one_at_a_time": _Server(pipe, 1, "bench")}
    report: dict[str, Any] = {"command": command, "shape": settings.shape, "requests_per_level": settings.requests,
                              "rounds": settings.rounds, "machine": {"cpus": os.cpu_count(), "threads": threads},
                              "prompt_tokens": int(np.mean([len(pipe.prompts.ids(r.prompt, r.image is not None))
                                                            for r in requests])),
                              "levels": {}, "differing": dict.fromkeys(WAYS, 0), "answers": 0}  # fmt: skip
    m = settings.requests

    def way(key: str, c: int) -> tuple[float, list[float], list[str], list[str]]:
        """(wall s, latencies, texts, the texts each alone) of one level's requests the ``key`` way."""
        if key == "generate_batch":
            start = time.perf_counter()
            out = pipe.generate(requests[:m])
            wall = time.perf_counter() - start
            return wall, [wall] * m, [r.text for r in out], expected[:m]
        url = servers["one_at_a_time" if key == "one_at_a_time" else "default"].url
        wall, lat, texts = _burst(url, (uncached if key == "cache_none" else greedy)[:m], c)
        return wall, lat, texts, (uncached_expected if key == "cache_none" else expected)[:m]

    try:
        for srv in servers.values():  # warm-up: sessions, the cost model, uvicorn
            _burst(srv.url, greedy[:4], 4)
            _burst(srv.url, uncached[:4], 4)
        for c in settings.concurrency:
            per: dict[str, dict[str, list]] = {k: {"rps": [], "lat": []} for k in WAYS}
            for r in range(settings.rounds):
                for key in rotated(WAYS, r):
                    progress(f"serving: {c} client(s), round {r + 1}/{settings.rounds}, {key}")
                    wall, lat, texts, alone = way(key, c)
                    report["differing"][key] += sum(a != b for a, b in zip(texts, alone, strict=True))
                    report["answers"] += len(texts) if key == "default" else 0
                    per[key]["rps"].append(m / wall)
                    per[key]["lat"].extend(lat)
            level: dict[str, Any] = {
                key: {"requests_per_s": _spread(v["rps"]),
                      "p50_s": float(np.percentile(v["lat"], 50)), "p99_s": float(np.percentile(v["lat"], 99))}
                for key, v in per.items()
            }  # fmt: skip
            for key in WAYS[1:]:
                level[f"default_over_{key}"] = ratio(per["default"]["rps"], per[key]["rps"])
            report["levels"][str(c)] = level
        report["counted"] = {str(c): counted(pipe, servers["default"], requests[:m], greedy[:m], c, settings.shape,
                                             progress) for c in settings.concurrency}  # fmt: skip
        url = servers["default"].url
        pairs = list(zip(requests, greedy, strict=True))
        slow = {"seer": False, "decoding": "fixed", "gen_length": LONG_WINDOW}  # a step per position, all N
        long = [(dc.replace(x, **slow), {**body, "seer": False, "decoding": "fixed", "max_tokens": LONG_WINDOW})
                for x, body in pairs]  # fmt: skip
        progress("serving: overhead, one client, HTTP vs SeerPipeline.generate, request by request")
        report["overhead"] = _overhead(pipe, url, pairs[: settings.overhead_requests])
        progress(f"serving: overhead on longer requests (the padded loop, the fixed rule, {LONG_WINDOW} positions)")
        report["overhead_long"] = _overhead(pipe, url, long[: settings.long_requests])
    finally:
        for srv in servers.values():
            srv.close()
    c = max(settings.concurrency)
    top, count = report["levels"][str(c)], report["counted"][str(c)]
    report["headline"] = {f"serving_over_cache_none_{c}": top["default_over_cache_none"],
                          f"serving_over_generate_batch_{c}": top["default_over_generate_batch"],
                          "overhead_1": report["overhead"]["relative"],
                          f"rows_per_call_{c}": count["served"]["rows_per_call"],
                          f"kv_host_bytes_per_step_{c}": count["served"]["kv_host_bytes_per_step"],
                          f"projected_h200_over_at_once_{c}": count["at_once_over_served"]}  # fmt: skip
    report |= report["headline"]
    report["load_average"] = os.getloadavg()
    return report


def counted(pipe, server: _Server, requests: list, bodies: list[dict], clients: int, shape: str,
            progress: Progress) -> dict[str, Any]:  # fmt: skip
    """The window-graph calls of one burst of ``bodies`` through the server (``clients`` at a time) and of
    ``generate`` of the same ``requests`` at once, recorded and projected onto one H200
    (``seer_export.bench.projection``)."""
    from seer_export.bench.projection import ExportDims, Recorder, summary

    dims = ExportDims.of(pipe.backend.spec("denoise"))
    prompt = None if shape == "llada-v" else PROJECTED_PROMPT
    progress(f"serving: {clients} client(s), the calls counted (served, then generate at once)")
    with Recorder(pipe.backend, step=lambda: server.engine.steps) as served:
        first = server.engine.steps
        _burst(server.url, bodies, clients)
        steps = server.engine.steps - first
    with Recorder(pipe.backend) as at_once:
        pipe.generate(requests)
    s, a = summary(served, dims, steps, prompt), summary(at_once, dims, None, prompt, kv_resident=True)
    return {"served": s, "at_once": a, "at_once_over_served": a["projected_h200_s"] / s["projected_h200_s"]}


def _headline(key: str, value: Any) -> str:
    if isinstance(value, dict):
        return f"{key} {value['value']:.2f}x [{value['min']:.2f}-{value['max']:.2f}]"
    if key.startswith("overhead"):
        return f"{key} {value * 100:+.1f} %"
    return f"{key} {value:.3g}"


PROJECTED_PROMPT = 793  # the fixture's prompts are projected at LLaDA-V's one-tile prompt (gpu-limits.md §6.1)


def table(report: dict) -> str:
    lines = [f"shape {report['shape']} (prompts of {report['prompt_tokens']} tokens on average)", "",
             "| clients | way | requests/s [min-max] | p50 s | p99 s |", "|---|---|---|---|---|"]  # fmt: skip
    for c, level in report["levels"].items():
        for key in WAYS:
            v = level[key]
            r = v["requests_per_s"]
            lines.append(f"| {c} | {key} | {r['value']:.1f} [{r['min']:.1f}-{r['max']:.1f}] | {v['p50_s']:.3f} | "
                         f"{v['p99_s']:.3f} |")  # fmt: skip
        for key in WAYS[1:]:
            x = level[f"default_over_{key}"]
            lines.append(f"| {c} | default / {key} | {x['value']:.2f}x [{x['min']:.2f}-{x['max']:.2f}] | | |")
    lines.append("")
    for key, what in (("overhead", "the requests above"),
                      ("overhead_long", f"padded fixed-rule requests at {LONG_WINDOW} positions")):  # fmt: skip
        o = report[key]
        lines.append(f"server overhead, {what} (one client, HTTP vs SeerPipeline.generate, {o['requests']} "
                     f"requests): {o['http_median_s'] * 1e3:.1f} ms vs {o['direct_median_s'] * 1e3:.1f} ms median, "
                     f"{o['fixed_cost_s'] * 1e3:+.1f} ms, {o['relative'] * 100:+.1f} %")  # fmt: skip
    lines += ["", "| clients | run | engine steps | calls/step | rows/call | host K/V bytes/step | device copies "
              "bytes/step | projected H200 s |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for c, count in report.get("counted", {}).items():
        for run in ("served", "at_once"):
            x = count[run]
            per = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
            lines.append(f"| {c} | {run} | {x['steps'] or '-'} | {per(x['calls_per_step'])} | {x['rows_per_call']:.2f} | "
                         f"{per(x['kv_host_bytes_per_step'])} | {per(x['device_copy_bytes_per_step'])} | "
                         f"{x['projected_h200_s']:.3f} |")  # fmt: skip
        lines.append(f"| {c} | at once / served | | | | | | {count['at_once_over_served']:.2f} |")
    lines.append("")
    d = report["differing"]
    lines.append(f"answers differing from generate alone (float rounding at a border): "
                 f"{', '.join(f'{k} {v}' for k, v in d.items())} (of {report['answers']} per way)")  # fmt: skip
    lines.append("headline: " + ", ".join(_headline(k, v) for k, v in report["headline"].items()))
    lines.append(f"load average {report['load_average'][0]:.2f}")
    return "\n".join(lines)
