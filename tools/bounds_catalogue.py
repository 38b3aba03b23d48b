"""Run each bad-input case of issue 24 through the real commands and print what each did.

    python tools/bounds_catalogue.py --engines engines/tiny-llada-v-fp32 [--json docs/bench/bounds.json]

Every case runs as its own process under ``/usr/bin/time`` (GNU time: wall seconds and peak RSS), in a scratch
folder; the table gives the command, its exit status, the last line it printed on stderr, the wall time and the
peak RSS, next to a control run (a good request through the same command) whose peak RSS is the baseline. The
C++ ``seer_run`` and Triton cases are measured by their own tests (tests/test_cpp.py, tests/test_triton.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

BIG = 50_000_000


def timed(argv: list[str], cwd: Path) -> dict:
    """Exit status, last stderr line, wall seconds and peak RSS (MiB) of ``argv``."""
    stats = cwd / ".time"
    p = subprocess.run(["/usr/bin/time", "-f", "%e %M", "-o", str(stats), *argv], capture_output=True, text=True,
                       cwd=cwd, timeout=900)  # fmt: skip
    wall, rss = stats.read_text().split()[-2:]
    stats.unlink()
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    return {"exit": p.returncode, "line": lines[-1] if lines else "", "stderr_lines": len(lines),
            "wall_s": float(wall), "peak_rss_mib": round(int(rss) / 1024)}  # fmt: skip


def cases(engines: Path, work: Path) -> list[tuple[str, list[str]]]:
    run = ["seer-run", "--engines", str(engines), "--threads", "1"]
    ids = ["seer-prompt-ids", "--engines", str(engines)]
    good = work / "good.jsonl"
    good.write_text(json.dumps({"prompt": "count to 3 ."}) + "\n")
    big = work / "big.jsonl"
    with big.open("w") as f:
        f.write(json.dumps({"prompt": "count to 3 ."}) + "\n" + '{"prompt": "' + "count " * (BIG // 6) + '"}\n')
    api = ("import sys; from seer_trt import SeerPipeline, Request; p = SeerPipeline.from_manifest(sys.argv[1], "
           "threads=1); r = p.generate([Request('count ' * (50_000_000 // 6))])[0]; sys.exit(r.error)")  # fmt: skip
    os.mkfifo(work / "fifo.png")
    fifo_jsonl = work / "fifo.jsonl"
    fifo_jsonl.write_text("".join(json.dumps(x) + "\n" for x in ({"prompt": "count to 3 .", "image": "fifo.png"},
                                                                  {"prompt": "count to 3 ."})))  # fmt: skip
    Image.new("RGB", (7000, 7000)).save(work / "49mp.png")
    mixed = work / "mixed.jsonl"
    mixed.write_text(json.dumps({"prompt": "count to 3 ."}) + "\n{not json\n" + json.dumps({"prompt": ""}) + "\n")
    missing = work / "missing.jsonl"
    missing.write_text(json.dumps({"prompt": "count to 3 .", "image": "nowhere.png"}) + "\n")
    export = work / "export"
    shutil.copytree(engines, export)
    (export / "notes.txt").write_text("mine")
    (export / "my_results").mkdir()
    (export / "my_results" / "a.json").write_text("{}")
    repo = work / "repo"
    subprocess.run(["seer-triton", "--engines", str(engines), "--out", str(repo), "--flavour", "cpu"], check=True,
                   capture_output=True)  # fmt: skip
    (repo / "seer" / "my_notes.md").write_text("mine")
    (work / "outdir").mkdir()
    return [
        ("control: one good JSONL request", [*run, "--input", str(good), "--output", "good.out"]),
        ("a 50 MB JSONL line", [*run, "--input", str(big), "--output", "big.out"]),
        ("a 50 MB prompt, Python API", [sys.executable, "-c", api, str(engines)]),
        ("--image naming a FIFO", [*run, "--prompt", "count to 3 .", "--image", "fifo.png"]),
        ("a JSONL image naming a FIFO", [*run, "--input", str(fifo_jsonl), "--output", "fifo.out"]),
        ("a 49 MP PNG of a few hundred KB", [*run, "--prompt", "count to 3 .", "--image", "49mp.png"]),
        ("seer-export --force onto an export holding user files",
         ["seer-export", "--out", str(export), "--force", "--no-validate"]),
        ("seer-triton --force onto a repository holding a user file",
         ["seer-triton", "--engines", str(engines), "--out", str(repo), "--flavour", "cpu", "--force"]),
        ("seer-triton --out inside an export",
         ["seer-triton", "--engines", str(engines), "--out", str(export / "repo"), "--flavour", "cpu"]),
        ("--output naming a folder", [*run, "--input", str(good), "--output", "outdir"]),
        ("--tiles in a missing folder", [*ids, "--prompt", "hi", "--image", "49mp.png", "--tiles", "/nonexistent/d/t.npy"]),
        ("seer-prompt-ids --input with bad lines", [*ids, "--input", str(mixed), "--output", "ids.out"]),
        ("a run-time JSONL error (missing image)", [*run, "--input", str(missing), "--output", "missing.out"]),
        ("--refresh-interval 0", [*run, "--prompt", "count to 3 .", "--cache", "reuse", "--refresh-interval", "0"]),
        ("--output with --prompt", [*run, "--prompt", "count to 3 .", "--output", "x.out"]),
        ("--json with --input", [*run, "--input", str(good), "--json"]),
        ("--tiles without --image", [*ids, "--prompt", "hi", "--tiles", "t.npy"]),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", type=Path, required=True, help="an export of the bundled fixture")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="seer-bounds-"))
    try:
        rows = []
        for name, command in cases(args.engines.resolve(), work):
            row = {"case": name, "command": " ".join(command if len(" ".join(command)) < 300 else command[:3]),
                   **timed(command, work)}  # fmt: skip
            rows.append(row)
            print(f"{name:58} exit {row['exit']:3}  {row['wall_s']:6.2f} s  {row['peak_rss_mib']:5} MiB  "
                  f"{row['line'][:150]}", flush=True)  # fmt: skip
        kept = (work / "export" / "notes.txt").read_text() == "mine" and (
            work / "repo" / "seer" / "my_notes.md"
        ).exists()
        left = sorted(p.name for p in work.iterdir() if ".partial" in p.name or p.name.startswith(".out"))
        print(f"user files intact: {kept}; staging files left: {left or 'none'}; /nonexistent/d created: "
              f"{Path('/nonexistent/d').exists()}")  # fmt: skip
        if args.json:
            report = {"command": " ".join(["python tools/bounds_catalogue.py", *(argv or sys.argv[1:])]),
                      "load_average": os.getloadavg(), "user_files_intact": kept, "leftovers": left, "rows": rows}  # fmt: skip
            args.json.write_text(json.dumps(report, indent=1) + "\n")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
