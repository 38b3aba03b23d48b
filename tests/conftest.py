"""Shared pytest setup: torch on one thread (the CPU machines are small and often busy), the one export of the
bundled fixture that the export, runtime and CLI tests share, and the Triton server files the serving test needs
(installed on first use, so the README's test command passes on a fresh machine).

Tiers (markers in pyproject.toml): ``slow``, ``serving``, ``cpp``, ``gpu``; the fast tier is what carries none,
``python3 -m pytest -m "not slow and not serving and not cpp and not gpu"``. The fixture export takes about a minute
of seer-export, so a test that requests it (directly or through another fixture) and names no tier is marked
``slow`` here: it can never pull the export into the fast tier.

Tests write only into pytest's temporary folders (and the Triton install into its cache folder), never into the
working tree."""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import pytest

TIERS = ("slow", "serving", "cpp", "gpu")


def pytest_collection_modifyitems(items):
    for item in items:
        if "fixture_export" in item.fixturenames and not any(item.get_closest_marker(t) for t in TIERS):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    # Only when a collected test module imported torch: the runtime tier must be able to run without it,
    # and a test that checks seer_trt never imports torch must not see it imported from here.
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def fixture_export(tmp_path_factory) -> tuple[Path, object, str]:
    """The bundled fixture exported in fp32 by the seer-export CLI, validated, with goldens: (folder, manifest,
    the CLI's stdout)."""
    from seer_export.cli import main
    from seer_trt.contracts.manifest import Manifest

    out = tmp_path_factory.mktemp("fixture") / "engines"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = main(["--out", str(out), "--samples", "8", "--save-goldens", "--sampling"])
    assert rc == 0, stderr.getvalue()
    return out, Manifest.read(out), stdout.getvalue()


@pytest.fixture(scope="session")
def modelopt_install():
    """NVIDIA ModelOpt in its own venv (seer_export.qdq), installed into ``$SEER_MODELOPT_HOME`` or
    ``~/.cache/seer-trt/modelopt`` on first use (about 2 GB, a couple of minutes), reused after."""
    from seer_export.qdq import setup

    return setup()


@pytest.fixture(scope="session")
def triton_install():
    """The tritonserver files (nvidia-pytriton's binary and a numpy<2 venv for the Python backend), installed into
    ``$SEER_TRITON_HOME`` or ``~/.cache/seer-trt/triton`` on first use (a download of about 60 MB), reused after."""
    from seer_trt.serving.triton.local import setup

    return setup()
