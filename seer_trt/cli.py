"""What every CLI shares: an argument parser whose errors are one line, the one-line error exit (and interrupt),
the export extra's check, JSON written atomically, the git sha of reports.

In:  the CLI's name; an error; a report dict and a path.
Out: exit status 2 and one line on stderr (``--verbose`` re-raises); the file in place only when complete.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line naming ``--help``, exit status 2, like every other bad input."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}; see {self.prog} --help", file=sys.stderr)
        raise SystemExit(2)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` as indented JSON at ``path``, never half-written."""
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def save_figure(fig: Any, path: Path, dpi: int = 110) -> None:
    """A matplotlib figure as a PNG at ``path`` (folder made), never half-written; the figure is closed."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial.png")
    try:
        fig.savefig(tmp, dpi=dpi)
    finally:
        plt.close(fig)
    tmp.replace(path)


def git_sha() -> str | None:
    """The short commit of the source tree this runs from, None outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).parent)  # fmt: skip
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


EXPORT_MODULES = ("torch", "transformers", "safetensors", "onnx", "onnxscript")  # what the export extra brings


def require_extra(prog: str, modules: tuple[str, ...] = EXPORT_MODULES, extra: str = "export") -> None:
    """Refuse to start, in one line, when an extra's packages are missing (a runtime-only ``pip install .``).

    Raises:
        ConfigError: naming the missing packages and the install command.
    """
    import importlib.util

    from seer_trt.errors import ConfigError

    def importable(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    missing = [m for m in modules if not importable(m)]
    if missing:
        raise ConfigError(f"{prog} needs the '{extra}' extra ({', '.join(missing)} not installed); install it with "
                          f"pip install 'seer-trt[{extra}]'")  # fmt: skip


def interrupted(prog: str, err: KeyboardInterrupt, verbose: bool) -> int:
    """One line for Ctrl-C / SIGTERM / SIGHUP, exit status 128 + the signal; ``--verbose`` re-raises."""
    from seer_trt.outfolder import signal_name

    if verbose:
        raise err
    name, signum = signal_name(err)
    print(f"{prog}: interrupted ({name}); nothing half-written was left behind", file=sys.stderr)
    return 128 + signum


def printable(text: str) -> str:
    """``text`` safe to print: a lone surrogate (a path or argument that was not UTF-8) shown escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def fail(prog: str, err: BaseException, verbose: bool) -> int:
    """One line on stderr for an error a user caused, exit status 2; ``--verbose`` re-raises it."""
    if verbose:
        raise err
    print(printable(f"{prog}: error: {err}"), file=sys.stderr)
    return 2
