"""Checksums of an export's graph files: recorded by seer-export, verified by seer-build and on request at run time.

In:  an export folder and its ``Manifest``.
Out: ``checksums``: {path relative to the folder: sha256} of every file the graphs read (each ``.onnx`` file and
     its external data; a weights file several graphs share counts once), which the exporter records in the
     manifest; ``verify`` raises naming each file that differs from that record.

A graph file swapped for one with the same inputs and outputs but other weights passes every signature check the
backends make; only its bytes tell. One map over files (not one hash per graph) stays right whatever the file
layout: a graph with its own weights, or all graphs sharing one external-data file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from seer_trt.contracts.confined import inside, regular
from seer_trt.contracts.errors import ManifestError
from seer_trt.contracts.manifest import Manifest

BLOCK = 1 << 22  # bytes read at a time: hashing a 17 GB export never holds more than this


class IntegrityError(ManifestError):
    """A file of the export is not the one the manifest recorded."""


def graph_files(manifest: Manifest) -> list[str]:
    """Every file the graphs read, relative to the export folder, in graph order, each once (and the shared weights'
    index, which the runtime maps the tensors by)."""
    files = [f for e in manifest.graphs.values() for f in (e.file, e.external_data) if f is not None]
    if manifest.weights is not None:
        files.append(manifest.weights.index)
    return list(dict.fromkeys(files))


def sha256(path: Path) -> str:
    """Hex sha256 of a file, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def checksums(folder: str | Path, manifest: Manifest) -> dict[str, str]:
    """{file: sha256} of every file the manifest's graphs read, as found in ``folder``."""
    return {name: sha256(Path(folder) / name) for name in graph_files(manifest)}


def verify(folder: str | Path, manifest: Manifest, log: Callable[[str], None] | None = None) -> int:
    """Check every graph file against the manifest's record; returns how many files were checked.

    Args:
        folder: the export folder.
        manifest: its manifest.
        log: where to say that an older export recorded no checksums (then nothing is checked); None: that is an
            error too.

    Raises:
        IntegrityError: a file differs from its recorded sha256, is missing, or is not covered by the record; or
            (``log`` None) the manifest records no checksums.
    """
    folder = Path(folder)
    if not manifest.checksums:
        text = f"{folder} records no checksums (exported before manifest schema 1.2)"
        if log is None:
            raise IntegrityError(f"{text}, so its graph files cannot be verified; re-export with seer-export")
        log(f"{text}: graph files not verified; re-export to record them")
        return 0
    files = graph_files(manifest)
    problems = [f"{name} has no recorded checksum" for name in files if name not in manifest.checksums]
    for name in files:
        if name not in manifest.checksums:
            continue
        path = inside(folder, name, f"checksums.{name}")
        if not path.exists():
            problems.append(f"{name} is missing")
        elif regular(path, folder, name) and sha256(path) != manifest.checksums[name]:
            problems.append(
                f"{name} differs from the exported file (sha256 {manifest.checksums[name][:12]}... recorded)"
            )
    if problems:
        raise IntegrityError(f"{folder}: {'; '.join(problems)}; the export folder was modified or damaged, re-export "
                             f"with seer-export")  # fmt: skip
    return len(files)
