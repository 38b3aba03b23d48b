"""Issues 37's and 42's catalogues through the real commands and a real server on loopback, for one version of the code.

    python3 tools/hostile_catalogue.py --engines E [--code DIR] [--timeout 60] [--input-timeout 600]
        [--export-timeout 600] [--rss-cap-mb 4096] [--only GROUP ...] [--json OUT]

E: an export of the bundled fixture (copied per case, never changed). DIR: the folder holding the ``seer_trt``
package and the ``export`` folder (``seer_export``) to run (default: this checkout), so the same catalogue measures
an older commit checked out beside it (``git worktree add /tmp/before aab65bc``; ``--code /tmp/before``); the report
names the files a child imported. Each command runs under GNU time (``/usr/bin/time``: wall seconds, peak RSS) with
``--timeout`` seconds (``--input-timeout`` for the long ``--input`` files, ``--export-timeout`` for a full
``seer-export``), then SIGTERM, then SIGKILL 10 s later ("hung"); one whose RSS passes ``--rss-cap-mb`` is killed
there (the machine is shared). Everything is written in a temporary folder.

Issue 37 (groups ``exports``, ``turns``, ``headers``, ``urls``): hostile exports through ``seer-run`` (traversal,
absolute path, outside symlink, FIFO manifest, FIFO tokenizer, a 10^9 bucket, a 1 GiB manifest), conversations of
1,001 and 3,001 empty turns in a JSONL line, and through ``seer-serve``: 400 connections that never finish their
headers (then ``/health`` and one request), and one body naming 20 image URLs of 40 MB each with
``--allow-image-urls`` (served from 127.0.0.1).

Issue 42: ``stops``: a streamed chat request with four stop sequences of 5,120 characters while a second client
polls ``/health`` every 5 ms (its p99 and max), one with a 1 MB stop sequence, and a body with ``temperature`` 10^6;
``input``: ``seer-run --input`` of 1,000, 10,000 and 100,000 lines; ``checkpoints``: ``seer-export --no-validate`` of
the fixture's checkpoint with ``num_hidden_layers`` 10^6, and with one NaN weight (then ``seer-run`` on what it
wrote); ``repeats``: an export whose ``cost_calibration.repeats`` is 10^9 through ``seer-serve`` (does it ever
answer ``/health``?) and ``seer-run``; ``flags``: ``temperature`` 10^6 in a JSONL line, ``seer-serve --ray garbage``
and ``--ray 127.0.0.1:``; ``triton``: the README's ``seer-triton`` command from a clone's root. Prints one JSON object
per case and writes them all to ``--json``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# --code's seer_trt and seer_export: an editable install's import hook (sys.meta_path) outranks PYTHONPATH, so it
# goes. The hook is registered as a class (``type(f)`` is ``type``), hence the isinstance. seer_export is that tree's
# export/ folder, as the install maps it.
SETUP = """
import importlib.util, os, runpy, sys
code = os.environ['SEER_CODE']
sys.meta_path[:] = [f for f in sys.meta_path
                    if not (f if isinstance(f, type) else type(f)).__module__.startswith('__editable__')]
class Export:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == 'seer_export':
            return importlib.util.spec_from_file_location(name, os.path.join(code, 'export', '__init__.py'),
                                                          submodule_search_locations=[os.path.join(code, 'export')])
