"""What ``seer-eval`` measures: accuracy of the padded loop, LLaDA-V's early-stopping loop, Seer and the oracle on held-out
fixture prompts (docs/DESIGN.md "Measuring").

In:  an export of the fixture model (``seer-export --model tiny-llada-v``), a sample count, a seed, a window N.
Out: per mode exact match against the ground truth (overall and per task) and against the padded loop's own
     answers, and the mean steps; for Seer the premature-cut rate (L* shorter than the true answer plus its
     ``<|eot_id|>``), the mean kept window over the true length and the distribution of L* minus the true
     length; markdown tables, JSON and a PNG; a progress line per chunk of prompts on stderr.

Modes: ``padded`` denoises all N positions every step; ``early_stop`` is the official setting of LLaDA-V's demo
and evaluation (``stopping_criteria=['<|eot_id|>']``: stop once the answer before the first ``<|eot_id|>`` is
complete); ``seer`` cuts at the step-zero boundary; ``oracle`` cuts at the true length (answer +
``<|eot_id|>``), the physical limit of truncation. All run through the same pipeline, with the exact loop
(cache "none").

``--cache POLICIES`` measures prompt K/V cache policies instead (docs/DESIGN.md "Prompt K/V cache"): Seer with the exact loop, then
Seer under each policy at each refresh interval: exact match, answers identical to the exact loop's, token
agreement with it (the exact loop's answer positions, through its first ``<|eot_id|>``) and refreshes (steps that
computed the prompt) per request. Reuse and forecast at one interval refresh at the same steps unless a drift gate
moves them, so their rows compare the two at equal refresh counts.

``--decoding RULES`` measures decoding strategies instead (docs/DESIGN.md "Decoding strategies"): the exact
``fixed`` loop (padded, one token per step by default) first, then each rule under each setting (LLaDA-V's
early-stop loop, Seer, Seer with early stop, and that with the prompt cache; the prompt cache with and without
Seer, the default request's setting): exact match, answers identical to
the exact fixed loop's, forward passes per answer (Seer's rows add one step-zero pass at the probe's depth) and
the wall seconds of the setting's batches, the figure the default is chosen from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from seer_trt.contracts.errors import ConfigError, SeerError
from seer_trt.contracts.policies import CACHE_MODES, DEFAULT_POLICY, CacheConfig
from seer_trt.eval import cache_fidelity, easy_vqa, shards
from seer_trt.eval.paired import paired
from seer_trt.eval.report import git_sha, save_figure
from seer_trt.eval.tasks import HELD_OUT_SEED, Sample, held_out, vocabulary
from seer_trt.runtime.decoding import Rule
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request, Result

MODES = ("padded", "early_stop", "seer", "oracle")


CHUNK = 50  # prompts per batch, and per progress line


def fixture_samples(pipe: SeerPipeline, n: int, seed: int) -> list[Sample]:
    """Held-out samples of the export's fixture task family, drawn for its image geometry.

    Raises:
        ConfigError: the export's tokenizer does not know the fixture task's words (not a fixture model).
    """
    vocab = pipe.prompts.tokenizer.get_vocab()
    unknown = [w for w in vocabulary() if w not in vocab]
    if unknown:
        raise ConfigError(
            f"this export ({pipe.manifest.model.name}) does not speak the fixture task (its tokenizer lacks "
            f"{unknown[:5]}); seer-eval measures exports of tiny-llada-v"
        )
    v = pipe.manifest.vision
    return held_out(n, seed, pipe.manifest.model.task_family, v.image_size // v.patch_size, v.patch_size)


def eval_samples(pipe: SeerPipeline, n: int | None, seed: int, dataset: str | None = None,
                 split: str = "test") -> list[Sample]:  # fmt: skip
    """What an evaluation scores: ``n`` held-out fixture prompts of ``seed`` (``dataset`` None), or the first ``n``
    questions of a public dataset's ``split`` in its own order (``n`` None: the whole split).

    Raises:
        ConfigError: an unknown dataset, or an export whose tokenizer does not know the dataset's answers.
    """
    if dataset is None:
        return fixture_samples(pipe, 200 if n is None else n, seed)
    if dataset != easy_vqa.DATASET:
        raise ConfigError(f"--dataset {dataset!r}: expected {easy_vqa.DATASET} (or no --dataset: the fixture's task)")
    samples = easy_vqa.load(split, n)
    vocab = pipe.prompts.tokenizer.get_vocab()
    unknown = sorted({s.answer[0] for s in samples} - set(vocab))
    if unknown:
        raise ConfigError(f"this export ({pipe.manifest.model.name}) cannot write {dataset}'s answers {unknown[:5]} "
                          f"(its tokenizer lacks them); --dataset {dataset} measures exports of tiny-llada-v-vqa")  # fmt: skip
    return samples


def describe(n: int, dataset: str | None, split: str) -> str:
    """The prompts of a table's title: "200 held-out fixture prompts" or "9673 questions of easy-vqa's test split"."""
    return f"{n} held-out fixture prompts" if dataset is None else f"{n} questions of {dataset}'s {split} split"


