"""One-off measurement for issue 43 item 4 ("Counted, not guessed"): a served run's window-graph calls counted, and
projected onto LLaDA-V 8B on one H200 (``export/bench/projection.py``), against the same requests run at once.

Not a user tool. It runs against whichever tree ``SEER_TREE`` names, so it uses only what 293d5a7 and the new engine
both have (``SeerPipeline.from_manifest``, ``Engine(pipe, policy=, max_rows=)``, ``start`` / ``submit`` / ``close``,
``engine.steps``, ``pipe.generate``, ``pipe.backend``); the projection module is loaded from this file's tree.

    A  the issue's case: tiny-llada-v-hard, 16 held-out prompts, the exact loop over 64 positions (seer off, fixed,
       64 steps), submitted 5 ms and 30 ms apart to one engine, under naive_pad and the default policy; the same 16
       through ``generate`` at once. Prompts (12-33 embeddings) are projected at P = 793.
    B  LLaDA-V's token counts: the ``llada-v`` shape of export/bench/serving.py (prompts of ~776), 16 client threads
       each sending its requests one after another, default requests; the same through ``generate`` at once.
       Positions kept as they are; bytes scaled.

    SEER_TREE=/work/before PYTHONPATH=/work/wtboot python experiments/projection.py --json /tmp/projection-before.json
    SEER_TREE=/work/wt43 PYTHONPATH=/work/wtboot python experiments/projection.py --json /tmp/projection-after.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]


def _projection():
    """export/bench/projection.py of this file's tree (the tree under test may have none)."""
    spec = importlib.util.spec_from_file_location("projection", HERE / "export" / "bench" / "projection.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["projection"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


P = _projection()


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def served(pipe, requests, policy: str | None, gap_s: float | None = None, clients: int | None = None):
    """``requests`` through one Engine: submitted ``gap_s`` apart from one thread, or by ``clients`` threads each one
    after another. Returns (recorder, engine steps, results, wall s)."""
    from seer_trt.runtime.engine import Engine

    engine = Engine(pipe, policy=policy)
    rec = P.Recorder(pipe.backend, step=lambda: engine.steps).attach()
    results: list[Any] = [None] * len(requests)
    start = time.perf_counter()
    engine.start()
    try:
        if clients is None:
            tickets = []
            for r in requests:
                tickets.append(engine.submit(r))
                time.sleep(gap_s)
            for i, t in enumerate(tickets):
                results[i] = t.result(timeout=1800)
        else:

            def client(c: int) -> None:
                for i in range(c, len(requests), clients):
                    results[i] = engine.submit(requests[i]).result(timeout=1800)

            threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        wall = time.perf_counter() - start
        engine.close()
        rec.detach()
    return rec, engine.steps, results, wall


def at_once(pipe, requests, policy: str | None):
    rec = P.Recorder(pipe.backend).attach()
    start = time.perf_counter()
    try:
        results = pipe.generate(requests, policy)
    finally:
        rec.detach()
    return rec, results, time.perf_counter() - start


def _run_figures(rec, dims, steps, prompt, results, wall, alone=None, kv_resident=False) -> dict[str, Any]:
    s = P.summary(rec, dims, steps=steps, prompt=prompt, kv_resident=kv_resident)
    s["failed"] = sum(1 for r in results if r is None or r.error is not None)
    s["max_row_steps"] = max((r.steps for r in results if r is not None and r.error is None), default=0)
    s["wall_s"] = round(wall, 2)
    s["load_average"] = _load()
    if alone is not None:
        s["differing_from_at_once"] = sum(a is None or a.text != b.text for a, b in zip(results, alone, strict=True))
    return s


def scenario_a(folder: Path, seed: int, threads: int, progress) -> dict[str, Any]:
    from seer_trt.eval.tasks import held_out
    from seer_trt.runtime.pipeline import SeerPipeline
    from seer_trt.runtime.request import Request

    pipe = SeerPipeline.from_manifest(folder, threads=threads, calibrate=True)
    dims = P.ExportDims.of(pipe.backend.spec("denoise"))
    requests = [Request(s.question, s.image, seer=False, decoding="fixed", gen_length=64, steps=64)
                for s in held_out(16, seed, "hard")]  # fmt: skip
    out: dict[str, Any] = {"export": str(folder), "requests": len(requests), "prompt_scaled_to": P.PROMPT}
    for policy in ("naive_pad", "cost_model"):
        progress(f"A: {policy}: generate, 16 at once")
        rec, alone, wall = at_once(pipe, requests, policy)
        runs = {"at_once": _run_figures(rec, dims, None, P.PROMPT, alone, wall),
                "at_once_kv_resident": _run_figures(rec, dims, None, P.PROMPT, alone, wall, kv_resident=True)}  # fmt: skip
        for gap in (0.005, 0.030):
            progress(f"A: {policy}: served, submitted {gap * 1e3:.0f} ms apart")
            rec, steps, results, wall = served(pipe, requests, policy, gap_s=gap)
            run = _run_figures(rec, dims, steps, P.PROMPT, results, wall, alone)
            run["served_over_at_once_kv_resident"] = P.ratio(run, runs["at_once_kv_resident"])
            run["served_over_at_once"] = P.ratio(run, runs["at_once"])
            runs[f"served_{gap * 1e3:.0f}ms"] = run
        out[policy] = runs
    return out


def scenario_b(folder: Path, seed: int, threads: int, per_client: int, progress) -> dict[str, Any]:
    from seer_export.bench.serving import Settings, _workload

    clients = 16
    settings = Settings(shape="llada-v", requests=clients * per_client, overhead_requests=0)
    pipe, requests, _ = _workload(folder, settings, seed, threads, progress)
    dims = P.ExportDims.of(pipe.backend.spec("denoise"))
    prompt_tokens = [len(pipe.prompts.ids(r.prompt, r.image is not None)) for r in requests]
    progress(f"B: generate, {len(requests)} at once")
    rec, alone, wall = at_once(pipe, requests, None)
    runs = {"at_once": _run_figures(rec, dims, None, None, alone, wall),
            "at_once_kv_resident": _run_figures(rec, dims, None, None, alone, wall, kv_resident=True)}  # fmt: skip
    progress(f"B: generate, {len(requests)} at once, naive_pad (a reference: every row in calls of a batch bucket)")
    rec, _, wall = at_once(pipe, requests, "naive_pad")
    runs["at_once_naive_pad_kv_resident"] = _run_figures(rec, dims, None, None, alone, wall, kv_resident=True)
    progress(f"B: served, {clients} clients x {per_client} requests one after another")
    rec, steps, results, wall = served(pipe, requests, None, clients=clients)
    runs["served"] = run = _run_figures(rec, dims, steps, None, results, wall, alone)
    head = {
        "rows_per_call_16": run["rows_per_call"],
        "kv_host_bytes_per_step_16": run["kv_host_bytes_per_step"],
        "kv_host_bytes_per_step_16_llada_v": run["kv_host_bytes_per_step_llada_v"],
        # at once (K/V resident) over served: 1.0 = the served run is worth as much H200 time as the ideal batch
        "projected_h200_over_at_once_16": runs["at_once_kv_resident"]["projected_h200_s"] / run["projected_h200_s"],
        "projected_h200_over_at_once_16_as_run": runs["at_once"]["projected_h200_s"] / run["projected_h200_s"],
        "projected_h200_over_at_once_naive_pad_16": runs["at_once_naive_pad_kv_resident"]["projected_h200_s"]
        / run["projected_h200_s"],
    }
    return {"export": str(folder), "requests": len(requests), "clients": clients,
            "prompt_tokens_mean": sum(prompt_tokens) / len(prompt_tokens), "prompt_scaled_to": None, **head,
            "runs": runs}  # fmt: skip


def _mib(x: float | None) -> str:
    return "-" if x is None else f"{x / 2**20:.2f}"


def _row(name: str, s: dict[str, Any], ratio: float | None) -> str:
    cps = "-" if s["calls_per_step"] is None else f"{s['calls_per_step']:.2f}"
    return (f"| {name} | {s['steps'] or '-'} | {s['window_calls']} | {cps} | {s['rows_per_call']:.2f} | "
            f"{_mib(s['kv_host_bytes_per_step'])} | {_mib(s['kv_host_bytes_per_step_llada_v'])} | "
            f"{s['projected_h200_s']:.3f} | {'-' if ratio is None else f'{ratio:.2f}'} |")  # fmt: skip


def table(report: dict[str, Any]) -> str:
    lines = [f"tree {report['tree']}", "",
             "| run | engine steps | window calls | calls/step | rows/call | K/V host MiB/step (export) | "
             "K/V host MiB/step (LLaDA-V) | projected H200 s | served / at once (K/V resident) |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for policy in ("naive_pad", "cost_model"):
        runs = report.get("a", {}).get(policy)
        for key, s in (runs or {}).items():
            lines.append(_row(f"A {policy} {key}", s, s.get("served_over_at_once_kv_resident")))
    b = report.get("b")
    if b:
        for key, s in b["runs"].items():
            ratio = s["projected_h200_s"] / b["runs"]["at_once_kv_resident"]["projected_h200_s"]
            lines.append(_row(f"B {key}", s, ratio if key == "served" else None))
        lines += ["", f"B: rows_per_call_16 {b['rows_per_call_16']:.2f}, kv_host_bytes_per_step_16 "
                  f"{b['kv_host_bytes_per_step_16']:.0f} ({_mib(b['kv_host_bytes_per_step_16_llada_v'])} MiB at "
                  f"LLaDA-V), projected_h200_over_at_once_16 {b['projected_h200_over_at_once_16']:.3f} (at once, "
                  f"K/V resident, over served; as run {b['projected_h200_over_at_once_16_as_run']:.3f}; at once under "
                  f"naive_pad, K/V resident, over served {b['projected_h200_over_at_once_naive_pad_16']:.3f})"]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", choices=("a", "b", "both"), default="both")
    ap.add_argument("--hard", type=Path, default=Path("/tmp/exports/hard"))
    ap.add_argument("--llada-v", type=Path, default=Path("/tmp/exports/llada-v-shape"))
    ap.add_argument("--seed", type=int, default=7)  # seer_trt.eval.tasks.HELD_OUT_SEED
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--per-client", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import seer_trt

    tree = str(Path(seer_trt.__file__).resolve().parents[1])
    if os.environ.get("SEER_TREE") and tree != str(Path(os.environ["SEER_TREE"]).resolve()):
        raise SystemExit(f"seer_trt comes from {tree}, not SEER_TREE {os.environ['SEER_TREE']}")

    def progress(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')} load {_load()[0]}] {line}", file=sys.stderr, flush=True)

    report: dict[str, Any] = {"tree": tree, "load_average_start": _load()}
    if args.scenario in ("a", "both"):
        report["a"] = scenario_a(args.hard, args.seed, args.threads, progress)
    if args.scenario in ("b", "both"):
        report["b"] = scenario_b(args.llada_v, args.seed, args.threads, args.per_client, progress)
    report["load_average_end"] = _load()
    text = json.dumps(report, indent=1)
    if args.json:
        args.json.write_text(text)
    print(text)
    print(table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
