"""Last stage, detokenize: each row's kept window -> its answer ids and text (docs/DESIGN.md "Seer, exactly").

In:  the denoised windows [B, N] (positions past a row's L* still masked), L* per row, the export's tokenizer.
Out: per row the answer ids (before the first ``<|eot_id|>``) and their text, special tokens dropped; a row whose
     answer holds the mask id is no answer (``MaskAnswerError``, that row's failure alone: cpp/src/detokenize.cpp).

A finished row has committed every position of its answer, and a model never predicts the mask token it was trained
to replace; an answer that holds it comes from a broken export (a NaN weight exported with ``--no-validate`` turns
every prediction into the mask id), and is refused rather than reported as text.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seer_trt.contracts.errors import SeerError


class MaskAnswerError(SeerError):
    """The model produced the mask token as an answer: the export is broken."""


def mask_in_answer(ids: list[int], mask_id: int) -> str | None:
    """Why answer ``ids`` is no answer (it holds ``mask_id``), or None; word for word C++'s ``mask_in_answer``."""
    if mask_id not in ids:
        return None
    return (f"the model produced the mask token (id {mask_id}) as an answer, at {ids.count(mask_id)} of its "
            f"{len(ids)} positions from position {ids.index(mask_id)}; the export is broken (non-finite or corrupt "
            f"weights): re-export it with validation (seer-export without --no-validate)")  # fmt: skip


def answer_ids(row: np.ndarray, eot_id: int) -> list[int]:
    """A kept window's answer: ids before its first ``<|eot_id|>`` (the whole window when there is none)."""
    ids = row.tolist()
    return ids[: ids.index(eot_id)] if eot_id in ids else ids


def answer(
    row: np.ndarray, kept: int, tokenizer: Any, eot_id: int, mask_id: int | None = None
) -> tuple[list[int], str]:
    """(answer ids, text) of one denoised window ``row`` [N] cut to its ``kept`` positions.

    Raises:
        MaskAnswerError: ``mask_id`` given and the answer holds it (a broken export; ``mask_in_answer``).
    """
    ids = answer_ids(row[:kept], eot_id)
    why = None if mask_id is None else mask_in_answer(ids, mask_id)
    if why is not None:
        raise MaskAnswerError(why)
    return ids, tokenizer.decode(ids, skip_special_tokens=True)


def detokenize(tokens: np.ndarray, kept: np.ndarray, tokenizer: Any, eot_id: int,
               mask_id: int | None = None) -> list[tuple[list[int], str]]:  # fmt: skip
    """(answer ids, text) of every row of ``tokens`` [B, N], each cut to its ``kept`` positions (``answer``).

    Raises:
        MaskAnswerError: ``mask_id`` given and a row's answer holds it; a caller that answers rows apart calls
            ``answer`` per row, so only that row fails.
    """
    return [answer(row, int(k), tokenizer, eot_id, mask_id) for row, k in zip(tokens, kept, strict=True)]
