"""Signals at many points of a real export: each must stop it with one line and keep the previous export.

    python tools/signal_sweep.py --points 20 [--signal SIGTERM] [--json docs/bench/signal-sweep.json]

First one export of the bundled fixture runs to completion (``seer-export --no-validate``) into a scratch folder:
that is the previous export, and its duration spreads the points (from 0.2 s to 98% of it, evenly). Then, for
each point, the same command re-exports with ``--force`` onto it and gets the signal at that many seconds after
start. Each run passes when: the exit status is 128 + the signal, stderr's last line is the one interrupt line
and nothing else but progress lines came before it, no staging folder is left next to the output, and every file
of the previous export is byte-for-byte as it was (sha256). Printed: one row per point and the totals; with
``--json``, the rows as a report.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROGRESS = "["  # seer-export's progress lines start with the elapsed time: "[   6.5s] exported embed.onnx ..."


def digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def command(out: Path, force: bool) -> list[str]:
    return ["seer-export", "--out", str(out), "--no-validate", *(["--force"] if force else [])]


def one(out: Path, at: float, signum: int, previous: dict[str, str]) -> dict:
    # SIGINT: restore its default explicitly (a child of a background job inherits it ignored)
    preexec = (lambda: signal.signal(signal.SIGINT, signal.default_int_handler)) if signum == signal.SIGINT else None
    start = time.perf_counter()
    p = subprocess.Popen(command(out, True), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=preexec)  # fmt: skip
    time.sleep(max(0.0, at - (time.perf_counter() - start)))
    sent = time.perf_counter() - start
    last_stage = None
    p.send_signal(signum)
    stdout, stderr = p.communicate(timeout=600)
    wall = time.perf_counter() - start
    stages = [line for line in stdout.splitlines() if line.startswith(PROGRESS)]
    last_stage = stages[-1].split("] ", 1)[-1][:60] if stages else "(start-up)"
    err_lines = [line for line in stderr.splitlines() if line.strip()]
    left = sorted(x.name for x in out.parent.iterdir() if x.name != out.name)
    kept = digest(out) == previous
    line = err_lines[-1] if err_lines else ""
    ok = p.returncode == 128 + signum and len(err_lines) == 1 and "interrupted" in line and not left and kept
    return {"at_s": round(sent, 2), "stopped_after_s": round(wall - sent, 2), "last_stage": last_stage,
            "exit": p.returncode, "stderr": err_lines[-3:], "leftovers": left, "previous_kept": kept, "ok": ok}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=20, help="signals sent, spread over one export (default 20)")
    ap.add_argument("--signal", default="SIGTERM", choices=("SIGTERM", "SIGINT", "SIGHUP"))
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args(argv)
    signum = int(signal.Signals[args.signal])
    scratch = Path(tempfile.mkdtemp(prefix="seer-signal-sweep-"))
    try:
        out = scratch / "export"
        start = time.perf_counter()
        subprocess.run(command(out, False), check=True, stdout=subprocess.DEVNULL)
        duration = time.perf_counter() - start
        previous = digest(out)
        print(f"previous export: {duration:.1f} s, {len(previous)} files; {args.points} x {args.signal}", flush=True)
        points = [0.2 + (0.98 * duration - 0.2) * i / max(1, args.points - 1) for i in range(args.points)]
        rows = []
        for at in points:
            row = one(out, at, signum, previous)
            rows.append(row)
            print(f"{row['at_s']:7.2f} s  exit {row['exit']:4}  stopped in {row['stopped_after_s']:5.2f} s  "
                  f"{'ok  ' if row['ok'] else 'FAIL'}  after: {row['last_stage']}  | {row['stderr'][-1:]}", flush=True)  # fmt: skip
        passed = sum(r["ok"] for r in rows)
        print(f"{passed}/{len(rows)} stopped with one line and kept the previous export")
        if args.json:
            report = {"command": " ".join(["python tools/signal_sweep.py", *(argv or sys.argv[1:])]),
                      "signal": args.signal, "export_s": round(duration, 1), "load_average": os.getloadavg(),
                      "passed": passed, "rows": rows}  # fmt: skip
            args.json.write_text(json.dumps(report, indent=1) + "\n")
        return 0 if passed == len(rows) else 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
