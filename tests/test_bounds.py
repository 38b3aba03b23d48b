"""Bounded before work (issue 24): no request makes the runtime take memory or time that grows with an input past
what the export can use, ``--force`` never deletes a user's file, a signal is never lost, and errors say the right
thing. The C++ reader's cases are in tests/test_cpp.py, the Triton server's in tests/test_triton.py; the earlier
catalogue (issue 16) is tests/test_bad_inputs.py.

Memory and time are asserted as bounds on a refusal (a check that reads the input's length must not cost what
tokenizing it would), measured in a child process: its peak RSS (``ru_maxrss``) against a control run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from cli_capture import cli
from ort_sessions import telemetry_env
from PIL import Image

from seer_trt.cli import launch
from seer_trt.cli.common import check_output, jsonl_line_limit, read_jsonl, write_output
from seer_trt.cli.prompt_ids import main as prompt_ids_main
from seer_trt.cli.run import main as run_main
from seer_trt.cli.triton import main as triton_main
from seer_trt.contracts import outfolder, signals
from seer_trt.contracts.errors import ConfigError, InputError
from seer_trt.contracts.geometry import parse_pinpoints
from seer_trt.contracts.manifest import VisionInfo
from seer_trt.contracts.outfolder import FolderError, check_target, foreign_entries, replace_folder
from seer_trt.runtime.image import ImageLimits, decoded_pixel_limit, load_image
from seer_trt.runtime.prompt import PromptFormat, longest_token

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "export" / "fixtures" / "tiny-llada-v"
BIG = 50_000_000  # a 50 MB prompt
MB = 2**20


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def child(code: str, timeout: float = 300) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object last."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=timeout)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def peak_mb() -> str:
    return "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024"


# --- what a checkpoint's config.json or an export's manifest says is bounded before any work (issue 42) ------------


def test_a_config_or_a_calibration_past_its_bounds_is_one_line_before_any_work(tmp_path):
    """A config.json of a million layers (seer-export built layers at 50 MB/s until killed) is refused against the
    checkpoint's tensors before torch is imported; a manifest asking the cost model's calibration for 10^9 repeats
    (seer-serve never listened) is refused before ONNX Runtime is: one line each, exit 2."""
    from test_manifest import edited, make_manifest

    ckpt = shutil.copytree(FIXTURE, tmp_path / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1_000_000}))
    export = tmp_path / "engines"
    export.mkdir()
    data = edited(make_manifest("float32").to_dict(), "cost_calibration.repeats", 10**9)
    (export / "manifest.json").write_text(json.dumps(data))
    runs = {
        "seer_export.cli": (["--checkpoint", str(ckpt), "--out", str(tmp_path / "out"), "--no-validate"],
                            "num_hidden_layers 1000000 (decoder layers), the tensors hold 8"),
        "seer_trt.cli.serve": (["--engines", str(export), "--port", "0"],
                               "calibration repeats must be a whole number in [1, 20]"),
    }  # fmt: skip
    for module, (argv, message) in runs.items():
        found = child(f"""
            import contextlib, io, json, sys
            from {module} import main
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                rc = main({argv!r})
            print(json.dumps({{"rc": rc, "err": err.getvalue(), "heavy": sorted({{"torch", "onnxruntime"}} & set(sys.modules))}}))
        """)  # fmt: skip
        assert found["rc"] == 2 and message in one_line(found["err"]) and found["heavy"] == [], (module, found)
    assert not (tmp_path / "out").exists()


def test_an_oversized_or_undecodable_config_json_is_one_line_before_it_is_read(tmp_path, monkeypatch):
    """A config.json past MAX_CONFIG_BYTES is refused from its size (never parsed); one that is not UTF-8 is refused
    as unreadable, not with a traceback."""
    from seer_trt.contracts import config as contract

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"pad": "x" * contract.MAX_CONFIG_BYTES}))
    parsed = []
    monkeypatch.setattr(contract.json, "loads", lambda *a, **k: parsed.append(a) or {})
    with pytest.raises(ConfigError, match=f"bytes, more than the {contract.MAX_CONFIG_BYTES} a model's configuration"):
        contract.read_json(path)
    assert parsed == []
    monkeypatch.undo()
    path.write_bytes(b'{"name": "\xff\xfe"}')
    with pytest.raises(ConfigError, match="is not readable JSON"):
        contract.read_json(path)


# --- prompt text is bounded before templating and tokenizing ----------------------------------------------------


def test_the_character_bound_holds_every_prompt_the_bucket_can_take():
    """``max_chars`` is an upper bound: no text of more characters can fit the bucket (every id holds at most the
    longest token's characters), and text that fits is never refused by it."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(FIXTURE / "tokenizer.json"))
    longest = longest_token(tok)
    vocab = tok.get_vocab()
    word = max(vocab, key=len)  # a text made of the longest token, as densely as the vocabulary allows
    text = tok.decode([vocab[word]] * 50)
    assert len(text) <= 50 * longest and len(tok.encode(text, add_special_tokens=False).ids) >= len(text) / longest


def test_turns_are_bounded_and_rendering_is_linear_in_them(monkeypatch):
    """1,001 empty turns (issue 37: 23 s of CPU) are refused before any rendering; a conversation the bucket can hold
    renders in two template passes whatever its length, with the same pieces the per-content renders give; a
    template that changes content in another way still takes the per-content path."""
    from seer_trt.runtime.prompt import ChatFormat

    chat = ChatFormat.from_folder(FIXTURE)
    fmt = PromptFormat.__new__(PromptFormat)
    fmt.max_tokens, fmt.max_chars, fmt.max_turns = 512, 10**6, 128
    many = tuple(("user", "") if i % 2 == 0 else ("assistant", "") for i in range(1000))
    start = time.perf_counter()
    with pytest.raises(InputError, match="the conversation has 1001 turns, more than the 128 accepted"):
        fmt.check_length("count", None, many)
    assert time.perf_counter() - start < 1.0  # rendering them took 23 s
    renders = []
    real = ChatFormat._render
    monkeypatch.setattr(ChatFormat, "_render", lambda self, r, c: renders.append(1) or real(self, r, c))
    history = tuple((("user", f" q{i} ") if i % 2 == 0 else ("assistant", f"a{i} <|eot_id|>")) for i in range(126))
    pieces = chat.segments(" count to 3 . ", "you count .", history)
    assert len(renders) == 2
    roles, slots = ["system", *(r for r, _ in history), "user"], [f"\x00slot {i}\x00" for i in range(128)]
    base = real(chat, roles, slots)
    alone = [
        chat._placed_alone(roles, slots, base, i, text)
        for i, text in enumerate(["you count .", *(t for _, t in history), " count to 3 . "])
    ]
    assert [t for t, role in pieces if role is not None] == alone  # the per-content renders' placement
    calm = ChatFormat(chat.template.replace("| trim", "| trim | replace('!', '.')"), chat.bos_token)
    renders.clear()
    assert [t for t, role in calm.segments("q!", None, (("user", "a!"), ("assistant", "b"))) if role] == [
        "a.",
        "b",
        "q.",
    ]
    assert len(renders) == 2 + 3  # the per-content path


@pytest.mark.slow
def test_a_50_mb_prompt_is_refused_at_once_through_the_python_api(fixture_export):
    got = child(f"""
        import json, resource, time
        from seer_trt.runtime.pipeline import SeerPipeline
        from seer_trt.runtime.request import Request
        pipe = SeerPipeline.from_manifest({str(fixture_export[0])!r}, threads=1)
        pipe.generate([Request("count to 3 .")])
        text = "count " * ({BIG} // 6)
        before = {peak_mb()}
        t = time.perf_counter()
        bad, = pipe.generate([Request(text)])
        s = time.perf_counter() - t
        bad, good = pipe.generate([Request(text), Request("count to 3 .")])  # and it fails alone
        print(json.dumps(dict(s=s, grew=({peak_mb()}) - before, error=bad.error,
                              kind=bad.error_kind, good=good.text, limit=pipe.prompts.max_chars)))
    """)
    assert got["good"].startswith("1 2 3") and got["kind"] == "input"
    assert f"{BIG // 6 * 6} characters, more than the {got['limit']} accepted (max_prompt_chars" in got["error"]
    assert "largest prompt bucket" in got["error"]
    assert got["s"] < 1.0 and got["grew"] < 200, got  # refused before any work that grows with it


@pytest.mark.slow
def test_a_50_mb_jsonl_line_is_refused_with_bounded_memory(fixture_export, tmp_path):
    """The CLI reads a line no further than the bound: the 50 MB line is its own error, the others are answered,
    and the run's peak RSS is the control run's."""
    big = tmp_path / "big.jsonl"
    with big.open("w") as f:
        f.write(json.dumps({"prompt": "count to 3 ."}) + "\n")
        f.write('{"prompt": "' + "count " * (BIG // 6) + '"}\n')
        f.write(json.dumps({"prompt": "repeat cat 2 times ."}) + "\n")
    small = tmp_path / "small.jsonl"
    small.write_text(
        json.dumps({"prompt": "count to 3 ."}) + "\n" + json.dumps({"prompt": "repeat cat 2 times ."}) + "\n"
    )
    runs = {}
    for name, path in (("control", small), ("big", big)):
        runs[name] = child(f"""
            import json, resource, sys, time
            from seer_trt.cli.run import main
            t = time.perf_counter()
            rc = main(["--engines", {str(fixture_export[0])!r}, "--input", {str(path)!r}, "--output",
                       {str(tmp_path / (name + ".out"))!r}, "--threads", "1"])
            print(json.dumps(dict(rc=rc, s=time.perf_counter() - t, peak={peak_mb()})))
        """)
    results = [json.loads(line) for line in (tmp_path / "big.out").read_text().splitlines()]
    assert runs["big"]["rc"] == 1 and [r["error"] is None for r in results] == [True, False, True]
    assert results[1]["error"].startswith("line 2: ") and "a request line may hold" in results[1]["error"]
    assert runs["big"]["peak"] - runs["control"]["peak"] < 200, runs
    t = time.perf_counter()
    assert read_jsonl(big, jsonl_line_limit(9728))[1][1].startswith("line 2: ")
    assert time.perf_counter() - t < 3.0  # the line is skipped in bounded chunks, never parsed


def test_jsonl_lines_past_the_bound_fail_alone_and_the_rest_are_read(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n' + b'{"prompt": "' + b"x" * 5000 + b'"}\n\n{"prompt": "b"}')
    got = read_jsonl(path, 1000)
    assert [n for n, _ in got] == [1, 2, 4] and got[0][1] == {"prompt": "a"} and got[2][1] == {"prompt": "b"}
    assert got[1][1].startswith("line 2: 5014 bytes, more than the 1000 a request line may hold")
    assert jsonl_line_limit(10) == 120 + 2**16
    with pytest.raises(InputError, match="is a folder"):
        read_jsonl(tmp_path, 1000)


# --- images: regular files only, decoded no larger than the model can use ---------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are a POSIX feature")
def test_a_fifo_image_is_refused_without_waiting(tmp_path):
    fifo = tmp_path / "image.png"
    os.mkfifo(fifo)
    t = time.perf_counter()
    with pytest.raises(InputError, match="is a FIFO, not a regular file"):
        load_image(fifo, ImageLimits(10**6, 10**6))
    assert time.perf_counter() - t < 5  # open(2) on a FIFO without a writer would block forever
    with pytest.raises(InputError, match="is a folder"):
        load_image(tmp_path, ImageLimits(10**6, 10**6))


@pytest.mark.slow
def test_a_fifo_image_fails_its_request_alone(fixture_export, tmp_path):
    fifo = tmp_path / "image.png"
    os.mkfifo(fifo)
    lines = [{"prompt": "count to 3 .", "image": str(fifo)}, {"prompt": "count to 3 ."}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "out.jsonl"
    rc, _, err = cli(run_main, ["--engines", str(fixture_export[0]), "--input", str(tmp_path / "in.jsonl"), "--output",
                                str(out)])  # fmt: skip
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert rc == 1 and results[0]["error"].startswith("line 1: image ") and "FIFO" in results[0]["error"]
    assert results[1]["text"].startswith("1 2 3")


def test_the_decode_limit_follows_the_tiling(tmp_path):
    pad = VisionInfo(384, 14, 729, "pad", "flat", (), None, "none")
    grid = parse_pinpoints("(1x1),...,(6x6)", 384)  # LLaDA-V's image_grid_pinpoints
    llada_v = VisionInfo(384, 14, 729, "anyres_max_4", "spatial_unpad", grid, 4, "unpad")
    assert decoded_pixel_limit(pad) == 2048 * 2048  # one 384 px tile: the floor
    assert decoded_pixel_limit(llada_v) == 4 * 2304 * 2304  # the largest grid, 6 x 6 tiles of 384 px
    limits = ImageLimits(50_000_000, 50 * MB, 2048 * 2048)
    png = tmp_path / "wide.png"
    Image.new("RGB", (7000, 7000)).save(png)  # 49 MP, a few hundred KB: decoding it whole took 734 MB
    assert png.stat().st_size < MB
    t = time.perf_counter()
    with pytest.raises(InputError, match=r"7000x7000 px and would decode to 49000000 pixels.*max_decoded_pixels"):
        load_image(png, limits)
    assert time.perf_counter() - t < 2  # refused from the header
    jpeg = tmp_path / "photo.jpg"
    Image.new("RGB", (6000, 4000), (200, 10, 10)).save(jpeg, quality=50)  # 24 MP: decodes at 1/4 scale
    pixels, original = load_image(jpeg, limits, needed=lambda size: (384, 384))
    assert original == (6000, 4000) and pixels.shape[0] * pixels.shape[1] <= 2048 * 2048
    assert ImageLimits.of(llada_v).decoded == 4 * 2304 * 2304
    assert (
        ImageLimits.of(VisionInfo(384, 14, 729, "pad", "flat", (), None, "none", max_decoded_pixels=10)).decoded == 10
    )


# --- --force replaces only what seer-trt wrote -------------------------------------------------------------------


def fake_export(folder: Path) -> None:
    """An export's files as ``replace_folder`` leaves them: the record lists them."""
    with replace_folder(check_target(folder, True, outfolder.is_export, legacy=outfolder.export_files)) as staging:
        (staging / "manifest.json").write_text(json.dumps({"schema_version": "2.2", "graphs": {
            "embed": {"file": "embed.onnx", "external_data": "weights.data"}}}))  # fmt: skip
        (staging / "embed.onnx").write_bytes(b"onnx")
        (staging / "weights.data").write_bytes(b"w")
        (staging / "tokenizer").mkdir()
        (staging / "tokenizer" / "tokenizer.json").write_text("{}")


@pytest.mark.parametrize("recorded", [True, False])
def test_force_refuses_an_export_holding_a_users_file_and_keeps_it(tmp_path, recorded):
    out = tmp_path / "export"
    fake_export(out)
    if not recorded:  # an export of an older seer-trt: its manifest says what is ours
        (out / outfolder.FILES_RECORD).unlink()
    assert foreign_entries(out, outfolder.export_files) == []
    check_target(out, True, outfolder.is_export, legacy=outfolder.export_files)  # ours alone: replaceable
    (out / "notes.txt").write_text("mine")
    (out / "my_results").mkdir()
    (out / "my_results" / "run1.json").write_text("{}")
    (out / "tokenizer" / "my_vocab.txt").write_text("mine too")
    (out / ".git").mkdir()
    with pytest.raises(FolderError) as err:
        check_target(out, True, outfolder.is_export, "--out", "an export", legacy=outfolder.export_files)
    message = str(err.value)
    assert ".git/, my_results/, notes.txt, tokenizer/my_vocab.txt" in message and "not even with --force" in message
    assert (out / "notes.txt").read_text() == "mine" and (out / "my_results" / "run1.json").is_file()


def test_a_nested_output_with_its_own_record_is_judged_by_it(tmp_path):
    out = tmp_path / "export"
    fake_export(out)
    engines = out / "tensorrt"
    with replace_folder(check_target(engines, True, lambda p: True, nested=True)) as staging:
        (staging / "denoise.plan").write_bytes(b"plan")
    assert foreign_entries(out, outfolder.export_files) == []
    (engines / "mine.txt").write_text("x")
    assert foreign_entries(out, outfolder.export_files) == ["tensorrt/mine.txt"]


def test_an_output_inside_an_export_or_repository_is_refused(tmp_path):
    out = tmp_path / "export"
    fake_export(out)
    with pytest.raises(FolderError, match=r"is inside an export .* choose a folder outside it"):
        check_target(out / "repo", False, outfolder.is_repository, "--out", legacy=outfolder.repository_files)
    repo = tmp_path / "repo"
    repo.mkdir()
    outfolder.write_repository_marker(repo, {"name": "seer"})
    with pytest.raises(FolderError, match="is inside a model repository"):
        check_target(repo / "sub" / "export", False, outfolder.is_export, legacy=outfolder.export_files)
    check_target(out / "tensorrt", True, lambda p: True, nested=True)  # seer-build's engine folder belongs there


@pytest.mark.slow
def test_seer_triton_force_keeps_a_users_file_and_refuses_an_export_as_parent(fixture_export, tmp_path):
    repo = tmp_path / "repo"
    argv = ["--engines", str(fixture_export[0]), "--out", str(repo), "--flavour", "cpu"]
    assert cli(triton_main, argv)[0] == 0
    (repo / "seer" / "my_notes.md").write_text("mine")
    rc, _, err = cli(triton_main, [*argv, "--force"])
    assert rc == 2 and "seer/my_notes.md" in one_line(err) and "not even with --force" in err
    assert (repo / "seer" / "my_notes.md").read_text() == "mine"
    (repo / "seer" / "my_notes.md").unlink()
    assert cli(triton_main, [*argv, "--force"])[0] == 0  # ours alone again: replaced
    export = tmp_path / "export"
    shutil.copytree(fixture_export[0], export)
    rc, _, err = cli(triton_main, ["--engines", str(export), "--out", str(export / "repo"), "--flavour", "cpu"])
    assert rc == 2 and "is inside an export" in one_line(err) and not (export / "repo").exists()


# --- signals are never lost --------------------------------------------------------------------------------------


def previous_output(tmp_path):
    """An output folder holding a previous repository, and the target that replaces it."""
    out = tmp_path / "out"
    out.mkdir()
    (out / outfolder.REPOSITORY_MARKER).write_text("previous")
    return out, check_target(out, True, outfolder.is_repository, legacy=outfolder.repository_files)


def test_a_swallowed_signal_is_delivered_again_and_the_previous_output_stays(tmp_path):
    """An exception raised inside a ``__del__`` (or caught by a library's broad ``except``) is lost; the signal is
    redelivered until it unwinds the block, and ``replace_folder`` refuses to swap in after one."""
    out, target = previous_output(tmp_path)
    swallowed = []
    t = time.perf_counter()
    with pytest.raises(signals.Interrupted) as err:
        with signals.signals_as_interrupts(), replace_folder(target) as staging:
            (staging / outfolder.REPOSITORY_MARKER).write_text("new")
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)  # the handler raises here...
            except BaseException as e:  # noqa: BLE001 - ...and a careless library swallows it
                swallowed.append(e)
            deadline = time.time() + 10
            while time.time() < deadline:  # work goes on: the redelivery must stop it
                time.sleep(0.01)
    assert swallowed and err.value.signum == signal.SIGTERM and time.perf_counter() - t < 5
    assert (out / outfolder.REPOSITORY_MARKER).read_text() == "previous" and sorted(os.listdir(tmp_path)) == ["out"]
    assert not signals._pending  # acted on: nothing left to redeliver
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_signal_swallowed_at_the_end_still_keeps_the_previous_output(tmp_path):
    out, target = previous_output(tmp_path)
    with pytest.raises(signals.Interrupted):
        with signals.signals_as_interrupts(), replace_folder(target) as staging:
            (staging / outfolder.REPOSITORY_MARKER).write_text("new")
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.1)
            except BaseException:  # noqa: BLE001, S110 - swallowed just before the block ends
                pass
    assert (out / outfolder.REPOSITORY_MARKER).read_text() == "previous"


def test_a_signal_turned_into_another_error_still_ends_as_the_signal(tmp_path):
    """torch.export's tracer catches the signal's exception and raises its own error (CI saw a TypeError about
    FakeTensors): the block must still end as the signal, not as an error exit."""
    out, target = previous_output(tmp_path)
    with pytest.raises(signals.Interrupted) as err:
        with signals.signals_as_interrupts(), replace_folder(target) as staging:
            (staging / outfolder.REPOSITORY_MARKER).write_text("new")
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)
            except BaseException as e:  # noqa: BLE001 - what a tracer does with it
                raise TypeError("unsupported operand type(s) for *: 'FakeTensor' and 'FakeTensor'") from e
    assert err.value.signum == signal.SIGTERM and isinstance(err.value.__cause__, TypeError)
    assert (out / outfolder.REPOSITORY_MARKER).read_text() == "previous" and sorted(os.listdir(tmp_path)) == ["out"]
    assert not signals._pending and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    with pytest.raises(TypeError):  # without a signal, the error stays itself
        with signals.signals_as_interrupts():
            raise TypeError("a plain error")


@pytest.mark.slow
def test_sigterm_just_after_the_vision_graph_stops_the_export(tmp_path):
    """The point the issue found the signal lost (the step-zero export starting): one line, the previous export
    kept, no staging folder."""
    out = tmp_path / "engines"
    fake_export(out)
    before = (out / "manifest.json").read_text()
    p = subprocess.Popen([sys.executable, "-m", "seer_export.cli", "--out", str(out), "--force", "--no-validate"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    seen = []
    for line in p.stdout:
        seen.append(line)
        if "exported vision.onnx" in line:
            time.sleep(1.0)
            p.send_signal(signal.SIGTERM)
            break
    _, err = p.communicate(timeout=300)
    assert seen and "exported vision.onnx" in seen[-1], seen
    assert p.returncode == 128 + signal.SIGTERM and "interrupted (SIGTERM)" in one_line(err), (
        p.returncode,
        err[-3000:],
    )
    assert (out / "manifest.json").read_text() == before and sorted(os.listdir(tmp_path)) == ["engines"]


def test_an_interrupt_during_start_up_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "interrupted_at_import.py").write_text("raise KeyboardInterrupt\n")
    (tmp_path / "failed_import.py").write_text(
        "try:\n    raise KeyboardInterrupt\nexcept KeyboardInterrupt:\n    raise ImportError('initialization failed')\n"
    )  # what Ctrl-C inside an extension module's import looks like
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in ("interrupted_at_import", "failed_import"):
        assert launch("seer-run", module) == 130
        assert one_line(capsys.readouterr().err) == "seer-run: interrupted (SIGINT) while starting; nothing was done"
    (tmp_path / "broken.py").write_text("raise ImportError('a real bug')\n")
    with pytest.raises(ImportError, match="a real bug"):  # only interrupts are turned into the line
        launch("seer-run", "broken")


def _start_seer_run(folder) -> subprocess.Popen:
    """seer-run in a child that says "go" on stderr from the console script's call on, after its one import line,
    which imports nothing but the launcher."""
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from seer_trt.cli import seer_run; sys.stderr.write('go\\n'); sys.stderr.flush(); "
            f"sys.argv[1:] = ['--engines', {str(folder)!r}, '--prompt', 'count to 3 .']; seer_run()")  # fmt: skip
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stderr.readline() == "go\n"
    return p


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5])
def test_sigterm_and_sigint_during_a_real_start_up_are_one_line(fixture_export, fraction):
    """During the command's imports, then while the pipeline opens; any command, not only those writing folders. The
    signal comes at a fraction of the time the whole command takes here, measured first: fixed delays meet the
    command's end (or the interpreter's exit, past the launcher) on a fast or an idle machine."""
    p = _start_seer_run(fixture_export[0])
    start = time.perf_counter()
    out, _ = p.communicate(timeout=120)
    whole = time.perf_counter() - start
    assert p.returncode == 0 and out.startswith("1 2 3")
    for signum in (signal.SIGINT, signal.SIGTERM):
        p = _start_seer_run(fixture_export[0])
        time.sleep(fraction * whole)
        p.send_signal(signum)
        out, err = p.communicate(timeout=120)
        if p.returncode == 0:  # finished first: only a run that went much faster than the measured one
            assert fraction == 0.5 and out.startswith("1 2 3")
            continue
        assert p.returncode == 128 + signum and f"interrupted ({signal.Signals(signum).name})" in one_line(err), err


