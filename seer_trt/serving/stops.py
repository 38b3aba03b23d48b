"""Where stop sequences end an answer (OpenAI's ``stop``; docs/DESIGN.md "Serving and embedding"), whole or
streamed, by one rule.

In:  a request's stop sequences (at most four, each at most the characters an answer can hold:
     ``Limits.max_answer_chars``); the answer's text, whole, or as it grows while its ids become final.
Out: where the answer is cut (``cut_at_stop``, ``StopScan.feed``); while it streams, how many of its last characters
     may begin a stop sequence and are held back (``StopScan.held``); how many answer ids the returned text holds
     (``ids_holding``: what usage counts).

The rule: the answer ends before the occurrence of a stop sequence that ends first in its text, the longest of those
ending at the same character. An autoregressive server, which checks its text after each token, stops there; and a
prefix of the text holds that occurrence as soon as it holds its last character, so a stream is cut where the whole
answer is.

Each sequence is matched by Knuth, Morris and Pratt's automaton ("Fast pattern matching in strings", SIAM J. Comput.
6(2), 1977) with their improved ``next`` table, built once per request: a character of the text costs O(log m)
fallbacks at most (m the sequence's length), so a scan costs the text's length times that per sequence, whatever
the sequences hold; the text before ``StopScan.feed``'s last call is not scanned again.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence

from seer_trt.contracts.errors import InputError
from seer_trt.contracts.requests import MAX_STOPS


def check_stops(seqs: Sequence[str], max_chars: int) -> tuple[str, ...]:
    """A request's stop sequences, checked: at most ``MAX_STOPS``, none empty, each at most ``max_chars`` characters
    (``Limits.max_answer_chars``: a longer one could never end an answer, and matching costs grow with its length).

    Raises:
        InputError: more than four, one that is not text or is empty, or one past ``max_chars``.
    """
    seqs = tuple(seqs)
    if len(seqs) > MAX_STOPS:
        raise InputError(f"stop has {len(seqs)} sequences; send at most {MAX_STOPS}")
    if any(not isinstance(q, str) for q in seqs):
        raise InputError("stop holds a sequence that is not text; send strings")
    if any(not q for q in seqs):
        raise InputError("stop holds an empty sequence; every stop sequence needs a character")
    longest = max(map(len, seqs), default=0)
    if longest > max_chars:
        raise InputError(f"stop holds a sequence of {longest} characters, more than the {max_chars} accepted (what "
                         f"the largest answer window can hold, max_answer_chars: a longer one could never match); "
                         f"send a shorter one")  # fmt: skip
    return seqs


def kmp_next(seq: str) -> array:
    """[m] Knuth, Morris and Pratt's improved ``next`` table of ``seq``: after ``seq[:k]`` has matched, a character
    other than ``seq[k]`` falls back to ``seq[:next[k]]`` (-1: to nothing), the longest proper border of ``seq[:k]``
    whose next character is not ``seq[k]`` (one whose next character is ``seq[k]`` would fail again)."""
    nxt = array("i", [0]) * len(seq)
    border = -1  # the longest proper border of seq[:k] (-1 for k = 0: not even the empty one)
    for k, c in enumerate(seq):
        nxt[k] = nxt[border] if border >= 0 and seq[border] == c else border
        while border >= 0 and seq[border] != c:  # the border of seq[:k + 1]: next skips only borders that fail on c
            border = nxt[border]
        border += 1
    return nxt


def common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix of ``a`` and ``b``, by bisection over slices compared in C."""
    hi = min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    lo, hi = 0, hi - 1  # a[:lo] == b[:lo]; a[:hi + 1] != b[:hi + 1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if a[:mid] == b[:mid] else (lo, mid - 1)
    return lo


