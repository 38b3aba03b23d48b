"""``seer-bench --cpp LIB``: the C++ runtime (cpp/, docs/DESIGN.md "C++ runtime") against the Python one, per request.

In:  the Python pipeline of the bench, a built ``libseer.so``, the bench's settings (lengths, rounds, threads).
Out: per gen_length the median per-request latency of each runtime over rounds in which they alternate (order
     rotated per prompt and round, after an untimed warm-up), their ratio with its per-round spread, and the time
     each spends outside the graphs: end-to-end time less the time inside ONNX Runtime's run calls.

Both run the same graphs on the same ONNX Runtime library (the installed wheel's) with the same thread count, and
their answers are checked equal, so the difference is the runtime around the graphs.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from seer_trt.contracts.errors import SeerError
from seer_trt.eval.accuracy import fixture_samples
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request
from seer_trt.serving.cpp import CppPipeline, CppRequests, wheel_library

RUNTIMES = ("python", "cpp")


def _time_sessions(pipe: SeerPipeline) -> list[float]:
    """Wrap every open ONNX Runtime session's run call of the Python backend: returns the list its seconds go to.
    (The bench reaches into the backend's sessions on purpose: the C++ side times exactly Session::Run.)"""
    spent = [0.0]
    for sess in pipe.backend._sessions.values():
        run = sess.run_with_iobinding

        def timed(*args, _run=run, **kw):
            start = time.perf_counter()
            try:
                return _run(*args, **kw)
            finally:
                spent[0] += time.perf_counter() - start

        sess.run_with_iobinding = timed
    return spent


def cpp_vs_python(pipe: SeerPipeline, engines: Path, library: Path, lengths: tuple[int, ...], prompts: int,
                  rounds: int, threads: int, seed: int, progress) -> dict[str, Any]:  # fmt: skip
    samples = fixture_samples(pipe, prompts, seed)
    out: dict[str, Any] = {"library": str(library), "ort_library": wheel_library(), "threads": threads,
                           "prompts": prompts, "rounds": rounds}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, CppPipeline(library, engines, ort_library=wheel_library(),
                                                           threads=threads) as cpp:  # fmt: skip
        conv = CppRequests(engines)
        base = [conv.convert({"prompt": s.question, "image": s.image}, Path(tmp) / f"{i}.npy")
                for i, s in enumerate(samples)]  # fmt: skip
        for n in lengths:
            py_requests = [Request(s.question, s.image, gen_length=n) for s in samples]
            cpp_requests = [{**r, "gen_length": n} for r in base]
            py_first = [pipe.generate(r)[0] for r in py_requests]  # warm-up, and the answers to compare
            cpp_first = [cpp.generate([r])[0] for r in cpp_requests]
            same = sum(a.token_ids == tuple(b["token_ids"]) and (a.kept, a.steps) == (b["kept"], b["steps"])
                       for a, b in zip(py_first, cpp_first, strict=True))  # fmt: skip
            if same != len(samples):
                raise SeerError(f"the C++ runtime answered {len(samples) - same} of {len(samples)} prompts "
                                f"differently at gen_length {n}; it must match before it is timed")  # fmt: skip
            spent = _time_sessions(pipe)
            wall = {k: [] for k in RUNTIMES}  # per round: seconds over all prompts
            outside = {k: [] for k in RUNTIMES}
            for r in range(rounds):
                progress(f"C++ vs Python, gen_length {n}: round {r + 1}/{rounds}")
                total = dict.fromkeys(RUNTIMES, 0.0)
                graphs = dict.fromkeys(RUNTIMES, 0.0)
                for k in range(len(samples)):
                    for name in RUNTIMES[(r + k) % 2 :] + RUNTIMES[: (r + k) % 2]:
                        before = spent[0]
                        start = time.perf_counter()
                        if name == "python":
                            pipe.generate(py_requests[k])
                            graphs[name] += spent[0] - before
                        else:
                            graphs[name] += cpp.generate([cpp_requests[k]])[0]["seconds"]["graphs"]
                        total[name] += time.perf_counter() - start
                for name in RUNTIMES:
                    wall[name].append(total[name] / len(samples))
                    outside[name].append((total[name] - graphs[name]) / len(samples))
            per_round = [p / c for p, c in zip(wall["python"], wall["cpp"], strict=True)]
            out[str(n)] = {
                "latency_ms": {k: 1e3 * float(np.median(v)) for k, v in wall.items()},
                "outside_graphs_ms": {k: 1e3 * float(np.median(v)) for k, v in outside.items()},
                "python_over_cpp": {"value": float(np.median(wall["python"]) / np.median(wall["cpp"])),
                                    "min": float(min(per_round)), "max": float(max(per_round)), "rounds": rounds},
                "answers_equal": same,
                "rounds_s": {"wall": wall, "outside": outside},
            }  # fmt: skip
    return out


def table(report: dict[str, Any]) -> str:
    lines = [f"## C++ vs Python runtime, one request at a time ({report['prompts']} prompts, median of "
             f"{report['rounds']} interleaved rounds, {report['threads']} thread(s), the same ONNX Runtime)", "",
             "| gen_length | Python (ms) | C++ (ms) | Python / C++ | outside graphs: Python (ms) | C++ (ms) | "
             "answers equal |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for n, row in report.items():
        if not isinstance(row, dict) or "latency_ms" not in row:
            continue
        r = row["python_over_cpp"]
        lines.append(f"| {n} | {row['latency_ms']['python']:.1f} | {row['latency_ms']['cpp']:.1f} | "
                     f"{r['value']:.2f}x [{r['min']:.2f}-{r['max']:.2f}] | {row['outside_graphs_ms']['python']:.2f} | "
                     f"{row['outside_graphs_ms']['cpp']:.2f} | {row['answers_equal']}/{report['prompts']} |")  # fmt: skip
    return "\n".join(lines)
