"""seer-serve's replicas on a real local Ray cluster, loopback only: load, then the same load with a replica killed.

    unshare -n python3 tools/ray_cluster.py --engines EXPORT [--replicas 2] [--clients 16] [--requests 200]
        [--fault] [--json OUT]

Run as root inside a network namespace of its own (``unshare -n``): it brings up ``lo`` and starts a head and one
more node as separate ``ray start`` processes on 127.0.0.1 (Ray otherwise binds and dials the machine's own address),
deploys ``seer_trt.serving.ray_serve`` with ``seer-serve --ray ... --replicas N`` (one CPU each, so they land on
both nodes), and sends ``--requests`` held-out requests (text and image, every fourth streamed) from ``--clients`` threads through
Serve's proxy. A client sends again, up to 5 times, what ends in a 5xx, a closed connection or a stream without
``[DONE]`` (what a client of any replicated service does); nothing else retries. With ``--fault`` a replica's process
is killed (SIGKILL) halfway through a second run of the same load; with ``--drain`` a last run is scaled down to one
replica halfway (Serve stops the other gracefully). Prints (and writes) one JSON object: per run the
requests sent, answered first time, answered on retry, refused (4xx), lost (no answer after the retries) and hung
(no answer within the per-try timeout), requests/s, p50/p99, requests per replica (the ``X-Seer-Replica`` header,
and on the steady run each replica's own request counter from Ray's metrics agents),
answers equal to ``SeerPipeline.generate``'s alone; for the fault run the seconds until Serve had every replica
running again and the survivor's RSS before and after; then seer-serve's exit status on SIGTERM and the
applications left. The cluster is stopped on the way out.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from seer_trt.eval.report import print_report

HEAD_PORT, HTTP_PORT = 6390, 8590
METRICS_PORTS = (8591, 8592)  # each node's Ray metrics agent (Prometheus text): the replicas' own request counters
TRY_TIMEOUT_S, TRIES = 60.0, 5


def sh(*args: str) -> None:
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)


def start_cluster() -> None:
    env = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_metrics_report_interval_ms": "1000"}
    os.environ.update(env)
    sh("ip", "link", "set", "lo", "up")
    sh(
        "ray",
        "start",
        "--head",
        "--node-ip-address",
        "127.0.0.1",
        "--port",
        str(HEAD_PORT),
        "--num-cpus",
        "1",
        "--include-dashboard",
        "false",
        "--disable-usage-stats",
        "--metrics-export-port",
        str(METRICS_PORTS[0]),
    )
    sh("ray", "start", "--address", f"127.0.0.1:{HEAD_PORT}", "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
       "--metrics-export-port", str(METRICS_PORTS[1]))  # fmt: skip


def serve_argv(engines: Path, replicas: int, model: str) -> list[str]:
    return ["--engines", str(engines), "--ray", f"127.0.0.1:{HEAD_PORT}", "--replicas", str(replicas), "--threads", "1",
            "--model-name", model, "--host", "127.0.0.1", "--port", str(HTTP_PORT)]  # fmt: skip


def scale(engines: Path, replicas: int, model: str) -> None:
    """The deployed application with another replica count and every other argument as seer-serve gave it: Serve
    stops the replicas it no longer needs gracefully (they take no new requests and finish what they hold)."""
    from ray import serve

    from seer_trt.cli.serve import build_parser, ray_application
    from seer_trt.serving.ray_serve import APP

    args = build_parser().parse_args(serve_argv(engines, replicas, model))
    serve.run(ray_application(args, None), name=APP, route_prefix="/")


def start_serving(engines: Path, replicas: int, model: str) -> subprocess.Popen:
    """``seer-serve --ray`` deploying the application, once Serve's proxy answers /health through a replica."""
    import httpx

    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"seer-serve-ray-{os.getpid()}.log", "w+")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "seer_trt.cli.serve", *serve_argv(engines, replicas, model)],
                            stdout=subprocess.DEVNULL, stderr=log, text=True)  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{HTTP_PORT}/health", timeout=5).status_code == 200 and running(replicas):
                return proc
        except httpx.TransportError:
            pass
        time.sleep(1)
    proc.kill()
    proc.wait(30)
    log.seek(0)
    raise SystemExit(f"seer-serve --ray did not come up: {log.read()[-2000:]}")


