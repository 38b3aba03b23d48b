"""Run a CLI's ``main`` in-process and capture what it prints (shared by the CLI tests)."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable


def cli(main: Callable[[list[str]], int], argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)``'s exit status (argparse's SystemExit included), stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as stop:  # argparse's errors
            rc = stop.code
    return rc, out.getvalue(), err.getvalue()
