"""A hostile export is refused in one line, at once, with bounded memory: every path its manifest names stays inside
its folder, only regular files are opened, and what is parsed whole is bounded first (seer_trt/contracts/confined.py;
issue 37's catalogue: traversal, absolute path, outside symlink, FIFO, huge bucket, huge manifest)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from seer_trt.contracts.errors import ManifestError
from seer_trt.contracts.manifest import Manifest
from seer_trt.runtime.pipeline import SeerPipeline

BOUND_S = 1.0  # what a refusal may take, start-up of the command excluded
BOUND_MB = 100  # peak RSS a refusing command may reach (its imports included)


def _edit(folder: Path, change: Callable[[dict], None]) -> None:
    path = folder / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _outside_graph(folder: Path) -> None:
    outside = folder.parent / "outside"
    outside.mkdir()
    shutil.copy(folder / "denoise.onnx", outside / "denoise.onnx")
    (folder / "denoise.onnx").unlink()
    (folder / "denoise.onnx").symlink_to(outside / "denoise.onnx")


def _fifo(name: str) -> Callable[[Path], None]:
    def make(folder: Path) -> None:
        (folder / name).unlink()
        os.mkfifo(folder / name)

    return make


def _huge_manifest(folder: Path) -> None:
    with open(folder / "manifest.json", "r+b") as f:  # sparse: 1 GiB that costs no disk and is never read
        f.truncate(2**30)


HOSTILE: dict[str, tuple[Callable[[Path], None], str]] = {
    "traversal": (
        lambda f: _edit(f, lambda d: d["graphs"]["denoise"].update(file="../../../../etc/passwd")),
        "graphs.denoise.file is '../../../../etc/passwd', a path outside the export folder",
    ),
    "absolute path": (
        lambda f: _edit(f, lambda d: d["graphs"]["denoise"].update(file="/etc/passwd")),
        "graphs.denoise.file is '/etc/passwd', a path outside the export folder",
    ),
    "weights outside": (
        lambda f: _edit(f, lambda d: d["weights"].update(file="../../etc/passwd")),
        "weights.file is '../../etc/passwd', a path outside",
    ),
    "tokenizer outside": (lambda f: _edit(f, lambda d: d.update(tokenizer="/usr")), "tokenizer is '/usr'"),
    "outside symlink": (_outside_graph, "graphs.denoise.file ('denoise.onnx') resolves through a symbolic link"),
    "fifo manifest": (_fifo("manifest.json"), "the manifest manifest.json is not a regular file"),
    "fifo tokenizer": (_fifo("tokenizer/tokenizer.json"), "tokenizer tokenizer.json is not a regular file"),
    "fifo index": (_fifo("weights.json"), "weights.index weights.json is not a regular file"),
    "huge bucket": (
        lambda f: _edit(f, lambda d: d["buckets"].update(answer=[16, 10**9])),
        "buckets.answer [16, 1000000000]: at most 64 sizes of at most 65536",
    ),
    "huge manifest": (_huge_manifest, "the manifest manifest.json is 1073741824 bytes, more than the 16777216"),
}


@pytest.fixture
def hostile(fixture_export, tmp_path) -> Callable[[str], tuple[Path, str]]:
    def make(kind: str) -> tuple[Path, str]:
        folder = tmp_path / kind.replace(" ", "-") / "engines"
        shutil.copytree(fixture_export[0], folder, ignore=shutil.ignore_patterns("goldens*"))
        change, line = HOSTILE[kind]
        change(folder)
        return folder, line

    return make


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_hostile_export_is_refused_by_the_python_api_in_one_line_at_once(hostile, kind):
    folder, line = hostile(kind)
    start = time.monotonic()
    with pytest.raises(ManifestError) as err:
        SeerPipeline.from_manifest(folder, threads=1)
    assert time.monotonic() - start < BOUND_S
    assert line in str(err.value) and "\n" not in str(err.value)
    assert str(folder) in str(err.value) or "buckets" in line  # the export is named, not a request


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["traversal", "outside symlink", "fifo tokenizer", "huge bucket", "huge manifest"])
def test_seer_run_refuses_a_hostile_export_in_one_line_within_time_and_memory(hostile, kind):
    folder, line = hostile(kind)
    # VmHWM: this process's own peak (ru_maxrss would carry the forking test process's)
    code = ("import re, sys, time; from seer_trt.cli import seer_run; t = time.monotonic()\n"
            f"sys.argv[1:] = ['--engines', {str(folder)!r}, '--prompt', 'count to 3 .']\n"
            "try:\n    seer_run()\nexcept SystemExit as e:\n    rc = e.code\n"
            "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)\n"
            "print(rc, time.monotonic() - t, int(hwm) // 1024)")  # fmt: skip
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    rc, seconds, peak_mb = p.stdout.split()
    assert int(rc) == 2 and line in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert float(seconds) < BOUND_S and int(peak_mb) < BOUND_MB  # the runtime's imports included


def test_a_regular_export_still_reads_and_names_every_path(fixture_export):
    manifest = Manifest.read(fixture_export[0])
    entries = dict(manifest.paths())
    assert entries["graphs.denoise.file"] == "denoise.onnx" and entries["weights.index"] == "weights.json"
    assert entries["tokenizer"] == manifest.tokenizer


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_seer_triton_refuses_a_hostile_export_in_one_line_and_writes_nothing(hostile, kind, tmp_path):
    """seer-triton reads the export through the same confined Manifest.read: exit 2, one line naming the entry, at
    once, and no repository written (the orchestrator inside tritonserver: tests/test_triton.py)."""
    from cli_capture import cli

    from seer_trt.cli.triton import main as triton_main

    folder, line = hostile(kind)
    out = tmp_path / "repo"
    start = time.monotonic()
    rc, stdout, err = cli(triton_main, ["--engines", str(folder), "--out", str(out), "--flavour", "cpu"])
    assert time.monotonic() - start < BOUND_S
    assert rc == 2 and line in err and len(err.strip().splitlines()) == 1 and stdout == "", err
    assert not out.exists() and list(tmp_path.glob("repo*")) == []  # nothing staged left behind either