sys.meta_path.insert(0, Export)
sys.path.insert(0, code)
"""
BOOT = SETUP + "m = sys.argv.pop(1); sys.argv[0] = m; runpy.run_module(m, run_name='__main__', alter_sys=True)\n"
STOP_CHARS = 5120  # the longest stop sequence the fixed code takes for the fixture: 256 answer ids x (19 + 1) chars
BIG_STOP = 10**6  # characters
Cases = Iterator[tuple[str, dict]]  # a group's cases, each (name, result) as it ends
CHAT = {"model": "m", "messages": [{"role": "user", "content": "count to 3 ."}]}


def module(name: str) -> list[str]:
    return [sys.executable, "-c", BOOT, name]


def imported(env: dict) -> dict:
    """Where a child of --code imports seer_trt and seer_export from: refused unless both lie in --code."""
    probe = SETUP + "import seer_trt, seer_export; print(seer_trt.__file__); print(seer_export.__file__)"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    files = dict(zip(("seer_trt", "seer_export"), out.stdout.split(), strict=False))
    if len(files) != 2 or not all(f.startswith(env["SEER_CODE"] + os.sep) for f in files.values()):
        raise SystemExit(f"--code {env['SEER_CODE']}: a child imports {files or out.stderr[-500:]}")
    return files


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        task_dir = Path(f"/proc/{todo.pop()}/task")
        for task in task_dir.glob("*") if task_dir.is_dir() else ():
            with contextlib.suppress(OSError):
                kids = [int(c) for c in (task / "children").read_text().split()]
                found, todo = found + kids, todo + kids
    return found


def kill(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def cap_rss(p: subprocess.Popen, cap_mb: int, capped: threading.Event) -> None:
    """SIGKILL what GNU time runs once its RSS (summed over its processes) passes ``cap_mb``."""
    while p.poll() is None:
        pids, kb = descendants(p.pid), 0
        for pid in pids:
            with contextlib.suppress(OSError, AttributeError):  # gone, or a zombie (no VmRSS)
                kb += int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1))
        if kb > cap_mb * 1024:
            capped.set()
            return kill(pids, signal.SIGKILL)
        time.sleep(0.1)


def timed(cmd: list[str], env: dict, timeout: float, stdin: str | None = None, cwd: Path | None = None,
          rss_cap_mb: int | None = None) -> dict:  # fmt: skip
    """``cmd`` under GNU time: exit status (or hung, or killed at the RSS cap), its last stderr line, the number of
    stderr lines, what it printed (``answer``), wall s, peak RSS MB."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as t:
        p = subprocess.Popen(["/usr/bin/time", "-o", t.name, "-f", "%e %M", *cmd], env=env, text=True, cwd=cwd,
                             stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        capped = threading.Event()
        if rss_cap_mb:
            threading.Thread(target=cap_rss, args=(p, rss_cap_mb, capped), daemon=True).start()
        hung = False
        try:
            out, err = p.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            hung = True
            command = children(p)
            kill(command, signal.SIGTERM)
            try:
                out, err = p.communicate(timeout=10)
                ended = "ended on SIGTERM"
            except subprocess.TimeoutExpired:
                kill(command, signal.SIGKILL)
                out, err = p.communicate()
                ended = "ignored SIGTERM: SIGKILL"
        fields = Path(t.name).read_text().split()[-2:] if Path(t.name).stat().st_size else []
    lines = [line for line in err.strip().splitlines() if line and not line.startswith("Command ")]
    result = {"exit": p.returncode, "line": lines[-1][:300] if lines else "", "stderr_lines": len(lines),
              "wall_s": float(fields[0]) if fields else None, "peak_rss_mb": int(fields[1]) // 1024 if fields else None}  # fmt: skip
    if out.strip():
        result["answer"] = out.strip()[:200]
    if capped.is_set():
        result.update(exit=f"killed past the {rss_cap_mb} MB RSS cap")
    elif hung:
        result.update(exit=f"hung past {timeout:g} s ({ended})")
    return result


def edit(folder: Path, change) -> None:
    data = json.loads((folder / "manifest.json").read_text())
    change(data)
    (folder / "manifest.json").write_text(json.dumps(data))


def outside_symlink(folder: Path) -> None:
    outside = folder.parent / "outside"
    outside.mkdir()
    shutil.copy(folder / "denoise.onnx", outside / "denoise.onnx")
    (folder / "denoise.onnx").unlink()
    (folder / "denoise.onnx").symlink_to(outside / "denoise.onnx")


def fifo(name: str):
    def make(folder: Path) -> None:
        (folder / name).unlink()
        os.mkfifo(folder / name)

    return make


def huge_manifest(folder: Path) -> None:
    with open(folder / "manifest.json", "r+b") as f:
        f.truncate(2**30)


EXPORTS = {
    "traversal": lambda f: edit(f, lambda d: d["graphs"]["denoise"].update(file="../../../../etc/passwd")),
    "absolute path": lambda f: edit(f, lambda d: d["graphs"]["denoise"].update(file="/etc/passwd")),
    "outside symlink": outside_symlink,
    "fifo manifest": fifo("manifest.json"),
    "fifo tokenizer": fifo("tokenizer/tokenizer.json"),
    "huge bucket": lambda f: edit(f, lambda d: d["buckets"].update(answer=[16, 10**9])),
    "huge manifest": huge_manifest,
}


def copy_export(engines: Path, folder: Path) -> Path:
    shutil.copytree(engines, folder, ignore=shutil.ignore_patterns("goldens*"))
    return folder


def run_cmd(engines: Path, *flags: str) -> list[str]:
    return [*module("seer_trt.cli.run"), "--engines", str(engines), *flags, "--threads", "1"]


def turns_line(n: int) -> str:
    history = [["user", ""] if i % 2 == 0 else ["assistant", ""] for i in range(n - 1)]
    return json.dumps({"prompt": "count to 3 .", "history": history}) + "\n"


def jsonl(env: dict, args, tmp: Path, name: str, text: str, timeout: float, cap: int | None = None) -> dict:
    """``seer-run --input`` of ``text``; with the first line's error and how many lines were answered."""
    path, out = tmp / f"{name}.jsonl", tmp / f"{name}.out"
    path.write_text(text)
    result = timed(run_cmd(args.engines, "--input", str(path), "--output", str(out)), env, timeout, rss_cap_mb=cap)
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.is_file() else []
    if rows:
        result.update(answered=sum(not r.get("error") for r in rows), answer_text=rows[0].get("text", "")[:100],
                      answer_error=(rows[0].get("error") or "")[:200])  # fmt: skip
    return result


def hostile_exports(env: dict, args, tmp: Path) -> Cases:
    for kind, change in EXPORTS.items():
        folder = copy_export(args.engines, tmp / kind.replace(" ", "-") / "engines")
        change(folder)
        yield f"seer-run, export: {kind}", timed(run_cmd(folder, "--prompt", "count to 3 ."), env, args.timeout)


def empty_turns(env: dict, args, tmp: Path) -> Cases:
    for n in (1001, 3001):
        line = turns_line(n)
        key = f"seer-run, a JSONL line of {n} empty turns ({len(line) // 1024} KB)"
        yield key, jsonl(env, args, tmp, f"turns-{n}", line, args.timeout)


def serve(code_env: dict, engines: Path, *flags: str) -> tuple[subprocess.Popen, int, Path]:
    t = Path(tempfile.mkstemp(suffix=".time")[1])
    p = subprocess.Popen(["/usr/bin/time", "-o", str(t), "-f", "%e %M", *module("seer_trt.cli.serve"),
                          "--engines", str(engines), "--port", "0", "--threads", "1", "--model-name", "m", *flags],
                         env=code_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    line = p.stderr.readline()
    port = int(re.search(r"http://127\.0\.0\.1:(\d+)/v1", line).group(1))
    threading.Thread(target=p.stderr.read, daemon=True).start()
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the socket is bound before the line, listened on after it
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.2)
    return p, port, t


def children(p: subprocess.Popen) -> list[int]:
    """The command GNU time runs: signals go to it (GNU time would die of them and leave it running)."""
    return [int(c) for c in Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()]


def end(p: subprocess.Popen) -> None:
    """SIGTERM to the server GNU time runs; SIGKILL 60 s later."""
    server = children(p)
    kill(server, signal.SIGTERM)
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        kill(server, signal.SIGKILL)
        p.wait()


def usage(t: Path) -> tuple[float | None, int | None]:
    """GNU time's wall s and peak RSS MB, read from (and removing) its output file."""
    fields = t.read_text().split()[-2:]
    t.unlink()
    return (float(fields[0]), int(fields[1]) // 1024) if len(fields) == 2 else (None, None)


def stop(p: subprocess.Popen, t: Path) -> dict:
    end(p)
    return {"server_peak_rss_mb": usage(t)[1]}


def unfinished_headers(env: dict, args) -> dict:
    import httpx

    p, port, t = serve(env, args.engines)
    held = []
    try:
        for _ in range(400):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            held.append(s)
        time.sleep(1.0)
        with httpx.Client(timeout=30) as c:
            start = time.monotonic()
            health = c.get(f"http://127.0.0.1:{port}/health").status_code
            r = c.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT)
            seconds = time.monotonic() - start
        out = {"health": health, "request": r.status_code, "health_and_request_s": round(seconds, 3)}
    finally:
        for s in held:
            s.close()
    return out | stop(p, t)


def image_urls(env: dict, args, folder: Path) -> dict:
    import httpx

    (folder / "big.bin").write_bytes(os.urandom(40 * 2**20))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a: None
    files = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=files.serve_forever, daemon=True).start()
    p, port, t = serve(env, args.engines, "--allow-image-urls")
    try:
        parts = [{"type": "text", "text": "what is it ?"}]
        parts += [{"type": "image_url", "image_url": {"url": f"http://127.0.0.1:{files.server_port}/big.bin?{i}"}}
                  for i in range(20)]  # fmt: skip
        start = time.monotonic()
        with httpx.Client(timeout=120) as c:
            r = c.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                       json={"model": "m", "messages": [{"role": "user", "content": parts}]})  # fmt: skip
        out = {"status": r.status_code, "line": r.text[:300], "seconds": round(time.monotonic() - start, 3)}
    finally:
        files.shutdown()
    return out | stop(p, t)


