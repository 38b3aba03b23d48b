"""What the measuring CLIs (seer-eval, seer-bench) share: their JSON written atomically, the git sha, the
one-line error exit.

In:  a report dict and a path; an error and the CLI's name.
Out: the file in place only when complete (temp name, then rename); exit status 2 and one line on stderr.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` as indented JSON at ``path``, never half-written."""
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def git_sha() -> str | None:
    """The short commit of the source tree this runs from, None outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).parent)  # fmt: skip
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def fail(prog: str, err: BaseException, verbose: bool) -> int:
    """One line on stderr for an error a user caused, exit status 2; ``--verbose`` re-raises it."""
    if verbose:
        raise err
    print(f"{prog}: error: {err}", file=sys.stderr)
    return 2
