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
    """Runs the README's first command verbatim: install, then the main job on the bundled fixture."""
    command = setup_commands()[0]
    assert "pip install" in command and "seer-reference" in command
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "| baseline (padded) |" in out.stdout
    assert "| calibrated |" in out.stdout and "| paper |" in out.stdout
