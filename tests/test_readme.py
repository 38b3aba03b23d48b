"""The README stays true: its two set-up commands are what CI runs, its main job and its Python snippet run as
written (in a temporary folder, never in the working tree; the slow tier), its command list has one line per
command, and the modules and files it and docs/ name exist. Every flag is docs/cli.md's job (test_cli_docs.py)."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def setup_commands() -> list[str]:
    block = re.search(r"## Set-up.*?```bash\n(.*?)```", README, re.S)
    assert block, "README.md has no '## Set-up' section with a bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.S | re.M)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def test_readme_has_two_setup_commands_and_ci_runs_exactly_them():
    commands = setup_commands()
    assert len(commands) == 2, commands
    assert commands[0].startswith("python3 -m pip install") and "seer-export" in commands[0]
    assert commands[1] == "python3 -m pytest -q"
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    steps = [line for line in ci if line.strip() and not line.startswith("#")]
    # CI is the README: the shell preamble, then the two commands verbatim, nothing a user would not run
    assert steps == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', *commands], steps


@pytest.fixture(scope="module")
def main_job(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The README's first command after its install step (this environment is that install), verbatim, in a
    temporary folder: the export lands there, not in the working tree."""
    install, *rest = setup_commands()[0].split(" && ")
    assert install.startswith("python3 -m pip install") and rest, setup_commands()[0]
    folder = tmp_path_factory.mktemp("readme")
    out = subprocess.run(["bash", "-c", " && ".join(rest)], capture_output=True, text=True, timeout=1200, cwd=folder)
    return folder, out


@pytest.mark.slow
def test_readme_main_job_runs(main_job):
    folder, out = main_job
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "| graph | output | dtype |" in out.stdout and "end-to-end Seer" in out.stdout  # the parity report
    engines = re.search(r"seer-run --engines (\S+)", setup_commands()[0]).group(1)
    assert (folder / engines / "manifest.json").is_file()
    assert out.stdout.strip().splitlines()[-1] == "1 2 3 4 5 6 7"  # seer-run's answer to "count to 7 ."


@pytest.mark.slow
def test_readme_python_snippet_runs(main_job):
    """The snippet under '## Python', verbatim, where the main job left its export: it draws its own image."""
    folder, job = main_job
    assert job.returncode == 0
    code = re.search(r"```python\n(.*?)```", section("Python"), re.S).group(1)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=folder)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("1 2 3 "), lines  # the picture's three shapes, counted; then L*, steps, seconds
    assert lines[1:] == ["True 1 2 3", "True cat cat", "False the prompt is empty; send the question as text"], lines


def scripts() -> dict[str, str]:
    """pyproject's [project.scripts] (a regex, not tomllib: the project supports Python 3.10)."""
    table = re.search(r"^\[project\.scripts\]\n(.*?)(?=^\[|\Z)", (ROOT / "pyproject.toml").read_text(), re.S | re.M)
    return dict(re.findall(r'^([\w-]+) = "([\w.:]+)"', table.group(1), re.M))


@pytest.mark.parametrize("command", sorted(scripts()))
def test_command_list_has_one_line_per_command(command):
    commands = section("Commands")
    assert "docs/cli.md" in commands, "the command list should point at docs/cli.md for the flags"
    lines = [line for line in commands.splitlines() if line.startswith(f"- `{command}`")]
    assert len(lines) == 1, f"the README's command list needs one line '- `{command}`: ...', found {len(lines)}"


def test_commands_are_listed_in_order_of_the_command_reference():
    """README and docs/cli.md name the same commands (the C++ seer_run aside), in the same order."""
    listed = re.findall(r"^- `(seer-[a-z-]+)`", section("Commands"), re.M)
    documented = re.findall(r"^## (seer-[a-z-]+)$", (ROOT / "docs" / "cli.md").read_text(), re.M)
    assert listed == documented and sorted(listed) == sorted(scripts()), (listed, documented)


DOCS = {"README.md": README, **{f"docs/{p.name}": p.read_text() for p in (ROOT / "docs").glob("*.md")}}


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_modules_named_in_the_docs_exist(doc):
    """``python -m X`` and ``from X import`` name modules that exist: paths move, the docs must follow."""
    text = DOCS[doc]
    modules = set(re.findall(r"python3? -m ((?:seer_trt|seer_export)[\w.]*)", text))
    modules |= set(re.findall(r"^from ((?:seer_trt|seer_export)[\w.]*) import", text, re.M))
    missing = [m for m in sorted(modules) if importlib.util.find_spec(m) is None]
    assert not missing, f"{doc} names modules that do not exist: {missing}"


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_files_named_in_the_docs_exist(doc):
    """Every `seer_trt/...`, `export/...`, `tools/...`, `cpp/...`, `tests/...` or `docs/...` path in backticks
    exists (build outputs aside)."""
    paths = re.findall(r"`((?:seer_trt|export|tools|cpp|tests|docs)/[\w./-]*)`", DOCS[doc])
    built = ("cpp/build/",)  # what a build writes, not the checkout
    missing = sorted({p for p in paths if not p.startswith(built) and not (ROOT / p).exists()})
    assert not missing, f"{doc} names files that do not exist: {missing}"


def test_readme_names_no_folder_outside_the_repository():
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).resolve().is_relative_to(ROOT) and (ROOT / target).exists(), target
    assert "../" not in README and "shared/" not in README


def test_default_export_folder_is_the_readmes():
    from seer_export.onnx.options import ExportOptions

    engines = re.search(r"seer-run --engines (\S+)", setup_commands()[0]).group(1)
    assert "--out" not in setup_commands()[0]  # the README uses the default folder, and names it
    assert shlex.split(engines)[0] == str(ExportOptions().out)
