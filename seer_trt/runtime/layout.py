"""How rows of different prompt and answer lengths sit in one graph call (docs/DESIGN.md "Seer, exactly" hybrid execution, DESIGN "Graphs and their contract").

In:  per row a prefix [C_i, D] (Seer's end tail, then the prompt) with its position ids, and a kept answer window
     L_i; a target shape (static bucket, exact, or packed); for a cached step, the past length of the call's K/V.
Out: ``Layout``: a call's graph inputs besides the answer ids (``prefix_embeds``, ``segment_ids``,
     ``position_ids``), the index that maps the call's rows' state [n, L_max] to ``gen_ids`` [b, g] and back, and
     where each row's prefix columns sit (a refresh's K/V of that row are read from there).

    static / eager (b = n rows)        packed (b = 1)                          cached (b = n rows)
    row 0: pad.. prompt0 | ans0 pad    prompt0 prompt1 prompt2 | ans0 ans1 ans2  row 0: pad.. past0 | ans0 pad
    row 1: pad..  prompt1 | ans1       segment ids 1 1 2 2 2 3 | 1 1 2 2 3 3 3   row 1: pad..  past1 | ans1
                                       positions restart per row

Segment 0 is padding; attention stays within equal non-zero segment ids, so a row computes the same values
whatever else shares the call. Positions count each row's own tokens from 0 (prompt, then answer). A cached step's
past columns are the row's prompt K/V from its last refresh, right-aligned to the call's past length; they carry
their rotation, so their position ids are not read.
"""

from __future__ import annotations

import dataclasses

import numpy as np


def window_layout(prefix_valid: np.ndarray, kept: np.ndarray, gen_length: int) -> tuple[np.ndarray, np.ndarray]:
    """``segment_ids`` [B, P + G] int32 and ``position_ids`` [B, P + G] int64 for left-padded rows.

    Row b's segment (id 1) covers its valid prompt tokens and its first ``kept[b]`` answer positions.
    """
    gen_valid = np.arange(gen_length)[None] < np.asarray(kept)[:, None]  # [B, G]
    valid = np.concatenate([prefix_valid, gen_valid], axis=1)
    return valid.astype(np.int32), np.maximum(np.cumsum(valid, axis=1) - 1, 0).astype(np.int64)


