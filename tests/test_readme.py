"""The README stays true: its two set-up commands are what CI runs, and every other code block runs as written, from
a temporary folder laid out as a clone (never the working tree): the main job and the Python snippet (slow), the
C++ commands (cpp), seer-serve, Ray Serve and Triton with their clients, each printing what the README says it
prints (serving; the ports they name are free in a network namespace of their own). Its command list has one line
per command, and the modules and files it and docs/ name exist. Every flag is docs/cli.md's job
(test_cli_docs.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from ort_sessions import telemetry_env

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


# --- every block runs -------------------------------------------------------------------------------------------

# (section, n-th code block in it) -> the tests that run it as written, by file
RUNS = {
    ("Set-up", 0): ("test_readme.py", "test_readme_main_job_runs"),  # the second line is CI itself (test above)
    ("Python", 0): ("test_readme.py", "test_readme_python_snippet_runs"),
    ("C++", 0): ("test_readme.py", "test_readme_cpp_commands_run"),
    ("C++", 1): ("test_cpp.py", "test_readme_cpp_example_builds_and_prints_what_it_says"),
    ("C++", 2): ("test_cpp.py", "test_readme_c_sampled_request_prints_what_seer_run_answers"),
    ("Serving over HTTP (OpenAI's API)", 0): ("test_readme.py", "test_readme_http_blocks_run"),
    ("Serving over HTTP (OpenAI's API)", 1): ("test_readme.py", "test_readme_http_blocks_run"),
    ("Scaling out", 0): ("test_readme.py", "test_readme_ray_block_runs"),
    ("Serving on Triton", 0): ("test_readme.py", "test_readme_triton_blocks_run"),
    ("Serving on Triton", 1): ("test_readme.py", "test_readme_triton_blocks_run"),
}


def blocks(title: str) -> list[str]:
    """The code blocks of a README section, in order."""
    return re.findall(r"```\w*\n(.*?)```", section(title), re.S)


def test_every_readme_block_is_run_by_a_test():
    """A block added to the README without a test that runs it fails here: name its test in RUNS."""
    found = {(title, i) for title in re.findall(r"^## (.+)$", README, re.M) for i in range(len(blocks(title)))}
    missing, gone = sorted(found - set(RUNS)), sorted(set(RUNS) - found)
    assert not missing and not gone, f"README blocks without a test: {missing}; named in RUNS but gone: {gone}"
    for file, test in RUNS.values():
        assert f"def {test}(" in (ROOT / "tests" / file).read_text(), f"tests/{file} has no {test}"


def clone(tmp_path: Path, export: Path) -> Path:
    """A folder laid out as the clone's root after the set-up's first command: the export where it wrote it, under
    its own name (a copy of hard links; seer-serve names its model after the folder)."""
    root = tmp_path / "clone"
    (root / "engines").mkdir(parents=True)
    shutil.copytree(export, root / "engines" / "tiny-llada-v-fp32", copy_function=link_or_copy)
    return root


def link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system
        shutil.copy2(src, dst)


def printed(title: str) -> str:
    """What the README says a section's client prints (its sentence "It prints `...`")."""
    return re.search(r"It prints `([^`]+)`", section(title)).group(1)


@pytest.mark.cpp
def test_readme_cpp_commands_run(fixture_export, tmp_path):
    """The C++ section's commands, verbatim, in a copy of cpp/ and tools/ort_sdk.sh laid out as the clone, under an
    empty HOME: the build (ONNX Runtime's headers fetched by tools/ort_sdk.sh, which imports onnxruntime), the
    prompt ids, seer_run's answer; and nothing of ONNX Runtime's telemetry written under HOME on the way."""
    root = clone(tmp_path, fixture_export[0])
    shutil.copytree(ROOT / "cpp", root / "cpp", ignore=shutil.ignore_patterns("build"))
    (root / "tools").mkdir()
    shutil.copy2(ROOT / "tools" / "ort_sdk.sh", root / "tools" / "ort_sdk.sh")
    home = tmp_path / "home"
    home.mkdir()
    env = telemetry_env(os.environ, home, None)
    for line in blocks("C++")[0].strip().splitlines():
        out = subprocess.run(["bash", "-c", line], cwd=root, env=env, capture_output=True, text=True, timeout=1800)
        assert out.returncode == 0, (line, out.stdout[-3000:], out.stderr[-3000:])
    (result,) = [json.loads(line) for line in (root / "results.jsonl").read_text().splitlines()]
    assert result["error"] is None and result["text"] == "1 2 3 4 5 6 7", result
    assert [str(p.relative_to(home)) for p in home.rglob("*") if "Microsoft" in p.parts] == []