# --- output files ------------------------------------------------------------------------------------------------


def test_output_files_are_checked_before_work_and_leave_nothing(tmp_path, monkeypatch):
    with pytest.raises(InputError, match="is a folder; name a file"):
        check_output(tmp_path)
    with pytest.raises(InputError, match=r"does not exist; create it first \(mkdir -p"):
        check_output(tmp_path / "missing" / "out.jsonl")
    assert not (tmp_path / "missing").exists()
    staged = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (staged.append(Path(src).name), real(src, dst)))
    write_output(tmp_path / "out.jsonl", "x\n")
    assert (tmp_path / "out.jsonl").read_text() == "x\n" and os.listdir(tmp_path) == ["out.jsonl"]
    assert staged[0].startswith(f".out.jsonl.partial-{os.getpid()}-")  # this process's own staging name
    monkeypatch.setattr(os, "replace", lambda src, dst: (_ for _ in ()).throw(OSError(28, "No space left")))
    with pytest.raises(OSError):
        write_output(tmp_path / "other.jsonl", "y\n")
    assert os.listdir(tmp_path) == ["out.jsonl"]  # the staging file went with the failure


@pytest.mark.slow
def test_run_and_prompt_ids_refuse_bad_outputs_and_conflicting_flags_up_front(fixture_export, tmp_path):
    engines = str(fixture_export[0])
    (tmp_path / "in.jsonl").write_text(json.dumps({"prompt": "count to 3 ."}) + "\n")
    cases = [
        (run_main, ["--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path)], "is a folder; name a file"),
        (run_main, ["--prompt", "count to 3 .", "--output", str(tmp_path / "o.jsonl")], "--output goes with --input"),
        (run_main, ["--input", str(tmp_path / "in.jsonl"), "--json"], "--json goes with --prompt"),
        (run_main, ["--prompt", "count to 3 .", "--cache", "reuse", "--refresh-interval", "0"],
         "refresh interval 0 (--refresh-interval"),
        (prompt_ids_main, ["--prompt", "hi", "--tiles", "/nonexistent/dir/t.npy", "--image", str(tmp_path / "x.png")],
         "the folder /nonexistent/dir does not exist"),
        (prompt_ids_main, ["--prompt", "hi", "--tiles", str(tmp_path / "t.npy")], "--image and --tiles go together"),
        (prompt_ids_main, ["--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path)], "is a folder"),
    ]  # fmt: skip
    for main, argv, words in cases:
        rc, out, err = cli(main, ["--engines", engines, *argv])
        assert rc == 2 and out == "" and words in one_line(err), (argv, err)
    assert not Path("/nonexistent/dir").exists()
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]  # nothing half-written, no staging file


@pytest.mark.slow
def test_prompt_ids_converts_the_good_lines_and_the_cpp_runner_gets_the_errors_in_place(fixture_export, tmp_path):
    png = tmp_path / "shapes.png"
    Image.fromarray(np.full((40, 40, 3), 255, np.uint8)).save(png)
    lines = [json.dumps({"prompt": "count to 3 ."}), "{not json", json.dumps({"prompt": "hi", "image": str(png)}),
             json.dumps({"prompt": ""})]  # fmt: skip
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "cpp.jsonl"
    rc, _, err = cli(prompt_ids_main, ["--engines", str(fixture_export[0]), "--input", str(tmp_path / "in.jsonl"),
                                       "--output", str(out), "--tiles-dir", str(tmp_path / "tiles")])  # fmt: skip
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert rc == 1 and "2 converted, 2 failed" in one_line(err)
    assert "prompt_ids" in got[0] and got[1]["error"].startswith("line 2: not JSON")
    assert Path(got[2]["image_tiles"]) == tmp_path / "tiles" / "3.npy" and np.load(got[2]["image_tiles"]).ndim == 4
    assert got[3]["error"] == "line 4: the prompt is empty; send the question as text"


@pytest.mark.slow
def test_run_time_jsonl_errors_name_their_line(fixture_export, tmp_path):
    lines = [{"prompt": "count to 3 ."}, {"prompt": "count to 3 .", "image": str(tmp_path / "missing.png")},
             {"prompt": "count " * 1500}]  # within the character bound, past the bucket once tokenized  # fmt: skip
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "out.jsonl"
    rc, _, _ = cli(run_main, ["--engines", str(fixture_export[0]), "--input", str(tmp_path / "in.jsonl"), "--output",
                              str(out)])  # fmt: skip
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert rc == 1 and got[0]["error"] is None
    assert got[1]["error"].startswith("line 2: image ") and "does not exist" in got[1]["error"]
    assert got[2]["error"].startswith("line 3: the prompt takes") and "largest prompt bucket" in got[2]["error"]


def test_max_prompt_chars_is_a_setting_checked_when_set():
    from types import SimpleNamespace

    from seer_trt.contracts.errors import ConfigError

    manifest = SimpleNamespace(tokenizer=FIXTURE.name, system_prompt=None, buckets=SimpleNamespace(prompt=(64,)),
                               vision=SimpleNamespace(placement="inline"))  # fmt: skip
    fmt = PromptFormat(FIXTURE.parent, manifest)
    assert fmt.max_tokens == 64 and fmt.max_chars == 64 * longest_token(fmt.tokenizer)
    assert PromptFormat(FIXTURE.parent, manifest, max_chars=100).max_chars == 100
    with pytest.raises(InputError, match="101 characters, more than the 100 accepted"):
        PromptFormat(FIXTURE.parent, manifest, max_chars=100).ids("x" * 101, False)
    with pytest.raises(InputError, match="the prompt and system message hold 101"):
        PromptFormat(FIXTURE.parent, manifest, max_chars=100).ids("x" * 51, False, "y" * 50)
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ConfigError, match="max_prompt_chars must be a positive integer"):
            PromptFormat(FIXTURE.parent, manifest, max_chars=bad)


@pytest.mark.parametrize("setting", [None, "0"])
def test_onnx_runtime_telemetry_is_off_unless_asked_for(fixture_export, tmp_path, setting):
    """ONNX Runtime 1.32 writes a device id and an event database under ~/.cache/Microsoft at its import (issue 37);
    seer-run under an empty HOME leaves nothing there, and ORT_DISABLE_TELEMETRY=0, the documented way to turn it
    on, brings both back (so the check can fail; CI markers are not passed on, as ONNX Runtime stays off under them)."""
    home = tmp_path / "home"
    home.mkdir()
    env = telemetry_env(os.environ, home, setting)  # this process set ORT_DISABLE_TELEMETRY: not inherited
    r = subprocess.run([sys.executable, "-m", "seer_trt.cli.run", "--engines", str(fixture_export[0]), "--prompt",
                        "count to 3 .", "--threads", "1"], env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0 and "1 2 3" in r.stdout, r.stderr
    written = sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())
    if setting is None:
        assert written == [], written
    else:
        assert ".cache/Microsoft/DeveloperTools/.onnxruntime/deviceid" in written, (written, sorted(env))


@pytest.mark.serving
def test_the_largest_bodies_at_once_and_many_requests_keep_seer_serves_memory_bounded(fixture_export, tmp_path):
    """tools/serve_memory.py on a real seer-serve: 24 bodies of the largest accepted size at once (46 MB each on the
    fixture) are answered or refused 429 with Retry-After past the held-bytes budget; the server's peak RSS stays
    within 5 x that budget over its RSS before (each held body is parsed, base64-decoded and decoded: 3.2-3.6 x
    measured), and after them it gives the memory back (malloc_trim once no body
    is held); 300 text requests leave RSS flat (issue 37)."""
    out = tmp_path / "memory.json"
    p = subprocess.run([sys.executable, str(REPO / "tools" / "serve_memory.py"), "--engines", str(fixture_export[0]),
                        "--bodies", "24", "--requests", "300", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads(out.read_text())
    bodies, requests = report["bodies"], report["requests"]
    print(json.dumps({"bodies": bodies, "requests": requests["rss_mb_after_each_tenth"]}))
    assert set(bodies["statuses"]) <= {"200", "429 retry-after"} and bodies["statuses"].get("200", 0) >= 1
    assert bodies["rss_peak_mb"] - bodies["rss_before_mb"] < 5 * bodies["held_budget_bytes"] / 2**20
    # given back but the backend's bounded output-buffer cache for the new shapes (at most 512 MiB; held, the 24
    # bodies alone would be 1.1 GB)
    assert bodies["rss_after_mb"] - bodies["rss_before_mb"] < 400
    curve = [mb for _, mb in requests["rss_mb_after_each_tenth"]]
    assert requests["statuses"] == {"200": 300} and curve[-1] - curve[0] < 32  # flat
