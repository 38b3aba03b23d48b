"""``seer-run --input`` streams (issue 42): it reads, answers and writes a group of lines at a time, so its memory does
not grow with the file; results keep input order with failed lines in their place, ``--output`` is never
half-written, and ``--input -`` / stdout stream too. Over a stand-in pipeline that records every ``generate`` call
(the fast tier), and once over the fixture export (slow)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import types
from pathlib import Path

import pytest
from cli_capture import cli

from seer_trt.cli import run
from seer_trt.cli.run import GROUP_BATCHES, answer_in_groups, main, read_requests
from seer_trt.contracts.errors import InputError
from seer_trt.runtime.request import Request, Result

BATCH = (1, 2, 4)  # the stand-in's batch buckets: a group is GROUP_BATCHES x 4 lines
GROUP = GROUP_BATCHES * BATCH[-1]


class Recorder:
    """A pipeline stand-in: answers a prompt with itself, fails the prompt "bad" at run time, records each call's
    size, and runs ``hook(call number)`` before answering."""

    def __init__(self, hook=None) -> None:
        self.calls: list[int] = []
        self.hook = hook or (lambda n: None)
        self.buckets = types.SimpleNamespace(batch=BATCH)
        self.prompts = types.SimpleNamespace(max_chars=1000)

    def settings(self, **fields) -> None:
        pass

    def generate(self, requests: list[Request]) -> list[Result]:
        self.calls.append(len(requests))
        self.hook(len(self.calls))
        return [Result.failed("too long for its bucket") if r.prompt == "bad" else
                Result(r.prompt, (1,), (1,), 1, 1, 64, {}) for r in requests]  # fmt: skip


def lines(n: int) -> list[str]:
    """``n`` request lines: every 7th not JSON, every 11th a bad field, every 13th failing at run time."""
    out = []
    for i in range(1, n + 1):
        if i % 7 == 0:
            out.append("{not json")
        elif i % 11 == 0:
            out.append(json.dumps({"prompt": f"q{i}", "temperature": "hot"}))
        elif i % 13 == 0:
            out.append(json.dumps({"prompt": "bad"}))
        else:
            out.append(json.dumps({"prompt": f"q{i}"}))
    return out


def answered(n: int) -> int:
    """How many of ``lines(n)`` are answered."""
    return sum(1 for i in range(1, n + 1) if i % 7 and i % 11 and i % 13)


def check_results(results: list[dict], n: int) -> None:
    """One result per line, in input order, each failure naming its own line."""
    assert len(results) == n
    for i, r in enumerate(results, 1):
        if i % 7 == 0:
            assert r["error"] == f"line {i}: not JSON (Expecting property name enclosed in double quotes)", r
        elif i % 11 == 0:
            assert r["error"].startswith(f"line {i}: ") and "temperature is 'hot'" in r["error"], r
        elif i % 13 == 0:
            assert r["error"] == f"line {i}: too long for its bucket", r
        else:
            assert r["error"] is None and r["text"] == f"q{i}", r


@pytest.fixture
def stand_in(monkeypatch):
    """seer-run over a ``Recorder`` instead of an export; returns a function that sets the recorder's hook."""
    from seer_trt.runtime.pipeline import SeerPipeline

    made: list[Recorder] = []

    def from_manifest(folder, **options):
        return made[-1]

    monkeypatch.setattr(SeerPipeline, "from_manifest", staticmethod(from_manifest))

    def use(hook=None) -> Recorder:
        made.append(Recorder(hook))
        return made[-1]

    return use


def test_groups_are_bounded_lazy_and_in_input_order():
    """``generate`` never takes more than a group's lines, each group is read only when the one before it is
    written, and every result lands in its line's place."""
    n, group, read = 60, 8, []

    def records():
        for i, text in enumerate(lines(n), 1):
            read.append(i)
            yield i, (json.loads(text) if text != "{not json" else f"line {i}: not JSON (Expecting property name "
                      f"enclosed in double quotes)")  # fmt: skip

    pipe = Recorder()
    results = []
    for chunk in answer_in_groups(pipe, read_requests(records(), {}), group):
        assert len(read) <= len(results) + group  # nothing read past the group being answered
        results += chunk
    check_results([r.to_dict() for r in results], n)
    assert pipe.calls and max(pipe.calls) <= group and sum(pipe.calls) == n - n // 7 - n // 11 + n // 77
    assert len(pipe.calls) == -(-n // group)  # one call per group: every group holds a valid line here


def test_the_cli_streams_its_output_file_through_one_staging_file(stand_in, tmp_path):
    n = 5 * GROUP + 3
    (tmp_path / "in.jsonl").write_text("\n".join(lines(n)) + "\n")
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")
    seen = []

    def hook(call: int) -> None:  # while it runs, the previous output stays whole and one staging file grows
        seen.append((out.read_text(), sorted(p.name.split("-")[0] for p in tmp_path.glob(".out.jsonl.partial-*"))))

    pipe = stand_in(hook)
    rc, stdout, err = cli(main, ["--engines", "unused", "--input", str(tmp_path / "in.jsonl"), "--output", str(out)])
    assert rc == 1 and stdout == "" and f"{answered(n)} answered, {n - answered(n)} failed" in err, err
    assert max(pipe.calls) <= GROUP and len(pipe.calls) == 6
    assert seen == [("previous\n", [".out.jsonl.partial"])] * 6
    check_results([json.loads(line) for line in out.read_text().splitlines()], n)
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "out.jsonl"]


