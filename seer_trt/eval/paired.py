"""Paired comparison of two decoding runs on the same prompts (docs/DESIGN.md "Measuring"): discordant pairs and
McNemar's exact test.

In:  two lists of per-prompt outcomes (True: exact answer), same prompts in the same order.
Out: ``Paired``: both exact-match rates, the discordant counts (right only in the first run, only in the second)
     and McNemar's exact two-sided p (binomial, p = 1/2, over the discordant pairs; 1.0 when there are none).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p for ``b`` and ``c`` discordant pairs: 2 P(X <= min(b, c)), X ~ Bin(b + c, 1/2)."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclasses.dataclass(frozen=True)
class Paired:
    n: int  # prompts
    exact_a: float  # exact-match rate of run a (the reference: no cut)
    exact_b: float  # exact-match rate of run b
    only_a: int  # prompts right in a and wrong in b (answers b lost)
    only_b: int  # prompts right in b and wrong in a (answers b gained)
    p: float  # McNemar's exact two-sided p over only_a + only_b

    @property
    def points(self) -> float:
        """b minus a, in percentage points."""
        return 100 * (self.exact_b - self.exact_a)

    def to_dict(self) -> dict[str, float | int]:
        return {**dataclasses.asdict(self), "points": round(self.points, 2)}


def paired(a: Sequence[bool], b: Sequence[bool]) -> Paired:
    """Compare per-prompt outcomes ``a`` (the reference) and ``b`` on the same prompts."""
    if len(a) != len(b):
        raise ValueError(f"paired runs must cover the same prompts: {len(a)} against {len(b)}")
    only_a = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
    only_b = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
    n = len(a)
    return Paired(n, sum(map(bool, a)) / max(n, 1), sum(map(bool, b)) / max(n, 1), only_a, only_b,
                  mcnemar_exact(only_a, only_b))  # fmt: skip
