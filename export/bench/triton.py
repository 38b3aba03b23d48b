"""``seer-bench --workload triton``: Triton's one engine (the repository ``seer-triton --flavour cpu`` writes by
default: one decoupled model, one engine, requests of separate calls sharing its steps) against seer-serve on the same
export, prompts and clients (docs/DESIGN.md "Measuring", "Serving and embedding").

In:  an export of the fixture; concurrency levels; requests per level; rounds; intra-op threads (both servers alike).
Out: per concurrency, each server's answers/s in every round and their medians, the ratio Triton over seer-serve (the
     ratio of medians, with the smallest and largest single-round ratio); the long request (the fixed loop over
     ``LONG["gen_length"]`` positions, Seer off, one step per position), once per server per round, as a ratio of
     median seconds; how many of Triton's answers equal seer-serve's; the load average at the start and the end.

Both servers run in processes of their own on 127.0.0.1 (``tritonserver`` with its Python-backend stub, ``seer-serve``
under uvicorn); the clients are threads of this process, each with its own client made and warmed before the clock
starts: Triton over one gRPC stream per client (``stream_infer``: what a streaming Triton caller holds open), seer-serve
over HTTP. The prompts are held-out fixture prompts with their pictures (PNG bytes to Triton's ``image`` input, a data
URL to seer-serve). Rounds rotate which server goes first at every level, so load from elsewhere hits both alike.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import queue
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np

from seer_export.bench.rounds import machine, ratio, rotated

Progress = Callable[[str], None]
SERVERS = ("seer-serve", "triton")
MODEL = "seer"  # both servers' model name
GEN_LENGTH = 64
LONG = {"gen_length": 128, "steps": 128, "seer": False, "decoding": "fixed"}
LONG_PROMPT = "repeat cat 9 times ."


@dataclasses.dataclass(frozen=True)
class Settings:
    concurrency: tuple[int, ...] = (1, 4, 16)
    requests: int = 48  # per level and server, per round
    rounds: int = 3

    @classmethod
    def quick(cls) -> Settings:
        return cls(requests=16, rounds=2)


@dataclasses.dataclass(frozen=True)
class Prompt:
    text: str
    image: bytes | None  # PNG


def prompts(n: int, seed: int) -> list[Prompt]:
    """The first ``n`` held-out fixture prompts of ``seed``, pictures as PNG bytes."""
    from PIL import Image

    from seer_trt.eval.tasks import make_samples

    out = []
    for s in make_samples(seed, n):
        png = None
        if s.image is not None:
            buf = io.BytesIO()
            Image.fromarray(s.image).save(buf, format="PNG")
            png = buf.getvalue()
        out.append(Prompt(s.question, png))
    return out


class _Clients(threading.local):
    """One client per thread and server: a gRPC stream stays open for the thread's requests."""

    def __init__(self) -> None:
        self.triton: tuple[Any, queue.Queue] | None = None


def tensors(prompt: Prompt, settings: dict[str, Any]) -> list:
    import tritonclient.grpc as grpcclient

    values: dict[str, Any] = {"prompt": prompt.text.encode(), **settings}
    if prompt.image is not None:
        values["image"] = prompt.image
    out = []
    for name, value in values.items():
        if isinstance(value, bool):
            kind, array = "BOOL", np.array([[value]])
        elif isinstance(value, int):
            kind, array = "INT32", np.array([[value]], dtype=np.int32)
        else:
            kind, array = "BYTES", np.array([[value.encode() if isinstance(value, str) else value]], dtype=object)
        t = grpcclient.InferInput(name, [1, 1], kind)
        t.set_data_from_numpy(array)
        out.append(t)
    return out


class Triton:
    """Asks the decoupled model over this thread's gRPC stream (one response: the request does not stream)."""

    def __init__(self, url: str) -> None:
        self.url, self.local, self.kept = url, _Clients(), []  # clients kept open: their channels share a socket

    def __call__(self, prompt: Prompt, **settings: Any) -> str:
        import tritonclient.grpc as grpcclient

        if self.local.triton is None:
            client, answers = grpcclient.InferenceServerClient(self.url), queue.Queue()
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            self.local.triton = (client, answers)
            self.kept.append(client)
        client, answers = self.local.triton
        client.async_stream_infer(MODEL, tensors(prompt, {"gen_length": GEN_LENGTH, **settings}))
        result, error = answers.get(timeout=600)
        if error is not None:
            raise RuntimeError(f"Triton answered an error: {error}")
        return result.as_numpy("text")[0, 0].decode()

    def close(self) -> None:
        for client in self.kept:
            client.stop_stream()
            client.close()


class SeerServe:
    """Asks seer-serve's chat endpoint over HTTP (one connection per request, as urllib does)."""

    def __init__(self, url: str) -> None:
        self.url = f"http://{url}/v1/chat/completions"

    def __call__(self, prompt: Prompt, **settings: Any) -> str:
        import base64

        content: Any = prompt.text
        if prompt.image is not None:
            url = "data:image/png;base64," + base64.b64encode(prompt.image).decode()
            content = [{"type": "text", "text": prompt.text}, {"type": "image_url", "image_url": {"url": url}}]
        gen = settings.pop("gen_length", GEN_LENGTH)
        body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": gen, **settings}
        request = urllib.request.Request(self.url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read())["choices"][0]["message"]["content"]

    def close(self) -> None:
        pass


