"""``seer-bench`` on the fixture: speed side by side in one run — Seer vs the padded loop vs the early-stopping loop vs the oracle,
dispatch policies on two batches, ONNX Runtime vs PyTorch eager, and where the time goes (docs/DESIGN.md "Measuring").

In:  an export folder (``--engines``), the PyTorch checkpoint it came from (for the eager comparison; the
     registry finds the fixture's), ``--quick`` for a run of about two minutes, ``--threads`` for both backends.
Out: markdown tables on stdout, JSON (``--json``: the command, settings, git sha, machine and thread settings,
     every figure, the headline ratios at the top) and a PNG (``--plot``).

Every timing is repeated over rounds in which the modes (or policies, or backends) are interleaved, their order
rotated from round to round, after an untimed warm-up, so a burst of machine load hits all of them alike. A ratio
is the ratio of the medians over rounds; its spread is the smallest and largest ratio of a single round.

Scenarios:
- single request: latency of the padded loop (``padded``: every step over all N positions), LLaDA-V's official
  early-stopping loop (``early_stop``: stop once the answer before the first ``<|eot_id|>`` is complete), Seer
  and the oracle (window cut at the true length), at gen_length 64, 128, 256;
- batched, every dispatch policy on two batches: the fixture's long tail (most answers short, a quarter long;
  Seer on) and long prompts (the same questions behind several hundred filler tokens, windows cut at the true
  length, so the prompt dominates each step as on the real model); throughput (valid answer tokens, through
  the first ``<|eot_id|>``, per second), padding waste, the cost model's prediction; the tokens of every
  request are checked equal across policies. A policy slower than ``prune`` times the fastest in the warm-up
  round is not timed again (it cannot be the best; its warm-up time is reported);
- parallel decoding (docs/DESIGN.md "Decoding strategies"): LLaDA-V's early-stop loop (fixed, the official
  setting) against the same loop with the parallel rule (``--decoding``, default factor:1), without and with the
  prompt cache refreshed every 32 steps (that one is upstream's Fast-dLLM hook's algorithm run by this runtime),
  and Seer + early stop + the parallel rule, without and with the cache (default refresh); one request at a time
  and all in one call, every mode interleaved per round;
- backends: one denoising step, PyTorch eager vs ONNX Runtime, batch 1, the same thread count for both; ONNX
  Runtime fetching only what a step reads (as the loop does under cache none) and fetching the prompt K/V too;
- C++ (``--cpp LIB``, ``seer_export.bench.cpp``): the C++ runtime against this one, one request at a time, with
  the time each spends outside the graphs;
- overhead: share of end-to-end time in detection (boundary rule), routing (dispatch plan), packing (layouts)
  and model compute (step zero and denoising), in the default policy's long-tail runs.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from seer_export.bench.rounds import machine, ratio, rotated
from seer_trt.contracts.errors import ConfigError, SeerError
from seer_trt.contracts.graphs import step_outputs
from seer_trt.contracts.policies import DEFAULT_POLICY, POLICIES
from seer_trt.eval.accuracy import fixture_samples, oracle_window, truth_ids
from seer_trt.eval.report import git_sha, save_figure
from seer_trt.eval.tasks import WORDS, Sample
from seer_trt.runtime.decoding import Rule
from seer_trt.runtime.kv_cache import no_cache
from seer_trt.runtime.layout import window_layout
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request, Result

Progress = Callable[[str], None]


MODES = ("padded", "early_stop", "seer", "oracle")


@dataclasses.dataclass(frozen=True)
class Settings:
    lengths: tuple[int, ...] = (64, 128, 256)  # single-request gen_length sweep
    single_prompts: int = 4  # prompts per gen_length
    single_rounds: int = 3
    batch: int = 16  # requests in the long-tail batch
    batch_gen_length: int = 128
    long_batch: int = 8  # requests in the long-prompt batch
    long_prompt: tuple[int, int] = (200, 450)  # its prompt lengths (embeddings), drawn uniformly
    batch_rounds: int = 5
    prune: float = 2.5  # policies this much slower than the fastest in the warm-up are timed only there
    step_lengths: tuple[int, ...] = (16, 64, 128, 256)  # answer lengths of the per-step backend comparison
    step_rounds: int = 5
    step_calls: int = 5  # calls per backend per round (their median is the round's time)
    prompt_len: int = 24  # prompt embeddings of the per-step comparison
    threads: int = 1  # intra-op threads of ONNX Runtime and of PyTorch alike
    cpp_lengths: tuple[int, ...] = (64, 128)  # --cpp: gen_lengths of the C++ vs Python comparison
    cpp_prompts: int = 8
    cpp_rounds: int = 5
    decoding: str = "factor:1"  # the parallel rule of the parallel-decoding scenario
    parallel_prompts: int = 8  # prompts of that scenario (one at a time, then all in one call)
    parallel_rounds: int = 3
    parallel_gen_length: int = 128

    @classmethod
    def quick(cls, threads: int = 1, decoding: str = "factor:1") -> Settings:
        return cls(lengths=(64, 128), single_prompts=2, single_rounds=5, batch=12, long_batch=6, batch_rounds=3,
                   step_lengths=(16, 128), step_rounds=5, step_calls=7, threads=threads, decoding=decoding,
                   parallel_prompts=6)  # fmt: skip


def valid_tokens(r: Result, eot_id: int) -> int:
    """Answer tokens through the first ``<|eot_id|>`` (docs/DESIGN.md "Measuring")."""
    return len(r.token_ids) + (1 if eot_id in r.window else 0)


def timed(pipe: SeerPipeline, requests: list[Request], policy: str | None = None):
    start = time.perf_counter()
    out = pipe.generate_batch(requests, policy=policy)
    seconds = time.perf_counter() - start
    failed = [r.error for r in out.results if not r.ok]
    if failed:
        raise SeerError(f"{len(failed)} request(s) failed, first: {failed[0]}")
    return seconds, out


def single(pipe: SeerPipeline, settings: Settings, seed: int, progress: Progress) -> dict[str, Any]:
    """Padded / early-stopping / Seer / oracle, one request at a time, interleaved per prompt."""
    eot = pipe.manifest.special_tokens.eot_id
    samples = fixture_samples(pipe, settings.single_prompts, seed)
    out: dict[str, Any] = {}
    for n in settings.lengths:

        def request(mode: str, s: Sample, n: int = n) -> Request:
            window = oracle_window(pipe, s, n) if mode == "oracle" else None
            return Request(s.question, s.image, gen_length=n, seer=mode in ("seer", "oracle"), window=window,
                           early_stop=mode == "early_stop", cache="none", decoding="fixed")  # fmt: skip

        for mode in MODES:  # warm-up: sessions, buffers for these shapes
            timed(pipe, [request(mode, samples[0])])
        secs: dict[str, list[float]] = {m: [] for m in MODES}
        first: dict[str, list[Result]] = {m: [] for m in MODES}
        for r in range(settings.single_rounds):
            progress(f"single gen_length {n}: round {r + 1}/{settings.single_rounds}")
            total = dict.fromkeys(MODES, 0.0)
            for k, s in enumerate(samples):
                for mode in rotated(MODES, r + k):
                    seconds, batch = timed(pipe, [request(mode, s)])
                    total[mode] += seconds
                    if r == 0:
                        first[mode].append(batch.results[0])
            for mode in MODES:
                secs[mode].append(total[mode])
        row = {}
        for mode in MODES:
            results = first[mode]
            row[mode] = {
                "latency_s": float(np.median(secs[mode])) / len(samples),
                "latency_range_s": [min(secs[mode]) / len(samples), max(secs[mode]) / len(samples)],
                "tokens_per_s": sum(valid_tokens(x, eot) for x in results) / float(np.median(secs[mode])),
                "mean_steps": float(np.mean([x.steps for x in results])),
                "mean_kept": float(np.mean([x.kept for x in results])),
                "speedup_vs_padded": ratio(secs["padded"], secs[mode]),
                "speedup_vs_early_stop": ratio(secs["early_stop"], secs[mode]),
            }
        out[str(n)] = row
    return out


def long_tail(pipe: SeerPipeline, size: int, seed: int) -> list[Sample]:
    """A batch whose answers are mostly short (<= 6 tokens) with a quarter long (>= 24 tokens)."""
    pool = fixture_samples(pipe, 40 * size, seed)
    short = [s for s in pool if len(s.answer) <= 6]
    long = [s for s in pool if len(s.answer) >= 24]
    n_long = max(1, size // 4)
    if len(short) < size - n_long or len(long) < n_long:
        raise ConfigError(f"the fixture pool of seed {seed} holds too few short/long answers for a batch of {size}")
    return short[: size - n_long] + long[:n_long]


def long_prompts(pipe: SeerPipeline, samples: list[Sample], span: tuple[int, int], seed: int) -> list[Sample]:
    """``samples`` behind filler words (fixture vocabulary) that bring each prompt to a length drawn from ``span``."""
    rng = np.random.default_rng(seed)
    largest = pipe.manifest.buckets.prompt[-1]
    if span[1] > largest:
        raise ConfigError(f"long prompts of up to {span[1]} embeddings exceed the largest prompt bucket {largest}")
    out = []
    for s in samples:
        base = len(pipe.encode(s.question, s.image).embeds)
        filler = " ".join(rng.choice(WORDS, max(0, int(rng.integers(span[0], span[1] + 1)) - base)))
        out.append(dataclasses.replace(s, question=f"{filler} {s.question}"))
    return out


def parallel_modes(rule: str) -> dict[str, dict[str, Any]]:
    """The parallel-decoding scenario's modes: Request fields of each. The parallel rule commits by probability, so
    its modes rank by it (``low_confidence``; Dream's own loop ranks by a score that is none)."""
    modes = {
        "early_stop": {"seer": False, "early_stop": True, "decoding": "fixed", "cache": "none"},
        "early_stop_parallel": {"seer": False, "early_stop": True, "decoding": rule, "cache": "none"},
        "early_stop_parallel_cache32": {
            "seer": False,
            "early_stop": True,
            "decoding": rule,
            "cache": "reuse",
            "refresh_interval": 32,
        },  # fmt: skip
        "seer_parallel": {"seer": True, "early_stop": True, "decoding": rule, "cache": "none"},
        "seer_parallel_cache": {"seer": True, "early_stop": True, "decoding": rule, "cache": "reuse"},
    }
    return {m: f if Rule.parse(f["decoding"]).fixed else {**f, "remasking": "low_confidence"} for m, f in modes.items()}


def parallel(pipe: SeerPipeline, settings: Settings, seed: int, progress: Progress) -> dict[str, Any]:
    """Parallel decoding with and without Seer and the cache, one request at a time and batched, interleaved."""
    samples = fixture_samples(pipe, settings.parallel_prompts, seed)
    modes = parallel_modes(settings.decoding)
    n = settings.parallel_gen_length
    requests = {m: [Request(s.question, s.image, gen_length=n, **f) for s in samples] for m, f in modes.items()}
    truth = [truth_ids(pipe, s) for s in samples]
    out: dict[str, Any] = {"decoding": settings.decoding, "gen_length": n, "prompts": len(samples)}
    for shape in ("batch_1", "batched"):
        for m in modes:  # warm-up
            timed(pipe, requests[m][:1] if shape == "batch_1" else requests[m])
        secs: dict[str, list[float]] = {m: [] for m in modes}
        first: dict[str, list[Result]] = {}
        for r in range(settings.parallel_rounds):
            progress(f"parallel decoding ({settings.decoding}), {shape}: round {r + 1}/{settings.parallel_rounds}")
            for m in rotated(list(modes), r):
                if shape == "batch_1":
                    runs = [timed(pipe, [q]) for q in requests[m]]
                    seconds, results = sum(x[0] for x in runs), [x[1].results[0] for x in runs]
                else:
                    seconds, batch = timed(pipe, requests[m])
                    results = list(batch.results)
                secs[m].append(seconds)
                first.setdefault(m, results)
        out[shape] = {
            m: {
                "answers_per_s": len(samples) / float(np.median(secs[m])),
                "seconds_range": [min(secs[m]), max(secs[m])],
                "exact": sum(list(x.token_ids) == t for x, t in zip(first[m], truth, strict=True)),
                "forward_passes": float(np.mean([x.steps for x in first[m]])),
                "speedup_vs_early_stop": ratio(secs["early_stop"], secs[m]),
                "speedup_vs_early_stop_parallel_cache32": ratio(secs["early_stop_parallel_cache32"], secs[m]),
            }
            for m in modes
        }
    return out


def batched(pipe: SeerPipeline, samples: list[Sample], settings: Settings, label: str, oracle: bool,
            progress: Progress) -> dict[str, Any]:  # fmt: skip
    """Every dispatch policy on the same batch, interleaved over rounds after a warm-up round."""
    eot = pipe.manifest.special_tokens.eot_id
    n = settings.batch_gen_length
    requests = [Request(s.question, s.image, gen_length=n, window=oracle_window(pipe, s, n) if oracle else None,
                        cache="none", decoding="fixed") for s in samples]  # fmt: skip
    warm: dict[str, float] = {}
    first: dict[str, Any] = {}
    for policy in POLICIES:
        progress(f"{label}: warm-up, policy {policy}")
        warm[policy], first[policy] = timed(pipe, requests, policy)
    contenders = [p for p in POLICIES if p == DEFAULT_POLICY or warm[p] <= settings.prune * min(warm.values())]
    secs: dict[str, list[float]] = {p: [] for p in contenders}
    stages: dict[str, float] = {}
    for r in range(settings.batch_rounds):
        progress(f"{label}: round {r + 1}/{settings.batch_rounds}, policies {', '.join(contenders)}")
        for policy in rotated(contenders, r):
            seconds, out = timed(pipe, requests, policy)
            secs[policy].append(seconds)
            if policy == DEFAULT_POLICY:
                for name, value in out.results[0].seconds.items():  # batch stages: equal for every result
                    stages[name] = stages.get(name, 0.0) + value / settings.batch_rounds
    tokens = sum(valid_tokens(x, eot) for x in first[DEFAULT_POLICY].results)
    windows = {p: [x.window for x in b.results] for p, b in first.items()}
    rows = {}
    for policy in POLICIES:
        times = secs.get(policy, [warm[policy]])
        stats = first[policy].stats
        rows[policy] = {
            "seconds": float(np.median(times)),
            "seconds_range": [min(times), max(times)],
            "rounds": len(times) if policy in secs else 0,
            "tokens_per_s": tokens / float(np.median(times)),
            "steps": stats.steps,  # loop steps: every live row stepped together in each
            "calls": stats.calls,  # window-graph calls: the policy's split of each step's rows
            "rows_per_call": stats.rows_per_call,
            "same_tokens": windows[policy] == windows[DEFAULT_POLICY],
        }
    fixed = [p for p in contenders if p != DEFAULT_POLICY]
    best = max(fixed, key=lambda p: rows[p]["tokens_per_s"])
    return {
        "requests": len(samples),
        "gen_length": n,
        "windows": "oracle (true length)" if oracle else "Seer",
        "prompt_lengths": [len(pipe.encode(s.question, s.image).embeds) for s in samples],
        "true_lengths": [len(truth_ids(pipe, s)) + 1 for s in samples],
        "cost_model": pipe.cost.to_dict() if pipe.cost else None,
        "policies": rows,
        "best_fixed": best,
        "default_over_best_fixed": ratio(secs[best], secs[DEFAULT_POLICY]),
        "default_over_per_request": ratio(secs["per_request"], secs[DEFAULT_POLICY]) if "per_request" in secs else None,
        "stage_seconds": stages,
    }


def backends(pipe: SeerPipeline, model, settings: Settings, progress: Progress) -> dict[str, Any]:
    """One denoising step, PyTorch eager vs ONNX Runtime, batch 1, at each answer length, interleaved."""
    import torch

    dim = pipe.manifest.model.hidden_size
    mask = pipe.manifest.special_tokens.mask_id
    rng = np.random.default_rng(0)
    reads = step_outputs(pipe.backend.spec("denoise"))  # what a step of the loop fetches under cache none
    out = {}
    for g in settings.step_lengths:
        progress(f"backends: answer length {g}")
        valid = np.ones((1, settings.prompt_len), dtype=bool)
        seg, pos = window_layout(valid, np.array([g]), g)
        prefix = (0.02 * rng.standard_normal((1, settings.prompt_len, dim))).astype(pipe.manifest.precision)
        gen_ids = np.full((1, g), mask, dtype=np.int64)
        feeds = {"prefix_embeds": prefix, "gen_ids": gen_ids, "segment_ids": seg, "position_ids": pos,
                 **no_cache(pipe.backend.spec("denoise"), 1)}  # fmt: skip
        targs = [torch.from_numpy(a) for a in (prefix.astype(np.float32), gen_ids, seg, pos)]
        runs = {"onnxruntime": lambda feeds=feeds: pipe.backend.run("denoise", feeds, reads),
                "onnxruntime_all_outputs": lambda feeds=feeds: pipe.backend.run("denoise", feeds),
                "pytorch": lambda targs=targs: model(*targs)}  # fmt: skip
        rounds: dict[str, list[float]] = {k: [] for k in runs}
        with torch.no_grad():
            for fn in runs.values():  # warm-up
                fn()
                fn()
            for r in range(settings.step_rounds):
                calls: dict[str, list[float]] = {k: [] for k in runs}
                for c in range(settings.step_calls):
                    for name in rotated(list(runs), r + c):
                        start = time.perf_counter()
                        runs[name]()
                        calls[name].append(time.perf_counter() - start)
                for name, values in calls.items():
                    rounds[name].append(float(np.median(values)))
        out[str(g)] = {"onnxruntime_ms": 1e3 * float(np.median(rounds["onnxruntime"])),
                       "onnxruntime_all_outputs_ms": 1e3 * float(np.median(rounds["onnxruntime_all_outputs"])),
                       "pytorch_ms": 1e3 * float(np.median(rounds["pytorch"])),
                       "ort_over_torch": ratio(rounds["pytorch"], rounds["onnxruntime"]),
                       "on_demand_over_all_outputs": ratio(rounds["onnxruntime_all_outputs"], rounds["onnxruntime"]),
                       "rounds_s": rounds}  # fmt: skip
    return out


def window_graph(pipe: SeerPipeline) -> dict[str, Any]:
    """The window graph's size: nodes in its file, and after ONNX Runtime's own fusions (what a session runs)."""
    import tempfile
    from collections import Counter

    import onnx
    import onnxruntime

    path = pipe.folder / pipe.manifest.graph("denoise").file

    def ops(model) -> Counter:
        return Counter(n.op_type for n in model.graph.node)

    with tempfile.TemporaryDirectory() as tmp:
        options = onnxruntime.SessionOptions()
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        options.log_severity_level = 3  # not the warning that an ALL-level dump is machine-specific: it is read here
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.data")
        onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        before, after = ops(onnx.load(str(path), load_external_data=False)), ops(
            onnx.load(options.optimized_model_filepath, load_external_data=False))  # fmt: skip
    return {"nodes": sum(before.values()), "nodes_onnxruntime": sum(after.values()),
            "ops": dict(before.most_common()), "ops_onnxruntime": dict(after.most_common())}  # fmt: skip


def overhead(stages: dict[str, float]) -> dict[str, float]:
    """Shares of end-to-end time in one policy's batched runs."""
    total = sum(stages.values())
    compute = stages.get("step_zero", 0.0) + stages.get("denoise", 0.0)
    named = {"detection": "boundary", "routing": "dispatch", "packing": "packing"}
    out = {k: stages.get(v, 0.0) / total for k, v in named.items()}
    out["model_compute"] = compute / total
    out["other"] = 1.0 - sum(out.values())
    return out


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """The ratios to read, each {value, min, max, rounds} (ratio of medians, per-round spread). The overhead
    shares stay in ``overhead``: fractions of a percent of a run, at the resolution of the clock, not ratios."""
    single = report["single"]
    n = "128" if "128" in single else max(single, key=int)
    row = single[n]
    steps = report["backends"]
    rounds = np.array([[a / b for a, b in zip(s["rounds_s"]["pytorch"], s["rounds_s"]["onnxruntime"], strict=True)]
                       for s in steps.values()])  # fmt: skip
    per_round = np.median(rounds, axis=0)
    out: dict[str, Any] = {"gen_length": int(n)}
    out["seer_over_padded"] = row["seer"]["speedup_vs_padded"]
    out["seer_over_early_stop"] = row["seer"]["speedup_vs_early_stop"]
    out["early_stop_over_padded"] = row["early_stop"]["speedup_vs_padded"]
    out["oracle_over_padded"] = row["oracle"]["speedup_vs_padded"]
    out["seer_over_oracle"] = ratio_of(row["seer"]["speedup_vs_padded"], row["oracle"]["speedup_vs_padded"])
    for name in ("long_tail", "long_prompt"):
        b = report[name]
        out[f"{name}_best_fixed"] = b["best_fixed"]
        out[f"{name}_default_over_best_fixed"] = b["default_over_best_fixed"]
    out["long_tail_default_over_per_request"] = report["long_tail"]["default_over_per_request"]
    for shape in ("batch_1", "batched"):
        row = report["parallel"][shape]
        out[f"seer_parallel_over_early_stop_{shape}"] = row["seer_parallel"]["speedup_vs_early_stop"]
        out[f"seer_parallel_over_early_stop_parallel_cache32_{shape}"] = row["seer_parallel"][
            "speedup_vs_early_stop_parallel_cache32"
        ]
        out[f"seer_parallel_cache_over_early_stop_parallel_cache32_{shape}"] = row["seer_parallel_cache"][
            "speedup_vs_early_stop_parallel_cache32"
        ]
    out["ort_over_torch_per_step"] = {
        "value": float(np.median([s["ort_over_torch"]["value"] for s in steps.values()])),
        "min": float(per_round.min()),
        "max": float(per_round.max()),
        "rounds": int(len(per_round)),
    }
    return out


def ratio_of(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """a / b of two ratios (same rounds): the value, and the spread's outer bounds."""
    return {"value": a["value"] / b["value"], "min": a["min"] / b["max"], "max": a["max"] / b["min"],
            "rounds": a["rounds"]}  # fmt: skip


def fmt(r: dict[str, float] | None) -> str:
    if r is None:
        return "-"
    return f"{r['value']:.2f}x [{r['min']:.2f}-{r['max']:.2f}]"


def tables(report: dict[str, Any]) -> str:
    rounds = report["settings"]["single_rounds"]
    lines = [f"## Single request: padded vs early-stopping vs Seer vs oracle (median of {rounds} rounds; "
             f"[min-max] of single rounds); Seer = {report['detector']}", "",
             "| gen_length | mode | latency (s) | tokens/s | mean steps | mean kept | speedup vs padded | "
             "speedup vs early stop |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for n, row in report["single"].items():
        for mode, r in row.items():
            lines.append(f"| {n} | {mode} | {r['latency_s']:.3f} | {r['tokens_per_s']:.1f} | {r['mean_steps']:.1f} | "
                         f"{r['mean_kept']:.1f} | {fmt(r['speedup_vs_padded'])} | {fmt(r['speedup_vs_early_stop'])} |")  # fmt: skip
    for name, title in (("long_tail", "long-tail batch"), ("long_prompt", "long-prompt batch")):
        b = report[name]
        p = sorted(b["prompt_lengths"])
        lines += ["", f"## Batched, {title}: {b['requests']} requests, prompts {p[0]}-{p[-1]} embeddings, true "
                  f"lengths {sorted(b['true_lengths'])}, gen_length {b['gen_length']}, windows: {b['windows']}", "",
                  "| policy | seconds [min-max] | rounds | tokens/s | steps | calls | rows per call | "
                  "same tokens |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for pol, r in b["policies"].items():
            lines.append(f"| {pol} | {r['seconds']:.3f} [{r['seconds_range'][0]:.3f}-{r['seconds_range'][1]:.3f}] | "
                         f"{r['rounds'] or 'warm-up only'} | {r['tokens_per_s']:.1f} | {r['steps']} | {r['calls']} | "
                         f"{r['rows_per_call']:.1f} | {'yes' if r['same_tokens'] else 'NO'} |")  # fmt: skip
        lines += ["", f"{DEFAULT_POLICY} over the best fixed policy ({b['best_fixed']}): "
                  f"{fmt(b['default_over_best_fixed'])}; over per_request: {fmt(b['default_over_per_request'])}"]  # fmt: skip
    lines += ["", f"## One denoising step, batch 1, {report['machine']['threads']} thread(s) each "
              f"(median of {report['settings']['step_rounds']} rounds)", "",
              "| answer length | ONNX Runtime (ms) | PyTorch eager (ms) | ORT speedup | ORT fetching the prompt K/V too "
              "(ms) | outputs on demand speedup |", "|---|---|---|---|---|---|"]  # fmt: skip
    for g, r in report["backends"].items():
        lines.append(f"| {g} | {r['onnxruntime_ms']:.2f} | {r['pytorch_ms']:.2f} | {fmt(r['ort_over_torch'])} | "
                     f"{r['onnxruntime_all_outputs_ms']:.2f} | {fmt(r['on_demand_over_all_outputs'])} |")  # fmt: skip
    w = report["window_graph"]
    fused = ", ".join(f"{op} {n}" for op, n in w["ops_onnxruntime"].items() if op not in w["ops"])
    lines += ["", f"Window graph: {w['nodes']} nodes in the file, {w['nodes_onnxruntime']} after ONNX Runtime's "
              f"fusions ({fused or 'none'})"]  # fmt: skip
    par = report["parallel"]
    lines += ["", f"## Parallel decoding ({par['decoding']}), gen_length {par['gen_length']}, {par['prompts']} prompts "
              f"(median of {report['settings']['parallel_rounds']} rounds)", "",
              "| shape | mode | answers/s | exact | forward passes / answer | vs early stop | vs early stop + parallel "
              "+ cache 32 |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for shape in ("batch_1", "batched"):
        for m, r in par[shape].items():
            lines.append(f"| {shape} | {m} | {r['answers_per_s']:.1f} | {r['exact']}/{par['prompts']} | "
                         f"{r['forward_passes']:.2f} | {fmt(r['speedup_vs_early_stop'])} | "
                         f"{fmt(r['speedup_vs_early_stop_parallel_cache32'])} |")  # fmt: skip
    o = report["overhead"]
    lines += ["", f"## Where the time goes ({DEFAULT_POLICY}, long-tail batch)", "",
              "| detection | routing | packing | model compute | other |", "|---|---|---|---|---|",
              f"| {100 * o['detection']:.3f} % | {100 * o['routing']:.3f} % | {100 * o['packing']:.2f} % | "
              f"{100 * o['model_compute']:.1f} % | {100 * o['other']:.1f} % |"]  # fmt: skip
    lines += ["", "## Headline", ""]
    for k, v in report["headline"].items():
        lines.append(f"- {k}: {fmt(v) if isinstance(v, dict) else v if not isinstance(v, float) else f'{v:.4f}'}")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    lengths = [int(n) for n in report["single"]]
    for mode, colour in (("early_stop", "tab:orange"), ("seer", "tab:blue"), ("oracle", "tab:green")):
        r = [report["single"][str(n)][mode]["speedup_vs_padded"] for n in lengths]
        v = np.array([x["value"] for x in r])
        err = np.array([[x["value"] - x["min"] for x in r], [x["max"] - x["value"] for x in r]])
        ax1.errorbar(
            lengths,
            v,
            yerr=np.maximum(err, 0),
            fmt="o-",
            color=colour,
            capsize=3,
            label=f"seer ({report['detector']})" if mode == "seer" else mode,
        )
    ax1.axhline(1.0, color="0.5", linestyle="--", label="padded")
    ax1.set_xscale("log", base=2)
    ax1.set_xticks(lengths, [str(n) for n in lengths])
    ax1.set_xlabel("gen_length")
    ax1.set_ylabel("speedup over the padded loop (single request)")
    ax1.legend()
    width = 0.4
    x = np.arange(len(POLICIES))
    for k, (name, colour) in enumerate((("long_tail", "tab:blue"), ("long_prompt", "tab:purple"))):
        pol = report[name]["policies"]
        best = pol[report[name]["best_fixed"]]["tokens_per_s"]
        ax2.bar(x + (k - 0.5) * width, [pol[p]["tokens_per_s"] / best for p in POLICIES], width, color=colour,
                label=name.replace("_", "-") + " batch")  # fmt: skip
    ax2.axhline(1.0, color="0.5", linestyle="--")
    ax2.set_xticks(x, POLICIES, rotation=30)
    ax2.set_ylabel("throughput / best fixed policy's")
    ax2.legend()
    fig.tight_layout()
    save_figure(fig, path)


def bench(engines: Path, checkpoint: Path | None, settings: Settings, seed: int = 7,
          progress: Progress = lambda s: None, command: str | None = None,
          cpp: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """Every scenario (and with ``cpp``, a built libseer.so, the C++ runtime against this one); returns the report
    (what ``--json`` writes)."""
    import torch

    from seer_export.models.registry import load

    if settings.threads < 1:
        raise ConfigError(f"--threads must be >= 1 (the same count for both backends), got {settings.threads}")
    torch.set_num_threads(settings.threads)
    pipe = SeerPipeline.from_manifest(engines, threads=settings.threads)
    model, folder = load(pipe.manifest.model.name, checkpoint)
    model.eval()
    started = time.time()
    load_before = machine(settings.threads)["load_average"]
    report: dict[str, Any] = {"single": single(pipe, settings, seed, progress)}
    progress("measuring the backend's call costs for the cost_model policy")
    t0 = time.perf_counter()
    pipe.calibrate_costs()
    calibration_s = time.perf_counter() - t0
    tail = long_tail(pipe, settings.batch, seed + 1)
    report["long_tail"] = batched(pipe, tail, settings, "long-tail batch", False, progress)
    prompts = long_prompts(pipe, long_tail(pipe, settings.long_batch, seed + 2), settings.long_prompt, seed + 3)
    report["long_prompt"] = batched(pipe, prompts, settings, "long-prompt batch", True, progress)
    report["parallel"] = parallel(pipe, settings, seed + 5, progress)
    report["backends"] = backends(pipe, model, settings, progress)
    report["window_graph"] = window_graph(pipe)
    report["overhead"] = overhead(report["long_tail"]["stage_seconds"])
    if cpp is not None:
        from seer_export.bench.cpp import cpp_vs_python

        report["cpp"] = cpp_vs_python(pipe, engines, cpp, settings.cpp_lengths, settings.cpp_prompts,
                                      settings.cpp_rounds, settings.threads, seed + 4, progress)  # fmt: skip
    info = machine(settings.threads)
    info["load_average_before"] = load_before
    return {
        "headline": headline({**report, "machine": info}),
        "command": command,
        "engines": str(engines),
        "checkpoint": str(folder),
        "model": pipe.manifest.model.name,
        "precision": pipe.manifest.precision,
        "seer": dataclasses.asdict(pipe.seer),
        "detector": pipe.seer.describe(),
        "settings": dataclasses.asdict(settings),
        "cost_model_calibration_s": calibration_s,
        "git": git_sha(),
        "machine": info,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "seconds": time.time() - started,
        **report,
    }
