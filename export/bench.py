"""``seer-bench``: speed side by side in one run — Seer vs the padded baseline vs the oracle, dispatch policies,
ONNX Runtime vs PyTorch eager, and where the time goes (DESIGN §8).

In:  an export folder (``--engines``), the PyTorch checkpoint it came from (for the eager comparison; the
     registry finds the fixture's), ``--quick`` for a one-minute run.
Out: markdown tables on stdout, JSON (``--json``: settings, git sha, machine, versions, every figure, and the
     headline ratios at the top level) and PNG plots (``--plot``: speedup vs gen_length, throughput per policy).

Scenarios, each measured side by side (modes or policies interleaved round-robin, so machine noise hits all
alike; ratios are what to read):
- single request: baseline / Seer / oracle latency and throughput (valid answer tokens, through the first
  ``<|eot_id|>``, per second) at gen_length 64, 128, 256;
- batched: a long-tail mix (most answers short, a quarter long), Seer on, under every dispatch policy;
  throughput and padding waste; the tokens of every request are checked equal across policies;
- backends: one denoising step, PyTorch eager vs ONNX Runtime, at several answer lengths;
- overhead: share of end-to-end time in detection (boundary rule), routing (dispatch plan), packing (layouts)
  and model compute (step zero and denoising graphs).
"""

from __future__ import annotations

import dataclasses
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from seer_trt.cli import Parser, fail, git_sha, require_extra, save_figure, write_json
from seer_trt.dispatch import POLICIES
from seer_trt.errors import ConfigError, SeerError
from seer_trt.evaluate import fixture_samples, oracle_window, truth_ids
from seer_trt.layout import window_layout
from seer_trt.pipeline import Request, Result, SeerPipeline

Progress = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Settings:
    lengths: tuple[int, ...] = (64, 128, 256)  # single-request gen_length sweep
    single_prompts: int = 6  # prompts per gen_length
    batch: int = 16  # requests in the long-tail batch
    batch_gen_length: int = 128
    repeats: int = 3  # rounds of the interleaved batched policies
    step_lengths: tuple[int, ...] = (16, 64, 128, 256)  # answer lengths of the per-step backend comparison
    step_repeats: int = 20
    prompt_len: int = 24  # prompt embeddings of the per-step comparison

    @classmethod
    def quick(cls) -> Settings:
        return cls(single_prompts=2, batch=12, repeats=1, step_lengths=(16, 128), step_repeats=5)


def valid_tokens(r: Result, eot_id: int) -> int:
    """Answer tokens through the first ``<|eot_id|>`` (DESIGN §8)."""
    return len(r.token_ids) + (1 if eot_id in r.window else 0)


def single(pipe: SeerPipeline, settings: Settings, seed: int, progress: Progress) -> dict[str, Any]:
    """Baseline / Seer / oracle, one request at a time, interleaved per prompt."""
    eot = pipe.manifest.special_tokens.eot_id
    samples = fixture_samples(pipe, settings.single_prompts, seed)
    out: dict[str, Any] = {}
    for n in settings.lengths:
        secs = {m: 0.0 for m in ("baseline", "seer", "oracle")}
        toks = {m: 0 for m in secs}
        steps = {m: 0 for m in secs}
        for k, s in enumerate(samples):
            progress(f"single gen_length {n}: prompt {k + 1}/{len(samples)}")
            requests = {
                "baseline": Request(s.question, s.image, gen_length=n, seer=False),
                "seer": Request(s.question, s.image, gen_length=n),
                "oracle": Request(s.question, s.image, gen_length=n, window=oracle_window(pipe, s, n)),
            }
            for mode, request in requests.items():
                start = time.perf_counter()
                (r,) = pipe.generate(request)
                secs[mode] += time.perf_counter() - start
                if not r.ok:
                    raise SeerError(f"single {mode} gen_length {n}: {r.error}")
                toks[mode] += valid_tokens(r, eot)
                steps[mode] += r.steps
        row = {}
        for mode in secs:
            row[mode] = {
                "latency_s": secs[mode] / len(samples),
                "tokens_per_s": toks[mode] / secs[mode],
                "mean_steps": steps[mode] / len(samples),
                "speedup": secs["baseline"] / secs[mode],
            }
        out[str(n)] = row
    return out


