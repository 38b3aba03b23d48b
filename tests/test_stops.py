"""Stop sequences (seer_trt.serving.stops; docs/DESIGN.md "Serving and embedding"): the scan against a brute-force
reference on random texts, the streamed text against the whole one for every kind of stop, and the answer ids that a
cut text holds. No server: the HTTP side is tests/test_serve.py's."""

from __future__ import annotations

import random

import pytest

from seer_trt.serving.openai.chat import TextStream
from seer_trt.serving.stops import StopScan, common_prefix, cut_at_stop, ids_holding

CASES = 3000  # random cases per property (seeded: a failure reproduces)


def brute_cut(text: str, seqs: tuple[str, ...]) -> int | None:
    """The module's rule, spelt out: of every occurrence, the one that ends first, the longest of those ending there."""
    hits = [(i + len(q), -len(q)) for q in seqs for i in range(len(text) - len(q) + 1) if text.startswith(q, i)]
    if not hits:
        return None
    end, minus = min(hits)
    return end + minus


def brute_held(text: str, seqs: tuple[str, ...]) -> int:
    """The longest end of ``text`` that begins a stop sequence and is shorter than it."""
    return max((k for q in seqs for k in range(1, len(q)) if text.endswith(q[:k])), default=0)


def random_text(rng: random.Random, alphabet: str, most: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, most)))


def random_stops(rng: random.Random, alphabet: str) -> tuple[str, ...]:
    return tuple(random_text(rng, alphabet, 6) or alphabet[0] for _ in range(rng.randint(1, 4)))


def test_the_scan_equals_the_brute_force_reference_on_random_texts():
    """A text fed as it grows and, at random, with its last characters rewritten (a later id changing a decoded
    prefix's end): after every feed the cut and the held characters are the reference's on that text."""
    rng = random.Random(1)
    for _ in range(CASES):
        alphabet = rng.choice(["ab", "abc", "a\u00e9\u20ac"])  # few letters: many overlaps and partial matches
        seqs = random_stops(rng, alphabet)
        scan, text = StopScan(seqs), ""
        for _ in range(rng.randint(1, 12)):
            if text and rng.random() < 0.3:
                text = text[: rng.randint(0, len(text))]  # an end rewritten: scanned again from where it differs
            text += random_text(rng, alphabet, 5)
            cut = scan.feed(text)
            assert cut == brute_cut(text, seqs), (text, seqs)
            if cut is not None:
                break
            assert scan.held == brute_held(text, seqs), (text, seqs)


def test_common_prefix_equals_a_character_walk():
    rng = random.Random(2)
    for _ in range(CASES):
        a, b = random_text(rng, "ab", 12), random_text(rng, "ab", 12)
        walk = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        assert common_prefix(a, b) == walk, (a, b)


def byte_tokens(text: str, rng: random.Random) -> list[bytes]:
    """``text``'s UTF-8 bytes in random pieces: a character's bytes may be split between ids, as byte-level BPE's."""
    data, out, i = text.encode(), [], 0
    while i < len(data):
        n = rng.randint(1, 4)
        out.append(data[i : i + n])
        i += n
    return out


def stream(pieces: list[bytes], seqs: tuple[str, ...], rng: random.Random) -> str:
    """What a client gets of the answer ``pieces`` (an id per piece), pushed in random runs and finished."""
    decoded = TextStream(lambda ids: b"".join(pieces[i] for i in ids).decode("utf-8", "replace"), seqs)
    ids, sent, i = list(range(len(pieces))), [], 0
    while i < len(ids):
        n = rng.randint(1, 3)
        sent.append(decoded.push(ids[i : i + n]))
        i += n
    sent.append(decoded.finish(b"".join(pieces).decode("utf-8", "replace")))
    assert "".join(sent) == decoded.sent
    return decoded.sent


@pytest.mark.parametrize(("answer", "seqs", "whole"), [
    ("count 1 2 3 4 5", ("3 4",), "count 1 2 "),  # a sequence that arrives across pushes
    ("count 1 2 3 4 5", ("3 5", "2 3 4 6"), "count 1 2 3 4 5"),  # partial matches that turn out not to match
    ("abcd", ("abcd", "bc"), "a"),  # several: the one that ends first cuts, not the one that begins first
    ("xabcy", ("abc", "bc"), "x"),  # two ending at the same character: the longer
    ("caf\u00e9 \u20ac5 \U0001f600!", ("\u20ac5", "\U0001f600"), "caf\u00e9 "),  # characters split between ids
    ("no stop here", ("zz",), "no stop here"),
])  # fmt: skip
def test_streamed_text_equals_the_whole_answer_cut(answer, seqs, whole):
    rng = random.Random(3)
    assert cut_at_stop(answer, seqs)[0] == whole
    for _ in range(50):
        assert stream(byte_tokens(answer, rng), seqs, rng) == whole


def test_streamed_text_equals_the_whole_on_random_answers():
    rng = random.Random(4)
    for _ in range(CASES // 3):
        alphabet = rng.choice(["ab ", "a\u00e9\u20ac ", "x\U0001f600 "])
        answer, seqs = random_text(rng, alphabet, 30), random_stops(rng, alphabet)
        assert stream(byte_tokens(answer, rng), seqs, rng) == cut_at_stop(answer, seqs)[0], (answer, seqs)


def test_a_stream_holds_back_a_possible_stop_and_sends_it_once_it_is_not_one():
    pieces = {(1,): "1 2", (1, 2): "1 2 3", (1, 2, 3): "1 2 3 5", (1, 2, 3, 4): "1 2 3 5 3 4"}
    text = TextStream(lambda ids: pieces[tuple(ids)], ("3 4",))
    assert text.push([1]) == "1 2" and text.push([2]) == " "  # "3" may begin "3 4": held
    assert text.push([3]) == "3 5" and text.push([4]) == " " and text.stopped
    assert text.finish("1 2 3 5 3 4 and more") == "" and text.sent == "1 2 3 5 "


def test_the_ids_a_cut_answer_holds_are_the_fewest_that_decode_to_it():
    """A word per id joined by spaces (the fixture's WordLevel decoder), and UTF-8 bytes split between ids."""
    words = ["1", "2", "3", "4", "5"]
    join = lambda ids: " ".join(words[i] for i in ids)  # noqa: E731
    ids = list(range(len(words)))
    assert [ids_holding(ids, t, join) for t in ("", "1", "1 ", "1 2 3", "1 2 3 4 5")] == [0, 1, 2, 3, 5]
    pieces = byte_tokens("a\u20acb", random.Random(5))
    split = lambda ids: b"".join(pieces[i] for i in ids).decode("utf-8", "replace")  # noqa: E731
    needed = next(k for k in range(len(pieces) + 1) if split(list(range(k))).startswith("a\u20ac"))
    assert ids_holding(list(range(len(pieces))), "a\u20ac", split) == needed