def majority_baseline(samples: list[Sample], dataset: str | None) -> dict[str, Any] | None:
    """A dataset's majority-answer baseline on ``samples``: the train split's most frequent answer, given to all."""
    if dataset is None:
        return None
    answer = easy_vqa.majority_answer("train")
    return {"answer": answer, "exact_match": float(np.mean([s.answer == (answer,) for s in samples]))}


def truth_ids(pipe: SeerPipeline, sample: Sample) -> list[int]:
    """The true answer ids, without ``<|eot_id|>``."""
    return pipe.prompts.tokenizer.encode(" ".join(sample.answer), add_special_tokens=False).ids


def oracle_window(pipe: SeerPipeline, sample: Sample, gen_length: int) -> int:
    """The oracle's cut: the true answer and its ``<|eot_id|>``, within the window."""
    return min(len(truth_ids(pipe, sample)) + 1, gen_length)


def mode_request(pipe: SeerPipeline, sample: Sample, mode: str, gen_length: int | None) -> Request:
    """The request of ``sample`` in one of MODES, on the exact loop (the fixed schedule, cache none)."""
    n = gen_length or pipe.manifest.generation.gen_length
    window = oracle_window(pipe, sample, n) if mode == "oracle" else None
    return Request(sample.question, sample.image, gen_length=gen_length, seer=mode in ("seer", "oracle"),
                   window=window, early_stop=mode == "early_stop", cache="none", decoding="fixed")  # fmt: skip


# the settings each decoding rule is measured under: Request fields beside the rule
DECODING_SETTINGS = {
    "padded": {"seer": False, "early_stop": False, "cache": "none"},
    "early_stop": {"seer": False, "early_stop": True, "cache": "none"},
    "early_stop_reuse": {"seer": False, "early_stop": True, "cache": "reuse"},
    "seer": {"seer": True, "early_stop": False, "cache": "none"},
    "seer_early_stop": {"seer": True, "early_stop": True, "cache": "none"},
    "seer_early_stop_reuse": {"seer": True, "early_stop": True, "cache": "reuse"},
    "reuse": {"seer": False, "early_stop": False, "cache": "reuse"},
    "seer_reuse": {"seer": True, "early_stop": False, "cache": "reuse"},  # the default request's setting
}
UNCUT = {"seer": "padded", "seer_early_stop": "early_stop", "seer_early_stop_reuse": "early_stop_reuse",
         "seer_reuse": "reuse"}  # pairs: a Seer setting and the same setting uncut  # fmt: skip
EXACT_LOOP = ("fixed", "padded")  # the reference every setting is compared with: no Seer, no stop, no cache


def run_decodings(pipe: SeerPipeline, samples: list[Sample], gen_length: int | None, rules: list[str],
                  progress: Callable[[str], None] | None = None,
                  settings: list[str] | None = None) -> dict[tuple[str, str], tuple[list[Result], float]]:  # fmt: skip
    """(rule, setting) -> (results, wall seconds): the exact fixed loop, then every rule under every setting
    (``settings``: only these, the exact loop only where "fixed" and "padded" are among them)."""
    import time

    if settings is None:
        runs = [EXACT_LOOP] + [(r, s) for r in rules for s in DECODING_SETTINGS if (r, s) != EXACT_LOOP]
    else:
        runs = [(r, s) for r in rules for s in settings]
    out = {}
    for rule, setting in runs:
        fields = DECODING_SETTINGS[setting]
        if not Rule.parse(rule).fixed:  # a rule that commits by probability ranks by it (Dream's default score is none)
            fields = {**fields, "remasking": "low_confidence"}
        results: list[Result] = []
        start = time.perf_counter()
        for first in range(0, len(samples), CHUNK):
            chunk = samples[first : first + CHUNK]
            results += pipe.generate([Request(s.question, s.image, gen_length=gen_length, decoding=rule, **fields)
                                      for s in chunk])  # fmt: skip
        seconds = time.perf_counter() - start
        failed = [r.error for r in results if not r.ok]
        if failed:
            raise SeerError(f"{rule} / {setting}: {len(failed)} request(s) failed, first: {failed[0]}")
        out[(rule, setting)] = (results, seconds)
        if progress:
            progress(f"{rule} / {setting}: {len(samples)} prompts in {seconds:.1f} s")
    return out


