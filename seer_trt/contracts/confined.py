"""An export reads only regular files inside its own folder (docs/DESIGN.md "Bounds and output folders").

Exports are shared like checkpoints (a Triton repository, a model hub folder), so a manifest is untrusted input:
every path it names must be relative, normalised, and resolve (symbolic links followed) inside the export folder;
what is opened must be a regular file (a FIFO or a device would block or never end), opened without blocking, and
files that are parsed whole (the manifest, the weights index, the tokenizer) are bounded in size before they are
read. A violation is a ``ManifestError`` in one line naming the export and the entry.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath

from seer_trt.contracts.errors import ManifestError

MAX_MANIFEST_BYTES = 16 * 2**20  # a manifest is a few KiB; anything near this is not one
MAX_INDEX_BYTES = 64 * 2**20  # the weights index: one short line per tensor (LLaDA-V 8B: about 1,000)
MAX_TOKENIZER_BYTES = 256 * 2**20  # tokenizer.json of a 150k vocabulary with its merges: about 10 MiB


def inside(folder: str | Path, name: object, entry: str) -> Path:
    """The resolved path of ``name``, a path the manifest's ``entry`` names, inside ``folder``.

    Raises:
        ManifestError: not a non-empty relative path, a ``..`` in it, or a path that resolves (through a symbolic
            link) outside the export folder.
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ManifestError(f"export {folder}: manifest entry {entry} is {ascii(name)[:80]}, not a file name inside "
                            f"the export; re-export with seer-export")  # fmt: skip
    pure = PurePosixPath(name)
    if pure.is_absolute() or PureWindowsPath(name).drive or PureWindowsPath(name).root or ".." in pure.parts:
        raise ManifestError(f"export {folder}: manifest entry {entry} is {ascii(name)[:80]}, a path outside the export "
                            f"folder; an export reads only files inside its own folder (re-export with seer-export)")  # fmt: skip
    root = Path(folder).resolve()
    path = (root / pure).resolve()
    if path != root and not path.is_relative_to(root):
        raise ManifestError(f"export {folder}: manifest entry {entry} ({ascii(name)[:80]}) resolves through a symbolic "
                            f"link to a file outside the export folder; an export reads only files inside its own "
                            f"folder (re-export with seer-export)")  # fmt: skip
    return path


def regular(path: Path, folder: str | Path, entry: str, limit: int | None = None) -> os.stat_result:
    """``path``'s status if it is a regular file of at most ``limit`` bytes.

    Raises:
        FileNotFoundError: it does not exist (callers say what to do).
        ManifestError: a FIFO, device, socket or folder, or larger than ``limit``.
    """
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ManifestError(f"export {folder}: {entry} {path.name} is not a regular file (a FIFO, device, socket or "
                            f"folder); re-export with seer-export")  # fmt: skip
    if limit is not None and st.st_size > limit:
        raise ManifestError(f"export {folder}: {entry} {path.name} is {st.st_size} bytes, more than the {limit} such a "
                            f"file may be; re-export with seer-export")  # fmt: skip
    return st


def read_bounded(path: Path, folder: str | Path, entry: str, limit: int) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes, opened without blocking (a FIFO put there
    after the check is refused, not waited on).

    Raises:
        FileNotFoundError: it does not exist.
        ManifestError: not a regular file, or larger than ``limit``.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ManifestError(f"export {folder}: {entry} {path.name} is not a regular file (a FIFO, device, socket "
                                f"or folder); re-export with seer-export")  # fmt: skip
        if st.st_size > limit:
            raise ManifestError(f"export {folder}: {entry} {path.name} is {st.st_size} bytes, more than the {limit} "
                                f"such a file may be; re-export with seer-export")  # fmt: skip
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 2**20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:  # it grew after the check
            raise ManifestError(f"export {folder}: {entry} {path.name} is more than the {limit} bytes such a file may "
                                f"be; re-export with seer-export")  # fmt: skip
        return data
    finally:
        os.close(fd)


def export_file(folder: str | Path, name: object, entry: str, limit: int | None = None) -> Path:
    """``inside`` and ``regular`` at once: the resolved path of a file the export reads.

    Raises:
        FileNotFoundError: it does not exist.
        ManifestError: outside the folder, not a regular file, or larger than ``limit``.
    """
    path = inside(folder, name, entry)
    regular(path, folder, entry, limit)
    return path
