"""``seer-bench --workload llada-v-shaped | lavida-shaped``: the prompt K/V cache at LLaDA-V's or LaViDa-LLaDA's token counts (docs/DESIGN.md "Measuring", "Prompt K/V cache").

In:  an export folder of a random-weight LLaDA-V of the fixture's width (``--engines``; written there first, from a
     ``seer_export.models.random_checkpoint``, when the folder holds no export), ``Settings``, the cache's refresh interval.
Out: the report (``--json``): per-step time of the window graph uncached vs cached, end to end side by side, the
     cache's bytes per request at LLaDA-V's dims, and at its top level the headline ratios ``cache_step_speedup``
     and ``seer_cache_over_seer``; markdown tables on stdout.

The fixture hides the cache's point: its prompts are 12-33 embeddings, so its answer window dominates a step. Here
prompts are ``image_tokens`` (729: one 384-px tile; 2916: four) plus about ``text_tokens`` of question and chat
template, and answers are VQA-short (``answers``, 2-12 tokens). The image tokens are stood in by text embeddings
(filler words): the language model sees embeddings either way, and the vision tower, run once per request, is not
what a cache changes. Random weights have no step-zero boundary, so the oracle's window (answer + ``<|eot_id|>``)
stands in for L*:

    baseline          the padded loop: N positions, N steps, every step computing the prompt
    baseline+cache    the same loop with the reuse cache (the prompt computed at block starts and every R steps):
                      the strongest no-Seer setting, the part of a prefix cache (LaViDa's ``prefix_lm``) a user
                      would add; measured in ``baseline_cells`` only
    seer              the step-zero early exit (layer 0 of 8, as layer 3 of LLaDA-V's 32: 1/8 of a step), then the
                      exact loop over L* + the margin
    seer+reuse        the same with the reuse cache (refresh every R steps and at block starts)
    seer+forecast     the same with the ResilPhase forecast cache (order 1)
    oracle+cache      the window cut at L*, no step zero, the pipeline's default cache policy

``lavida-shaped`` is the same language model at LaViDa-LLaDA's counts (every 384-px tile pooled to 14 x 14: a
768 x 768 image is 196 + 28 x 29 = 1008 features, a 384 x 768 one 196 + 28 x 15 = 616), every mode in LaViDa's loop
(one token a step in blocks of min(128, N)); ``mmada-shaped`` at MMaDA's (1024 image ids and three markers) in its
loop (N / 2 steps in blocks of N / 4). The loop's steps and blocks are every mode's (``Family.own_loop``): Seer cuts
the window, not the rate.

Every mode runs the same requests; modes are interleaved in rounds (order rotated, after an untimed warm-up); a
ratio is the ratio of medians over rounds with its per-round spread (``seer_export.bench.rounds.ratio``). The padded
baseline takes N full steps at every shape; it runs end to end in ``baseline_cells`` and is estimated elsewhere as
N times its measured step (labelled so). Throughput counts each request's stand-in answer and its
``<|eot_id|>`` in every mode (random weights write random tokens).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from seer_export.bench.rounds import machine, ratio, rotated
from seer_export.models.families import FAMILIES
from seer_trt.contracts.config import GenerationConfig, SeerConfig
from seer_trt.contracts.errors import ConfigError, SeerError
from seer_trt.contracts.manifest import MANIFEST_FILE
from seer_trt.contracts.policies import DEFAULT_CACHE, CacheConfig
from seer_trt.eval.tasks import WORDS
from seer_trt.runtime.kv_cache import cache_bytes, forecast_weights, no_cache
from seer_trt.runtime.layout import padded_layout, rows_cached
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request
from seer_trt.runtime.step_zero import run_step_zero

Progress = Callable[[str], None]
MODES = ("baseline", "baseline+cache", "seer", "seer+reuse", "seer+forecast", "oracle+cache")
QUESTION = "how many shapes are in the picture ? count the cat dog sun tree star fish moon box shapes and answer ."
# LLaDA-V's own dims for the cache's size: 32 layers, hidden 4096 (32 heads x 128, full multi-head K/V), fp16, a
# prompt of about 3.7k embeddings (anyres: the base tile, a 2x2 grid's map with its newlines, the text)
LLADA_V = {"layers": 32, "kv_hidden": 4096, "prompt": 3700, "itemsize": 2}


@dataclasses.dataclass(frozen=True)
class Shape:
    """A model's token counts, its own loop (the baseline's blocks and steps) and its dims for the cache's size."""

    name: str  # the --workload value
    model: str  # who runs at these counts
    family: str  # seer_export.models.families: whose own loop (steps and blocks for N) every mode runs
    image_tokens: tuple[int, ...]
    dims: dict[str, int]


