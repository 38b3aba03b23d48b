"""docs/cli.md from the commands' own argument parsers: every flag of every command, generated, never hand-written.

    python tools/cli_docs.py           # write docs/cli.md
    python tools/cli_docs.py --check   # exit status 1 when docs/cli.md is not what this would write

In:  pyproject.toml's [project.scripts] (command -> module:main). A module's ``build_parser()`` gives the parser;
     a module without one builds its parser in ``main``, which is caught at its ``parse_args`` call (nothing
     else of ``main`` runs); a command whose parser cannot be had either way gets its ``main(["--help"])``
     text. The C++ ``seer_run`` gets the usage text of cpp/cli/seer_run.cpp (no build needed).
Out: markdown: a section per command with its description, a synopsis of its required options and a table of
     every option (flags, default, help).

argparse wraps help text at the terminal's width (and colours it on Python 3.14+), so COLUMNS and the colour
switches are fixed while parsers are built and read; the tables themselves depend on no width.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI_MD = ROOT / "docs" / "cli.md"
SEER_RUN_CPP = ROOT / "cpp" / "cli" / "seer_run.cpp"
COLUMNS = "100"
# The order of a request's life (export, run, measure, build, serve, then the PyTorch side); a command missing
# here still gets its section, after these.
ORDER = ("seer-export", "seer-run", "seer-prompt-ids", "seer-eval", "seer-bench", "seer-quantize", "seer-build",
         "seer-triton", "seer-serve", "seer-reference", "seer-calibrate")  # fmt: skip

HEADER = """\
# Command-line reference

Every flag of every command, generated from the commands' own parsers by `tools/cli_docs.py`; do not edit by
hand: run `python tools/cli_docs.py` after changing a flag (`tests/test_cli_docs.py` fails until you do). Each
command prints its own flags with `--help`. The README lists the commands; [DESIGN.md](DESIGN.md) says what they do.
"""


def scripts() -> dict[str, str]:
    """pyproject's [project.scripts], command -> "module:function" (a regex, not tomllib: Python 3.10 is supported)."""
    text = (ROOT / "pyproject.toml").read_text()
    table = re.search(r"^\[project\.scripts\]\n(.*?)(?=^\[|\Z)", text, re.S | re.M)
    if not table:
        raise SystemExit("pyproject.toml has no [project.scripts] table")
    return dict(re.findall(r'^([\w-]+)\s*=\s*"([\w.:]+)"', table.group(1), re.M))


TERMINAL = {"COLUMNS": COLUMNS, "NO_COLOR": "1", "PYTHON_COLORS": "0"}  # width; no colour (argparse colours on 3.14+)


@contextlib.contextmanager
def fixed_terminal(prog: str) -> Iterator[None]:
    """The terminal argparse formats for (TERMINAL) and argv[0] (a default ``prog``) fixed, then restored."""
    saved_env, saved_argv0 = {k: os.environ.get(k) for k in TERMINAL}, sys.argv[0]
    os.environ.update(TERMINAL)
    sys.argv[0] = prog
    try:
        yield
    finally:
        sys.argv[0] = saved_argv0
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class _Caught(BaseException):  # BaseException: no ``except Exception`` in a main may swallow it
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def caught_parser(main) -> argparse.ArgumentParser | None:
    """The parser ``main`` builds, stopped at its ``parse_args`` call; None when it never gets there."""

    def stop(self, *args, **kwargs):
        raise _Caught(self)

    saved = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = stop
    try:
        main(["--help"])
    except _Caught as caught:
        return caught.parser
    except (Exception, SystemExit):
        return None
    finally:
        argparse.ArgumentParser.parse_args = saved
    return None


