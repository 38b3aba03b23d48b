"""Last stage, detokenize: each row's kept window -> its answer ids and text (docs/DESIGN.md "Seer, exactly").

In:  the denoised windows [B, N] (positions past a row's L* still masked), L* per row, the export's tokenizer.
Out: per row the answer ids (before the first ``<|eot_id|>``) and their text, special tokens dropped.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def answer_ids(row: np.ndarray, eot_id: int) -> list[int]:
    """A kept window's answer: ids before its first ``<|eot_id|>`` (the whole window when there is none)."""
    ids = row.tolist()
    return ids[: ids.index(eot_id)] if eot_id in ids else ids


def detokenize(tokens: np.ndarray, kept: np.ndarray, tokenizer: Any, eot_id: int) -> list[tuple[list[int], str]]:
    """(answer ids, text) of every row of ``tokens`` [B, N], each cut to its ``kept`` positions."""
    answers = [answer_ids(row[:k], eot_id) for row, k in zip(tokens, kept, strict=True)]
    return [(a, tokenizer.decode(a, skip_special_tokens=True)) for a in answers]