SHAPES = {
    s.name: s
    for s in (
        Shape("llada-v-shaped", "LLaDA-V", "llada-v", (729, 2916), LLADA_V),
        Shape("lavida-shaped", "LaViDa-LLaDA", "lavida-llada", (1008, 616), {**LLADA_V, "prompt": 1050}),
        # 1024 image ids and the three markers ahead of the question
        Shape("mmada-shaped", "MMaDA", "mmada", (1027,), {**LLADA_V, "prompt": 1070}),
    )
}


@dataclasses.dataclass(frozen=True)
class Settings:
    image_tokens: tuple[int, ...] = (729, 2916)  # one 384-px tile, four tiles
    text_tokens: int = 40  # about: the question and the chat template
    gen_lengths: tuple[int, ...] = (128, 256)
    answers: tuple[int, ...] = (2, 5, 8, 12)  # stand-in answer lengths (tokens before <|eot_id|>), one request each
    rounds: int = 3  # interleaved rounds of the end-to-end runs
    step_windows: tuple[int, ...] = (16,)  # L* of the per-step timing (16: the headline's)
    step_rounds: int = 5
    step_calls: int = 5  # calls per variant per round (their median is the round's time)
    baseline_cells: tuple[tuple[int, int], ...] = ((729, 128),)  # (image tokens, N) whose baseline runs end to end
    refresh: int = DEFAULT_CACHE.refresh  # R of seer+reuse and seer+forecast
    threads: int = 1  # ONNX Runtime intra-op threads
    workload: str = "llada-v-shaped"  # SHAPES

    @classmethod
    def quick(
        cls, threads: int = 1, refresh: int = DEFAULT_CACHE.refresh, workload: str = "llada-v-shaped"
    ) -> Settings:
        """The headline cell only (the shape's first image count, N = 128), three requests, three rounds."""
        first = SHAPES[workload].image_tokens[0]
        return cls(image_tokens=(first,), gen_lengths=(128,), answers=(2, 6, 12), rounds=3, step_rounds=3,
                   refresh=refresh, threads=threads, baseline_cells=((first, 128),), workload=workload)  # fmt: skip

    @classmethod
    def full(cls, threads: int = 1, refresh: int = DEFAULT_CACHE.refresh, workload: str = "llada-v-shaped") -> Settings:
        counts = SHAPES[workload].image_tokens
        return cls(image_tokens=counts, baseline_cells=((counts[0], 128),), refresh=refresh, threads=threads,
                   workload=workload)  # fmt: skip


def random_config(vision_tokens: int = 2916):
    """The benchmark's model: the fixture's width (hidden 128, 8 layers, 4 heads, MLP 384) with random weights,
    LLaDA-V's RoPE base, the Seer statistic at layer 0 (an early exit of 1/8 of a step, as layer 3 of 32), and a
    vision tile of ``vision_tokens`` patches so the prompt buckets reach 4096 (vision is not benchmarked)."""
    from seer_export.models.config import DiffusionMLLMConfig, TextConfig, VisionConfig

    side = int(round(vision_tokens**0.5))
    return DiffusionMLLMConfig(
        text=TextConfig(vocab_size=83, hidden_size=128, intermediate_size=384, num_hidden_layers=8,
                        num_attention_heads=4, num_key_value_heads=4),
        vision=VisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=1,
                            image_size=2 * side, patch_size=2),
        image_aspect_ratio="pad",
        seer=SeerConfig(probe_layer=0, label="random weights: step-zero cost only"),
        generation=GenerationConfig(),
        system_prompt=None,
    )  # fmt: skip