class StopScan:
    """A request's stop sequences met in its answer's text as the text grows (the module's rule)."""

    def __init__(self, seqs: Sequence[str]) -> None:
        self.seqs = tuple(seqs)
        assert all(self.seqs), "an empty stop sequence: the request's check refuses it"
        self.tables = [kmp_next(q) for q in self.seqs]
        self.text = ""  # the text scanned so far
        # per sequence [len(text) + 1]: its characters matched at the end of each prefix of the text
        self.states = [array("i", [0]) for _ in self.seqs]
        self.cut: int | None = None  # where the answer ends (the first occurrence's start), once one is in the text

    @property
    def held(self) -> int:
        """The longest end of the scanned text that begins a stop sequence and is shorter than it: characters a
        stream holds back until the text shows whether the sequence follows."""
        return max((s[-1] for s in self.states), default=0)

    def feed(self, text: str) -> int | None:
        """Scan ``text``, the answer's text as it stands now, from where it differs from the text scanned before (a
        later id may change the last characters of a decoded prefix); where it is cut, or None. A cut stands."""
        if self.cut is not None or not self.seqs:
            return self.cut
        start = common_prefix(self.text, text)
        end, longest = len(text), 0  # the first occurrence's end, and its sequence's length
        for q, nxt, states in zip(self.seqs, self.tables, self.states, strict=True):
            del states[start + 1 :]
            k = states[-1]
            for i in range(start, end):  # to the first occurrence's end so far: a longer one may end there too
                c = text[i]
                while k >= 0 and q[k] != c:
                    k = nxt[k]
                k += 1
                states.append(k)
                if k == len(q):
                    if i + 1 < end or k > longest:
                        end, longest = i + 1, k
                    break
        if longest:
            self.cut = end - longest
        self.text = text
        return self.cut


def cut_at_stop(text: str, seqs: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to (without) the stop sequence that ends first in it (the module's rule), and whether one did."""
    cut = StopScan(seqs).feed(text)
    return (text, False) if cut is None else (text[:cut], True)


def ids_holding(ids: Sequence[int], text: str, decode: Callable[[list[int]], str]) -> int:
    """The fewest of ``ids`` whose decoded text starts with ``text`` (an answer cut at a stop sequence: its ids past
    the cut were not returned), by bisection over prefixes: a prefix of the ids decodes to a prefix of the answer
    (its last character possibly incomplete), so once a prefix holds ``text`` every longer one does."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decode(list(ids[:mid])).startswith(text) else (mid + 1, hi)
    return lo


class TextStream:
    """Answer ids as they become final -> the text to send: each time the new suffix of the whole final prefix,
    decoded, held back while that text does not extend what was sent (a character whose bytes are not all final,
    a merge a later id changes) and while it may begin a stop sequence. The stop sequences cut it where they cut the
    whole answer (``seer_trt.serving.stops``), and a push scans only the text that is new: its cost grows with that
    text, not with the sequences' length."""

    def __init__(self, decode: Callable[[list[int]], str], stop: tuple[str, ...] = ()) -> None:
        self.decode = decode
        self.scan = StopScan(stop)  # the answer ends before the first of these to end; text that may begin one waits
        self.stopped = False  # a stop sequence was met: nothing more is sent
        self.ids: list[int] = []
        self.sent = ""

    def push(self, ids: list[int]) -> str:
        self.ids += ids
        return self._extend(self.decode(self.ids), hold_partial=True)

    def finish(self, text: str) -> str:
        """The rest of the answer's final text (``Result.text``)."""
        return self._extend(text, hold_partial=False)

    def _extend(self, text: str, hold_partial: bool) -> str:
        if self.stopped:
            return ""
        if hold_partial:  # a character whose bytes are not all final yet decodes as U+FFFD: not scanned, not sent
            text = text.rstrip("\ufffd")
        cut = self.scan.feed(text)
        if cut is not None:
            text, self.stopped = text[:cut], True
        elif hold_partial:  # a stop sequence may begin in the text's last characters
            text = text[: len(text) - self.scan.held]
        if not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta
