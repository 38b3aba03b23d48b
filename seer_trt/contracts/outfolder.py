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
SIGTERM and SIGHUP (``signals_as_interrupts``) unwind through the block, which removes the staging folder; a
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
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from seer_trt.contracts.errors import SeerError
from seer_trt.contracts.manifest import MANIFEST_FILE

REPOSITORY_MARKER = ".seer-triton.json"  # written at the root of every repository seer-triton writes
COLLECTION_README = "README.md"  # the one plain file a folder of exports may hold
LEGACY_STALE_S = 3600  # a partial folder of an older seer-trt (no owner in its name) untouched this long is stale
_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


class FolderError(SeerError):
    """An output folder cannot be written: a file is in the way, it holds the user's files, or it is not writable."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the process was, so ``finally`` blocks and staging cleanup run."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signal_name(err: KeyboardInterrupt) -> tuple[str, int]:
    """("SIGTERM", 15) for an ``Interrupted``, ("SIGINT", 2) for a plain KeyboardInterrupt."""
    signum = getattr(err, "signum", signal.SIGINT)
    return signal.Signals(signum).name, int(signum)


@contextlib.contextmanager
def signals_as_interrupts() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``Interrupted`` inside the block (SIGINT raises KeyboardInterrupt already).

    Python's default for SIGTERM ends the process at once, leaving staging folders behind; as an exception it
    unwinds like Ctrl-C. Only the main thread can install handlers: elsewhere the block runs unchanged.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Interrupted(signum)

    # a signal someone chose to ignore (nohup's SIGHUP) stays ignored
    previous = {s: signal.signal(s, handler) for s in _SIGNALS
                if s != signal.SIGINT and signal.getsignal(s) is signal.SIG_DFL}  # fmt: skip
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Signals wait until the block ends: a swap is a few renames that must not stop half-way."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


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
                 what: str = "seer-trt output") -> Target:  # fmt: skip
    """Check, before any work, that ``out`` may be written; removes stale partial folders of our own.

    Args:
        out: the output folder.
        force: replace an output this tool wrote (``owned``); nothing else is ever replaced.
        owned: whether an existing non-empty folder is one this tool wrote.
        flag: the option that named it, for messages.
        what: what this tool writes, for messages ("an export", "a model repository").

    Raises:
        FolderError: ``out`` is a file or under one, holds anything not ours, is ours but ``force`` is not set, or
            nothing on the way to it is writable.
    """
    out = Path(out).expanduser().resolve()
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
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # mkdtemp makes it private; the output is an ordinary folder once in place
        with _signals_held():
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
