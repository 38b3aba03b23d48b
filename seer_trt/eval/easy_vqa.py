"""easy-vqa, a public visual question answering set, as ``Sample``s (docs/DESIGN.md "Measuring").

In:  a split name ("train" or "test") and an optional limit (the first N questions in the dataset's order).
Out: ``Sample``s: ``<image>`` and the question, the 64 x 64 RGB picture [64, 64, 3] uint8, the answer as one word,
     and the answer's type as the sample's task ("yes/no", "shape", "colour").

Everything is read through the package's own API (``easy_vqa.get_train_questions`` and the rest), so the
questions, their order and the answers are the published ones: 38,575 training and 9,673 test questions on
4,000 and 1,000 pictures of one shape each, 13 answers. ``easy_vqa`` is a dependency of the evaluation extra
(``pip install 'seer-trt[eval]'``), never of the runtime: this module imports it only when called.
The fixture trained on it (``tiny-llada-v-vqa``) names it as its task family (``DATASET``).
"""

from __future__ import annotations

import functools
import re

import numpy as np

from seer_trt.contracts.errors import ConfigError
from seer_trt.eval.tasks import IMAGE_TOKEN, Sample

DATASET = "easy-vqa"  # the name --dataset takes and the fixture's config.json holds as its task family
SPLITS = ("train", "test")
SHAPES = ("circle", "rectangle", "triangle")
ANSWER_TYPES = ("yes/no", "shape", "colour")  # the task of a sample: what kind of word answers it
ROLE_WORDS = ("system", "user", "assistant")  # the chat template's role names, which the tokenizer reads as words
WORD = re.compile(r"\w+|[^\w\s]+")  # how the fixture's tokenizer splits text (tokenizers' Whitespace pre-tokenizer)


def _package():
    try:
        import easy_vqa
    except ImportError:
        raise ConfigError(
            f"--dataset {DATASET} reads the easy_vqa package, which is not installed; "
            "install the evaluation extra: pip install 'seer-trt[eval]' (or pip install easy-vqa)"
        ) from None
    return easy_vqa


def answer_type(answer: str) -> str:
    """One of ANSWER_TYPES."""
    if answer in ("yes", "no"):
        return "yes/no"
    return "shape" if answer in SHAPES else "colour"


@functools.cache
def _images(split: str) -> dict[int, np.ndarray]:
    """Image id -> [64, 64, 3] uint8, every picture of the split (4,000 or 1,000 small PNGs, read once)."""
    from PIL import Image

    ev = _package()
    paths = ev.get_train_image_paths() if split == "train" else ev.get_test_image_paths()
    out = {}
    for image_id, path in paths.items():
        with Image.open(path) as im:
            out[int(image_id)] = np.asarray(im.convert("RGB"), dtype=np.uint8)
    return out


def load(split: str, limit: int | None = None) -> list[Sample]:
    """The questions of ``split`` in the dataset's order (the first ``limit`` of them), with pictures and answers.

    Raises:
        ConfigError: an unknown split, a limit below 1, or easy_vqa not installed.
    """
    if split not in SPLITS:
        raise ConfigError(f"easy-vqa has no split {split!r}; expected one of {list(SPLITS)}")
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit {limit}: expected at least 1 question (or no limit for the whole split)")
    ev = _package()
    questions, answers, image_ids = ev.get_train_questions() if split == "train" else ev.get_test_questions()
    n = len(questions) if limit is None else min(limit, len(questions))
    images = _images(split)
    return [Sample(answer_type(answers[k]), f"{IMAGE_TOKEN}\n{questions[k]}", (answers[k],), images[image_ids[k]])
            for k in range(n)]  # fmt: skip


def majority_answer(split: str = "train") -> str:
    """The most frequent answer of ``split``: the baseline that answers it to every question."""
    answers = (_package().get_train_questions() if split == "train" else _package().get_test_questions())[1]
    values, counts = np.unique(answers, return_counts=True)
    return str(values[counts.argmax()])


def vocabulary() -> list[str]:
    """Every word of the train split's questions (as the tokenizer splits them), the answers and the role words.

    The test split's questions hold no other word (27 distinct words in each), so nothing is read from it here.
    """
    ev = _package()
    words: dict[str, None] = dict.fromkeys(ROLE_WORDS)
    for text in ev.get_train_questions()[0]:
        words.update(dict.fromkeys(WORD.findall(text)))
    words.update(dict.fromkeys(ev.get_answers()))
    return list(words)


def disjoint_parts(split: str, n: int, parts: int, seed: int = 0) -> list[list[Sample]]:
    """``parts`` disjoint sets of ``n`` questions of ``split``, drawn at random (``seed``): what calibration fits,
    chooses and reports on (the train split: the test split is never used to choose).

    Raises:
        ConfigError: the split holds fewer than ``n * parts`` questions.
    """
    samples = load(split)
    if n * parts > len(samples):
        raise ConfigError(f"{parts} parts of {n} questions need {n * parts}; {split} holds {len(samples)}; "
                          f"lower --n")  # fmt: skip
    order = np.random.default_rng(seed).permutation(len(samples))
    return [[samples[i] for i in order[k * n : (k + 1) * n]] for k in range(parts)]