@pytest.mark.parametrize("failure", [KeyboardInterrupt, OSError(28, "No space left on device")])
def test_a_run_that_fails_halfway_leaves_the_previous_output(stand_in, tmp_path, failure):
    (tmp_path / "in.jsonl").write_text("\n".join(lines(4 * GROUP)) + "\n")
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")

    def hook(call: int) -> None:
        if call == 3:
            raise failure

    stand_in(hook)
    rc, _, err = cli(main, ["--engines", "unused", "--input", str(tmp_path / "in.jsonl"), "--output", str(out)])
    assert rc == (130 if failure is KeyboardInterrupt else 2) and len(err.strip().splitlines()) == 1, err
    assert out.read_text() == "previous\n" and sorted(os.listdir(tmp_path)) == ["in.jsonl", "out.jsonl"]


def test_stdin_and_stdout_stream_a_group_at_a_time(stand_in, monkeypatch):
    """With ``--input -`` and no ``--output``, a group's results are on stdout before the next group is answered."""
    n = 3 * GROUP
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(("\n".join(lines(n)) + "\n").encode())))
    printed, seen = io.StringIO(), []
    stand_in(lambda call: seen.append(printed.getvalue().count("\n")))
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
        rc = main(["--engines", "unused", "--input", "-"])
    assert rc == 1 and seen == [0, GROUP, 2 * GROUP], seen
    check_results([json.loads(line) for line in printed.getvalue().splitlines()], n)


def test_an_input_that_holds_no_request_writes_nothing(stand_in, tmp_path):
    (tmp_path / "in.jsonl").write_text("\n\n")
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")
    pipe = stand_in()
    rc, stdout, err = cli(main, ["--engines", "unused", "--input", str(tmp_path / "in.jsonl"), "--output", str(out)])
    assert rc == 2 and "holds no requests; write one JSON object per line" in err and pipe.calls == []
    assert out.read_text() == "previous\n" and sorted(os.listdir(tmp_path)) == ["in.jsonl", "out.jsonl"]


def test_output_paths_are_resolved_before_they_are_compared_or_replaced(stand_in, tmp_path, monkeypatch):
    """The output is never the input (named relatively, or through a link); a link is followed, so it stays a link
    and its target gets the results; an output that is no regular file (/dev/null) is written, not replaced."""
    monkeypatch.chdir(tmp_path)
    Path("in.jsonl").write_text("\n".join(lines(3)) + "\n")
    Path("link.jsonl").symlink_to(tmp_path / "in.jsonl")
    stand_in()
    for output in ("in.jsonl", str(tmp_path / "in.jsonl"), "./sub/../in.jsonl", "link.jsonl"):
        Path("sub").mkdir(exist_ok=True)
        rc, _, err = cli(main, ["--engines", "unused", "--input", "in.jsonl", "--output", output])
        assert rc == 2 and f"--output {Path(output)} is the --input file (in.jsonl)" in err, err
    assert Path("in.jsonl").read_text() == "\n".join(lines(3)) + "\n"
    Path("results.jsonl").write_text("previous\n")
    Path("out-link.jsonl").symlink_to("results.jsonl")
    rc, _, err = cli(main, ["--engines", "unused", "--input", "in.jsonl", "--output", "out-link.jsonl"])
    assert rc == 0 and Path("out-link.jsonl").is_symlink(), err
    check_results([json.loads(line) for line in Path("results.jsonl").read_text().splitlines()], 3)
    rc, _, err = cli(main, ["--engines", "unused", "--input", "in.jsonl", "--output", os.devnull])
    assert rc == 0 and Path(os.devnull).is_char_device(), err
    with pytest.raises(InputError, match="is the --input file"):
        run.check_output(Path("link.jsonl"), source=Path("in.jsonl"))


@pytest.mark.slow
def test_the_fixture_export_answers_a_file_in_bounded_groups(fixture_export, tmp_path, monkeypatch):
    """Over the real pipeline: ``generate`` takes at most GROUP_BATCHES x the largest batch bucket, and the answers
    are those of the lines one at a time (the fixture's answers to these prompts sit far from any border)."""
    from seer_trt.runtime.pipeline import SeerPipeline

    folder, manifest, _ = fixture_export
    group = GROUP_BATCHES * manifest.buckets.batch[-1]
    prompts = ["count to 3 .", "repeat cat 2 times .", "count to 5 ."]
    rows = [json.dumps({"prompt": prompts[i % 3]}) for i in range(group + 5)]
    rows[3], rows[group + 1] = "{not json", json.dumps({"prompt": " "})
    (tmp_path / "in.jsonl").write_text("\n".join(rows) + "\n")
    sizes = []
    real = SeerPipeline.generate
    monkeypatch.setattr(SeerPipeline, "generate", lambda self, rs, *a: (sizes.append(len(rs)), real(self, rs, *a))[1])
    out = tmp_path / "out.jsonl"
    rc, _, err = cli(main, ["--engines", str(folder), "--input", str(tmp_path / "in.jsonl"), "--output", str(out),
                            "--threads", "1"])  # fmt: skip
    assert rc == 1 and f"{group + 3} answered, 2 failed" in err, err
    assert sizes == [group - 1, 5]  # the line that is not JSON never reaches generate
    results = [json.loads(line) for line in out.read_text().splitlines()]
    want = {p: r.text for p, r in zip(prompts, SeerPipeline.from_manifest(folder).generate(prompts), strict=True)}
    for i, (row, r) in enumerate(zip(rows, results, strict=True), 1):
        if i == 4:
            assert r["error"].startswith("line 4: not JSON")
        elif i == group + 2:
            assert r["error"] == f"line {group + 2}: the prompt is empty; send the question as text"
        else:
            assert r["error"] is None and r["text"] == want[json.loads(row)["prompt"]], (i, r)