def decoding_metrics(pipe: SeerPipeline, samples: list[Sample],
                     runs: dict[tuple[str, str], tuple[list[Result], float]]) -> list[dict[str, Any]]:  # fmt: skip
    """One row per (rule, setting): exact match (overall and per task), = the exact fixed loop, forward passes per
    answer, seconds; a Seer setting also its premature cuts and its cut's cost, paired with the same rule and setting
    uncut (``UNCUT``) on the same prompts."""
    truth = [truth_ids(pipe, s) for s in samples]
    exact = [list(r.token_ids) for r in runs[EXACT_LOOP][0]] if EXACT_LOOP in runs else None
    hits = {key: [list(r.token_ids) == t for r, t in zip(results, truth, strict=True)]
            for key, (results, _) in runs.items()}  # fmt: skip
    rows = []
    for (rule, setting), (results, seconds) in runs.items():
        answers = [list(r.token_ids) for r in results]
        uncut = (rule, UNCUT[setting]) if setting in UNCUT else None
        cut_cost = (
            {"uncut": UNCUT[setting], **paired(hits[uncut], hits[(rule, setting)]).to_dict()} if uncut in hits else None
        )
        rows.append({
            "decoding": rule,
            "setting": setting,
            "exact_match": float(np.mean([a == t for a, t in zip(answers, truth, strict=True)])),
            "match_exact_loop": None if exact is None
            else float(np.mean([a == b for a, b in zip(answers, exact, strict=True)])),
            "forward_passes": float(np.mean([r.steps for r in results])),
            "step_zero": setting.startswith("seer"),
            "mean_kept": float(np.mean([r.kept for r in results])),
            "seconds": seconds,
            "answers_per_s": len(results) / seconds,
            "against_uncut": cut_cost,
            # a Seer setting's cuts shorter than the true answer and its <|eot_id|> (tokens lost); None uncut
            "premature_cut_rate": float(np.mean([r.kept < len(t) + 1 for r, t in zip(results, truth, strict=True)]))
            if setting.startswith("seer") else None,
            "exact_by_task": by_task([s.task for s in samples], hits[(rule, setting)]),
        })  # fmt: skip
    return rows


