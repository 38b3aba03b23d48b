"""tools/ort_sdk.sh (run by the README's cmake step) imports onnxruntime for its library path with ONNX Runtime's
telemetry off unless the environment sets it, as the project's sessions do (docs/DESIGN.md "Telemetry"). Run under an
empty HOME with stand-ins for apt-get and dpkg-deb (no network; the real fetch runs in the cpp tier,
tests/test_readme.py), once unset and once with ORT_DISABLE_TELEMETRY=0, which must bring the telemetry files back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ort_sessions import telemetry_env

ROOT = Path(__file__).resolve().parents[1]

APT_GET = """#!/usr/bin/env bash
# a stand-in: 'update' does nothing, 'download' leaves one empty package per name in the current folder
for a in "$@"; do [ "$a" = download ] && touch fake-onnxruntime.deb fake-json.deb; done
exit 0
"""
DPKG_DEB = """#!/usr/bin/env bash
# a stand-in for 'dpkg-deb -x DEB DIR': the headers ort_sdk.sh copies
mkdir -p "$3/usr/include/onnxruntime" "$3/usr/include/nlohmann"
echo '#define ORT_API_VERSION 21' > "$3/usr/include/onnxruntime/onnxruntime_c_api.h"
touch "$3/usr/include/nlohmann/json.hpp"
"""


@pytest.mark.skipif(not Path("/usr/share/keyrings/debian-archive-keyring.gpg").is_file(),
                    reason="tools/ort_sdk.sh needs Debian's archive keyring")  # fmt: skip
@pytest.mark.parametrize("setting", [None, "0"])
def test_ort_sdk_imports_onnxruntime_with_telemetry_off_unless_asked_for(tmp_path, setting):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("apt-get", APT_GET), ("dpkg-deb", DPKG_DEB)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    env = telemetry_env(os.environ, home, setting)
    env |= {
        "PATH": f"{bin_dir}:{env['PATH']}",
        "PYTHON": sys.executable,
        "SEER_DEBIAN_MIRROR": "http://deb.invalid/debian",
    }
    out = subprocess.run(["bash", str(ROOT / "tools" / "ort_sdk.sh"), str(tmp_path / "sdk")], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "sdk" / "lib" / "libonnxruntime.so").exists() and "headers 1.21" in out.stdout
    written = sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())
    if setting is None:
        assert written == [], written
    else:  # the check can fail: ONNX Runtime's import writes these when telemetry is on
        assert ".cache/Microsoft/DeveloperTools/.onnxruntime/deviceid" in written, written
