"""easy-vqa through its own package (``seer_trt.eval.easy_vqa``): a few questions load with their pictures and answers
in the dataset's order; a missing package names the extra to install; calibration's parts come from the train split
and never overlap; the fixture's tokenizer reads every question whole; ``seer-eval --dataset`` refuses what it
cannot score."""

import builtins

import easy_vqa as ev  # the eval extra (installed with .[all], as CI does)
import numpy as np
import pytest

from seer_trt.contracts.errors import ConfigError
from seer_trt.eval import easy_vqa


def test_a_few_test_questions_load_in_the_datasets_order():
    questions, answers, image_ids = ev.get_test_questions()
    samples = easy_vqa.load("test", limit=5)
    assert len(samples) == 5
    for s, q, a in zip(samples, questions, answers, strict=False):
        assert s.question == f"<image>\n{q}"
        assert s.answer == (a,)
        assert s.task == easy_vqa.answer_type(a)
        assert s.image.shape == (64, 64, 3) and s.image.dtype == np.uint8
    assert len(easy_vqa.load("train", limit=3)) == 3


def test_answer_types_cover_the_thirteen_answers():
    types = {a: easy_vqa.answer_type(a) for a in ev.get_answers()}
    assert len(types) == 13
    assert sorted(a for a, t in types.items() if t == "yes/no") == ["no", "yes"]
    assert sorted(a for a, t in types.items() if t == "shape") == ["circle", "rectangle", "triangle"]
    assert sum(t == "colour" for t in types.values()) == 8


@pytest.mark.parametrize(("split", "limit", "words"), [("dev", None, "no split 'dev'"), ("test", 0, "--limit 0")])
def test_a_bad_split_or_limit_is_one_clear_error(split, limit, words):
    with pytest.raises(ConfigError, match=words):
        easy_vqa.load(split, limit)


def test_a_missing_package_names_the_extra(monkeypatch):
    real = builtins.__import__

    def no_easy_vqa(name, *args, **kwargs):
        if name == "easy_vqa":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_easy_vqa)
    with pytest.raises(ConfigError, match=r"pip install 'seer-trt\[eval\]'"):
        easy_vqa.load("test", 1)


def test_calibration_parts_are_disjoint_train_questions():
    parts = easy_vqa.disjoint_parts("train", 50, 3)
    keys = [{(s.question, s.image.tobytes()) for s in part} for part in parts]
    assert [len(p) for p in parts] == [50, 50, 50]
    assert not (keys[0] & keys[1]) and not (keys[1] & keys[2]) and not (keys[0] & keys[2])
    with pytest.raises(ConfigError, match="lower --n"):
        easy_vqa.disjoint_parts("train", 20_000, 3)


def test_the_majority_answer_comes_from_the_train_split():
    assert easy_vqa.majority_answer("train") == "yes"


def test_the_fixture_tokenizer_reads_every_question_whole():
    from seer_export.reference.fixture import build_tokenizer

    tok = build_tokenizer("llada-v", easy_vqa.DATASET)
    unk = tok.token_to_id("[UNK]")
    questions = ev.get_test_questions()[0][:500] + ev.get_train_questions()[0][:500]
    for q in questions:
        ids = tok.encode(q, add_special_tokens=False).ids
        assert unk not in ids, q
    assert tok.encode("what is the blue shape?", add_special_tokens=False).tokens == [
        "what", "is", "the", "blue", "shape", "?"
    ]  # fmt: skip
    for answer in ev.get_answers():
        assert tok.token_to_id(answer) is not None


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--limit", "5"], "--limit 5 counts a dataset's questions; pass --dataset easy-vqa"),
        (["--dataset", "easy-vqa", "--limit", "0"], "--limit must be >= 1"),
        (["--settings", "reuse"], "--settings reuse picks --decoding's settings; pass --decoding RULES too"),
        (["--decoding", "factor:1", "--settings", "reuse,fast"], "--settings ['fast']: expected a comma-separated"),
    ],
)
def test_seer_eval_refuses_a_limit_or_settings_it_cannot_use(tmp_path, capsys, argv, words):
    from seer_trt.cli.eval import main

    assert main(["--engines", str(tmp_path / "no-export"), *argv]) != 0
    assert words in capsys.readouterr().err


@pytest.mark.slow
def test_seer_eval_scores_the_bundled_vqa_fixture_on_a_few_test_questions(tmp_path, capsys):
    """seer-export --model tiny-llada-v-vqa, then seer-eval --dataset easy-vqa: every mode answers from the
    dataset's words, the majority baseline is printed, and --settings runs only the settings named."""
    import json

    from seer_export.cli import main as export
    from seer_trt.cli.eval import main as evaluate

    engines = tmp_path / "vqa"
    assert export(["--model", "tiny-llada-v-vqa", "--out", str(engines), "--samples", "2"]) == 0
    report = tmp_path / "modes.json"
    argv = ["--engines", str(engines), "--dataset", "easy-vqa", "--limit", "6", "--threads", "1"]
    assert evaluate([*argv, "--json", str(report)]) == 0
    out = json.loads(report.read_text())
    assert out["n"] == 6 and out["dataset"] == "easy-vqa" and out["split"] == "test"
    assert set(out["modes"]) == {"padded", "early_stop", "seer", "oracle"}
    assert sum(v["n"] for v in out["modes"]["padded"]["exact_by_task"].values()) == 6
    assert "majority-answer baseline" in capsys.readouterr().out
    slices = [tmp_path / f"slice-{i}.json" for i in range(3)]
    for i, path in enumerate(slices):
        assert evaluate([*argv, "--shard", f"{i}/3", "--json", str(path)]) == 0
    merged = tmp_path / "merged.json"
    assert evaluate(["--merge", *map(str, reversed(slices)), "--json", str(merged)]) == 0
    whole = json.loads(merged.read_text())
    assert whole["modes"] == out["modes"] and whole["n"] == 6 and whole["shards"]["complete"]
    assert whole["majority_baseline"] == pytest.approx(out["majority_baseline"])
    assert evaluate(["--merge", str(slices[0]), str(slices[2])]) == 0
    assert "PARTIAL: slices [0, 2] of 3 (4 of 6 prompts; missing [1])" in capsys.readouterr().out
    assert evaluate([*argv, "--decoding", "factor:1", "--settings", "reuse,seer_reuse", "--json", str(report)]) == 0
    rows = json.loads(report.read_text())["rows"]
    assert [(r["decoding"], r["setting"]) for r in rows] == [("factor:1", "reuse"), ("factor:1", "seer_reuse")]
    assert rows[0]["premature_cut_rate"] is None and rows[1]["against_uncut"]["uncut"] == "reuse"


def test_every_llada_v_fixture_defaults_to_the_products_rule():
    """A fixture's config.json gives the decoding rule its exports run by default: LLaDA-V's fixtures the product's
    (factor:1), as the README says; the trainer's config writes it (the vqa fixture once wrote "fixed")."""
    from seer_export.models.config import DiffusionMLLMConfig
    from seer_export.models.registry import FIXTURE_DIR
    from seer_export.reference.fixture import fixture_config
    from seer_trt.contracts.config import DEFAULT_DECODING

    folders = sorted(FIXTURE_DIR.parent.glob("tiny-llada-v*/config.json"))
    assert len(folders) >= 3
    for path in folders:
        assert DiffusionMLLMConfig.from_file(path).generation.decoding == DEFAULT_DECODING, path
    assert fixture_config(38, 64, 64, 16).to_dict()["generation"]["decoding"] == DEFAULT_DECODING
