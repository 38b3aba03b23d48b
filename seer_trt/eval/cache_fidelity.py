"""``seer-eval --cache``: fidelity of prompt K/V cache policies against the exact loop on held-out fixture prompts
(docs/DESIGN.md "Measuring", "Prompt K/V cache").

In:  a pipeline over an export of the fixture model, held-out samples, a window N, the cache policies to measure
     (``CacheConfig``s: reuse and forecast at refresh intervals R, forecast order, drift gate).
Out: per policy, against Seer with the exact loop (cache "none") on the same prompts: exact match (vs the ground
     truth), answers identical to the exact loop's, token agreement with it (the exact loop's answer positions,
     through its first ``<|eot_id|>``, as export parity counts them), refreshes (steps that computed the prompt)
     and steps per request; a markdown table.

Every policy runs Seer (step zero, cut, then the cached loop), so the exact loop differs from a policy only by the
cache. A reuse and a forecast policy of one R refresh at the same steps (step 0, every R steps, every block
start) unless a drift gate moves them: their rows compare the two at equal refresh counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from seer_trt.contracts.policies import EXACT, CacheConfig
from seer_trt.eval.tasks import Sample
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request, Result

CHUNK = 50  # prompts per batch, and per progress line


def policies(modes: Sequence[str], intervals: Sequence[int], order: int = 1,
             drift: float | None = None) -> list[CacheConfig]:  # fmt: skip
    """Every mode at every refresh interval (a mode "none" in ``modes`` is the exact loop, measured anyway)."""
    return [CacheConfig(mode, r, order, drift=drift) for mode in modes if mode != "none" for r in intervals]


def run_policy(pipe: SeerPipeline, samples: list[Sample], gen_length: int | None, cache: CacheConfig,
               progress: Callable[[str], None] | None = None) -> tuple[list[Result], list]:  # fmt: skip
    """Seer results of every sample under ``cache``, in batches of CHUNK prompts, and the K/V errors its drift
    gate measured (``BatchOutput.kv_errors``)."""
    from seer_trt.contracts.errors import SeerError

    out: list[Result] = []
    errors: list = []
    for start in range(0, len(samples), CHUNK):
        chunk = samples[start : start + CHUNK]
        batch = pipe.generate_batch(
            [Request(s.question, s.image, gen_length=gen_length, cache=cache, decoding="fixed") for s in chunk]
        )  # the fixed loop: figures comparable across versions
        out += batch.results
        errors += batch.kv_errors
        if progress:
            progress(f"{cache.label}: {len(out)}/{len(samples)} prompts")
    failed = [r.error for r in out if not r.ok]
    if failed:
        raise SeerError(f"{cache.label}: {len(failed)} request(s) failed, first: {failed[0]}")
    return out, errors


def agreement(results: list[Result], exact: list[Result], eot_id: int) -> tuple[float, float]:
    """(share of answers identical to the exact loop's, share of the exact loop's answer positions, through its
    first ``<|eot_id|>``, holding the same token)."""
    same_answer = float(np.mean([r.token_ids == e.token_ids for r, e in zip(results, exact, strict=True)]))
    equal = total = 0
    for r, e in zip(results, exact, strict=True):
        end = e.window.index(eot_id) + 1 if eot_id in e.window else len(e.window)
        mine = r.window[:end] + (None,) * max(0, end - len(r.window))
        equal += sum(a == b for a, b in zip(mine, e.window[:end], strict=True))
        total += end
    return same_answer, equal / max(total, 1)


def fidelity(pipe: SeerPipeline, samples: list[Sample], truth: list[list[int]], gen_length: int | None,
             configs: Sequence[CacheConfig], progress: Callable[[str], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """The exact loop and every policy of ``configs`` on ``samples``: one row each, the exact loop first."""
    eot = pipe.manifest.special_tokens.eot_id
    exact, _ = run_policy(pipe, samples, gen_length, EXACT, progress)
    rows = []
    for cache in [EXACT, *configs]:
        results, errors = (exact, []) if cache is EXACT else run_policy(pipe, samples, gen_length, cache, progress)
        same, tokens = agreement(results, exact, eot)
        pairs = [(r, f) for r, f in errors if f is not None]  # refreshes where a forecast existed: compare there
        compared = pairs or [(r, None) for r, _ in errors]
        rows.append({
            "policy": cache.label,
            "cache": cache.to_dict(),
            "exact_match": float(np.mean([list(r.token_ids) == t for r, t in zip(results, truth, strict=True)])),
            "same_answer_as_exact": same,
            "token_agreement": tokens,
            "refreshes_per_request": float(np.mean([r.refreshes for r in results])),
            "steps_per_request": float(np.mean([r.steps for r in results])),
            # the drift gate's measurements: relative K/V error of reuse / of the forecast at the refreshes it checked
            "gate_checks": len(compared),
            "kv_error_reuse": float(np.mean([r for r, _ in compared])) if compared else None,
            "kv_error_forecast": float(np.mean([f for _, f in pairs])) if pairs else None,
            "forecast_better_share": float(np.mean([f < r for r, f in pairs])) if pairs else None,
        })  # fmt: skip
    exact_match = rows[0]["exact_match"]
    for row in rows:
        row["exact_match_minus_exact"] = row["exact_match"] - exact_match
    return {"rows": rows}


def table(report: dict[str, Any], n: int, gen_length: int, detector: str, what: str = "") -> str:
    """The fidelity rows as markdown; reuse and forecast of one interval side by side by construction of the list
    (``what``: the prompts, default "{n} held-out fixture prompts")."""
    lines = [
        f"{what or f'{n} held-out fixture prompts'}, gen_length {gen_length}, Seer ({detector}); exact loop = cache none",
        "| cache policy | exact match | vs exact loop | same answer as exact | token agreement | refreshes / request "
        "| steps / request | K/V error at refresh: reuse / forecast (forecast better) |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def kv(r: dict[str, Any]) -> str:
        if r["kv_error_reuse"] is None:
            return "-"
        if r["kv_error_forecast"] is None:
            return f"{r['kv_error_reuse']:.4f} / -"
        return f"{r['kv_error_reuse']:.4f} / {r['kv_error_forecast']:.4f} ({100 * r['forecast_better_share']:.0f} %)"

    for r in report["rows"]:
        lines.append(f"| {r['policy']} | {100 * r['exact_match']:.1f} % | {100 * r['exact_match_minus_exact']:+.1f} "
                     f"pt | {100 * r['same_answer_as_exact']:.1f} % | {100 * r['token_agreement']:.2f} % | "
                     f"{r['refreshes_per_request']:.2f} | {r['steps_per_request']:.2f} | {kv(r)} |")  # fmt: skip
    lines += ["", "K/V error: relative Frobenius error, over every layer's prompt keys and values, of what the policy "
              "fed against the fresh K/V at the refreshes a drift gate checked (gated rows only; for a forecast, the refreshes "
              "with two or more snapshots, where both were computed)."]  # fmt: skip
    return "\n".join(lines)
