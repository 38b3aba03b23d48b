"""A local ``tritonserver`` for CPU-flavour repositories: the binary bundled in ``nvidia-pytriton`` (docs/DESIGN.md "Toolchain facts").

In:  ``setup``: a folder (``$SEER_TRITON_HOME``, default ``~/.cache/seer-trt/triton``) to install into;
     ``LocalServer``: a model repository.
Out: the install (server binary, its libraries, the Python backend and a stub Python with numpy < 2), and a
     running server on 127.0.0.1 with free HTTP / gRPC ports, stopped within a bounded time; or one line saying
     why not: a folder that is no seer-triton repository (refused before anything starts), or the first error the
     server logged (its whole log kept in a file the line names).

    python -m seer_trt.serving.triton.local setup                 # download the wheel, unpack the server, make the venv
    python -m seer_trt.serving.triton.local serve --repo REPO     # serve until Ctrl-C

Why a venv: the wheel's Python-backend stub (2.51) reads numpy arrays wrongly under numpy 2 (every element
becomes the first), and pytriton itself pins numpy < 2; so the stub runs in a venv of this Python with numpy < 2
and the runtime's other dependencies, found through PATH (the stub ignores PYTHONPATH). Only the wheel's server
files are unpacked: pytriton's Python package is never installed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path

from seer_trt.contracts.errors import ConfigError, SeerError
from seer_trt.contracts.outfolder import REPOSITORY_MARKER, is_repository

HOME_ENV = "SEER_TRITON_HOME"
DEFAULT_HOME = Path.home() / ".cache" / "seer-trt" / "triton"
WHEEL = "nvidia-pytriton==0.7.0"  # tritonserver 2.51 with the Python backend and stubs for Python 3.8-3.13
STUB_PACKAGES = ("numpy<2", "onnxruntime>=1.20", "tokenizers>=0.20", "jinja2>=3.1", "pillow>=10")
SETUP = f"python -m seer_trt.serving.triton.local setup (or set {HOME_ENV} to a folder it installed)"
WRITE_REPO = "seer-triton --engines EXPORT --out REPO --flavour cpu"
# a server log line: severity, date, time, thread, source] message ("E1201 16:29:01.427758 18412 server.cc:241] ...")
LOG_LINE = re.compile(r"^([EWI])\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] (.*)$")
CAUSE_CHARS = 300  # a cause quoted from the log is cut here: one line on a terminal, not a config table


@dataclasses.dataclass(frozen=True)
class ServerInstall:
    """Where the server pieces of one install live."""

    home: Path

    @property
    def server(self) -> Path:  # the wheel's pytriton/tritonserver folder
        return self.home / "server" / "pytriton" / "tritonserver"

    @property
    def binary(self) -> Path:
        return self.server / "bin" / "tritonserver"

    @property
    def libs(self) -> Path:  # the wheel's bundled shared libraries (libtritonserver, ...)
        return self.home / "server" / "nvidia_pytriton.libs"

    @property
    def venv(self) -> Path:
        return self.home / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def stamp(self) -> Path:
        return self.home / "installed.txt"

    @classmethod
    def find(cls, home: str | Path | None = None) -> ServerInstall:
        """The install at ``home`` (default: ``$SEER_TRITON_HOME`` or ``~/.cache/seer-trt/triton``).

        Raises:
            ConfigError: nothing complete is installed there; the message says how to install it.
        """
        install = cls(Path(home or os.environ.get(HOME_ENV) or DEFAULT_HOME))
        missing = [p for p in (install.binary, install.libs, install.python, install.stamp) if not p.exists()]
        if missing:
            raise ConfigError(
                f"no tritonserver install at {install.home} ({missing[0]} is missing); install it with {SETUP}"
            )
        return install

    def python_info(self) -> tuple[str, Path]:
        """The stub Python's "X.Y" and the folder holding its libpython (which the stub links)."""
        code = "import sys, sysconfig; print(f'{sys.version_info[0]}.{sys.version_info[1]}'); print(sysconfig.get_config_var('LIBDIR')); print(sysconfig.get_config_var('INSTSONAME'))"  # noqa: E501
        version, libdir, soname = subprocess.run([str(self.python), "-c", code], capture_output=True, text=True,
                                                 check=True, timeout=60).stdout.split()  # fmt: skip
        if not (Path(libdir) / soname).is_file():
            raise ConfigError(
                f"{self.python} has no shared {soname} in {libdir}; the Python backend's stub links libpython, so "
                f"use a Python built with --enable-shared for {SETUP}"
            )
        return version, Path(libdir)


