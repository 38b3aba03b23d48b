"""The second bundled fixture, ``tiny-llada-v-hard``, and the task families: the new model loads strictly and speaks
its own family; held-out prompts are deterministic; the ``shapes`` family draws exactly what it drew before."""

import hashlib
import json

import numpy as np
import pytest
import torch

from seer_export.models.registry import FIXTURE_DIR, HARD_FIXTURE_DIR, get_entry, load
from seer_export.reference.fixture import TaskEncoder, build_tokenizer, fixture_family
from seer_export.reference.seer import step_zero
from seer_trt.contracts.config import SeerConfig
from seer_trt.eval.tasks import (
    DEFAULT_FAMILY,
    FAMILY_KEY,
    HELD_OUT_SEED,
    TASK_FAMILIES,
    TASKS,
    held_out,
    make_samples,
    task_family,
)

# sha256 of make_samples(seed, 200) (task, question, answer, image bytes), computed before task families existed:
# the shapes family's prompts, held-out and training alike, must never move.
SHAPES_DIGESTS = {
    0: "e9dab4ad68b18c97163830df15276c31a84379dfd997d691da62e89adc90233d",
    7: "82f898e9431a5d9283fc34dc346b72d40a624d00760b40cc47c2240746ba940f",
    11: "d4e50029b5fed47cdc458bee6d2f14ef73550fa4077696406363bf809c142460",
    23: "533ad2192236830a1bc1b2239322784ecf460c3e0125e959b2bde5f105f2c2e3",
    1_000_000: "bd61165f283e6ea7d9edfe72523f0022a07a2def2dbb0940103a9ee6f03f80f7",
}


def digest(samples) -> str:
    h = hashlib.sha256()
    for s in samples:
        h.update(repr((s.task, s.question, s.answer)).encode())
        if s.image is not None:
            h.update(s.image.tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("seed", sorted(SHAPES_DIGESTS))
def test_shapes_family_draws_what_it_drew_before_families(seed):
    assert digest(make_samples(seed, 200)) == SHAPES_DIGESTS[seed]
    assert digest(make_samples(seed, 200, family="shapes")) == SHAPES_DIGESTS[seed]


def test_held_out_is_deterministic_and_defaults_to_the_shapes_family():
    assert digest(held_out(50)) == digest(make_samples(HELD_OUT_SEED, 50))
    assert digest(held_out(50, 11, None)) == digest(make_samples(11, 50))
    for family in TASK_FAMILIES:
        assert digest(held_out(60, 11, family)) == digest(held_out(60, 11, family))
        assert digest(held_out(60, 11, family)) != digest(held_out(60, 13, family))
    assert digest(held_out(60, 11, "hard")) != digest(held_out(60, 11, "shapes"))


def test_held_out_refuses_training_seeds_and_unknown_families():
    with pytest.raises(ValueError, match="training seed"):
        held_out(4, 1_000_000)
    with pytest.raises(ValueError, match="unknown task family"):
        held_out(4, 7, "no-such-family")


def test_hard_family_draws_every_one_of_its_tasks_with_true_answers():
    samples = held_out(400, family="hard")
    assert {s.task for s in samples} == set(task_family("hard").tasks)
    assert set(TASKS) < set(task_family("hard").tasks)
    for s in samples:
        if s.task in ("count_from", "count_down"):
            _, _, a, _, b, _ = s.question.split()  # count from a to b .
            step = 1 if s.task == "count_from" else -1
            assert s.answer == tuple(str(i) for i in range(int(a), int(b) + step, step)), s
        if s.task == "repeat_list":
            words, times = s.question.split()[1:-3], int(s.question.split()[-3])  # repeat w1 w2 k times .
            assert len(set(words)) == len(words) >= 2 and s.answer == tuple(words) * times, s
        assert 1 <= len(s.answer) <= 40 and (s.image is None) == ("<image>" not in s.question)


def test_hard_fixture_ships_and_names_its_family():
    entry = get_entry("tiny-llada-v-hard")
    assert entry.bundled == HARD_FIXTURE_DIR and entry.repo_id is None
    sizes = {p.name: p.stat().st_size for p in HARD_FIXTURE_DIR.iterdir()}
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "training.json"):
        assert name in sizes, f"{name} missing from {HARD_FIXTURE_DIR}"
    assert sizes["model.safetensors"] <= 10 * 2**20
    assert json.loads((HARD_FIXTURE_DIR / "config.json").read_text())[FAMILY_KEY] == "hard"
    assert json.loads((HARD_FIXTURE_DIR / "training.json").read_text())["family"] == "hard"
    assert FAMILY_KEY not in json.loads((FIXTURE_DIR / "config.json").read_text())  # the first fixture: unchanged
    assert fixture_family(HARD_FIXTURE_DIR) == "hard" and fixture_family(FIXTURE_DIR) == DEFAULT_FAMILY


def test_both_fixtures_ship_the_tokenizer_the_trainer_writes(tmp_path):
    build_tokenizer().save(str(tmp_path / "tokenizer.json"))
    written = json.loads((tmp_path / "tokenizer.json").read_text())
    for folder in (FIXTURE_DIR, HARD_FIXTURE_DIR):
        assert json.loads((folder / "tokenizer.json").read_text()) == written, folder


@pytest.fixture(scope="module")
def hard():
    model, folder = load("tiny-llada-v-hard")  # strict: every tensor present, none unexpected
    model.eval()
    return model, TaskEncoder(folder, model.config)


def test_hard_fixture_loads_strictly_with_a_calibration(hard):
    model, enc = hard
    data = json.loads((HARD_FIXTURE_DIR / "config.json").read_text())
    assert model.config.seer == SeerConfig.from_dict(data["seer"]) and model.config.seer.label == "calibrated"
    assert model.config.generation.gen_length == data["generation"]["gen_length"]
    assert enc.family == "hard"


def test_hard_tokenizer_covers_its_family_words(hard):
    _, enc = hard
    vocab = enc.tokenizer.get_vocab()
    for s in held_out(300, family="hard"):
        words = s.question.replace("<image>\n", "").split() + list(s.answer)
        assert all(w in vocab for w in words), [w for w in words if w not in vocab]
        assert len(enc.answer_ids(s)) == len(s.answer) + 1


def first_step_top1(model, enc, samples, n=64) -> np.ndarray:
    """Step zero's top-1 probability at each true answer position (the end tokens banned, as the sampler does)."""
    with torch.no_grad():
        prefix, valid = enc.prefix(model, samples)
        logits = step_zero(model, prefix, valid, n, enc.special, ()).logits.double()
    logits[..., list(enc.special.suppressed_ids)] = float("-inf")
    top = torch.softmax(logits, -1).amax(-1).numpy()  # [B, N]
    return np.concatenate([row[: len(s.answer)] for row, s in zip(top, samples, strict=True)])


def test_hard_fixture_is_less_sure_at_step_zero_than_the_first(hard):
    """What the second fixture is for: at step zero the first is sure of nearly every answer token, this one is not."""
    model, enc = hard
    p_hard = first_step_top1(model, enc, held_out(30, 11, "hard"))
    shapes, folder = load("tiny-llada-v")
    p_shapes = first_step_top1(shapes.eval(), TaskEncoder(folder, shapes.config), held_out(30, 11))
    assert np.median(p_shapes) > 0.99 and np.median(p_hard) < 0.95, (np.median(p_shapes), np.median(p_hard))
