"""Output folders the tools write (seer-export, seer-build, seer-triton): never half-written, never the user's.

In:  the folder a tool is asked to write (``--out``, or the engine folder of ``--engines``), ``--force``, and how to
     recognise a folder that tool wrote itself (``owned``: an export's manifest, a repository's marker, plans the
     manifest records).
Out: ``Target``, checked before any work; ``replace_folder(target)``, a staging folder that becomes the output
     only once the block completes.

    check_target ─► refuse: a file, a folder holding anything we did not write (even with --force), ours without
                 │  --force, nowhere writable ─► sweep our own stale partials (their process is gone)
    replace_folder ─► staging (.NAME.partial-PID.HOST-*) ─► block writes ─► swap in (signals held) ─► old removed

Staging sits next to the output, on its file system, so the swap is a rename. A mount point (a container
volume) cannot be renamed: its staging folder goes inside it and the swap moves entries instead. SIGINT,
SIGTERM and SIGHUP (``seer_trt.contracts.signals.signals_as_interrupts``) unwind through the block, which removes the staging folder; a
process killed outright leaves one, which the next run removes (its name carries the process id and host).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from seer_trt.contracts.errors import SeerError
from seer_trt.contracts.manifest import MANIFEST_FILE
from seer_trt.contracts.signals import check_interrupted, signals_held

REPOSITORY_MARKER = ".seer-triton.json"  # written at the root of every repository seer-triton writes
FILES_RECORD = ".seer-files.json"  # every output folder's list of the files seer-trt wrote in it (replace_folder)
COLLECTION_README = "README.md"  # the one plain file a folder of exports may hold
LEGACY_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")  # what exports copy
LEGACY_STALE_S = 3600  # a partial folder of an older seer-trt (no owner in its name) untouched this long is stale


class FolderError(SeerError):
    """An output folder cannot be written: a file is in the way, it holds the user's files, or it is not writable."""


# --------------------------------------------------------------------------------------------- output files


