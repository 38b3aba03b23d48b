"""Sampled requests with seeds through every surface: seer-run, seer-serve, Triton and the C++ runtime answer alike.

    python experiments/surface_agreement.py --engines EXPORT --n 200 [--temperature 0.8 --top-p 0.9] [--json OUT]

N held-out prompts of the fixture's tasks (``seer_trt.eval.tasks.held_out``: text and image questions), each sampled
at the temperature and top_p given with its own seed (its index). Each surface gets them as its users send them:
seer-run a JSONL file (images as PNG paths); seer-serve chat bodies on 127.0.0.1 from 8 client threads (images as
data: URLs); Triton gRPC streams from 8 client threads against a local tritonserver on the repository ``seer-triton
--flavour cpu`` writes (images as encoded bytes); the C++ runtime through its C ABI (``seer_trt.serving.cpp``, the
library built as ``tests/test_cpp.py`` builds it). Prints, per surface, the answers that differ from seer-run's.
A one-off measurement (docs/results.md), not a tool users run.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import queue
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def png(image: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(image).save(out, format="PNG")
    return out.getvalue()


def cases(n: int, temperature: float, top_p: float) -> list[dict]:
    from seer_trt.eval.tasks import held_out

    out = []
    for i, s in enumerate(held_out(n)):
        text_only = s.image is None or i % 6 == 0
        prompt = s.question.replace("<image>\n", "") if text_only else s.question
        out.append({"prompt": prompt, "image": None if text_only else png(s.image), "temperature": temperature,
                    "top_p": top_p, "seed": i})  # fmt: skip
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_run_request(case: dict, png_path: Path) -> dict:
    """A case as a seer-run request object: its image written to ``png_path`` and named by it."""
    out = {k: v for k, v in case.items() if k != "image"}
    if case["image"] is not None:
        png_path.write_bytes(case["image"])
        out["image"] = str(png_path)
    return out


def seer_run(engines: Path, items: list[dict], work: Path) -> list[str]:
    lines = [json.dumps(as_run_request(c, work / f"{i}.png")) for i, c in enumerate(items)]
    (work / "in.jsonl").write_text("\n".join(lines) + "\n")
    subprocess.run(["seer-run", "--engines", str(engines), "--input", str(work / "in.jsonl"), "--output",
                    str(work / "out.jsonl")], check=True)  # fmt: skip
    return [json.loads(line).get("text") for line in (work / "out.jsonl").read_text().splitlines()]


def seer_serve(engines: Path, items: list[dict]) -> list[str]:
    import httpx

    port = free_port()
    server = subprocess.Popen(["seer-serve", "--engines", str(engines), "--host", "127.0.0.1", "--port", str(port)])
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)

        model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]

        def ask(c: dict) -> str:
            content: list[dict] = [{"type": "text", "text": c["prompt"].replace("<image>\n", "")}]
            if c["image"] is not None:
                data = base64.b64encode(c["image"]).decode()
                content.append({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}})
            body = {"model": model, "messages": [{"role": "user", "content": content}], "temperature": c["temperature"],
                    "top_p": c["top_p"], "seed": c["seed"]}  # fmt: skip
            reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
            reply.raise_for_status()
            return reply.json()["choices"][0]["message"]["content"]

        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(ask, items))
    finally:
        server.terminate()
        server.wait(60)


def triton(engines: Path, items: list[dict], work: Path) -> list[str]:
    import tritonclient.grpc as grpcclient

    from seer_trt.serving.triton.local import LocalServer, ServerInstall

    repo = work / "triton"
    subprocess.run(["seer-triton", "--engines", str(engines), "--out", str(repo), "--flavour", "cpu"], check=True)

    def ask(url: str, c: dict) -> str:
        client = grpcclient.InferenceServerClient(url)
        responses: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        tensors = []
        values = {"prompt": np.array([[c["prompt"].encode()]], dtype=object),
                  "temperature": np.array([[c["temperature"]]], dtype=np.float32),
                  "top_p": np.array([[c["top_p"]]], dtype=np.float32),
                  "seed": np.array([[c["seed"]]], dtype=np.int64), "stream": np.array([[True]])}  # fmt: skip
        if c["image"] is not None:
            values["image"] = np.array([[c["image"]]], dtype=object)
        for name, value in values.items():
            dtype = {np.float32: "FP32", np.int64: "INT64", np.bool_: "BOOL"}.get(value.dtype.type, "BYTES")
            tensor = grpcclient.InferInput(name, list(value.shape), dtype)
            tensor.set_data_from_numpy(value)
            tensors.append(tensor)
        client.async_stream_infer("seer", tensors)
        text = ""
        while True:
            result, error = responses.get(timeout=600)
            if error is not None:
                raise error
            text += result.as_numpy("text")[0, 0].decode()
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        client.stop_stream()
        client.close()
        return text

    with LocalServer(repo, ServerInstall.find(), start_timeout=600) as running:
        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(lambda c: ask(running.grpc_url, c), items))


def cpp(engines: Path, items: list[dict], work: Path) -> list[str]:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_cpp import CACHE, sources_digest  # the build the C++ tests make

    from seer_trt.serving.cpp import CppPipeline, CppRequests, wheel_library

    library = CACHE / f"build-{sources_digest()}" / "libseer.so"
    if not library.is_file():
        raise SystemExit(f"{library} is not built; build it first: python3 -m pytest -q tests/test_cpp.py -k abi")

    convert = CppRequests(engines)
    requests = [convert.convert(as_run_request(c, work / f"{i}.png"), work / f"c{i}.npy") for i, c in enumerate(items)]
    with CppPipeline(library, engines, ort_library=wheel_library(), threads=1) as pipe:
        return [r.get("text") for r in pipe.generate(requests)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", type=Path, default=ROOT / "engines" / "tiny-llada-v-fp32")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--surfaces", default="serve,triton,cpp")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    items = cases(args.n, args.temperature, args.top_p)
    report: dict = {"n": args.n, "temperature": args.temperature, "top_p": args.top_p, "engines": str(args.engines),
                    "load_average": os.getloadavg()}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        reference = seer_run(args.engines, items, work)
        report["seer_run_distinct_answers"] = len(set(reference))
        surfaces = {"serve": lambda: seer_serve(args.engines, items), "triton": lambda: triton(args.engines, items, work),
                    "cpp": lambda: cpp(args.engines, items, work)}  # fmt: skip
        for name in args.surfaces.split(","):
            start = time.monotonic()
            got = surfaces[name]()
            differ = [i for i, (a, b) in enumerate(zip(reference, got, strict=True)) if a != b]
            report[name] = {"differ": len(differ), "first": [(i, reference[i], got[i]) for i in differ[:5]],
                            "seconds": round(time.monotonic() - start, 1)}  # fmt: skip
            print(f"{name}: {len(differ)} of {len(items)} answers differ from seer-run's", flush=True)
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
