"""docs/cli.md is what tools/cli_docs.py generates from the commands' parsers: every flag documented, none stale.
In-process, no subprocess: it imports each command's module (their imports are light) and reads its parser."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cli_docs():
    spec = importlib.util.spec_from_file_location("cli_docs", ROOT / "tools" / "cli_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_md_is_generated_from_the_parsers():
    tool = cli_docs()
    current = tool.CLI_MD.read_text() if tool.CLI_MD.is_file() else ""
    assert current == tool.generate(), (
        "docs/cli.md is out of date with the commands' flags; run: python tools/cli_docs.py"
    )


def test_cli_md_has_a_section_per_command_with_every_flag():
    """What the generator must not lose: each console script's section lists each of its options."""
    import argparse

    tool = cli_docs()
    text = tool.generate()
    for command, entry in tool.scripts().items():
        assert f"\n## {command}\n" in text, command
        section = text.split(f"\n## {command}\n", 1)[1].split("\n## ", 1)[0]
        module, function = entry.split(":")
        with tool.fixed_terminal(command):
            mod = importlib.import_module(module)
            parser = mod.build_parser() if hasattr(mod, "build_parser") else tool.caught_parser(getattr(mod, function))
        assert isinstance(parser, argparse.ArgumentParser), command
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in section, f"{command}: {option} missing from docs/cli.md"
