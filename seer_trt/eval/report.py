"""Writing reports: JSON and PNG files that are never half-written, and the git sha every report records."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from seer_trt.contracts.outfolder import write_file


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` as indented JSON at ``path``, never half-written (``write_file``)."""
    text = json.dumps(data, indent=2) + "\n"
    write_file(path, lambda f: f.write(text.encode("utf-8")))


def print_report(data: dict[str, Any], path: Path | None) -> None:
    """A tool's report: printed as indented JSON, and written to ``path`` where given (``write_json``)."""
    print(json.dumps(data, indent=2), flush=True)
    if path is not None:
        write_json(path, data)


def save_figure(fig: Any, path: Path, dpi: int = 110) -> None:
    """A matplotlib figure as a PNG at ``path`` (folder made), never half-written (``write_file``); the figure is
    closed."""
    import matplotlib.pyplot as plt

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path, lambda f: fig.savefig(f, dpi=dpi, format="png"))
    finally:
        plt.close(fig)


def git_sha() -> str | None:
    """The short commit of the source tree this runs from, None outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).parent)  # fmt: skip
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