def long_tail(pipe: SeerPipeline, size: int, seed: int) -> list:
    """A batch whose answers are mostly short (<= 6 tokens) with a quarter long (>= 24 tokens)."""
    pool = fixture_samples(pipe, 40 * size, seed)
    short = [s for s in pool if len(s.answer) <= 6]
    long = [s for s in pool if len(s.answer) >= 24]
    n_long = max(1, size // 4)
    if len(short) < size - n_long or len(long) < n_long:
        raise ConfigError(f"the fixture pool of seed {seed} holds too few short/long answers for a batch of {size}")
    return short[: size - n_long] + long[:n_long]


def batched(pipe: SeerPipeline, settings: Settings, seed: int, progress: Progress) -> dict[str, Any]:
    """Every dispatch policy on the same long-tail batch, interleaved for ``repeats`` rounds."""
    eot = pipe.manifest.special_tokens.eot_id
    samples = long_tail(pipe, settings.batch, seed)
    requests = [Request(s.question, s.image, gen_length=settings.batch_gen_length) for s in samples]
    if pipe.cost is None:
        progress("batched: measuring the backend's call costs for the cost_model policy")
        pipe.calibrate_costs()
    pipe.generate_batch(requests[:2])  # warm-up
    secs = {p: 0.0 for p in POLICIES}
    stages: dict[str, dict[str, float]] = {p: {} for p in POLICIES}
    first: dict[str, Any] = {}
    for k in range(settings.repeats):
        for policy in POLICIES:
            progress(f"batched: round {k + 1}/{settings.repeats}, policy {policy}")
            start = time.perf_counter()
            batch = pipe.generate_batch(requests, policy=policy)
            secs[policy] += time.perf_counter() - start
            for name, value in batch.results[0].seconds.items():  # batch stages: equal for every result
                stages[policy][name] = stages[policy].get(name, 0.0) + value
            first.setdefault(policy, batch)
    windows = {p: [r.window for r in b.results] for p, b in first.items()}
    tokens = sum(valid_tokens(r, eot) for r in first["hybrid"].results)
    rows = {}
    for policy in POLICIES:
        plan = first[policy].plans[0]
        rows[policy] = {
            "seconds": secs[policy] / settings.repeats,
            "tokens_per_s": tokens * settings.repeats / secs[policy],
            "padding_waste": plan.waste,
            "groups": [f"{g.path}:{len(g.rows)}x{g.prompt_len}+{g.gen_len}" for g in plan.groups],
            "same_tokens_as_hybrid": windows[policy] == windows["hybrid"],
            "stage_seconds": {k: v / settings.repeats for k, v in stages[policy].items()},
        }
    lengths = [len(truth_ids(pipe, s)) + 1 for s in samples]
    return {"requests": len(samples), "true_lengths": lengths, "gen_length": settings.batch_gen_length,
            "cost_model": pipe.cost.to_dict(), "policies": rows}  # fmt: skip


def backends(pipe: SeerPipeline, model, settings: Settings, progress: Progress) -> dict[str, Any]:
    """One denoising step, PyTorch eager vs ONNX Runtime, batch 1, at each answer length."""
    import torch

    dim = pipe.manifest.model.hidden_size
    mask = pipe.manifest.special_tokens.mask_id
    rng = np.random.default_rng(0)
    out = {}
    for g in settings.step_lengths:
        progress(f"backends: answer length {g}")
        valid = np.ones((1, settings.prompt_len), dtype=bool)
        seg, pos = window_layout(valid, np.array([g]), g)
        prefix = (0.02 * rng.standard_normal((1, settings.prompt_len, dim))).astype(pipe.manifest.precision)
        gen_ids = np.full((1, g), mask, dtype=np.int64)
        feeds = {"prefix_embeds": prefix, "gen_ids": gen_ids, "segment_ids": seg, "position_ids": pos}
        targs = [torch.from_numpy(a) for a in (prefix.astype(np.float32), gen_ids, seg, pos)]
        times = {"onnxruntime": [], "pytorch": []}
        with torch.no_grad():
            pipe.backend.run("denoise", feeds)
            model(*targs)
            for _ in range(settings.step_repeats):  # interleaved
                t0 = time.perf_counter()
                pipe.backend.run("denoise", feeds)
                t1 = time.perf_counter()
                model(*targs)
                t2 = time.perf_counter()
                times["onnxruntime"].append(t1 - t0)
                times["pytorch"].append(t2 - t1)
        med = {k: float(np.median(v)) for k, v in times.items()}
        out[str(g)] = {"onnxruntime_ms": 1e3 * med["onnxruntime"], "pytorch_ms": 1e3 * med["pytorch"],
                       "ort_over_torch": med["pytorch"] / med["onnxruntime"]}  # fmt: skip
    return out


def overhead(batch: dict[str, Any]) -> dict[str, float]:
    """Shares of end-to-end time in the hybrid batched run."""
    st = batch["policies"]["hybrid"]["stage_seconds"]
    total = sum(st.values())
    compute = st.get("step_zero", 0.0) + st.get("denoise", 0.0)
    return {
        "detection": st.get("boundary", 0.0) / total,
        "routing": st.get("dispatch", 0.0) / total,
        "packing": st.get("packing", 0.0) / total,
        "model_compute": compute / total,
        "other": (total - compute - st.get("boundary", 0) - st.get("dispatch", 0) - st.get("packing", 0)) / total,
    }


def headline(report: dict[str, Any]) -> dict[str, float]:
    single_128 = report["single"].get("128") or next(iter(report["single"].values()))
    pol = report["batched"]["policies"]
    routers = ("hybrid", "cost_model", "static", "packed")
    best = max(routers, key=lambda p: pol[p]["tokens_per_s"])
    steps = report["backends"]
    return {
        "seer_over_oracle_speedup": single_128["seer"]["speedup"] / single_128["oracle"]["speedup"],
        "seer_speedup_128": single_128["seer"]["speedup"],
        "oracle_speedup_128": single_128["oracle"]["speedup"],
        "best_router": best,
        "best_router_over_naive_pad": pol[best]["tokens_per_s"] / pol["naive_pad"]["tokens_per_s"],
        "best_router_over_per_request": pol[best]["tokens_per_s"] / pol["per_request"]["tokens_per_s"],
        "overhead_fraction": report["overhead"]["detection"] + report["overhead"]["routing"],
        "ort_over_torch_per_step": float(np.median([v["ort_over_torch"] for v in steps.values()])),
    }


def tables(report: dict[str, Any]) -> str:
    lines = [f"## Single request (baseline vs Seer vs oracle); Seer = {report['detector']}", "",
             "| gen_length | mode | latency (s) | tokens/s | mean steps | speedup |", "|---|---|---|---|---|---|"]  # fmt: skip
    for n, row in report["single"].items():
        for mode, r in row.items():
            lines.append(f"| {n} | {mode} | {r['latency_s']:.3f} | {r['tokens_per_s']:.1f} | {r['mean_steps']:.1f} | "
                         f"{r['speedup']:.2f}x |")  # fmt: skip
    b = report["batched"]
    lines += ["", f"## Batched: {b['requests']} requests, true lengths {sorted(b['true_lengths'])}, gen_length "
              f"{b['gen_length']}, Seer on", "",
              "| policy | seconds | tokens/s | padding waste | groups | same tokens |", "|---|---|---|---|---|---|"]  # fmt: skip
    for p, r in b["policies"].items():
        lines.append(f"| {p} | {r['seconds']:.3f} | {r['tokens_per_s']:.1f} | {100 * r['padding_waste']:.0f} % | "
                     f"{' '.join(r['groups'])} | {'yes' if r['same_tokens_as_hybrid'] else 'NO'} |")  # fmt: skip
    lines += ["", "## One denoising step, batch 1 (median)", "",
              "| answer length | ONNX Runtime (ms) | PyTorch eager (ms) | ORT speedup |", "|---|---|---|---|"]  # fmt: skip
    for g, r in report["backends"].items():
        lines.append(f"| {g} | {r['onnxruntime_ms']:.2f} | {r['pytorch_ms']:.2f} | {r['ort_over_torch']:.2f}x |")
    o = report["overhead"]
    lines += ["", "## Where the time goes (hybrid batch)", "",
              "| detection | routing | packing | model compute | other |", "|---|---|---|---|---|",
              f"| {100 * o['detection']:.3f} % | {100 * o['routing']:.3f} % | {100 * o['packing']:.2f} % | "
              f"{100 * o['model_compute']:.1f} % | {100 * o['other']:.1f} % |"]  # fmt: skip
    h = report["headline"]
    lines += ["", "## Headline", "", *(f"- {k}: {v:.3f}" if isinstance(v, float) else f"- {k}: {v}"
                                        for k, v in h.items())]  # fmt: skip
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    lengths = [int(n) for n in report["single"]]
    for mode, colour in (("baseline", "0.5"), ("seer", "tab:blue"), ("oracle", "tab:green")):
        label = f"seer ({report['detector']})" if mode == "seer" else mode
        ax1.plot(lengths, [report["single"][str(n)][mode]["speedup"] for n in lengths], "o-", color=colour,
                 label=label)  # fmt: skip
    ax1.set_xscale("log", base=2)
    ax1.set_xticks(lengths, [str(n) for n in lengths])
    ax1.set_xlabel("gen_length")
    ax1.set_ylabel("speedup over the padded baseline")
    ax1.legend(fontsize=7)
    pol = report["batched"]["policies"]
    ax2.bar(list(pol), [r["tokens_per_s"] for r in pol.values()], color="tab:blue")
    ax2.set_ylabel("valid tokens / s")
    ax2.set_title("long-tail batch, per dispatch policy")
    ax2.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    save_figure(fig, path)


def machine() -> dict[str, Any]:
    import os

    import onnxruntime
    import torch

    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "onnxruntime": onnxruntime.__version__,
            "torch": torch.__version__, "ort_threads": "default", "torch_threads": torch.get_num_threads()}  # fmt: skip