def replica_requests() -> dict[str, float]:
    """Requests each live replica has processed, from its own metrics (Ray Serve's
    ``ray_serve_deployment_request_counter_total``, scraped from every node's metrics agent)."""
    import re

    import httpx

    out: dict[str, float] = {}
    for port in METRICS_PORTS:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith("ray_serve_deployment_request_counter_total{") and 'application="seer"' in line:
                replica = re.search(r'replica="([^"]+)"', line).group(1)
                out[replica] = out.get(replica, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def settled_requests(before: dict[str, float], expected: int, wait_s: float = 30.0) -> dict[str, int]:
    """Per replica, the requests its metrics counted since ``before``, once they add up to ``expected`` or stop
    changing (the agents report every second)."""
    deadline, last = time.monotonic() + wait_s, None
    while True:
        now = replica_requests()
        diff = {r: int(n - before.get(r, 0.0)) for r, n in now.items() if n - before.get(r, 0.0) > 0}
        if sum(diff.values()) >= expected or diff == last or time.monotonic() > deadline:
            return diff
        last = diff
        time.sleep(2)


def bodies(n: int, model: str):
    from PIL import Image

    from seer_trt.eval.tasks import held_out
    from seer_trt.runtime.request import Request

    out = []
    for i, s in enumerate(held_out(n, 23)):
        content: object = s.question.replace("<image>\n", "") if s.image is None else None
        if s.image is not None:
            buf = io.BytesIO()
            Image.fromarray(s.image).save(buf, format="PNG")
            url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
            content = [{"type": "text", "text": s.question}, {"type": "image_url", "image_url": {"url": url}}]
        body = {"model": model, "messages": [{"role": "user", "content": content}], "stream": i % 4 == 3}
        out.append((body, Request(content if s.image is None else s.question, s.image)))
    return out


def ask(client, url: str, body: dict) -> tuple[int, str | None, str | None]:
    """(HTTP status, answer text or None, replica) of one try; raises on a closed connection or a broken stream."""
    if not body["stream"]:
        r = client.post(url, json=body)
        text = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else None
        return r.status_code, text, r.headers.get("x-seer-replica")
    with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, None, r.headers.get("x-seer-replica")
        pieces, done = [], False
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                if "error" in event:
                    raise ConnectionError(f"error event: {event['error']['message']}")
                if event.get("choices"):
                    pieces.append(event["choices"][0]["delta"].get("content") or "")
        if not done:
            raise ConnectionError("the stream ended without [DONE]")
        return 200, "".join(pieces), r.headers.get("x-seer-replica")


def load(items, clients: int, url: str, on_half=None) -> dict:
    import httpx

    outcome: list[dict] = [{} for _ in items]
    sent = Counter()
    lock = threading.Lock()

    def one(i: int) -> None:
        body = items[i][0]
        with lock:
            sent["n"] += 1
            if on_half is not None and sent["n"] == len(items) // 2:
                threading.Thread(target=on_half, daemon=True).start()
        start = time.monotonic()
        with httpx.Client(timeout=TRY_TIMEOUT_S) as client:
            for attempt in range(TRIES):
                try:
                    status, text, replica = ask(client, url, body)
                except httpx.TimeoutException:
                    outcome[i] = {"kind": "hung"}
                    return
                except (httpx.TransportError, ConnectionError, json.JSONDecodeError):
                    status, text, replica = 599, None, None
                if status == 200:
                    outcome[i] = {"kind": "first" if attempt == 0 else "retry", "text": text, "replica": replica,
                                  "s": time.monotonic() - start}  # fmt: skip
                    return
                if status < 500 and status != 429:
                    outcome[i] = {"kind": "refused", "status": status}
                    return
                time.sleep(0.5 * (attempt + 1))
        outcome[i] = {"kind": "lost"}

    start = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(len(items))))
    wall = time.monotonic() - start
    kinds = Counter(o["kind"] for o in outcome)
    lat = sorted(o["s"] for o in outcome if "s" in o)
    return {"sent": len(items), "answered_first_time": kinds["first"], "answered_on_retry": kinds["retry"],
            "refused": kinds["refused"], "lost": kinds["lost"], "hung": kinds["hung"],
            "requests_per_s": len(items) / wall, "p50_s": statistics.median(lat) if lat else None,
            "p99_s": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None,
            "per_replica": dict(Counter(o.get("replica") for o in outcome if "replica" in o)),
            "texts": [o.get("text") for o in outcome]}  # fmt: skip