def left_pad(prompts: list[np.ndarray], length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """[P_i, D] prompts -> zero left-padded embeds [B, P, D] and validity [B, P]; P = ``length`` or the longest."""
    longest = max(p.shape[0] for p in prompts) if length is None else length
    embeds = np.zeros((len(prompts), longest, prompts[0].shape[1]), dtype=prompts[0].dtype)
    valid = np.zeros((len(prompts), longest), dtype=bool)
    for b, p in enumerate(prompts):  # once per group, not per step
        embeds[b, longest - p.shape[0] :] = p
        valid[b, longest - p.shape[0] :] = True
    return embeds, valid


@dataclasses.dataclass(frozen=True)
class Layout:
    """One group's rows in one graph call; fixed (and read-only) for the whole denoising loop."""

    prefix_embeds: np.ndarray  # [b, p, D]
    segment_ids: np.ndarray  # [b, p + g] int32
    position_ids: np.ndarray  # [b, p + g] int64
    gen_shape: tuple[int, int]  # (b, g): the gen_ids the graph takes
    state: tuple[np.ndarray, np.ndarray]  # (row, position) of each live cell of the state [n, L_max]
    slot: tuple[np.ndarray, np.ndarray]  # where that cell sits in gen_ids [b, g]
    # [n] per row: the batch entry and first column of its prefix (its past, in a cached call) on the prompt axis
    prefix_at: tuple[np.ndarray, np.ndarray] | None = None

    def gen_ids(self, x: np.ndarray, mask_id: int) -> np.ndarray:
        """[b, g] graph input from the loop state ``x`` [n, L_max]; unused slots hold the mask id."""
        out = np.full(self.gen_shape, mask_id, dtype=np.int64)
        out[self.slot] = x[self.state]
        return out

    def gather(self, values: np.ndarray, shape: tuple[int, int], fill) -> np.ndarray:
        """A [b, g] graph output back in state shape [n, L_max]; cells past a row's window get ``fill``."""
        out = np.full(shape, fill, dtype=values.dtype)
        out[self.state] = values[self.slot]
        return out

    def select(self, entries: np.ndarray) -> Layout:
        """The layout of batch entries ``entries`` (sorted) alone: the group re-formed from its live rows. A row
        keeps its state index, so the loop's state [n, L_max] is untouched; a row left out is simply not fed."""
        entries = np.asarray(entries, dtype=np.int64)
        cells = np.isin(self.slot[0], entries)
        slot = (np.searchsorted(entries, self.slot[0][cells]), self.slot[1][cells])
        state = (self.state[0][cells], self.state[1][cells])
        return _frozen(Layout(self.prefix_embeds[entries], self.segment_ids[entries], self.position_ids[entries],
                              (len(entries), self.gen_shape[1]), state, slot))  # fmt: skip

    @property
    def rows(self) -> int:
        """The rows (state entries) this call serves."""
        return 0 if len(self.state[0]) == 0 else int(self.state[0].max()) + 1


def _frozen(layout: Layout) -> Layout:
    """The layout with its graph inputs read-only: the same array object then means the same values, so a backend
    may keep them on the device for the whole loop (``seer_trt.backends.tensorrt.frozen``)."""
    for array in (layout.prefix_embeds, layout.segment_ids, layout.position_ids):
        while isinstance(array, np.ndarray):  # a view ([None]) and the array it views, both made here
            array.setflags(write=False)
            array = array.base
    return layout


def _live(kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, position) of every kept answer cell, row-major."""
    rows = np.repeat(np.arange(len(kept)), kept)
    starts = np.cumsum(kept) - kept
    return rows, np.arange(int(kept.sum())) - np.repeat(starts, kept)


def with_tails(
    prompts: list[np.ndarray], kept: np.ndarray, tails: np.ndarray | None, tail_embed: np.ndarray | None
) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """Each row's prefix with its end tail in front: (prefixes [t_i + P_i, D], their position ids, prompt lengths).

    Seer's end tail (docs/DESIGN.md "Seer, exactly", "The end tail"): t_i end tokens that stand after row i's kept
    window, already committed, attended and never denoised. They sit in the prompt part of the call, ahead of the
    prompt (so a row's last prefix position is still its last prompt token: Dream's shift reads it), where the prompt
    K/V cache holds them like the prompt; their position ids P_i + L_i .. P_i + L_i + t_i - 1 put them after the
    window.
    """
    lengths = np.array([p.shape[0] for p in prompts], dtype=np.int64)
    if tails is None or not np.any(tails):
        return list(prompts), [np.arange(n) for n in lengths], lengths
    tails = np.asarray(tails, dtype=np.int64)
    prefixes = [np.concatenate([np.broadcast_to(tail_embed, (t, p.shape[1])).astype(p.dtype), p])
                for p, t in zip(prompts, tails.tolist(), strict=True)]  # fmt: skip
    positions = [np.concatenate([n + k + np.arange(t), np.arange(n)])
                 for n, k, t in zip(lengths.tolist(), np.asarray(kept).tolist(), tails.tolist(), strict=True)]  # fmt: skip
    return prefixes, positions, lengths


def padded_layout(prompts: list[np.ndarray], kept: np.ndarray, prompt_len: int, gen_len: int,
                  tails: np.ndarray | None = None, tail_embed: np.ndarray | None = None) -> Layout:  # fmt: skip
    """Rows one per batch entry, left-padded to ``prompt_len`` and padded after each window to ``gen_len``;
    ``tails``: each row's end tail (``with_tails``), inside ``prompt_len``."""
    kept = np.asarray(kept, dtype=np.int64)
    prefixes, prefix_pos, lengths = with_tails(prompts, kept, tails, tail_embed)
    return rows_padded(prefixes, prefix_pos, lengths, kept, prompt_len, gen_len)


def rows_padded(prefixes: list[np.ndarray], prefix_pos: list[np.ndarray], lengths: np.ndarray, kept: np.ndarray,
                prompt_len: int, gen_len: int) -> Layout:  # fmt: skip
    """``padded_layout`` of rows whose prefixes (end tail and prompt) are made: [C_i, D] with position ids [C_i];
    ``lengths``: each row's prompt length P_i (its answer starts at position P_i)."""
    kept = np.asarray(kept, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    prefix, valid = left_pad(prefixes, prompt_len)
    segment_ids, position_ids = window_layout(valid, kept, gen_len)
    sizes = np.array([len(p) for p in prefixes], dtype=np.int64)
    if (sizes != lengths).any():  # an end tail: its positions come after the window, the answer's after the prompt
        position_ids = position_ids.copy()
        for b, pos in enumerate(prefix_pos):  # once per call shape, not per step
            position_ids[b, prompt_len - len(pos) : prompt_len] = pos
        answer = lengths[:, None] + np.arange(gen_len)[None]  # [b, g] P_i + j
        position_ids[:, prompt_len:] = np.where(segment_ids[:, prompt_len:] > 0, answer, 0)
    live = _live(kept)
    at = (np.arange(len(prefixes), dtype=np.int64), prompt_len - sizes)
    return _frozen(Layout(prefix, segment_ids, position_ids, (len(prefixes), gen_len), live, live, at))


def rows_cached(prefixes: list[np.ndarray], prefix_pos: list[np.ndarray], lengths: np.ndarray, kept: np.ndarray,
                past_len: int, gen_len: int, shifted: bool = False) -> Layout:  # fmt: skip
    """A cached step's layout (docs/DESIGN.md "Prompt K/V cache"): one row per batch entry, its cached prefix K/V
    right-aligned in ``past_len`` past columns, then (``shifted``: Dream's shifted logits) its last prefix position
    computed live, then its answer padded to ``gen_len``. ``prefix_embeds`` holds only the live prefix positions
    ([b, 0, D], or [b, 1, D] when shifted); the call's ids cover past + that + answer."""
    kept = np.asarray(kept, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    b, live_cols = len(prefixes), int(shifted)
    cached = np.array([len(p) - live_cols for p in prefixes], dtype=np.int64)  # past columns each row holds
    cols = np.arange(past_len)[None]
    past_valid = cols >= past_len - cached[:, None]  # [b, past]
    answer_valid = np.arange(gen_len)[None] < kept[:, None]  # [b, g]
    live_valid = np.ones((b, live_cols), dtype=bool)
    segment_ids = np.concatenate([past_valid, live_valid, answer_valid], axis=1).astype(np.int32)
    position_ids = np.zeros(segment_ids.shape, dtype=np.int64)
    for i, pos in enumerate(prefix_pos):  # once per call shape, not per step
        position_ids[i, past_len - cached[i] : past_len] = pos[: cached[i]]
        position_ids[i, past_len : past_len + live_cols] = pos[cached[i] :]
    answer = lengths[:, None] + np.arange(gen_len)[None]
    position_ids[:, past_len + live_cols :] = np.where(answer_valid, answer, 0)
    dim, dtype = prefixes[0].shape[1], prefixes[0].dtype
    live = np.stack([p[len(p) - live_cols :] for p in prefixes]) if live_cols else np.zeros((b, 0, dim), dtype=dtype)
    state = _live(kept)
    at = (np.arange(b, dtype=np.int64), past_len - cached)
    return _frozen(Layout(np.ascontiguousarray(live), segment_ids, position_ids, (b, gen_len), state, state, at))


def packed_layout(prompts: list[np.ndarray], kept: np.ndarray, tails: np.ndarray | None = None,
                  tail_embed: np.ndarray | None = None) -> Layout:  # fmt: skip
    """Every row in one sequence: all prefixes (end tail, prompt), then all answer windows; segment i + 1 is row i."""
    kept = np.asarray(kept, dtype=np.int64)
    prefixes, prefix_pos, lengths = with_tails(prompts, kept, tails, tail_embed)
    return rows_packed(prefixes, prefix_pos, lengths, kept)


def rows_packed(prefixes: list[np.ndarray], prefix_pos: list[np.ndarray], lengths: np.ndarray,
                kept: np.ndarray) -> Layout:  # fmt: skip
    """``packed_layout`` of rows whose prefixes and their position ids are made (``rows_padded``)."""
    kept = np.asarray(kept, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    sizes = np.array([p.shape[0] for p in prefixes])
    prefix = np.concatenate(prefixes)[None]  # [1, sum (t_i + P_i), D]
    seg_prompt = np.repeat(np.arange(1, len(prefixes) + 1), sizes)
    seg_answer = np.repeat(np.arange(1, len(prefixes) + 1), kept)
    pos_prompt = np.concatenate(prefix_pos)
    rows, positions = _live(kept)
    pos_answer = lengths[rows] + positions
    segment_ids = np.concatenate([seg_prompt, seg_answer]).astype(np.int32)[None]
    position_ids = np.concatenate([pos_prompt, pos_answer]).astype(np.int64)[None]
    slot = (np.zeros(len(rows), dtype=np.int64), np.arange(len(rows)))
    at = (np.zeros(len(prefixes), dtype=np.int64), np.cumsum(sizes) - sizes)
    return _frozen(Layout(prefix, segment_ids, position_ids, (1, int(kept.sum())), (rows, positions), slot, at))