def ms(values: list[float], q: float) -> float | None:
    return round(1000 * sorted(values)[round(q * (len(values) - 1))], 1) if values else None


def streamed(url: str, body: dict, timeout: float) -> tuple[int | str, str]:
    """A streamed chat request: its status, and its answer (or its error)."""
    import httpx

    start, status, text = time.monotonic(), None, ""
    try:
        with httpx.Client(timeout=timeout) as c, c.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            status = r.status_code
            for line in r.iter_lines():
                if time.monotonic() - start > timeout:
                    raise httpx.ReadTimeout("past the deadline")
                if status != 200:
                    text += line
                elif line.startswith("data: {"):
                    event = json.loads(line[6:])
                    text += "".join(ch["delta"].get("content") or "" for ch in event.get("choices", []))
    except httpx.TimeoutException:
        status = f"no answer past {timeout:g} s"
    return status, text


def streamed_while_polled(url: str, body: dict, timeout: float, times: int) -> dict:
    """``times`` streamed chat requests, one after another (until one is not a 200), while a second client asks
    ``/health`` every 5 ms (1 s of that first, idle): their statuses, the first answer or error, the slowest's
    seconds, and ``/health``'s latency while they ran."""
    import httpx

    latencies, done = [], threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=timeout) as c:
            while not done.is_set():
                start = time.monotonic()
                with contextlib.suppress(httpx.TransportError):
                    c.get(f"{url}/health")
                latencies.append(time.monotonic() - start)
                time.sleep(0.005)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    time.sleep(1.0)
    idle, answers, seconds = list(latencies), [], []
    while len(answers) < times and all(status == 200 for status, _ in answers):
        start = time.monotonic()
        answers.append(streamed(url, body, timeout))
        seconds.append(time.monotonic() - start)
    done.set()
    poller.join(timeout + 5)
    during = latencies[len(idle) :]
    statuses = [status for status, _ in answers]
    return {"status": " ".join(f"{s} x{statuses.count(s)}" for s in dict.fromkeys(statuses)),
            "line": answers[0][1][:300], "seconds": round(max(seconds), 3), "health_polls": len(during),
            "health_p50_ms": ms(during, 0.5), "health_p99_ms": ms(during, 0.99), "health_max_ms": ms(during, 1.0),
            "idle_health_p99_ms": ms(idle, 0.99)}  # fmt: skip