def ensure_export(folder: Path, progress: Progress, cfg=None) -> Path:
    """``folder`` if it holds an export; otherwise a random checkpoint of ``cfg`` (``random_config()``) exported
    there (fp32, no validation: the graphs are the fixture's, validated by its own export).

    Raises:
        ConfigError: ``folder`` exists, holds no export and is not empty.
    """
    from seer_export.models.random_checkpoint import write_random_checkpoint
    from seer_export.onnx.options import ExportOptions
    from seer_export.onnx.run import run_export

    if (folder / MANIFEST_FILE).is_file():
        return folder
    if folder.exists() and any(folder.iterdir()):
        raise ConfigError(f"--engines {folder} holds no export and is not empty; pass a new folder (the benchmark "
                          f"exports a random LLaDA-V-shaped model there) or an export of one")  # fmt: skip
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        progress(f"writing a random-weight checkpoint and exporting it to {folder}")
        ckpt = write_random_checkpoint(Path(tmp) / "ckpt", cfg or random_config(), dtype=torch.float32, seed=0)
        run_export(ExportOptions(checkpoint=ckpt, out=folder, validate=False), log=lambda line: None)
    return folder


def prompt_text(pipe: SeerPipeline, image_tokens: int, rng: np.random.Generator) -> str:
    """A question behind ``image_tokens`` filler words (fixture vocabulary) standing in for the image's features."""
    return " ".join(rng.choice(WORDS, image_tokens)) + " " + QUESTION


def step_times(pipe: SeerPipeline, settings: Settings, progress: Progress) -> dict[str, Any]:
    """One window-graph call, batch 1, at each (image tokens, L*): uncached (the prompt computed), cached with one
    snapshot (reuse) and with two (the order-1 forecast), interleaved over rounds."""
    rng = np.random.default_rng(0)
    spec = pipe.backend.spec("denoise")
    mask = pipe.manifest.special_tokens.mask_id
    out = {}
    for image in settings.image_tokens:
        embeds = pipe.encode(prompt_text(pipe, image, rng)).embeds
        for window in settings.step_windows:
            progress(f"per-step time: {image} image tokens, L* {window}")
            layout = padded_layout([embeds], np.array([window]), len(embeds), window)
            base = {"prefix_embeds": layout.prefix_embeds, "gen_ids": np.full((1, window), mask, dtype=np.int64),
                    "segment_ids": layout.segment_ids, "position_ids": layout.position_ids}  # fmt: skip
            uncached = {**base, **no_cache(spec, 1)}
            shift = pipe.manifest.model.logit_shift
            cached = rows_cached([embeds], [np.arange(len(embeds))], [len(embeds)], [window], len(embeds) - shift,
                                 window, bool(shift))  # fmt: skip
            snapshots = []  # two refreshes: the forecast's two snapshots, each [1, H_kv, C, hd] per input
            for _ in range(2):
                fresh = pipe.backend.run("denoise", uncached)
                snapshots.append({n: fresh[n.replace("past_key_values", "present")][:, :, : len(embeds) - shift].copy()
                                  for n in (t.name for t in spec.inputs) if n.startswith("past_key_values.")})  # fmt: skip
            step = {**base, "prefix_embeds": cached.prefix_embeds, "segment_ids": cached.segment_ids,
                    "position_ids": cached.position_ids}  # fmt: skip
            feeds = {"uncached": uncached,
                     "reuse": {**step, "past_weights": np.ones(1, dtype=np.float32),
                               **{n: v[None] for n, v in snapshots[1].items()}},
                     "forecast": {**step, "past_weights": forecast_weights(np.array([0, 4]), 5, 0.55),
                                  **{n: np.stack([s[n] for s in snapshots]) for n in snapshots[0]}}}  # fmt: skip
            rounds: dict[str, list[float]] = {k: [] for k in feeds}
            for name in feeds:  # warm-up: bindings for these shapes
                pipe.backend.run("denoise", feeds[name])
            for r in range(settings.step_rounds):
                calls: dict[str, list[float]] = {k: [] for k in feeds}
                for c in range(settings.step_calls):
                    for name in rotated(list(feeds), r + c):
                        start = time.perf_counter()
                        pipe.backend.run("denoise", feeds[name])
                        calls[name].append(time.perf_counter() - start)
                for name, values in calls.items():
                    rounds[name].append(float(np.median(values)))
            out[f"{image}/{window}"] = {
                "image_tokens": image, "prompt": len(embeds), "window": window,
                **{f"{k}_ms": 1e3 * float(np.median(v)) for k, v in rounds.items()},
                "reuse_speedup": ratio(rounds["uncached"], rounds["reuse"]),
                "forecast_speedup": ratio(rounds["uncached"], rounds["forecast"]),
                "rounds_s": rounds,
            }  # fmt: skip
    return out