def write_file(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """A file at ``path`` written whole or not at all: ``write`` fills a staging file of this process's own in the
    same folder (``.NAME.partial-PID-*``, so processes writing one output never share it), which is renamed onto
    ``path`` once complete and removed on any failure, Ctrl-C included. No folder is created.

    Raises:
        OSError: the folder is missing or not writable, or writing fails (nothing is left then).
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.partial-{os.getpid()}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; the output is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------------------------- what is ours


def is_export(folder: Path) -> bool:
    """A folder seer-export wrote: its ``manifest.json`` is a JSON object with a schema version and graphs."""
    try:
        data = json.loads((folder / MANIFEST_FILE).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and "schema_version" in data and isinstance(data.get("graphs"), dict)


def is_repository(folder: Path) -> bool:
    """A folder seer-triton wrote: it holds the repository marker."""
    return (folder / REPOSITORY_MARKER).is_file()


def write_repository_marker(folder: Path, record: dict) -> None:
    (folder / REPOSITORY_MARKER).write_text(json.dumps({"tool": "seer-triton", **record}, indent=2) + "\n")


def visible(folder: Path) -> list[Path]:
    """Entries of ``folder`` not hidden (``.DS_Store``, ``.git``, our own staging folders): what a person sees."""
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def is_collection(folder: Path) -> bool:
    """A folder of exports such as ``engines/``: no manifest of its own, and nothing visible but export folders and
    a README (the repository's ``engines/`` starts with its README alone). Hidden entries do not count either way:
    a stray ``.DS_Store`` changes nothing."""
    if not folder.is_dir() or (folder / MANIFEST_FILE).exists():
        return False
    entries = visible(folder)
    return bool(entries) and all(
        (e.is_dir() and is_export(e)) or (e.name == COLLECTION_README and e.is_file()) for e in entries
    )


def export_files(folder: Path) -> set[str]:
    """What an export written before ``FILES_RECORD`` holds of ours, from its manifest: the manifest, every graph
    file and its weights, the weights index, the tokenizer files, and (``/``-terminated: the whole folder) the
    goldens and each build's engine folder."""
    try:
        data = json.loads((folder / MANIFEST_FILE).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return set()
    graphs = data.get("graphs") if isinstance(data, dict) else None
    if not isinstance(graphs, dict):
        return set()
    tok = data.get("tokenizer") or "tokenizer"
    names = {MANIFEST_FILE, "weights.json", "goldens/", *(f"{tok}/{f}" for f in LEGACY_TOKENIZER_FILES)}
    for entry in graphs.values():
        if isinstance(entry, dict):
            names |= {str(entry[k]) for k in ("file", "external_data") if entry.get(k)}
    builds = data.get("builds")
    names |= {f"{b}/" for b in builds} if isinstance(builds, dict) else set()
    return names


def repository_files(folder: Path) -> set[str]:
    """What a repository written before ``FILES_RECORD`` holds of ours: its marker and its model folders (those
    with a ``config.pbtxt``), whole."""
    return {REPOSITORY_MARKER} | {f"{p.name}/" for p in folder.iterdir() if (p / "config.pbtxt").is_file()}


def record_files(folder: Path) -> None:
    """Write ``FILES_RECORD`` into a finished output: every file below ``folder`` (links as themselves) and every
    folder (``/``-terminated)."""
    files, folders = [], []
    for d, dirs, fs in os.walk(folder):
        rel = Path(d).relative_to(folder)
        files += [(rel / f).as_posix() for f in fs]
        for x in dirs:
            (files if (Path(d) / x).is_symlink() else folders).append((rel / x).as_posix())
    record = {"tool": "seer-trt", "files": sorted(files), "folders": sorted(f"{x}/" for x in folders)}
    (folder / FILES_RECORD).write_text(json.dumps(record, indent=1) + "\n")


def recorded(folder: Path) -> tuple[set[str], set[str]] | None:
    """The files and the folders ``FILES_RECORD`` lists, or None when ``folder`` has no (readable) record."""
    try:
        data = json.loads((folder / FILES_RECORD).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        return None
    folders = data.get("folders") if isinstance(data.get("folders"), list) else []
    return {f for f in data["files"] if isinstance(f, str)}, {f.rstrip("/") for f in folders if isinstance(f, str)}


def foreign_entries(folder: Path, legacy: Callable[[Path], set[str]] | None = None) -> list[str]:
    """Entries below ``folder`` that seer-trt did not write there: not in its ``FILES_RECORD`` (or, for a folder
    written before records, in ``legacy(folder)``, where a name ending in ``/`` covers a whole folder). A folder
    below with a record of its own (seer-build's engine folder inside an export) is judged by that record. A
    folder holding nothing of ours is named whole (``my_results/``), hidden entries included: ``--force`` must
    never delete what a user put there."""
    record = recorded(folder)
    if record is not None:
        files, folders, whole = record[0], record[1], set()
    else:
        listed = legacy(folder) if legacy is not None else set()
        files, folders = {n for n in listed if not n.endswith("/")}, set()
        whole = {n.rstrip("/") for n in listed if n.endswith("/")}
    inside = folders | {p.as_posix() for n in files for p in Path(n).parents}  # folders holding something of ours
    foreign: list[str] = []

    def walk(sub: Path, rel: str) -> None:
        for entry in sorted(sub.iterdir()):
            name = f"{rel}{entry.name}"
            if not rel and (entry.name == FILES_RECORD or _is_staging(entry.name, folder.name)):
                continue
            if name in whole or name in files:
                continue
            if entry.is_dir() and not entry.is_symlink():
                if recorded(entry) is not None:
                    foreign.extend(f"{name}/{x}" for x in foreign_entries(entry))
                elif name in inside:
                    walk(entry, f"{name}/")
                else:
                    foreign.append(f"{name}/")
            else:
                foreign.append(name)

    walk(folder, "")
    return foreign


def output_above(path: Path) -> Path | None:
    """The nearest folder above ``path`` that is an export or a repository seer-trt wrote, if any."""
    return next((p for p in path.parents if is_export(p) or is_repository(p)), None)


# ------------------------------------------------------------------------------------------- check the target


@dataclasses.dataclass(frozen=True)
class Target:
    """An output folder checked for writing."""

    path: Path  # absolute, symlinks resolved
    flag: str  # how the user named it, for messages ("--out", "--engines DIR's engine folder")
    inside: bool  # a mount point: staging goes inside it and the swap moves entries (a mount cannot be renamed)

    @property
    def staging_parent(self) -> Path:
        return self.path if self.inside else self.path.parent


def _mount_points() -> set[str]:
    """Mount points of this process (Linux ``/proc/self/mountinfo``); empty where that cannot be read."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return set()
    # field 5 is the mount point, with spaces and the like octal-escaped ("\040")
    return {re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4]) for line in lines}


def is_mount(path: Path) -> bool:
    """True for a mount point, bind mounts included (``os.path.ismount`` misses a bind mount of the same device)."""
    return os.path.ismount(path) or str(path) in _mount_points()


def check_target(out: str | Path, force: bool, owned: Callable[[Path], bool], flag: str = "--out",
                 what: str = "seer-trt output", legacy: Callable[[Path], set[str]] | None = None,
                 nested: bool = False) -> Target:  # fmt: skip
    """Check, before any work, that ``out`` may be written; removes stale partial folders of our own.

    Args:
        out: the output folder.
        force: replace an output this tool wrote (``owned``) and that holds nothing else (``foreign_entries``);
            nothing else is ever replaced.
        owned: whether an existing non-empty folder is one this tool wrote.
        flag: the option that named it, for messages.
        what: what this tool writes, for messages ("an export", "a model repository").
        legacy: what an output of this tool written before ``FILES_RECORD`` holds of ours.
        nested: ``out`` belongs inside another seer-trt output (seer-build's engine folder in its export);
            otherwise an ``out`` inside an export or a repository is refused.

    Raises:
        FolderError: ``out`` is a file or under one, inside another output, holds anything not ours, is ours but
            ``force`` is not set, or nothing on the way to it is writable.
    """
    out = Path(out).expanduser().resolve()
    above = None if nested else output_above(out)
    if above is not None:
        kind = "an export" if is_export(above) else "a model repository"
        raise FolderError(f"{flag} {out} is inside {kind} ({above}), which seer-trt replaces whole; choose a folder "
                          f"outside it")  # fmt: skip
    blocker = next((p for p in (out, *out.parents) if p.exists()), None)
    if out.exists() and not out.is_dir():
        raise FolderError(f"{flag} {out} is a file; expected a folder (new, empty, or {what} to replace with --force)")
    if blocker is not None and not blocker.is_dir():
        raise FolderError(f"{flag} {out}: {blocker} is a file, not a folder; choose another {flag}")
    inside = out.is_dir() and is_mount(out)
    target = Target(out, flag, inside)
    if blocker is not None and not os.access(target.staging_parent if out.exists() else blocker, os.W_OK | os.X_OK):
        raise FolderError(f"{flag} {out}: {target.staging_parent if out.exists() else blocker} is not writable; "
                          f"choose a writable folder")  # fmt: skip
    if out.is_dir():
        sweep(target)
        entries = [p for p in out.iterdir() if not _is_staging(p.name, out.name)]
        if entries and not owned(out):
            names = ", ".join(p.name for p in sorted(entries)[:3]) + (", ..." if len(entries) > 3 else "")
            raise FolderError(f"{flag} {out} holds files seer-trt did not write ({names}) and is never replaced, not "
                              f"even with --force; choose a new or empty folder, or move them out")  # fmt: skip
        foreign = foreign_entries(out, legacy) if entries else []
        if foreign:
            names = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise FolderError(f"{flag} {out} holds {what}, and also files seer-trt did not write ({names}), which are "
                              f"never deleted, not even with --force; move them out, or choose another "
                              f"{flag}")  # fmt: skip
        if entries and not force:
            raise FolderError(f"{flag} {out} already holds {what}; pass --force to replace it, or choose another "
                              f"{flag}")  # fmt: skip
    elif out.parent.is_dir():
        sweep(target)
    return target


# -------------------------------------------------------------------------------------- staging and the swap


def _owner() -> str:
    """This process's mark in a staging folder's name: pid and a short hash of the host (network file systems)."""
    return f"{os.getpid()}.{_host()}"


def _host() -> str:
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def _is_staging(name: str, out_name: str) -> bool:
    return name.startswith((f".{out_name}.partial-", f".{out_name}.old-"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def sweep(target: Target) -> list[Path]:
    """Remove partial and old folders a previous run of ours left next to (or inside) ``target``; returns them.

    A folder is stale when the process its name records is gone (on this host), or, for names of an older
    seer-trt without an owner, when untouched for an hour. A stale old folder whose output is missing is the
    previous output a killed swap moved aside: it is moved back, not deleted.
    """
    parent, name = target.staging_parent, target.path.name
    removed = []
    if not parent.is_dir():
        return removed
    for entry in sorted(parent.iterdir()):
        if not entry.is_dir() or not _is_staging(entry.name, name):
            continue
        suffix = entry.name.split(".partial-" if ".partial-" in entry.name else ".old-", 1)[1]
        owner = re.match(r"(\d+)\.([0-9a-f]{8})-", suffix)
        if owner is not None:
            if owner.group(2) != _host() or _alive(int(owner.group(1))):
                continue
        else:
            try:
                if time.time() - entry.stat().st_mtime < LEGACY_STALE_S:
                    continue
            except OSError:
                continue
        if ".old-" in entry.name:
            _restore(entry, target)
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def _restore(old: Path, target: Target) -> None:
    """Put back the previous output a swap killed half-way had moved into ``old``."""
    if target.inside:
        if not visible(target.path):
            for entry in old.iterdir():
                os.replace(entry, target.path / entry.name)
    elif (old / target.path.name).exists() and not target.path.exists():
        os.replace(old / target.path.name, target.path)


@contextlib.contextmanager
def replace_folder(target: Target) -> Iterator[Path]:
    """A staging folder that becomes ``target.path`` only if the block completes; removed otherwise (exceptions,
    Ctrl-C, ``Interrupted``). The previous output stays until the new one is in place.

    Raises:
        FolderError: the staging folder cannot be created, or the swap fails (the previous output is restored).
    """
    parent = target.staging_parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.path.name}.partial-{_owner()}-", dir=parent))
    except OSError as err:
        raise FolderError(f"{target.flag} {target.path}: cannot write in {parent} ({err.strerror}); choose a "
                          f"writable folder") from None  # fmt: skip
    try:
        yield staging
        check_interrupted()  # a signal something swallowed on the way: the previous output stays
        record_files(staging)
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # mkdtemp makes it private; the output is an ordinary folder once in place
        with signals_held():
            try:
                (_swap_inside if target.inside else _swap)(staging, target)
            except OSError as err:
                raise FolderError(f"{target.flag} {target.path}: moving the finished output into place failed "
                                  f"({err.strerror or err}); the previous one is as it was") from None  # fmt: skip
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already when the swap moved it into place


def _swap(staging: Path, target: Target) -> None:
    """Rename ``staging`` onto the output; the previous output goes aside first and is removed once replaced."""
    live = target.path
    old = None
    if live.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{live.name}.old-{_owner()}-", dir=live.parent))
        os.replace(live, old / live.name)
    try:
        os.replace(staging, live)
    except OSError:
        if old is not None:
            os.replace(old / live.name, live)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _swap_inside(staging: Path, target: Target) -> None:
    """A mount point's swap: its entries go aside into a hidden folder inside it, the staging entries move in."""
    live = target.path
    old = Path(tempfile.mkdtemp(prefix=f".{live.name}.old-{_owner()}-", dir=live))
    moved_in: list[Path] = []
    previous = [p for p in live.iterdir() if p not in (staging, old) and not _is_staging(p.name, live.name)]
    try:
        for entry in previous:
            os.replace(entry, old / entry.name)
        for entry in list(staging.iterdir()):
            os.replace(entry, live / entry.name)
            moved_in.append(live / entry.name)
    except OSError:
        for entry in moved_in:
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        for entry in old.iterdir():
            os.replace(entry, live / entry.name)
        shutil.rmtree(old, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