def help_text(main) -> str:
    """What ``main(["--help"])`` prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(["--help"])
        except SystemExit:
            pass
    return out.getvalue().rstrip()


def cell(text: str, code: bool = False) -> str:
    """``text`` inside a markdown table cell: one line, pipes escaped; outside a code span ``<image>`` and the like
    escaped too, or markdown would take them for HTML tags."""
    text = " ".join(text.split()).replace("|", "\\|")
    return text if code else text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def flags(action: argparse.Action) -> str:
    """``--cache {none,reuse,forecast}``, ``--graphs GRAPH ...``, ``--force``: the option as typed."""
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    if action.metavar is not None:
        value = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    elif action.choices is not None:
        value = "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        value = action.dest.upper()
    if action.nargs in ("+", "*"):
        value = f"{value} [{value} ...]" if action.nargs == "+" else f"[{value} ...]"
    elif action.nargs == "?":
        value = f"[{value}]"
    elif isinstance(action.nargs, int) and action.nargs > 1:
        value = " ".join([value] * action.nargs)
    return ", ".join(f"{o} {value}" for o in action.option_strings)


def default(action: argparse.Action) -> str:
    """The default as a user would type it; empty for none and for on/off flags."""
    value = action.default
    if action.nargs == 0 or value is None or value is argparse.SUPPRESS:
        return ""
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return str(value)


def synopsis(parser: argparse.ArgumentParser) -> str:
    """The command with what it requires: ``seer-run --engines ENGINES (--prompt PROMPT | --input INPUT) [options]``."""
    grouped = {id(a): g for g in parser._mutually_exclusive_groups for a in g._group_actions}
    parts, seen = [parser.prog], set()
    for action in parser._actions:
        group = grouped.get(id(action))
        if group is not None and group.required:
            if id(group) not in seen:
                seen.add(id(group))
                parts.append("(" + " | ".join(flags(a) for a in group._group_actions) + ")")
        elif action.required:
            parts.append(flags(action))
    return " ".join(parts + ["[options]"])


def options_table(parser: argparse.ArgumentParser) -> str:
    formatter = parser._get_formatter()
    grouped = {id(a): g for g in parser._mutually_exclusive_groups for a in g._group_actions}
    rows = ["| option | default | help |", "|---|---|---|"]
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        group = grouped.get(id(action))
        notes = []
        if action.required:
            notes.append("required")
        if group is not None:
            others = [a.option_strings[0] for a in group._group_actions if a is not action]
            notes.append(("one of this or " if group.required else "not with ") + ", ".join(others))
        text = formatter._expand_help(action) if action.help else ""
        text += f" ({'; '.join(notes)})" if notes else ""
        value = cell(default(action), code=True)
        rows.append(f"| `{cell(flags(action), code=True)}` | {value and f'`{value}`'} | {cell(text)} |")
    return "\n".join(rows)


def parser_section(parser: argparse.ArgumentParser) -> str:
    parts = []
    if parser.description:
        parts.append(" ".join(parser.description.split()))
    parts += [f"```\n{synopsis(parser)}\n```", options_table(parser)]
    return "\n\n".join(parts)


def command_section(command: str, entry: str) -> str:
    module_name, function = entry.split(":")
    with fixed_terminal(command):
        module = importlib.import_module(module_name)
        real = getattr(getattr(module, function), "command_module", None)  # a launcher (seer_trt.cli.launch)
        if real is not None:
            module_name, function, entry = real, "main", f"{real}:main"
            module = importlib.import_module(module_name)
        build = getattr(module, "build_parser", None)
        parser = build() if callable(build) else caught_parser(getattr(module, function))
        body = parser_section(parser) if parser is not None else f"```\n{help_text(getattr(module, function))}\n```"
    return f"## {command}\n\n`{entry}`\n\n{body}\n"


def cpp_section() -> str:
    """seer_run's USAGE literal, as its ``--help`` prints it."""
    source = SEER_RUN_CPP.read_text()
    match = re.search(r"USAGE\s*=\s*((?:\s*\"(?:[^\"\\]|\\.)*\")+)\s*;", source)
    if not match:
        raise SystemExit(f"{SEER_RUN_CPP.relative_to(ROOT)}: no USAGE string literal found")
    literals = re.findall(r"\"((?:[^\"\\]|\\.)*)\"", match.group(1))
    text = "".join(literals).encode().decode("unicode_escape").rstrip()
    return (f"## seer_run (C++)\n\n`{SEER_RUN_CPP.relative_to(ROOT)}`, built as `cpp/build/seer_run`; it takes "
            f"`seer-prompt-ids`' requests and prints `seer-run`'s fields.\n\n```\n{text}\n```\n")  # fmt: skip


def generate() -> str:
    """The whole of docs/cli.md."""
    entries = scripts()
    commands = [c for c in ORDER if c in entries] + sorted(set(entries) - set(ORDER))
    sections = [HEADER, "\n".join(f"- [{c}](#{c})" for c in commands) + "\n- [seer_run (C++)](#seer_run-c)\n"]
    sections += [command_section(c, entries[c]) for c in commands]
    sections.append(cpp_section())
    return "\n".join(sections)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="cli_docs", description="Write docs/cli.md from the commands' parsers.")
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/cli.md differs from what would be written")
    args = ap.parse_args(argv)
    text = generate()
    if args.check:
        current = CLI_MD.read_text() if CLI_MD.is_file() else ""
        if current != text:
            print(f"{CLI_MD.relative_to(ROOT)} is out of date; run: python tools/cli_docs.py", file=sys.stderr)
            return 1
        return 0
    CLI_MD.write_text(text)
    print(f"wrote {CLI_MD.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