def replicas() -> list[int]:
    """PIDs of the live Serve replicas of the application: the processes Ray titles ``ray::ServeReplica:seer:...``."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                title = (proc / "cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if title.startswith(b"ray::ServeReplica:seer:"):
                out.append(int(proc.name))
    return sorted(out)


def running(n: int) -> bool:
    from ray import serve

    status = serve.status().applications.get("seer")
    if status is None:
        return False
    return sum(d.replica_states.get("RUNNING", 0) for d in status.deployments.values()) >= n and len(replicas()) >= n


def serve_applications() -> list[str]:
    from ray import serve

    return list(serve.status().applications)


def rss_mb(pid: int) -> float | None:
    try:
        return int(Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()[0]) / 1024
    except (OSError, IndexError):
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", required=True, type=Path)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--fault", action="store_true", help="a second run with one replica killed halfway")
    ap.add_argument("--drain", action="store_true", help="a last run scaled down to one replica halfway (graceful)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    start_cluster()
    report: dict = {"replicas": args.replicas, "clients": args.clients}
    serving = None
    try:
        import ray

        from seer_trt.runtime.pipeline import SeerPipeline

        ray.init(address=f"127.0.0.1:{HEAD_PORT}", logging_level="ERROR")
        t = time.monotonic()
        serving = start_serving(args.engines, args.replicas, "seer-test")
        report["deploy_s"] = time.monotonic() - t
        report["nodes"] = sorted({n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]})
        report["node_count"] = sum(n["Alive"] for n in ray.nodes())
        items = bodies(args.requests, "seer-test")
        pipe = SeerPipeline.from_manifest(args.engines, threads=1)
        expected = [r.text for r in pipe.generate([req for _, req in items])]
        url = f"http://127.0.0.1:{HTTP_PORT}/v1/chat/completions"
        runs = {"steady": None}
        if args.fault:
            runs["fault"] = None
        if args.drain:
            runs["drain"] = None
        for run in runs:
            on_half = None
            if run == "drain":

                def on_half() -> None:
                    report["drain_started"] = time.monotonic()
                    scale(args.engines, 1, "seer-test")
                    report["drain_deployed_s"] = time.monotonic() - report.pop("drain_started")

            if run == "fault":
                victims = replicas()
                survivor, victim = victims[0], victims[-1]
                report["survivor_rss_mb_before"] = rss_mb(survivor)

                def on_half(victim=victim) -> None:
                    report["killed_at"] = time.monotonic()
                    os.kill(victim, signal.SIGKILL)

            before = replica_requests()
            got = load(items, args.clients, url, on_half)
            texts = got.pop("texts")
            got["equal_to_generate"] = sum(a == b for a, b in zip(texts, expected, strict=True))
            if run == "steady":  # a killed replica's counters die with it: compared on the steady run
                got["per_replica_metrics"] = settled_requests(before, args.requests)
            runs[run] = got
            if run == "drain":
                deadline = time.monotonic() + 120
                while len(replicas()) > 1 and time.monotonic() < deadline:
                    time.sleep(0.5)
                report["replicas_after_drain"] = len(replicas())
            if run == "fault":
                deadline = time.monotonic() + 120
                while not running(args.replicas) and time.monotonic() < deadline:
                    time.sleep(0.5)
                report["replica_back_s"] = time.monotonic() - report.pop("killed_at")
                report["replicas_running_after"] = len(replicas())
                report["survivor_rss_mb_after"] = rss_mb(survivor)
        report["runs"] = runs
        serving.send_signal(signal.SIGTERM)  # seer-serve --ray removes the application and exits 128 + SIGTERM
        report["serve_exit"] = serving.wait(120)
        report["applications_after_stop"] = sorted(serve_applications())
    finally:
        if serving is not None and serving.poll() is None:
            serving.kill()
        subprocess.run(["ray", "stop", "--force"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    print_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