def full_step(pipe: SeerPipeline, embeds: np.ndarray, n: int, calls: int) -> float:
    """Seconds of one uncached step over the whole window (the padded baseline's step): the fastest of ``calls``."""
    layout = padded_layout([embeds], np.array([n]), len(embeds), n)
    feeds = {"prefix_embeds": layout.prefix_embeds, "segment_ids": layout.segment_ids,
             "position_ids": layout.position_ids, **no_cache(pipe.backend.spec("denoise"), 1),
             "gen_ids": np.full((1, n), pipe.manifest.special_tokens.mask_id, dtype=np.int64)}  # fmt: skip
    pipe.backend.run("denoise", feeds)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        pipe.backend.run("denoise", feeds)
        times.append(time.perf_counter() - start)
    return min(times)


def end_to_end(pipe: SeerPipeline, settings: Settings, image: int, n: int, progress: Progress) -> dict[str, Any]:
    """Every mode on the same requests (one per stand-in answer length), interleaved over rounds."""
    rng = np.random.default_rng(image + n)
    texts = [prompt_text(pipe, image, rng) for _ in settings.answers]
    embeds = [pipe.encode(t).embeds for t in texts]
    margin = pipe.seer.margin
    reuse = CacheConfig("reuse", settings.refresh)
    forecast = CacheConfig("forecast", settings.refresh)
    measured = (image, n) in settings.baseline_cells
    modes = [m for m in MODES if not m.startswith("baseline") or measured]
    loop = FAMILIES[SHAPES[settings.workload].family].own_loop(n)  # every mode: the family's steps and blocks for N
    shape = {"gen_length": n, "steps": loop.steps, "block_length": loop.block_length, "decoding": "fixed"}

    def run(mode: str, k: int) -> tuple[float, int, int]:
        """(seconds, steps, refreshes) of request k in ``mode``."""
        true = settings.answers[k] + 1  # the stand-in answer and its <|eot_id|>
        if mode.startswith("baseline"):
            cache = reuse if mode == "baseline+cache" else "none"
            request = Request(texts[k], seer=False, cache=cache, **shape)
        elif mode == "oracle+cache":
            request = Request(texts[k], window=true, **shape)
        else:
            cache = {"seer": "none", "seer+reuse": reuse, "seer+forecast": forecast}[mode]
            request = Request(texts[k], window=min(n, true + margin), cache=cache, **shape)
        start = time.perf_counter()
        if mode.startswith("seer"):  # the early exit Seer runs before cutting the window (its boundary is moot here)
            run_step_zero(pipe.backend, embeds[k][None], np.ones((1, len(embeds[k])), dtype=bool), n, pipe.seer)
        (result,) = pipe.generate([request])
        if not result.ok:
            raise SeerError(f"{mode}: the request failed: {result.error}")
        return time.perf_counter() - start, result.steps, result.refreshes

    for mode in modes:  # warm-up: sessions and bindings of these shapes
        progress(f"{image} image tokens, gen_length {n}: warm-up, {mode}")
        run(mode, 0)
    secs: dict[str, list[float]] = {m: [] for m in modes}
    counts: dict[str, tuple[list[int], list[int]]] = {m: ([], []) for m in modes}
    for r in range(settings.rounds):
        progress(f"{image} image tokens, gen_length {n}: round {r + 1}/{settings.rounds}")
        total = dict.fromkeys(modes, 0.0)
        for k in range(len(settings.answers)):
            for mode in rotated(modes, r + k):
                seconds, steps, refreshes = run(mode, k)
                total[mode] += seconds
                if r == 0:
                    counts[mode][0].append(steps)
                    counts[mode][1].append(refreshes)
        for mode in modes:
            secs[mode].append(total[mode])
    tokens = sum(a + 1 for a in settings.answers)
    rows = {}
    for mode in modes:
        rows[mode] = {
            "latency_s": float(np.median(secs[mode])) / len(texts),
            "latency_range_s": [min(secs[mode]) / len(texts), max(secs[mode]) / len(texts)],
            "tokens_per_s": tokens / float(np.median(secs[mode])),
            "mean_steps": float(np.mean(counts[mode][0])),
            "mean_refreshes": float(np.mean(counts[mode][1])),
            "over_seer": ratio(secs["seer"], secs[mode]),
            "estimated": False,
        }
    if not measured:  # N uncached steps at the full window, each at its measured time
        step = full_step(pipe, embeds[0], n, settings.step_calls)
        rows["baseline"] = {"latency_s": n * step, "tokens_per_s": tokens / (n * step * len(texts)),
                            "mean_steps": float(n), "mean_refreshes": float(n), "estimated": True,
                            "over_seer": {"value": float(np.median(secs["seer"])) / (n * step * len(texts))}}  # fmt: skip
    rows = {m: rows[m] for m in MODES if m in rows}  # baseline+cache: measured cells only
    return {"image_tokens": image, "prompt": int(np.mean([len(e) for e in embeds])), "gen_length": n,
            "answers": list(settings.answers), "refresh": settings.refresh, "modes": rows,
            "rounds_s": secs}  # fmt: skip