def bench(engines: Path, checkpoint: Path | None, settings: Settings, seed: int = 7,
          progress: Progress = lambda s: None) -> dict[str, Any]:  # fmt: skip
    """Every scenario; returns the report (what ``--json`` writes)."""
    from seer_export.models.registry import load

    pipe = SeerPipeline.from_manifest(engines)
    model, folder = load(pipe.manifest.model.name, checkpoint)
    model.eval()
    started = time.time()
    report: dict[str, Any] = {}
    report["single"] = single(pipe, settings, seed, progress)
    report["batched"] = batched(pipe, settings, seed + 1, progress)
    report["backends"] = backends(pipe, model, settings, progress)
    report["overhead"] = overhead(report["batched"])
    return {
        "headline": headline(report),
        "engines": str(engines),
        "checkpoint": str(folder),
        "model": pipe.manifest.model.name,
        "precision": pipe.manifest.precision,
        "seer": dataclasses.asdict(pipe.seer),
        "detector": pipe.seer.describe(),
        "settings": dataclasses.asdict(settings),
        "git": git_sha(),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "seconds": time.time() - started,
        **report,
    }


def main(argv: list[str] | None = None) -> int:
    ap = Parser(
        prog="seer-bench",
        description="Side-by-side speed of Seer vs the padded baseline vs the oracle, dispatch policies, and ONNX "
        "Runtime vs PyTorch eager, on an export of the fixture model (ratios measured in one run).",
    )
    ap.add_argument("--engines", type=Path, required=True, help="export folder (seer-export)")
    ap.add_argument("--checkpoint", type=Path, help="PyTorch checkpoint for the eager comparison (default: registry)")
    ap.add_argument("--json", type=Path, help="write the report here")
    ap.add_argument("--plot", type=Path, help="write a PNG here: speedup vs gen_length, throughput per policy")
    ap.add_argument("--quick", action="store_true", help="fewer prompts and repeats: about a minute")
    ap.add_argument("--seed", type=int, default=7, help="seed of the held-out prompts")
    ap.add_argument("--verbose", action="store_true", help="tracebacks on errors")
    args = ap.parse_args(argv)
    settings = Settings.quick() if args.quick else Settings()
    t0 = time.time()

    def progress(text: str) -> None:
        print(f"[{time.time() - t0:6.1f}s] {text}", file=sys.stderr, flush=True)

    try:
        require_extra("seer-bench")
        report = bench(args.engines, args.checkpoint, settings, args.seed, progress)
        print(tables(report))
        if args.json:
            write_json(args.json, report)
        if args.plot:
            plot(report, args.plot)
        return 0
    except (SeerError, OSError) as err:
        return fail("seer-bench", err, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
