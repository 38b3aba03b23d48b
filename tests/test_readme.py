"""The README's two set-up commands stay true: CI runs the second, this test runs the first."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Set-up.*?```bash\n(.*?)```", text, re.S)
    assert block, "README.md has no '## Set-up' section with a bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_has_two_setup_commands_and_ci_runs_the_test_one():
    commands = setup_commands()
    assert len(commands) == 2, commands
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci, f"CI must run the README's test command {commands[1]!r}"


def test_readme_main_job_runs():
    """Runs the README's first command verbatim: install, export the bundled fixture, answer one prompt."""
    command = setup_commands()[0]
    assert "pip install" in command and "seer-export" in command and "seer-run" in command
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "| graph | output | dtype |" in out.stdout and "end-to-end Seer" in out.stdout  # the parity report
    assert (ROOT / "engines" / "tiny-llada-v" / "manifest.json").is_file()
    assert out.stdout.strip().splitlines()[-1] == "1 2 3 4 5 6 7"  # seer-run's answer to "count to 7 ."