def stop_sequences(env: dict, args, tmp: Path) -> Cases:
    """A server of its own per case, so each server peak is that case's."""
    import httpx

    p, port, t = serve(env, args.engines)
    try:
        with httpx.Client(timeout=args.timeout) as c:
            r = c.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={**CHAT, "temperature": 1e6})
    finally:
        server = stop(p, t)
    yield "seer-serve, temperature 10^6", {"status": r.status_code, "line": r.text[:300]} | server
    n, counting = STOP_CHARS, "1 2 3 4 5 6 7 8 9 "  # the answer's own characters: partial matches held back
    for key, seqs, times in ((f"seer-serve, 20 streamed requests, 4 stops of {n:,} chars, /health every 5 ms",
                              [(counting * n)[:n], "1" * n, "3 " * (n // 2), "x" * n], 20),
                             (f"seer-serve, streamed, a stop of {BIG_STOP:,} chars, /health every 5 ms",
                              [(counting * BIG_STOP)[:BIG_STOP]], 1)):  # fmt: skip
        p, port, t = serve(env, args.engines)
        try:
            body = {**CHAT, "stream": True, "stop": seqs}
            result = streamed_while_polled(f"http://127.0.0.1:{port}", body, args.timeout, times)
        finally:
            server = stop(p, t)
        yield key, result | server


def many_lines(env: dict, args, tmp: Path) -> Cases:
    line = json.dumps({"prompt": "count to 3 ."}) + "\n"
    for n in (1000, 10000, 100000):
        yield f"seer-run --input of {n:,} lines", jsonl(env, args, tmp, f"lines-{n}", line * n, args.input_timeout,
                                                        args.rss_cap_mb)  # fmt: skip


def checkpoint(code: Path, folder: Path, config=None, weights=None) -> Path:
    """A copy of --code's fixture checkpoint with its config.json and weights changed."""
    shutil.copytree(code / "export" / "fixtures" / "tiny-llada-v", folder)
    if config:
        data = json.loads((folder / "config.json").read_text())
        config(data)
        (folder / "config.json").write_text(json.dumps(data))
    if weights:
        from safetensors.numpy import load_file, save_file

        tensors = load_file(folder / "model.safetensors")
        weights(tensors)
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def one_nan(tensors: dict) -> None:
    tensors["model.layers.3.mlp.down_proj.weight"][5, 7] = float("nan")


def checkpoints(env: dict, args, tmp: Path) -> Cases:
    export = [*module("seer_export.cli"), "--no-validate"]
    layers = checkpoint(args.code, tmp / "ckpt-layers", config=lambda d: d.update(num_hidden_layers=10**6))
    cmd = [*export, "--checkpoint", str(layers), "--out", str(tmp / "out-layers")]
    result = timed(cmd, env, args.timeout, rss_cap_mb=args.rss_cap_mb)
    result.pop("answer", None)  # its progress lines
    yield "seer-export, config.json num_hidden_layers 10^6", result
    nan, out = checkpoint(args.code, tmp / "ckpt-nan", weights=one_nan), tmp / "out-nan"
    result = timed([*export, "--checkpoint", str(nan), "--out", str(out)], env, args.export_timeout,
                   rss_cap_mb=args.rss_cap_mb)  # fmt: skip
    result.pop("answer", None)
    yield "seer-export, one NaN weight (model.layers.3.mlp.down_proj.weight[5, 7])", result
    if (out / "manifest.json").is_file():
        yield "seer-run on the NaN checkpoint's export", timed(run_cmd(out, "--prompt", "count to 3 ."), env,
                                                               args.timeout)  # fmt: skip


def serve_bounded(env: dict, engines: Path, timeout: float) -> dict:
    """``seer-serve --port 0`` for at most ``timeout`` s: its exit (or that it still ran), its stderr lines, and
    after how many seconds it answered ``/health`` 200, if ever."""
    import httpx

    t = Path(tempfile.mkstemp(suffix=".time")[1])
    p = subprocess.Popen(["/usr/bin/time", "-o", str(t), "-f", "%e %M", *module("seer_trt.cli.serve"), "--engines",
                          str(engines), "--port", "0", "--threads", "1"], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)  # fmt: skip
    lines: list[str] = []
    threading.Thread(target=lambda: [lines.append(line.rstrip()) for line in p.stderr], daemon=True).start()
    start, listened = time.monotonic(), None
    while listened is None and p.poll() is None and time.monotonic() - start < timeout:
        port = next((m.group(1) for m in map(re.compile(r"127\.0\.0\.1:(\d+)/v1").search, lines) if m), None)
        try:
            if port and httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                listened = round(time.monotonic() - start, 2)
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    running = p.poll() is None
    if running:
        end(p)
    wall, rss = usage(t)
    lines = [line for line in lines if line and not line.startswith("Command ")]
    exit_ = ("listening: stopped" if listened else f"hung past {timeout:g} s: stopped") if running else p.returncode
    return {"exit": exit_, "line": lines[-1][:300] if lines else "", "stderr_lines": len(lines),
            "health_200_after_s": listened, "wall_s": wall, "peak_rss_mb": rss}  # fmt: skip


def huge_repeats(env: dict, args, tmp: Path) -> Cases:
    folder = copy_export(args.engines, tmp / "repeats" / "engines")
    edit(folder, lambda d: d["cost_calibration"].update(repeats=10**9))
    yield "seer-serve, manifest cost_calibration.repeats 10^9", serve_bounded(env, folder, 30.0)
    yield "seer-run, manifest cost_calibration.repeats 10^9", timed(run_cmd(folder, "--prompt", "count to 3 ."), env,
                                                                     args.timeout)  # fmt: skip


def flags(env: dict, args, tmp: Path) -> Cases:
    line = json.dumps({"prompt": "count to 3 .", "temperature": 1e6}) + "\n"
    yield "seer-run, a JSONL line with temperature 10^6", jsonl(env, args, tmp, "temperature", line, args.timeout)
    for address in ("garbage", "127.0.0.1:"):
        cmd = [*module("seer_trt.cli.serve"), "--engines", str(args.engines), "--ray", address]
        yield f"seer-serve --ray {address}", timed(cmd, env, args.timeout)


def triton_readme(env: dict, args, tmp: Path) -> Cases:
    clone = tmp / "clone"
    copy_export(args.engines, clone / "engines" / "tiny-llada-v-fp32")
    cmd = [*module("seer_trt.cli.triton"), "--engines", "engines/tiny-llada-v-fp32", "--out", "triton-cpu",
           "--flavour", "cpu"]  # fmt: skip
    result = timed(cmd, env, args.timeout, cwd=clone)
    result.pop("answer", None)  # its summary of what it wrote
    result["wrote"] = (clone / "triton-cpu").is_dir() and any((clone / "triton-cpu").iterdir())
    yield "seer-triton, the README's command from a clone's root", result


GROUPS = {
    "exports": hostile_exports,
    "turns": empty_turns,
    "headers": lambda env, args, tmp: iter([("seer-serve, 400 unfinished headers", unfinished_headers(env, args))]),
    "urls": lambda env, args, tmp: iter([("seer-serve, 20 image URLs of 40 MB", image_urls(env, args, tmp))]),
    "stops": stop_sequences,
    "input": many_lines,
    "checkpoints": checkpoints,
    "repeats": huge_repeats,
    "flags": flags,
    "triton": triton_readme,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", required=True, type=Path)
    ap.add_argument("--code", type=Path, default=ROOT)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--input-timeout", type=float, default=600.0, help="for seer-run --input of many lines")
    ap.add_argument("--export-timeout", type=float, default=600.0, help="for a seer-export that runs to its end")
    ap.add_argument("--rss-cap-mb", type=int, default=4096, help="a command past this RSS is killed there")
    ap.add_argument("--only", nargs="+", choices=list(GROUPS), default=list(GROUPS))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.engines, args.code = args.engines.resolve(), args.code.resolve()
    env = {**os.environ, "SEER_CODE": str(args.code)}
    env.pop("ORT_DISABLE_TELEMETRY", None)
    report = {"code": str(args.code), "commit": subprocess.run(["git", "-C", str(args.code), "rev-parse", "--short",
                                                                "HEAD"], capture_output=True, text=True).stdout.strip(),
              "imports": imported(env), "load_average": os.getloadavg()}  # fmt: skip
    cases = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only:
            folder = Path(tmp) / name
            folder.mkdir()
            for key, result in GROUPS[name](env, args, folder):
                cases[key] = result
                print(key, result, flush=True)
    report["cases"] = cases
    report["load_average_after"] = os.getloadavg()
    text = json.dumps(report, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
