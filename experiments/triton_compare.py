"""Triton against seer-serve on one export, in one run (docs/results.md "Triton: one engine, streaming"); the
engine layout alone, in rotating rounds with their spread, is ``seer-bench --workload triton``.

    python experiments/triton_compare.py ENGINES ENGINE_REPO BLS_REPO

ENGINE_REPO: ``seer-triton --flavour cpu`` (the decoupled engine model); BLS_REPO: the same with ``--orchestration
bls`` (the per-instance BLS loop). Starts seer-serve and both tritonservers on 127.0.0.1, then: 48 held-out text
prompts (the fixture task's questions, seed 7, their image placeholder dropped), gen_length 64, from 1, 4 and 16
clients (each its own client, made and warmed before the clock starts: Triton over a gRPC stream, or ``infer`` for the
BLS model, seer-serve over HTTP), answers/s and the load average; the long request (the fixed loop over 128
positions, Seer off, 128 steps), best of 3; answers compared with seer-serve's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

from seer_export.bench.triton import LONG, LONG_PROMPT, MODEL, Prompt, SeerServe, Triton, burst, tensors
from seer_trt.eval.tasks import make_samples
from seer_trt.serving.triton.local import LocalServer, ServerInstall, free_port

PROMPTS = [Prompt(s.question.replace("<image>\n", ""), None) for s in make_samples(7, 48)]  # the placeholder dropped
CLIENTS = (1, 4, 16)


class Bls:
    """The bls orchestrator answers ``infer`` (it does not stream); one client per thread."""

    def __init__(self, url: str) -> None:
        import threading

        self.url, self.local = url, threading.local()

    def __call__(self, prompt: Prompt, **settings) -> str:
        import tritonclient.grpc as grpcclient

        if not hasattr(self.local, "client"):
            self.local.client = grpcclient.InferenceServerClient(self.url)
        inputs = tensors(prompt, {"gen_length": 64, **settings})
        return self.local.client.infer(MODEL, inputs, client_timeout=600).as_numpy("text")[0, 0].decode()


def long_request(ask, tries: int = 3) -> float:
    times = []
    for _ in range(tries):
        start = time.monotonic()
        ask(Prompt(LONG_PROMPT, None), **LONG)
        times.append(time.monotonic() - start)
    return min(times)


def main(argv: list[str]) -> int:
    engines, engine_repo, bls_repo = argv
    port = free_port()
    server = subprocess.Popen(["seer-serve", "--engines", engines, "--host", "127.0.0.1", "--port", str(port),
                               "--model-name", MODEL], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
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
            targets = {"seer-serve": SeerServe(f"127.0.0.1:{port}"), "triton-engine": Triton(eng.grpc_url),
                       "triton-bls": Bls(bls.grpc_url)}  # fmt: skip
            answers = {}
            for clients in CLIENTS:
                for name, ask in targets.items():
                    rate, out = burst(ask, PROMPTS, clients)
                    answers.setdefault(name, out)
                    print(f"{clients:>2} clients {name:14s} {rate:6.1f} answers/s  load {os.getloadavg()[0]:.2f}",
                          flush=True)  # fmt: skip
            for name, ask in targets.items():
                print(f"long request {name:14s} {long_request(ask):.3f} s", flush=True)
            for name, out in answers.items():
                same = sum(a == b for a, b in zip(out, answers["seer-serve"], strict=True))
                print(f"{name}: {same}/{len(PROMPTS)} answers equal seer-serve's")
            targets["triton-engine"].close()
    finally:
        server.terminate()
        server.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