def decoding_table(rows: list[dict[str, Any]], n: int, gen_length: int, detector: str, what: str = "") -> str:
    """``what``: the prompts (``describe``); default "{n} held-out prompts"."""
    lines = [
        f"{what or f'{n} held-out prompts'}, gen_length {gen_length}; seer = {detector}; exact loop = fixed, padded, cache none; "
        "the cut's cost: against the same rule and setting uncut, answers lost / gained and McNemar's exact p",
        "| decoding | setting | exact match | = exact loop | uncut exact | lost / gained | McNemar p "
        "| forward passes / answer | answers/s (eval batches) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        passes = f"{r['forward_passes']:.2f}" + (" + step zero" if r["step_zero"] else "")
        c = r.get("against_uncut")
        cost = f"{100 * c['exact_a']:.1f} % | {c['only_a']} / {c['only_b']} | {c['p']:.3g}" if c else "- | - | -"
        lines.append(f"| {r['decoding']} | {r['setting']} | {100 * r['exact_match']:.1f} % | "
                     f"{same(r['match_exact_loop'])} | {cost} | {passes} | {r['answers_per_s']:.1f} |")  # fmt: skip
    return "\n".join(lines)


def same(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f} %"


def fastest_within(rows: list[dict[str, Any]], points: float = 0.5) -> dict[str, Any] | None:
    """The row with the most answers/s whose exact match is within ``points`` percentage points of the exact
    fixed loop's (or above it); None without the exact loop."""
    exact = [r for r in rows if (r["decoding"], r["setting"]) == EXACT_LOOP]
    if not exact:
        return None
    base = exact[0]["exact_match"]
    fit = [r for r in rows if 100 * (base - r["exact_match"]) <= points]
    return max(fit, key=lambda r: r["answers_per_s"])


def evaluate_decoding(engines: str | Path, rules: list[str], n: int | None = 200, seed: int = HELD_OUT_SEED,
                      gen_length: int | None = None, progress: Callable[[str], None] | None = None,
                      threads: int = 0, tail: float | None = None, dataset: str | None = None,
                      split: str = "test", settings: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """Every decoding rule of ``rules`` under every setting (or ``settings``) on ``n`` held-out prompts (or a
    dataset's questions: ``eval_samples``), beside the exact loop (``tail``: Seer's end tail instead of the export's).

    Raises:
        ConfigError: a setting not in DECODING_SETTINGS.
    """
    unknown = [s for s in settings or () if s not in DECODING_SETTINGS]
    if unknown:
        raise ConfigError(f"--settings {unknown}: expected a comma-separated subset of {list(DECODING_SETTINGS)}")
    commit = git_sha()  # the code that runs: read before the run, as commits may land during it
    pipe = open_for_eval(engines, tail, threads=threads, calibrate=True)  # cost model timed before the settings
    samples = eval_samples(pipe, n, seed, dataset, split)
    rows = decoding_metrics(pipe, samples, run_decodings(pipe, samples, gen_length, rules, progress, settings))
    best = fastest_within(rows)
    return {"engines": str(engines), "model": pipe.manifest.model.name, "n": len(samples), "seed": seed,
            "dataset": dataset, "split": split if dataset else None,
            "majority_baseline": majority_baseline(samples, dataset),
            "gen_length": gen_length or pipe.manifest.generation.gen_length, "detector": pipe.seer.describe(),
            "threads": threads, "git": commit,
            "rows": rows, "fastest_within_0.5_points": best and {k: best[k] for k in ("decoding", "setting")}}  # fmt: skip


def open_for_eval(engines: str | Path, tail: float | None, **options: Any) -> SeerPipeline:
    """The export's pipeline, with Seer's end tail set to ``tail`` (None: the export's calibration)."""
    pipe = SeerPipeline.from_manifest(engines, **options)
    if tail is None:
        return pipe
    return SeerPipeline.from_manifest(engines, seer=pipe.seer.replace(tail=tail), **options)


def run_modes(pipe: SeerPipeline, samples: list[Sample], gen_length: int | None, modes=MODES,
              policy: str | None = None, progress: Callable[[str], None] | None = None) -> dict[str, list[Result]]:  # fmt: skip
    """Each mode's results over ``samples``, in batches of CHUNK prompts."""
    out: dict[str, list[Result]] = {}
    for mode in modes:
        results: list[Result] = []
        for start in range(0, len(samples), CHUNK):
            chunk = samples[start : start + CHUNK]
            results += pipe.generate([mode_request(pipe, s, mode, gen_length) for s in chunk], policy=policy)
            if progress:
                progress(f"{mode}: {len(results)}/{len(samples)} prompts")
        failed = [r.error for r in results if not r.ok]
        if failed:
            raise SeerError(f"{mode}: {len(failed)} request(s) failed, first: {failed[0]}")
        out[mode] = results
    return out


def metrics(
    truth: list[list[int]], tasks: list[str], results: dict[str, list[Result] | list[shards.Outcome]]
) -> dict[str, Any]:
    """Per mode: exact match vs ``truth`` (each prompt's answer ids) and vs the padded loop, per task (``tasks``);
    Seer's cut statistics."""
    true_len = np.array([len(t) + 1 for t in truth])  # answer + <|eot_id|>
    base = [list(r.token_ids) for r in results["padded"]] if "padded" in results else None
    base_hits = [a == t for a, t in zip(base, truth, strict=True)] if base is not None else None
    out: dict[str, Any] = {}
    for mode, rs in results.items():
        answers = [list(r.token_ids) for r in rs]
        kept = np.array([r.kept for r in rs])
        hits = [a == t for a, t in zip(answers, truth, strict=True)]
        row: dict[str, Any] = {
            "exact_match": float(np.mean(hits)),
            "mean_steps": float(np.mean([r.steps for r in rs])),
            "mean_kept": float(kept.mean()),
            "exact_by_task": by_task(tasks, hits),
        }
        if base is not None:
            row["match_padded"] = float(np.mean([a == b for a, b in zip(answers, base, strict=True)]))
        if base_hits is not None and mode in ("seer", "oracle"):
            row["against_padded"] = paired(base_hits, hits).to_dict()
        if mode == "seer":
            diff = kept - true_len
            row["premature_cut_rate"] = float(np.mean(diff < 0))
            row["mean_kept_over_true"] = float(np.mean(kept / true_len))
            values, counts = np.unique(diff, return_counts=True)
            row["kept_minus_true"] = {int(v): int(c) for v, c in zip(values, counts, strict=True)}
        out[mode] = row
    return out


def by_task(tasks: list[str], hits: list[bool]) -> dict[str, dict[str, int]]:
    """Exact answers and prompts per task (``tasks``: each prompt's), so a shortfall names the task that causes it."""
    out: dict[str, dict[str, int]] = {}
    for task, hit in zip(tasks, hits, strict=True):
        row = out.setdefault(task, {"exact": 0, "n": 0})
        row["exact"] += int(hit)
        row["n"] += 1
    return dict(sorted(out.items()))


def table(m: dict[str, Any], n: int, gen_length: int, detector: str = "", what: str = "") -> str:
    """``detector``: what "seer" cut with (``SeerConfig.describe``), printed under the title; ``what``: the prompts
    (``describe``; default "{n} held-out fixture prompts")."""
    lines = [
        f"{what or f'{n} held-out fixture prompts'}, gen_length {gen_length}"
        + (f"; seer = {detector}" if detector else ""),
        "| mode | exact match | = padded | lost / gained vs padded | McNemar p | premature cuts | kept / true "
        "| mean kept | mean steps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, row in m.items():
        pre = f"{100 * row['premature_cut_rate']:.1f} %" if "premature_cut_rate" in row else "-"
        ratio = f"{row['mean_kept_over_true']:.2f}x" if "mean_kept_over_true" in row else "-"
        same = f"{100 * row['match_padded']:.1f} %" if "match_padded" in row else "-"
        c = row.get("against_padded")
        cost = f"{c['only_a']} / {c['only_b']} | {c['p']:.3g}" if c else "- | -"
        lines.append(f"| {mode} | {100 * row['exact_match']:.1f} % | {same} | {cost} | {pre} | {ratio} | "
                     f"{row['mean_kept']:.1f} | {row['mean_steps']:.1f} |")  # fmt: skip
    modes = list(m)
    lines += ["", "exact answers per task", "| task | " + " | ".join(modes) + " |", "|---" * (len(modes) + 1) + "|"]
    for task in m[modes[0]]["exact_by_task"]:
        cells = [f"{m[k]['exact_by_task'][task]['exact']}/{m[k]['exact_by_task'][task]['n']}" for k in modes]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(m: dict[str, Any], path: Path, gen_length: int, detector: str = "") -> None:
    """Histogram of L* minus the true length, and exact match per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    dist = m["seer"]["kept_minus_true"]
    ax1.bar(list(dist), list(dist.values()), color="tab:blue")
    ax1.axvline(-0.5, color="tab:red", linestyle="--", label="premature (< 0)")
    ax1.set_xlabel("L* - true length (answer + <|eot_id|>)")
    ax1.set_ylabel("prompts")
    ax1.legend()
    ax1.set_title(
        f"Seer cut ({detector}), gen_length {gen_length}" if detector else f"Seer cut, gen_length {gen_length}",
        fontsize=8,
    )
    modes = list(m)
    colours = {"padded": "0.5", "early_stop": "tab:orange", "seer": "tab:blue", "oracle": "tab:green"}
    ax2.bar(modes, [100 * m[k]["exact_match"] for k in modes], color=[colours.get(k, "0.3") for k in modes])
    ax2.set_ylabel("exact match (%)")
    ax2.set_ylim(0, 100)
    fig.tight_layout()
    save_figure(fig, path)


def evaluate(engines: str | Path, n: int | None = 200, seed: int = HELD_OUT_SEED, gen_length: int | None = None,
             policy: str = DEFAULT_POLICY, progress: Callable[[str], None] | None = None,
             tail: float | None = None, dataset: str | None = None, split: str = "test",
             shard: tuple[int, int] | None = None, threads: int = 0) -> dict[str, Any]:  # fmt: skip
    """Run every mode on ``n`` held-out prompts (or a dataset's questions: ``eval_samples``) and return the figures
    (what ``--json`` writes); ``tail``: Seer's end tail instead of the export's (it cuts the oracle's window too);
    ``shard`` (i, count): only the i-th of ``count`` contiguous slices of those prompts, each answer kept in the report
    so that ``merge`` makes the whole table of the slices (``shards``); ``threads``: ONNX Runtime's intra-op
    threads (0: its own choice)."""
    commit = git_sha()  # before the run (evaluate_decoding)
    pipe = open_for_eval(engines, tail, policy=policy, threads=threads)
    samples = eval_samples(pipe, n, seed, dataset, split)
    total = len(samples)
    first, samples = shards.select(samples, shard)
    gen = gen_length or pipe.manifest.generation.gen_length
    results = run_modes(pipe, samples, gen_length, progress=progress)
    truth, tasks = [truth_ids(pipe, s) for s in samples], [s.task for s in samples]
    report = {
        "engines": str(engines),
        "model": pipe.manifest.model.name,
        "n": len(samples),
        "seed": seed,
        "dataset": dataset,
        "split": split if dataset else None,
        "majority_baseline": majority_baseline(samples, dataset),
        "gen_length": gen,
        "seer": dataclasses.asdict(pipe.seer),
        "detector": pipe.seer.describe(),
        "threads": threads,
        "git": commit,
        "modes": metrics(truth, tasks, results),
    }
    if shard is not None:
        report["shard"] = shards.describe_shard(shard, first, len(samples), total)
        report["answers"] = shards.records(truth, tasks, results)
    return report


def merge(paths: list[Path]) -> dict[str, Any]:
    """The reports of ``--shard`` runs (``paths``) as one report: the modes table of every answer they kept, as one run
    over those prompts makes it; its ``shards`` say which slices it covers (``complete`` False: not the whole set).

    Raises:
        ConfigError: slices of different runs, a slice twice, a file that is not a slice's report (``shards.load``).
    """
    header, truth, tasks, results = shards.combine(paths)
    return {**header, "modes": metrics(truth, tasks, results)}


def cache_policies(modes: str, intervals: str, order: int, drift: float | None) -> list[CacheConfig]:
    """The policies of ``--cache`` / ``--refresh-interval`` / ``--forecast-order`` / ``--drift-gate``.

    Raises:
        ConfigError: an unknown mode, an interval that is not a whole number >= 1, a bad order or gate.
    """
    names = [m.strip() for m in modes.split(",") if m.strip()]
    unknown = [m for m in names if m not in CACHE_MODES]
    if unknown or not names:
        raise ConfigError(f"--cache {modes!r}: expected a comma-separated subset of {list(CACHE_MODES)}")
    try:
        values = [int(v) for v in intervals.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"--refresh-interval {intervals!r}: expected whole numbers, e.g. 2,4,8") from None
    configs = cache_fidelity.policies(names, values, order)
    if drift is not None:
        configs += cache_fidelity.policies(names, values, order, drift)
    return configs


def evaluate_cache(engines: str | Path, configs: list[CacheConfig], n: int | None = 200, seed: int = HELD_OUT_SEED,
                   gen_length: int | None = None, progress: Callable[[str], None] | None = None,
                   dataset: str | None = None, split: str = "test", threads: int = 0) -> dict[str, Any]:  # fmt: skip
    """The exact loop and every cache policy of ``configs`` under Seer on ``n`` held-out prompts (or a dataset's
    questions: ``eval_samples``) (``cache_fidelity``); ``threads``: ONNX Runtime's intra-op threads."""
    commit = git_sha()  # before the run (evaluate_decoding)
    pipe = SeerPipeline.from_manifest(engines, threads=threads)
    samples = eval_samples(pipe, n, seed, dataset, split)
    truth = [truth_ids(pipe, s) for s in samples]
    report = cache_fidelity.fidelity(pipe, samples, truth, gen_length, configs, progress)
    return {"engines": str(engines), "model": pipe.manifest.model.name, "n": len(samples), "seed": seed,
            "dataset": dataset, "split": split if dataset else None,
            "gen_length": gen_length or pipe.manifest.generation.gen_length, "detector": pipe.seer.describe(),
            "threads": threads, "git": commit, **report}  # fmt: skip
