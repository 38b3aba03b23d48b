"""Writing reports: JSON and PNG files that are never half-written, and the git sha every report records."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any


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