def burst(ask: Callable[..., str], todo: list[Prompt], clients: int) -> tuple[float, list[str]]:
    """Answers/s of ``clients`` threads taking ``todo`` from one queue (each warmed first), and the answers."""
    work: queue.Queue = queue.Queue()
    for i in range(len(todo)):
        work.put(i)
    out: list[str] = [""] * len(todo)
    errors: list[BaseException] = []
    ready, go = threading.Barrier(clients + 1), threading.Event()

    def worker() -> None:
        try:
            ask(todo[0])  # this thread's client made and warm
        except BaseException as err:  # noqa: BLE001 - reported below, after every thread has stopped
            errors.append(err)
        ready.wait()
        go.wait()
        while not errors:
            try:
                i = work.get_nowait()
            except queue.Empty:
                return
            try:
                out[i] = ask(todo[i])
            except BaseException as err:  # noqa: BLE001
                errors.append(err)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    ready.wait()
    start = time.monotonic()
    go.set()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return len(todo) / (time.monotonic() - start), out


def _seer_serve(engines: str, threads: int, log) -> tuple[subprocess.Popen, str]:
    from seer_trt.serving.triton.local import free_port

    port = free_port()
    cmd = ["seer-serve", "--engines", str(engines), "--host", "127.0.0.1", "--port", str(port), "--model-name", MODEL]
    if threads:
        cmd += ["--threads", str(threads)]
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"seer-serve exited with {process.returncode} before it listened; its log: {log.name}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
            return process, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.25)
    process.kill()
    raise RuntimeError(f"seer-serve did not listen within 300 s; its log: {log.name}")


def bench(engines: str, settings: Settings, seed: int, progress: Progress, command: str, threads: int) -> dict:
    """The report the module docstring describes. Raises what a server or client raised."""
    from seer_trt.serving.triton.local import LocalServer, ServerInstall
    from seer_trt.serving.triton.repository import plan_repository, write_repository

    todo = prompts(settings.requests, seed)
    report: dict[str, Any] = {"command": command, "workload": "triton", "machine": machine(threads),
                              "settings": dataclasses.asdict(settings), "seed": seed, "gen_length": GEN_LENGTH,
                              "long_request": dict(LONG)}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="seer-bench-triton-") as tmp:
        repo = write_repository(plan_repository(engines, "cpu", MODEL, threads=threads), os.path.join(tmp, "repo"))
        with open(os.path.join(tmp, "seer-serve.log"), "wb") as log:
            server, serve_url = _seer_serve(engines, threads, log)
            try:
                with LocalServer(repo, ServerInstall.find(), start_timeout=600) as triton:
                    progress(f"servers up: seer-serve {serve_url}, tritonserver {triton.grpc_url}")
                    asks = {"seer-serve": SeerServe(serve_url), "triton": Triton(triton.grpc_url)}
                    try:
                        report.update(_rounds(asks, todo, settings, progress))
                    finally:
                        for ask in asks.values():
                            ask.close()
            finally:
                server.terminate()
                server.wait(30)
    report["load_average_end"] = list(os.getloadavg())
    return report


def _rounds(asks: dict[str, Callable[..., str]], todo: list[Prompt], settings: Settings, progress: Progress) -> dict:
    rates = {c: {name: [] for name in SERVERS} for c in settings.concurrency}
    long = {name: [] for name in SERVERS}
    answers: dict[str, list[str]] = {}
    for r in range(settings.rounds):
        for k, clients in enumerate(settings.concurrency):
            for name in rotated(SERVERS, r + k):
                rate, out = burst(asks[name], todo, clients)
                rates[clients][name].append(rate)
                answers.setdefault(name, out)
                progress(f"round {r + 1}/{settings.rounds}: {clients:>2} clients {name:10s} {rate:6.1f} answers/s "
                         f"(load {os.getloadavg()[0]:.2f})")  # fmt: skip
        for name in rotated(SERVERS, r):
            start = time.monotonic()
            asks[name](Prompt(LONG_PROMPT, None), **LONG)
            long[name].append(time.monotonic() - start)
    equal = sum(a == b for a, b in zip(answers["triton"], answers["seer-serve"], strict=True))
    return {
        "levels": [
            {
                "clients": c,
                "answers_per_s": {n: rates[c][n] for n in SERVERS},
                "median": {n: float(np.median(rates[c][n])) for n in SERVERS},
                "triton_over_seer_serve": ratio(rates[c]["triton"], rates[c]["seer-serve"]),
            }
            for c in settings.concurrency
        ],  # fmt: skip
        "long_seconds": long,
        # seconds, so seer-serve's over Triton's: above 1 when Triton's long request is the faster
        "long_triton_over_seer_serve": ratio(long["seer-serve"], long["triton"]),
        "answers_equal": equal,
        "answers": len(todo),
    }


def table(report: dict) -> str:
    lines = ["| clients | seer-serve answers/s | Triton answers/s | Triton / seer-serve [per-round range] |",
             "|---:|---:|---:|---|"]  # fmt: skip
    for level in report["levels"]:
        r = level["triton_over_seer_serve"]
        lines.append(f"| {level['clients']} | {level['median']['seer-serve']:.1f} | {level['median']['triton']:.1f} | "
                     f"{r['value']:.2f}x [{r['min']:.2f}-{r['max']:.2f}] |")  # fmt: skip
    r = report["long_triton_over_seer_serve"]
    long = report["long_seconds"]
    lines.append(f"\nlong request (gen_length {report['long_request']['gen_length']}, fixed, Seer off): seer-serve "
                 f"{np.median(long['seer-serve']):.3f} s, Triton {np.median(long['triton']):.3f} s, Triton's speed "
                 f"{r['value']:.2f}x [{r['min']:.2f}-{r['max']:.2f}]")  # fmt: skip
    lines.append(f"answers equal: {report['answers_equal']}/{report['answers']}; load average "
                 f"{report['machine']['load_average'][0]:.2f} -> {report['load_average_end'][0]:.2f}")  # fmt: skip
    return "\n".join(lines)