def memory(d: dict[str, int] = LLADA_V) -> dict[str, Any]:
    """The cache's bytes per request at the 8B model's dims ``d``, per policy (snapshots kept)."""
    one = cache_bytes(d["layers"], d["kv_hidden"], d["prompt"], d["itemsize"])
    return {"dims": dict(d), "reuse_bytes": one, "forecast_order1_bytes": 2 * one, "forecast_order2_bytes": 3 * one}


def bench_cache(engines: Path, settings: Settings, progress: Progress = lambda s: None,
                command: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Every part of the workload; returns the report (what ``--json`` writes)."""
    if settings.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {settings.threads}")
    started = time.time()
    shape = SHAPES[settings.workload]
    ensure_export(engines, progress)
    pipe = SeerPipeline.from_manifest(engines, threads=settings.threads)
    largest = pipe.buckets.prompt[-1]
    if max(settings.image_tokens) + 2 * settings.text_tokens > largest:
        raise ConfigError(f"prompts of {max(settings.image_tokens)} image tokens exceed this export's largest prompt "
                          f"bucket {largest}; export the benchmark's own model (a new --engines folder)")  # fmt: skip
    load_before = machine(settings.threads)["load_average"]
    steps = step_times(pipe, settings, progress)
    cells = {f"{i}/{n}": end_to_end(pipe, settings, i, n, progress)
             for i in settings.image_tokens for n in settings.gen_lengths}  # fmt: skip
    info = machine(settings.threads)
    info["load_average_before"] = load_before
    head = headline(steps, cells, settings)
    return {
        **head,
        "headline": head,
        "command": command,
        "engines": str(engines),
        "model": dataclasses.asdict(pipe.manifest.model),
        "precision": pipe.manifest.precision,
        "default_cache": DEFAULT_CACHE.to_dict(),
        "settings": dataclasses.asdict(settings),
        "machine": info,
        "workload": shape.name,
        "loop": {n: dataclasses.asdict(FAMILIES[shape.family].own_loop(n)) for n in settings.gen_lengths},
        "memory": memory(shape.dims),
        "step_times": steps,
        "end_to_end": cells,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "seconds": time.time() - started,
    }


def headline(steps: dict[str, Any], cells: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """``cache_step_speedup``: uncached over cached (reuse) step time at 729 image tokens and L* 16 (or the first
    cell measured); ``seer_cache_over_seer``: Seer over Seer with the default cache policy's mode, end to end, at 729
    image tokens and N = 128 (or the first cell)."""
    step_key = "729/16" if "729/16" in steps else next(iter(steps))
    cell_key = "729/128" if "729/128" in cells else next(iter(cells))
    mode = "seer+forecast" if DEFAULT_CACHE.mode == "forecast" else "seer+reuse"
    return {
        "cache_step_speedup": steps[step_key]["reuse_speedup"],
        "seer_cache_over_seer": cells[cell_key]["modes"][mode]["over_seer"],
        "cache_step_speedup_at": step_key,
        "seer_cache_over_seer_at": f"{cell_key} ({mode}, R={settings.refresh})",
    }


def fmt(r: dict[str, float] | None) -> str:
    if r is None:
        return "-"
    if "min" not in r:
        return f"{r['value']:.2f}x (estimated)"
    return f"{r['value']:.2f}x [{r['min']:.2f}-{r['max']:.2f}]"


def tables(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [f"## Per-step time of the window graph, batch 1 (median of {s['step_rounds']} rounds of "
             f"{s['step_calls']} calls; {report['machine']['threads']} thread(s))", "",
             "| image tokens | prompt | L* | uncached (ms) | reuse (ms) | forecast (ms) | uncached / reuse | "
             "uncached / forecast |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in report["step_times"].values():
        lines.append(f"| {r['image_tokens']} | {r['prompt']} | {r['window']} | {r['uncached_ms']:.2f} | "
                     f"{r['reuse_ms']:.2f} | {r['forecast_ms']:.2f} | {fmt(r['reuse_speedup'])} | "
                     f"{fmt(r['forecast_speedup'])} |")  # fmt: skip
    for cell in report["end_to_end"].values():
        lines += ["", f"## End to end: {cell['image_tokens']} image tokens (prompt {cell['prompt']}), gen_length "
                  f"{cell['gen_length']}, answers {cell['answers']}, R = {cell['refresh']} (median of {s['rounds']} "
                  f"rounds)", "", "| mode | latency (s) | tokens/s | steps | refreshes | over Seer |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for mode, r in cell["modes"].items():
            est = " (estimated: N x one step)" if r["estimated"] else ""
            lines.append(f"| {mode} | {r['latency_s']:.3f}{est} | {r['tokens_per_s']:.1f} | {r['mean_steps']:.1f} | "
                         f"{r['mean_refreshes']:.1f} | {fmt(r['over_seer'])} |")  # fmt: skip
    m = report["memory"]
    gib = 2**30
    lines += ["", f"## The cache's bytes per request at the 8B model's dims ({m['dims']['layers']} layers, K/V width "
              f"{m['dims']['kv_hidden']}, prompt {m['dims']['prompt']}, fp16)", "",
              f"reuse (one snapshot): {m['reuse_bytes'] / gib:.2f} GiB; forecast order 1 (two): "
              f"{m['forecast_order1_bytes'] / gib:.2f} GiB; order 2 (three): {m['forecast_order2_bytes'] / gib:.2f} GiB",
              "", "## Headline", "",
              f"- cache_step_speedup ({report['cache_step_speedup_at']}): {fmt(report['cache_step_speedup'])}",
              f"- seer_cache_over_seer ({report['seer_cache_over_seer_at']}): {fmt(report['seer_cache_over_seer'])}"]  # fmt: skip
    return "\n".join(lines)


def run(args: Any, command: str, progress: Callable[[str], None]) -> int:
    """``seer-bench --workload llada-v-shaped | lavida-shaped`` (parsed by ``seer_export.bench.cli``)."""
    from seer_trt.eval.report import write_json

    make = Settings.quick if args.quick else Settings.full
    settings = make(args.threads, args.refresh_interval, args.workload)
    report = bench_cache(args.engines, settings, progress, command)
    print(tables(report))
    if args.json:
        write_json(args.json, report)
    return 0
