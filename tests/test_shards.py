"""``seer-eval --shard`` / ``--merge`` (``seer_trt.eval.shards``): slices cover every prompt once, and a merge refuses
what is not one run's slices. The merged table equals the whole run's: tests/test_easy_vqa.py (slow, an export)."""

import json

import pytest

from seer_trt.contracts.errors import ConfigError
from seer_trt.eval import shards
from seer_trt.eval.accuracy import merge


@pytest.mark.parametrize(("total", "count"), [(10, 3), (9673, 8), (5, 5), (7, 1)])
def test_slices_cover_every_prompt_once_in_order(total, count):
    covered = [i for k in range(count) for i in range(*shards.bounds(total, (k, count)))]
    assert covered == list(range(total))


@pytest.mark.parametrize(("text", "words"), [("1-4", "expected I/N"), ("4/4", "0 <= I < N"), ("0/0", "0 <= I < N"),
                                             ("-1/2", "0 <= I < N"), ("a/b", "expected I/N")])  # fmt: skip
def test_a_bad_shard_is_one_clear_error(text, words):
    with pytest.raises(ConfigError, match=words):
        shards.parse(text)


def test_more_slices_than_prompts_is_refused():
    assert shards.select(list("abcde"), (4, 5)) == (4, ["e"])
    with pytest.raises(ConfigError, match="at most 2 slices"):
        shards.select(["a", "b"], (0, 3))


def slice_report(index: int, count: int = 2, **changes) -> dict:
    report = {"model": "m", "seed": 7, "dataset": "easy-vqa", "split": "test", "gen_length": 64, "seer": {"t": 1},
              "detector": "d", "engines": "E", "n": 1, "git": "abc", "majority_baseline": None,
              "shard": {"index": index, "count": count, "first": index, "n": 1, "total": count},
              "answers": {"truth": [[5]], "task": ["yes/no"],
                          "modes": {"padded": [[[5], 64, 64]], "seer": [[[5 + index], 2, 2]]}}}  # fmt: skip
    return {**report, **changes}


def write(tmp_path, name: str, report: dict):
    path = tmp_path / name
    path.write_text(json.dumps(report))
    return path


def test_merge_recomputes_the_table_from_every_answer(tmp_path):
    paths = [write(tmp_path, f"{i}.json", slice_report(i)) for i in (1, 0)]
    out = merge(paths)
    assert out["n"] == 2 and out["shards"]["complete"] and out["shards"]["merged"] == [0, 1]
    assert out["modes"]["padded"]["exact_match"] == 1.0
    assert out["modes"]["seer"]["exact_match"] == 0.5  # slice 1's Seer answer is wrong: read from its answers
    assert out["modes"]["seer"]["against_padded"]["only_a"] == 1


@pytest.mark.parametrize(
    ("second", "words"),
    [(slice_report(1, gen_length=128), "gen_length is 128"), (slice_report(0), r"slice\(s\) \[0\] given twice"),
     (slice_report(1, count=3), "count is 3"), ({"modes": {}}, "not a slice's report")],
)  # fmt: skip
def test_a_merge_of_slices_of_different_runs_is_refused(tmp_path, second, words):
    paths = [write(tmp_path, "a.json", slice_report(0)), write(tmp_path, "b.json", second)]
    with pytest.raises(ConfigError, match=words):
        merge(paths)


def test_a_missing_or_corrupt_slice_is_named(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        merge([tmp_path / "none.json"])
    with pytest.raises(ConfigError, match="not readable JSON"):
        merge([write(tmp_path, "a.json", slice_report(0)), tmp_path / "cut.json"])


@pytest.fixture(autouse=True)
def _cut_file(tmp_path):
    (tmp_path / "cut.json").write_text('{"shard": ')  # a slice's report cut short


@pytest.mark.parametrize("table", [[], ["--cache", "reuse"], ["--shard", "0/2"]])
def test_seer_eval_threads_reach_the_pipeline_of_every_table(monkeypatch, tmp_path, table):
    """--threads 1 is how slices share a machine's cores: the modes and cache tables once ignored it (ONNX Runtime
    then took every core in each slice's process)."""
    from seer_trt.cli.eval import main
    from seer_trt.runtime.pipeline import SeerPipeline

    seen = {}

    def opened(engines, **options):
        seen.update(options)
        raise ConfigError("stop here")

    monkeypatch.setattr(SeerPipeline, "from_manifest", staticmethod(opened))
    assert main(["--engines", str(tmp_path), "--threads", "1", *table]) != 0
    assert seen["threads"] == 1


@pytest.mark.parametrize("table", [[], ["--cache", "reuse"], ["--decoding", "factor:1"], ["--shard", "0/2"]])
def test_a_report_names_the_commit_it_started_on(monkeypatch, tmp_path, table):
    """A slice runs for half an hour: the commit is read before the run, so one landing meanwhile is not named."""
    from seer_trt.cli.eval import main
    from seer_trt.eval import accuracy
    from seer_trt.runtime.pipeline import SeerPipeline

    order = []

    def opened(engines, **options):
        order.append("run")
        raise ConfigError("stop here")

    monkeypatch.setattr(accuracy, "git_sha", lambda: order.append("git") or "abc1234")
    monkeypatch.setattr(SeerPipeline, "from_manifest", staticmethod(opened))
    assert main(["--engines", str(tmp_path), *table]) != 0
    assert order == ["git", "run"]
