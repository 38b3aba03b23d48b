"""TensorRT's quantized window graphs: NVIDIA ModelOpt's ONNX PTQ, calibrated on the export's own calls (docs/DESIGN.md
"Quantized exports").

In:  an export folder, a scheme (``trt-int8`` | ``trt-fp8`` | ``trt-int4``), calibration prompts.
Out: per window graph, a Q/DQ graph TensorRT builds into int8 / fp8 / int4 kernels (and ONNX Runtime's CPU provider
     runs, dequantizing, which is how seer-quantize's check and seer-eval measure its accuracy without a GPU).

    prompts ─► the source export's pipeline, recording every ``denoise`` call's inputs ─► calls.npz
    graph (weights inlined) + calls.npz ─► qdq_worker.py, under ModelOpt's Python ─► Q/DQ graph

Why another environment: ``nvidia-modelopt[onnx]`` pins onnx 1.21 and onnxruntime-gpu 1.24, which cannot sit
beside seer-trt's onnx and onnxruntime in one environment; so it lives in its own venv
(``$SEER_MODELOPT_HOME``, default ``~/.cache/seer-trt/modelopt``) and runs as a subprocess. Install it with
``python -m seer_export.qdq setup`` (about 2 GB; a couple of minutes).

Only the checkpoint's MatMul weights are quantized (q/k/v/o, the MLP, the LM head): attention's own products and
RoPE's exact rotation stay in the export's precision, as do norms and everything else. Activations are calibrated
with ModelOpt's ``max`` method (its ``entropy`` default is a pure-Python search that takes minutes per tensor);
int4 is weight-only AWQ (``awq_clip``), whose statistics need calls of one shape, so it takes the most frequent
shape among the recorded calls.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from seer_trt.contracts.errors import ConfigError, SeerError

HOME_ENV = "SEER_MODELOPT_HOME"
DEFAULT_HOME = Path.home() / ".cache" / "seer-trt" / "modelopt"
# ModelOpt's ONNX extra, and the CPU torch build it requires (a looser torch pin can pull a multi-GB CUDA build)
PACKAGES = ("nvidia-modelopt[onnx]==0.47.0", "torch==2.13.*")
SETUP = f"python -m seer_export.qdq setup (or set {HOME_ENV} to a folder it installed)"
WORKER = Path(__file__).with_name("qdq_worker.py")  # run with -I: its folder is not on its path


@dataclasses.dataclass(frozen=True)
class Scheme:
    mode: str  # ModelOpt's quantize_mode
    method: str  # its calibration method
    one_shape: bool  # the calibrator concatenates calls: they must share a shape
    about: str  # one line for --help and the manifest


SCHEMES = {
    "trt-int8": Scheme(
        "int8",
        "max",
        False,
        "ModelOpt Q/DQ for TensorRT: MatMul weights int8 per channel, activations int8 per tensor (max calibration)",
    ),  # fmt: skip
    "trt-fp8": Scheme(
        "fp8",
        "max",
        False,
        "ModelOpt Q/DQ for TensorRT: MatMul weights and activations FP8 E4M3 "
        "(max calibration; TensorRT runs it on compute capability 8.9+)",
    ),  # fmt: skip
    "trt-int4": Scheme(
        "int4",
        "awq_clip",
        True,
        "ModelOpt Q/DQ for TensorRT: MatMul weights int4 in blocks, activations as exported (AWQ clip)",
    ),  # fmt: skip
}
CALLS_KEPT = 48  # recorded calls handed to the calibrator at most, spread over the run
RECORDED_MAX = 4 * CALLS_KEPT  # calls held while recording: every k-th, k doubling when full (a real model's
# calls are megabytes each; thousands of them would not fit)
WORKER_TIMEOUT_S = 6 * 3600


@dataclasses.dataclass(frozen=True)
class ModeloptInstall:
    home: Path

    @property
    def python(self) -> Path:
        return self.home / "venv" / "bin" / "python"

    @property
    def stamp(self) -> Path:
        return self.home / "installed.txt"

    @classmethod
    def find(cls, home: str | Path | None = None) -> ModeloptInstall:
        """The install at ``home`` (default ``$SEER_MODELOPT_HOME`` or ``~/.cache/seer-trt/modelopt``).

        Raises:
            ConfigError: nothing complete is installed there; the message says how to install it.
        """
        install = cls(Path(home or os.environ.get(HOME_ENV) or DEFAULT_HOME))
        if not (install.python.is_file() and install.stamp.is_file()):
            raise ConfigError(f"the trt-* schemes run NVIDIA ModelOpt, which is not installed at {install.home}; "
                              f"install it with {SETUP}")  # fmt: skip
        pins = install.stamp.read_text().split()
        if pins != list(PACKAGES):
            raise ConfigError(f"{install.home} holds {pins}, this seer-trt runs {list(PACKAGES)}; reinstall: remove "
                              f"{install.home} and run {SETUP}")  # fmt: skip
        return install


def setup(home: str | Path | None = None, python: str = sys.executable) -> ModeloptInstall:
    """Make ModelOpt's venv at ``home``; idempotent.

    Raises:
        ConfigError: pip could not install it (the message has pip's last line).
    """
    install = ModeloptInstall(Path(home or os.environ.get(HOME_ENV) or DEFAULT_HOME))
    if install.stamp.is_file() and install.python.is_file() and install.stamp.read_text().split() == list(PACKAGES):
        return install
    install.home.mkdir(parents=True, exist_ok=True)
    for cmd in ([python, "-m", "venv", str(install.home / "venv")],
                [str(install.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *PACKAGES]):  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if out.returncode != 0:
            last = (out.stderr.strip() or out.stdout.strip() or "no output").splitlines()[-1]
            raise ConfigError(f"installing ModelOpt into {install.home} failed: {' '.join(cmd[:4])} ...: {last}; "
                              f"check the network and free space (about 2 GB), then run setup again")  # fmt: skip
    install.stamp.write_text("\n".join(PACKAGES) + "\n")
    return install


class RecordingBackend:
    """A backend that keeps the inputs of the calls of one graph, and otherwise is the backend it wraps.

    At most ``limit`` calls are held, spread over the run: every ``stride``-th call, the stride doubling (and every
    other held call dropped) when the store is full.
    """

    def __init__(self, backend: Any, graph: str, limit: int = RECORDED_MAX):
        self._backend, self.graph, self.limit = backend, graph, limit
        self.calls: list[dict[str, Any]] = []
        self.seen, self.stride = 0, 1

    def run(self, graph: str, feeds: Any, *args: Any, **kwargs: Any) -> Any:
        if graph == self.graph:
            import numpy as np

            if self.seen % self.stride == 0:
                self.calls.append({k: np.array(v) for k, v in feeds.items()})
                if len(self.calls) > self.limit:
                    self.calls, self.stride = self.calls[::2], self.stride * 2
            self.seen += 1
        return self._backend.run(graph, feeds, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


def record_calls(pipe: Any, requests: Sequence[Any], graph: str = "denoise") -> tuple[list[dict[str, Any]], int]:
    """The inputs of the ``graph`` calls ``pipe`` (a ``SeerPipeline``) makes answering ``requests`` (at most
    ``RECORDED_MAX``, spread over the run), and how many calls it made.

    Raises:
        ConfigError: a request failed, or no call of ``graph`` was made (the message says which).
    """
    if pipe.policy == "cost_model" and pipe.cost is None:
        pipe.calibrate_costs()  # its timing calls (zero prompts) go through the backend: not calibration data
    backend = pipe.backend
    pipe.backend = recorder = RecordingBackend(backend, graph)
    try:
        results = pipe.generate(list(requests))
    finally:
        pipe.backend = backend
    failed = [(i, r) for i, r in enumerate(results) if not r.ok]
    if failed:
        raise ConfigError(f"calibration prompt {failed[0][0] + 1} failed: {failed[0][1].error}; fix or drop that "
                          f"prompt")  # fmt: skip
    if not recorder.calls:
        raise ConfigError(f"the calibration prompts made no {graph} call (sampling runs denoise_logits instead); "
                          f"calibrate with greedy requests")  # fmt: skip
    return recorder.calls, recorder.seen


def choose_calls(calls: list[dict[str, Any]], one_shape: bool, keep: int = CALLS_KEPT) -> list[dict[str, Any]]:
    """At most ``keep`` calls spread evenly over the run; with ``one_shape``, only those of the most common shape."""
    if one_shape:
        shapes = collections.Counter(tuple(v.shape for v in c.values()) for c in calls)
        common = shapes.most_common(1)[0][0]
        calls = [c for c in calls if tuple(v.shape for v in c.values()) == common]
    if len(calls) > keep > 1:
        calls = [calls[round(i * (len(calls) - 1) / (keep - 1))] for i in range(keep)]
    return calls[:keep]


def weight_matmuls(model: Any, weights: set[str]) -> tuple[list[str], list[str]]:
    """(MatMul nodes by a checkpoint weight, the other MatMuls): only the first are quantized.

    The other MatMuls are attention's products and RoPE's rotation (a constant of the graph's own, ``const.*``).
    """
    from seer_export.onnx.shared_weights import CONSTANT_PREFIX

    ours = {w for w in weights if not w.startswith(CONSTANT_PREFIX)}  # the export stores weights pre-transposed
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul"]
    return [n.name for n in matmuls if n.input[1] in ours], [n.name for n in matmuls if n.input[1] not in ours]


def quantize_graph(src: Path, dst: Path, scheme: str, calls: list[dict[str, Any]], precision: str,
                   install: ModeloptInstall, work: Path, log: Callable[[str], None]) -> tuple[str, int]:  # fmt: skip
    """``src`` quantized by ModelOpt into ``dst`` and ``dst.data``; returns ModelOpt's version and the number of
    calls it calibrated on.

    Raises:
        ConfigError: ModelOpt failed (the message has its last line; its whole log is named).
    """
    import onnx

    from seer_export.onnx.shared_weights import load_inlined

    s = SCHEMES[scheme]
    model, weights = load_inlined(src)
    quantized, left = weight_matmuls(model, weights)
    if not quantized:
        raise ConfigError(f"{src} has no MatMul by a checkpoint weight: nothing for {scheme} to quantize")
    work.mkdir(parents=True, exist_ok=True)
    whole = work / "whole.onnx"
    onnx.save(model, str(whole), save_as_external_data=True, location="whole.data")
    del model
    chosen = choose_calls(calls, s.one_shape)
    import numpy as np

    np.savez(work / "calls.npz", **{f"{i}/{k}": v for i, c in enumerate(chosen) for k, v in c.items()})
    job = {"onnx": str(whole), "output": str(work / "qdq.onnx"), "result": str(work / "result.json"), "mode": s.mode,
           "method": s.method,
           "samples": str(work / "calls.npz"), "nodes_to_quantize": quantized, "nodes_to_exclude": left,
           "high_precision_dtype": precision}  # fmt: skip
    (work / "job.json").write_text(json.dumps(job))
    log(f"ModelOpt {s.mode} ({s.method}): {len(quantized)} weight MatMuls, {len(left)} left as exported, "
        f"calibrated on {len(chosen)} of {len(calls)} recorded calls")  # fmt: skip
    log_file = work / "modelopt.log"
    try:
        with log_file.open("w") as f:
            out = subprocess.run([str(install.python), "-I", str(WORKER), str(work / "job.json")], stdout=f,
                                 stderr=subprocess.STDOUT, timeout=WORKER_TIMEOUT_S)  # fmt: skip
        failed = None if out.returncode == 0 else f"exit status {out.returncode}"
    except subprocess.TimeoutExpired:
        failed = f"no result after {WORKER_TIMEOUT_S} s"
    result_file = work / "result.json"
    if failed is None and not result_file.is_file():
        failed = f"{result_file.name} not written"
    if failed is not None:
        kept = Path(tempfile.gettempdir()) / f"seer-quantize-{scheme}-{os.getpid()}.log"  # the staging folder goes
        shutil.copyfile(log_file, kept)
        lines = [line for line in kept.read_text(errors="replace").splitlines() if line.strip()]
        raise ConfigError(f"ModelOpt could not quantize {src.name} to {scheme} ({failed}): "
                          f"{lines[-1] if lines else 'no output'}; its whole log: {kept}")  # fmt: skip
    version = json.loads(result_file.read_text())["modelopt"]
    result = onnx.load(str(work / "qdq.onnx"))  # ModelOpt's own file, one link: onnx's loader takes it
    onnx.save(result, str(dst), save_as_external_data=True, location=f"{dst.name}.data")
    return version, len(chosen)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m seer_export.qdq",
                                 description="Install NVIDIA ModelOpt into its own venv for seer-quantize's trt-* "
                                 f"schemes ({', '.join(PACKAGES)}; about 2 GB).")  # fmt: skip
    ap.add_argument("command", choices=["setup"])
    ap.add_argument("--home", type=Path, help=f"where (default ${HOME_ENV} or {DEFAULT_HOME})")
    args = ap.parse_args(argv)
    try:
        install = setup(args.home)
    except (SeerError, OSError) as err:
        print(f"{ap.prog}: error: {err}", file=sys.stderr)
        return 2
    print(install.python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
