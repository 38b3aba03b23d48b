"""How often the C++ runtime's sampled answers differ from the Python runtime's on the same requests.

    python experiments/cpp_sampling_agreement.py EXPORT LIBSEER N [--topk] [--temperature T] [--top-p P]

N held-out prompts (``make_samples(23, N)``, text and image) at temperature 0.8, top_p 0.9 (or T, P), seed 1000 + i,
through
``SeerPipeline.generate`` and through ``libseer.so``'s C ABI (``CppPipeline``), both in one batch on the same ONNX
Runtime library; prints how many answers (ids, window, L*, steps, text) are equal, the differing rows, and how many sampled
windows differ from greedy decoding's (that the draws decide something). ``--topk``
runs a copy of EXPORT without ``denoise_logits``, so both sample from ``denoise``'s top ids (``TopK``). The
counter-based draws are bit for bit; libm's exp, log and pow differ from numpy's vectorised ones in the last bit on a
few percent of inputs, so a row can differ where a Gumbel argmax or a confidence rank sits at that bit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from seer_trt.eval.tasks import make_samples
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request
from seer_trt.serving.cpp import CppPipeline, CppRequests, load_library, wheel_library

FIELDS = {"token_ids": "token_ids", "window": "window", "kept": "kept", "steps": "steps", "text": "text"}


def without_logits(folder: Path, into: Path) -> Path:
    """A copy of the export ``folder`` whose manifest has no ``denoise_logits`` (sampling falls to ``TopK``)."""
    out = into / "engines"
    shutil.copytree(folder, out, ignore=shutil.ignore_patterns("denoise_logits.onnx"))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["graphs"].pop("denoise_logits", None)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return out


def main(folder: str, library: str, n: int, topk: bool = False, temperature: float = 0.8, top_p: float = 0.9) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        export = without_logits(Path(folder), Path(tmp)) if topk else Path(folder)
        samples = make_samples(23, n)
        conv = CppRequests(export)
        ids = [conv.convert({"prompt": s.question, "image": s.image}, Path(tmp) / f"{i}.npy")
               for i, s in enumerate(samples)]  # fmt: skip
        fields = [{"temperature": temperature, "top_p": top_p, "seed": 1000 + i} for i in range(n)]
        start = time.perf_counter()
        py = SeerPipeline.from_manifest(export)
        want = py.generate([Request(s.question, s.image, **f) for s, f in zip(samples, fields, strict=True)])
        python_s = time.perf_counter() - start
        greedy = py.generate([Request(s.question, s.image) for s in samples])
        py.close()
        start = time.perf_counter()
        with CppPipeline(load_library(library), export, ort_library=wheel_library()) as cpp:
            got = cpp.generate([{**r, **f} for r, f in zip(ids, fields, strict=True)])
        cpp_s = time.perf_counter() - start
    differing = [i for i, (a, b) in enumerate(zip(want, got, strict=True))
                 if not a.ok or b["error"] is not None
                 or any(getattr(a, f) != (tuple(b[k]) if isinstance(b[k], list) else b[k]) for f, k in FIELDS.items())]  # fmt: skip
    for i in differing:
        print(f"row {i}: python {list(want[i].window)} / C++ {got[i]['window']} {got[i]['error'] or ''}")
    graph = "denoise (TopK)" if topk else "denoise_logits (Sampled)"
    drawn = sum(a.window != g.window for a, g in zip(want, greedy, strict=True))
    print(f"{n - len(differing)}/{n} sampled answers equal through {graph} at temperature {temperature:g}, top_p {top_p:g} "
          f"(python {python_s:.1f} s, C++ {cpp_s:.1f} s); {drawn} "
          f"of them differ from the greedy answer's window")  # fmt: skip
    return 0 if not differing else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export")
    ap.add_argument("library")
    ap.add_argument("n", type=int)
    ap.add_argument("--topk", action="store_true", help="a copy of the export without denoise_logits (TopK)")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.9)
    a = ap.parse_args()
    sys.exit(main(a.export, a.library, a.n, a.topk, a.temperature, a.top_p))