def in_namespace(spec: dict, tmp_path: Path) -> dict:
    """``readme_netns.py``'s report of ``spec`` run in a network namespace of its own (needs root for unshare)."""
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    out = subprocess.run(["unshare", "-n", sys.executable, str(ROOT / "tests" / "readme_netns.py"),
                          str(tmp_path / "spec.json")], capture_output=True, text=True, timeout=1200, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    for step in report["before"] + report["after"]:
        assert step["rc"] == 0, step
    assert report.get("ready") and report["client"]["rc"] == 0, report
    return report


HTTP = "Serving over HTTP (OpenAI's API)"


def check_http_client(report: dict) -> None:
    """The OpenAI client printed what the README says: the answer, then its seer report with L* and steps."""
    answer, seer = report["client"]["stdout"].strip().split(" {", 1)
    assert answer == printed(HTTP), report["client"]
    figures = re.search(r"`('kept': \d+, 'denoise_steps': \d+)`", section(HTTP).split("It prints", 1)[1]).group(1)
    assert all(item in seer for item in figures.split(", ")), (figures, seer)


@pytest.mark.serving
def test_readme_http_blocks_run(fixture_export, tmp_path):
    """seer-serve as the README starts it and its OpenAI client, verbatim; SIGTERM ends the server (128 + 15)."""
    server, client = blocks(HTTP)
    root = clone(tmp_path, fixture_export[0])
    report = in_namespace({"cwd": str(root), "before": [], "server": server.strip(), "ready": "http://127.0.0.1:8000/health",
                           "client": client, "after": []}, tmp_path)  # fmt: skip
    check_http_client(report)
    assert report["server_rc"] == 128 + signal.SIGTERM and "seer-serve: interrupted (SIGTERM)" in report["server_log"]


@pytest.mark.serving
def test_readme_ray_block_runs(fixture_export, tmp_path):
    """``ray start --head`` and ``seer-serve --ray auto --replicas 2``, verbatim, answering the README's OpenAI client
    through Serve's proxy on the same port; SIGTERM removes the application, ``ray stop`` the cluster."""
    start, serve = blocks("Scaling out")[0].strip().splitlines()
    root = clone(tmp_path, fixture_export[0])
    report = in_namespace({"cwd": str(root), "before": [start], "server": serve, "ready": "http://127.0.0.1:8000/health",
                           "client": blocks(HTTP)[1], "after": ["ray stop"]}, tmp_path)  # fmt: skip
    check_http_client(report)
    assert report["server_rc"] == 128 + signal.SIGTERM and "2 replica(s)" in report["server_log"], report["server_log"]


@pytest.mark.serving
def test_readme_triton_blocks_run(fixture_export, triton_install, tmp_path):
    """The Triton section's commands, verbatim, from the clone's root (a relative --engines, as typed): set-up (done
    already: the install is found), the repository, the server; then its client, pointed at the server's gRPC port
    through TRITON_GRPC, printing what the README says."""
    setup, write, serve = blocks("Serving on Triton")[0].strip().splitlines()
    root = clone(tmp_path, fixture_export[0])
    for line in (setup, write):
        out = subprocess.run(["bash", "-c", line], cwd=root, capture_output=True, text=True, timeout=1800)
        assert out.returncode == 0 and "Traceback" not in out.stderr, (line, out.stdout, out.stderr[-3000:])
    marker = json.loads((root / "triton-cpu" / ".seer-triton.json").read_text())
    assert marker["source"] == str(root / "engines" / "tiny-llada-v-fp32")  # resolved once: the same from anywhere
    server = subprocess.Popen(["bash", "-c", serve], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)  # fmt: skip
    try:
        first = server.stdout.readline()  # "ready in S s: HTTP 127.0.0.1:P, gRPC 127.0.0.1:Q; log ..."
        grpc = re.search(r"gRPC (127\.0\.0\.1:\d+);", first)
        assert grpc, (first, server.stderr.read() if server.poll() is not None else "")
        env = {**os.environ, "TRITON_GRPC": grpc.group(1)}
        client = subprocess.run([sys.executable, "-c", blocks("Serving on Triton")[1]], cwd=root, env=env,
                                capture_output=True, text=True, timeout=600)  # fmt: skip
        assert client.returncode == 0 and client.stdout.strip() == printed("Serving on Triton"), client
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
        rc = server.wait(120)
    assert rc == 0  # the server stopped with it


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