def setup(home: str | Path | None = None, python: str = sys.executable) -> ServerInstall:
    """Install the server into ``home``: unpack the wheel's server files, make the stub venv. Idempotent.

    Raises:
        ConfigError: pip could not download or install what is needed (the message has pip's last line).
    """
    install = ServerInstall(Path(home or os.environ.get(HOME_ENV) or DEFAULT_HOME))
    if install.stamp.is_file() and install.binary.is_file() and install.python.is_file():
        return install
    install.home.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=install.home) as tmp:
        _pip([python, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", tmp, WHEEL])
        wheel = next(Path(tmp).glob("*.whl"))
        unpacked = Path(tmp) / "server"
        with zipfile.ZipFile(wheel) as zf:
            members = [m for m in zf.namelist() if m.startswith(("pytriton/tritonserver/", "nvidia_pytriton.libs/"))]
            zf.extractall(unpacked, members)
        for path in unpacked.rglob("*"):  # zip files drop the executable bit
            if path.is_file() and (path.suffix == "" or ".so" in path.name):
                path.chmod(0o755)
        shutil.rmtree(install.home / "server", ignore_errors=True)
        unpacked.rename(install.home / "server")
    if not install.python.is_file():
        _pip([python, "-m", "venv", str(install.venv)])
    _pip([str(install.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *STUB_PACKAGES])
    install.python_info()
    install.stamp.write_text(f"{WHEEL}\n" + "\n".join(STUB_PACKAGES) + "\n")
    return install


def _pip(cmd: list[str]) -> None:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        last = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ConfigError(f"{' '.join(cmd[:5])} ... failed ({last[0]}); check the network to the package index")


def check_served(repo: Path) -> Path:
    """``repo``, when it is a model repository seer-triton wrote (its marker file, ``REPOSITORY_MARKER``).

    Raises:
        ConfigError: it does not exist, or it is no seer-triton repository; the message says how to write one.
    """
    if not repo.exists():
        raise ConfigError(f"the model repository {repo} does not exist; write one with {WRITE_REPO}")
    if not is_repository(repo):
        raise ConfigError(f"{repo} is not a model repository seer-triton wrote (it has no {REPOSITORY_MARKER}); "
                          f"write one with {WRITE_REPO}")  # fmt: skip
    return repo


def first_error(log: str) -> str:
    """The cause of a failed start, quoted from the server's log: its first error that is not about CUDA, then
    the line it exits with (``error: creating server: ...``) when that says something else; each cut to
    ``CAUSE_CHARS``. No error logged: the log's last line."""
    errors, exit_line, last = [], None, ""
    for line in log.splitlines():
        line = line.strip()
        found = LOG_LINE.match(line)
        if found and found[1] == "E":
            error = found[2].strip('"')
            # a machine without a CUDA driver logs "CudaDriverHelper has not been initialized." and serves on CPU
            if "cuda" not in error.lower():
                errors.append(error)
        elif line.startswith("error: "):
            exit_line = line.removeprefix("error: ")
        last = line or last
    causes = [c for c in dict.fromkeys(errors[:1] + [exit_line]) if c] or [last or "the log is empty"]
    return "; ".join(c if len(c) <= CAUSE_CHARS else c[: CAUSE_CHARS - 3] + "..." for c in causes)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """``tritonserver`` on 127.0.0.1 over one repository, in its own process group; a context manager."""

    def __init__(self, repo: str | Path, install: ServerInstall | None = None, start_timeout: float = 300.0,
                 log: str | Path | None = None) -> None:  # fmt: skip
        """
        Raises:
            ConfigError: ``repo`` is no repository seer-triton wrote, or no complete install is found; nothing
                has started then.
        """
        self.repo = check_served(Path(repo)).resolve()  # the server is told one path that means it from anywhere
        self.install = install or ServerInstall.find()
        self.start_timeout = start_timeout
        self.http_port = self.grpc_port = 0
        self.process: subprocess.Popen | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="seer-triton-")
        self.log = Path(log) if log else Path(self._tmp.name) / "server.log"
        self.started_in = 0.0  # seconds from launch to ready

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def backends(self) -> Path:
        """A backend folder: the wheel's Python backend with the stub built for the venv's Python."""
        version, _ = self.install.python_info()
        stub = self.install.server / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not stub.is_file():
            raise ConfigError(f"the wheel has no Python-backend stub for Python {version}; use Python 3.8-3.13")
        folder = Path(self._tmp.name) / "backends" / "python"
        folder.mkdir(parents=True, exist_ok=True)
        for src in (*(self.install.server / "backends" / "python").iterdir(), stub):
            shutil.copy2(src, folder / src.name)
        return folder.parent

    def start(self) -> LocalServer:
        """Launch and wait until the server is ready.

        Raises:
            SeerError: the server exited or was not ready within ``start_timeout``; the message has the first
                error of its log (``first_error``) and where the whole log is kept.
        """
        _, libdir = self.install.python_info()
        backends = self.backends()
        self.http_port, self.grpc_port = free_port(), free_port()
        env = {
            **os.environ,
            "PATH": f"{self.install.venv / 'bin'}:{os.environ.get('PATH', '')}",  # the stub finds the venv here
            "LD_LIBRARY_PATH": f"{libdir}:{self.install.libs}",
        }
        env.pop("PYTHONHOME", None)
        cmd = [str(self.install.binary), f"--model-repository={self.repo}", f"--backend-directory={backends}",
               "--http-address=127.0.0.1", f"--http-port={self.http_port}", "--grpc-address=127.0.0.1",
               f"--grpc-port={self.grpc_port}", "--allow-metrics=false", "--allow-sagemaker=false",
               "--allow-vertex-ai=false", "--exit-timeout-secs=10", "--strict-readiness=true"]  # fmt: skip
        start = time.monotonic()
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while time.monotonic() - start < self.start_timeout:
                if self.process.poll() is not None:
                    raise self.failed(f"exited with {self.process.returncode}")
                if self.ready():
                    self.started_in = time.monotonic() - start
                    return self
                time.sleep(0.5)
            raise self.failed(f"was not ready within {self.start_timeout:.0f} s")
        except BaseException:  # not ready, or interrupted: nothing may outlive a failed start
            self.stop()
            raise

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def failed(self, what: str) -> SeerError:
        """A failed start's one line: the cause from the log first, then what the server did and where its whole
        log is. A log in this server's temporary folder is copied out first, as the folder goes with the server."""
        text = self.log.read_text(errors="replace") if self.log.is_file() else ""
        kept = self.log
        if self.log.parent == Path(self._tmp.name):
            fd, name = tempfile.mkstemp(prefix="seer-triton-", suffix=".log")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            kept = Path(name)
        return SeerError(f"tritonserver could not start: {first_error(text)} (it {what}; whole log: {kept})")

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM the server's process group, SIGKILL it after ``timeout``; returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        with contextlib.suppress(ProcessLookupError):  # stubs left behind by a killed server
            os.killpg(self.process.pid, signal.SIGKILL)
        return self.process.returncode

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self._tmp.cleanup()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m seer_trt.serving.triton.local", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("setup", help=f"install the server into ${HOME_ENV} (default {DEFAULT_HOME})")
    serve = sub.add_parser("serve", help="serve a cpu-flavour repository on 127.0.0.1 until Ctrl-C")
    serve.add_argument("--repo", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        if args.command == "setup":
            print(f"tritonserver installed in {setup().home}")
            return 0
        # Ctrl-C or SIGTERM leaves the `with`, which stops the server (it runs in its own process group).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        with contextlib.suppress(KeyboardInterrupt), LocalServer(args.repo) as server:
            print(f"ready in {server.started_in:.1f} s: HTTP {server.http_url}, gRPC {server.grpc_url}; log {server.log}",
                  flush=True)  # fmt: skip
            server.process.wait()
        return 0
    except (SeerError, OSError) as err:  # an unreadable repository or install: one line, never a traceback
        print(f"seer-triton local: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
