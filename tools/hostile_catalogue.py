"""Issue 37's catalogue through the real commands and a real server on loopback, for one version of the code.

    python3 tools/hostile_catalogue.py --engines E [--code DIR] [--timeout 60] [--json OUT]

E: an export of the bundled fixture (copied per case, never changed). DIR: the folder holding the ``seer_trt``
package to run (default: this checkout), so the same catalogue measures an older commit checked out beside it
(``git worktree add /tmp/before aab65bc``; ``--code /tmp/before``). Each command runs under GNU time
(``/usr/bin/time``: wall seconds, peak RSS) with ``--timeout`` seconds, then SIGTERM, then SIGKILL 10 s later
("hung"). Cases: hostile exports through ``seer-run`` (traversal, absolute path, outside symlink, FIFO manifest, FIFO
tokenizer, a 10^9 bucket, a 1 GiB manifest), conversations of 1,001 and 3,001 empty turns in a JSONL line, and
through ``seer-serve``: 400 connections that never finish their headers (then ``/health`` and one request), and
one body naming 20 image URLs of 40 MB each with ``--allow-image-urls`` (served from 127.0.0.1). Prints one JSON
object per case and writes them all to ``--json``.
"""

from __future__ import annotations

import argparse
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# runs a module of --code's seer_trt: an editable install's import hook (sys.meta_path) outranks PYTHONPATH, so it goes
BOOT = (
    "import os, runpy, sys; sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__"
    ".startswith('__editable__')]; sys.path.insert(0, os.environ['SEER_CODE']); m = sys.argv.pop(1); "
    "sys.argv[0] = m; runpy.run_module(m, run_name='__main__', alter_sys=True)"
)


def module(name: str) -> list[str]:
    return [sys.executable, "-c", BOOT, name]


def timed(cmd: list[str], env: dict, timeout: float, stdin: str | None = None) -> dict:
    """``cmd`` under GNU time: exit status (or hung), its last stderr line, wall s, peak RSS MB."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as t:
        p = subprocess.Popen(["/usr/bin/time", "-o", t.name, "-f", "%e %M", *cmd], env=env, text=True,
                             stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        hung = False
        try:
            out, err = p.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            hung = True
            command = children(p)
            for child in command:
                os.kill(child, signal.SIGTERM)
            try:
                out, err = p.communicate(timeout=10)
                ended = "ended on SIGTERM"
            except subprocess.TimeoutExpired:
                for child in command:
                    os.kill(child, signal.SIGKILL)
                out, err = p.communicate()
                ended = "ignored SIGTERM: SIGKILL"
        fields = Path(t.name).read_text().split()[-2:] if Path(t.name).stat().st_size else []
    lines = [line for line in err.strip().splitlines() if line and not line.startswith("Command ")]
    result = {"exit": p.returncode, "line": lines[-1][:300] if lines else "", "stderr_lines": len(lines),
              "wall_s": float(fields[0]) if fields else None, "peak_rss_mb": int(fields[1]) // 1024 if fields else None}  # fmt: skip
    if hung:
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


def turns_line(n: int) -> str:
    history = [["user", ""] if i % 2 == 0 else ["assistant", ""] for i in range(n - 1)]
    return json.dumps({"prompt": "count to 3 .", "history": history}) + "\n"


def serve(code_env: dict, engines: Path, *flags: str) -> tuple[subprocess.Popen, int, Path]:
    t = Path(tempfile.mkstemp(suffix=".time")[1])
    p = subprocess.Popen(["/usr/bin/time", "-o", str(t), "-f", "%e %M", *module("seer_trt.cli.serve"),
                          "--engines", str(engines), "--port", "0", "--threads", "1", "--model-name", "m", *flags],
                         env=code_env, stderr=subprocess.PIPE, text=True)  # fmt: skip
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


def stop(p: subprocess.Popen, t: Path) -> dict:
    server = children(p)
    for pid in server:
        os.kill(pid, signal.SIGTERM)
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        for pid in server:
            os.kill(pid, signal.SIGKILL)
        p.wait()
    fields = t.read_text().split()[-2:]
    t.unlink()
    return {"server_peak_rss_mb": int(fields[1]) // 1024 if len(fields) == 2 else None}


def unfinished_headers(env: dict, engines: Path) -> dict:
    import httpx

    p, port, t = serve(env, engines)
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
            r = c.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                       json={"model": "m", "messages": [{"role": "user", "content": "count to 3 ."}]})  # fmt: skip
            seconds = time.monotonic() - start
        out = {"health": health, "request": r.status_code, "health_and_request_s": round(seconds, 3)}
    finally:
        for s in held:
            s.close()
    return out | stop(p, t)


def image_urls(env: dict, engines: Path, folder: Path) -> dict:
    import httpx

    (folder / "big.bin").write_bytes(os.urandom(40 * 2**20))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a: None
    files = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=files.serve_forever, daemon=True).start()
    p, port, t = serve(env, engines, "--allow-image-urls")
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", required=True, type=Path)
    ap.add_argument("--code", type=Path, default=ROOT)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    env = {**os.environ, "SEER_CODE": str(args.code.resolve())}
    env.pop("ORT_DISABLE_TELEMETRY", None)
    report = {"code": str(args.code), "commit": subprocess.run(["git", "-C", str(args.code), "rev-parse", "--short",
                                                                "HEAD"], capture_output=True, text=True).stdout.strip()}  # fmt: skip
    cases = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for kind, change in EXPORTS.items():
            folder = tmp / kind.replace(" ", "-") / "engines"
            shutil.copytree(args.engines, folder, ignore=shutil.ignore_patterns("goldens*"))
            change(folder)
            cmd = [*module("seer_trt.cli.run"), "--engines", str(folder), "--prompt", "count to 3 .",
                   "--threads", "1"]  # fmt: skip
            cases[f"seer-run, export: {kind}"] = timed(cmd, env, args.timeout)
            print(kind, cases[f"seer-run, export: {kind}"], flush=True)
        for n in (1001, 3001):
            path = tmp / f"turns-{n}.jsonl"
            path.write_text(turns_line(n))
            cmd = [*module("seer_trt.cli.run"), "--engines", str(args.engines), "--input", str(path),
                   "--output", str(tmp / f"turns-{n}.out"), "--threads", "1"]  # fmt: skip
            key = f"seer-run, a JSONL line of {n} empty turns ({path.stat().st_size // 1024} KB)"
            cases[key] = timed(cmd, env, args.timeout)
            out = tmp / f"turns-{n}.out"
            if out.is_file() and out.read_text().strip():
                cases[key]["answer_error"] = (json.loads(out.read_text().splitlines()[0]).get("error") or "")[:200]
            print(key, cases[key], flush=True)
        cases["seer-serve, 400 unfinished headers"] = unfinished_headers(env, args.engines)
        print("headers", cases["seer-serve, 400 unfinished headers"], flush=True)
        cases["seer-serve, 20 image URLs of 40 MB"] = image_urls(env, args.engines, tmp)
        print("urls", cases["seer-serve, 20 image URLs of 40 MB"], flush=True)
    report["cases"] = cases
    text = json.dumps(report, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
