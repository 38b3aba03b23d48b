"""A long ``seer-eval`` split into slices that run apart (in parallel processes, or one after another across
interruptions) and merge into the one table the whole run would print (docs/DESIGN.md "Measuring").

In:  ``--shard I/N``: the I-th of N contiguous slices of the prompts (0-based); each slice's report keeps its answers
     (ids, kept window, steps per mode) beside the truth and task of every prompt it scored.
Out: ``combine``: the slices' reports as one run, which ``accuracy.merge`` makes one report of: the modes table
     recomputed from every answer kept (exact match, the paired columns against the padded loop, Seer's cut statistics),
     never averaged from the slices' tables; a partial merge (slices missing) says which slices it covers and is never
     presented as the whole set.

The padded loop of the 9,673 questions of easy-vqa's test split takes about 55 CPU minutes at gen_length 64 and
3.8 hours at 128 on one thread (docs/results.md): the slices are how that work is shared across cores and
survives a stopped run (a finished slice is a file; only the unfinished ones run again).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from seer_trt.contracts.errors import ConfigError

T = TypeVar("T")

# what every slice of one run shares; a slice of another run (another export's model, split, window or detector)
# is refused by name
SAME = ("model", "seed", "dataset", "split", "gen_length", "seer")


def parse(text: str) -> tuple[int, int]:
    """``--shard I/N`` as (i, count), 0 <= i < count.

    Raises:
        ConfigError: not two whole numbers, or i out of range.
    """
    try:
        i, count = (int(v) for v in text.split("/"))
    except ValueError:
        raise ConfigError(f"--shard {text!r}: expected I/N, the I-th of N slices from 0 (e.g. 0/4)") from None
    if count < 1 or not 0 <= i < count:
        raise ConfigError(
            f"--shard {text!r}: expected 0 <= I < N (slices count from 0: 0/{max(count, 1)} is the first)"
        )
    return i, count


def bounds(total: int, shard: tuple[int, int]) -> tuple[int, int]:
    """[first, last) of the prompts slice ``shard`` covers: contiguous, sizes differing by one at most."""
    i, count = shard
    return total * i // count, total * (i + 1) // count


def select(samples: Sequence[T], shard: tuple[int, int] | None) -> tuple[int, list[T]]:
    """(first index, the slice) of ``samples``; the whole list where ``shard`` is None.

    Raises:
        ConfigError: a slice with no prompts (more slices than prompts).
    """
    if shard is None:
        return 0, list(samples)
    first, last = bounds(len(samples), shard)
    if first == last:
        raise ConfigError(f"--shard {shard[0]}/{shard[1]}: {len(samples)} prompts make no slice {shard[0]} of "
                          f"{shard[1]}; use at most {len(samples)} slices")  # fmt: skip
    return first, list(samples[first:last])


def describe_shard(shard: tuple[int, int], first: int, n: int, total: int) -> dict[str, int]:
    return {"index": shard[0], "count": shard[1], "first": first, "n": n, "total": total}


def records(truth: list[list[int]], tasks: list[str], results: dict[str, Sequence[Any]]) -> dict[str, Any]:
    """Every answer a slice scored, as its report keeps it: each prompt's truth ids and task, and per mode each
    answer's [ids, kept, steps]."""
    return {"truth": truth, "task": tasks,
            "modes": {m: [[list(r.token_ids), r.kept, r.steps] for r in rs] for m, rs in results.items()}}  # fmt: skip


def load(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """The slices' reports, in slice order.

    Raises:
        ConfigError: a file that is missing or not a slice's report (written without ``--shard``), slices of
            different runs (``SAME``, or a different slice count or prompt count), a slice given twice.
    """
    reports = []
    for path in paths:
        try:
            report = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"--merge {path}: no such file") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ConfigError(f"--merge {path}: not readable JSON ({err})") from None
        if not isinstance(report, dict) or "shard" not in report or "answers" not in report:
            raise ConfigError(f"--merge {path}: not a slice's report (write one with seer-eval --shard I/N --json)")
        reports.append(report)
    first = reports[0]
    for path, report in zip(paths, reports, strict=True):
        for key in (*SAME, "count", "total"):
            a, b = (r.get(key, r["shard"].get(key)) for r in (first, report))
            if a != b:
                raise ConfigError(f"--merge {path}: its {key} is {b!r}, {paths[0]}'s is {a!r}; merge slices of one run")
    indices = [r["shard"]["index"] for r in reports]
    twice = sorted({i for i in indices if indices.count(i) > 1})
    if twice:
        raise ConfigError(f"--merge: slice(s) {twice} given twice")
    return sorted(reports, key=lambda r: r["shard"]["index"])


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What the modes table reads of one answer kept in a slice's report (a ``Result``'s fields of the same names)."""

    token_ids: tuple[int, ...]
    kept: int
    steps: int


def combine(paths: Sequence[Path]) -> tuple[dict[str, Any], list[list[int]], list[str], dict[str, list[Outcome]]]:
    """The slices of ``paths`` as one run: (its report's header, with ``shards`` naming what it covers; every prompt's
    truth ids; their tasks; per mode every answer), for ``accuracy.merge`` to make the table of.

    Raises:
        ConfigError: as ``load``.
    """
    reports = load(paths)
    truth: list[list[int]] = []
    tasks: list[str] = []
    results: dict[str, list[Outcome]] = {}
    for r in reports:
        truth += r["answers"]["truth"]
        tasks += r["answers"]["task"]
        for mode, rows in r["answers"]["modes"].items():
            results.setdefault(mode, []).extend(Outcome(tuple(ids), kept, steps) for ids, kept, steps in rows)
    first = reports[0]
    count, total = first["shard"]["count"], first["shard"]["total"]
    covered = [r["shard"]["index"] for r in reports]
    base = first.get("majority_baseline")
    if base is not None:
        hits = sum(r["majority_baseline"]["exact_match"] * r["n"] for r in reports)
        base = {"answer": base["answer"], "exact_match": hits / len(truth)}
    header = {**{k: first[k] for k in ("engines", *SAME, "detector")}, "n": len(truth), "majority_baseline": base,
              "shards": {"count": count, "total": total, "merged": covered, "complete": len(covered) == count,
                         "missing": [i for i in range(count) if i not in covered]},
              "git": sorted({r["git"] for r in reports if r.get("git")}),
              "commands": [r.get("command") for r in reports]}  # fmt: skip
    return header, truth, tasks, results
