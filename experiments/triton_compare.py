"""Triton against seer-serve on one export, in one run (docs/results.md "Triton: one engine, streaming").

    python experiments/triton_compare.py ENGINES ENGINE_REPO BLS_REPO

ENGINE_REPO: ``seer-triton --flavour cpu`` (the decoupled engine model); BLS_REPO: the same with ``--orchestration
bls`` (the per-instance BLS loop). Starts seer-serve and both tritonservers on 127.0.0.1, then: 48 held-out text
prompts (the fixture task's questions, seed 7, their image placeholder dropped), gen_length 64, from 1, 4 and 16
clients (each its own client, made and warmed before the clock starts: Triton over a gRPC stream, or ``infer`` for the
BLS model, seer-serve over HTTP), answers/s and the load average; the long request (the fixed loop over 128
positions, Seer off, 128 steps), best of 3; answers compared with seer-serve's.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient

from seer_trt.eval.tasks import make_samples
from seer_trt.serving.triton.local import LocalServer, ServerInstall, free_port

PROMPTS = [s.question.replace("<image>\n", "") for s in make_samples(7, 48)]  # text: the placeholder dropped
GEN_LENGTH = 64
LONG = {"gen_length": 128, "seer": False, "decoding": "fixed", "steps": 128}
CLIENTS = (1, 4, 16)
LOCAL = threading.local()
# every client made, never closed nor collected: tritonclient's channels to one server share a socket
KEPT: list = []


def tensors(prompt: str, gen_length: int = GEN_LENGTH, **settings) -> list:
    values = {"prompt": prompt.encode(), "gen_length": np.int32(gen_length), **settings}
    kinds = {"prompt": "BYTES", "gen_length": "INT32", "seer": "BOOL", "decoding": "BYTES", "steps": "INT32"}
    out = []
    for name, value in values.items():
        value = value.encode() if isinstance(value, str) else np.int32(value) if kinds[name] == "INT32" else value
        t = grpcclient.InferInput(name, [1, 1], kinds[name])
        t.set_data_from_numpy(np.array([[value]], dtype=object if kinds[name] == "BYTES" else None))
        out.append(t)
    return out


def client(url: str, stream: bool):
    """This thread's client (and its open stream) for ``url``."""
    key = (url, stream)
    clients = LOCAL.__dict__.setdefault("clients", {})
    if key not in clients:
        c, answers = grpcclient.InferenceServerClient(url), queue.Queue()
        if stream:
            c.start_stream(callback=lambda result, error: answers.put((result, error)))
        clients[key] = (c, answers)
        KEPT.append(c)
    return clients[key]


def triton_stream(url: str, prompt: str, **settings) -> str:
    c, answers = client(url, stream=True)
    c.async_stream_infer("seer", tensors(prompt, **settings))
    result, error = answers.get(timeout=600)  # not streamed: the one response
    if error is not None:
        raise error
    return result.as_numpy("text")[0, 0].decode()


def triton_infer(url: str, prompt: str, **settings) -> str:
    c, _ = client(url, stream=False)
    return c.infer("seer", tensors(prompt, **settings), client_timeout=600).as_numpy("text")[0, 0].decode()


def serve(url: str, prompt: str, gen_length: int = GEN_LENGTH, **settings) -> str:
    body = {"model": "seer", "messages": [{"role": "user", "content": prompt}], "max_tokens": gen_length, **settings}
    request = urllib.request.Request(f"http://{url}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())["choices"][0]["message"]["content"]


def run(ask, url: str, clients: int) -> tuple[float, list[str]]:
    """Answers/s of ``clients`` threads taking the prompts from one queue, and the answers."""
    todo: queue.Queue = queue.Queue()
    for i in range(len(PROMPTS)):
        todo.put(i)
    out: list = [None] * len(PROMPTS)
    ready, go = threading.Barrier(clients + 1), threading.Event()

    def worker() -> None:
        ask(url, PROMPTS[0])  # this thread's client made and warm
        ready.wait()
        go.wait()
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            out[i] = ask(url, PROMPTS[i])

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    ready.wait()
    start = time.monotonic()
    go.set()
    for t in threads:
        t.join()
    return len(PROMPTS) / (time.monotonic() - start), out


def long_request(ask, url: str, tries: int = 3) -> float:
    times = []
    for _ in range(tries):
        start = time.monotonic()
        ask(url, "repeat cat 9 times .", **LONG)
        times.append(time.monotonic() - start)
    return min(times)


def main(argv: list[str]) -> int:
    engines, engine_repo, bls_repo = argv
    port = free_port()
    server = subprocess.Popen(["seer-serve", "--engines", engines, "--host", "127.0.0.1", "--port", str(port),
                               "--model-name", "seer"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        install = ServerInstall.find()
        with LocalServer(engine_repo, install, start_timeout=600) as eng, \
                LocalServer(bls_repo, install, start_timeout=600) as bls:  # fmt: skip
            targets = {"seer-serve": (serve, f"127.0.0.1:{port}"), "triton-engine": (triton_stream, eng.grpc_url),
                       "triton-bls": (triton_infer, bls.grpc_url)}  # fmt: skip
            answers = {}
            for clients in CLIENTS:
                for name, (ask, url) in targets.items():
                    rate, out = run(ask, url, clients)
                    answers.setdefault(name, out)
                    print(f"{clients:>2} clients {name:14s} {rate:6.1f} answers/s  load {os.getloadavg()[0]:.2f}",
                          flush=True)  # fmt: skip
            for name, (ask, url) in targets.items():
                print(f"long request {name:14s} {long_request(ask, url):.3f} s", flush=True)
            for name, out in answers.items():
                same = sum(a == b for a, b in zip(out, answers["seer-serve"], strict=True))
                print(f"{name}: {same}/{len(PROMPTS)} answers equal seer-serve's")
    finally:
        server.terminate()
        server.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
