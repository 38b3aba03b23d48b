"""One graph through NVIDIA ModelOpt's ONNX PTQ, run inside ModelOpt's own environment (``seer_export.qdq``).

In:  ``python qdq_worker.py JOB.json``; JOB names the source graph (its weights inlined or beside it), the
     output path, the ModelOpt mode (``int8`` | ``fp8`` | ``int4``) and calibration method, the MatMul nodes to
     quantize and to leave, the precision of what stays unquantized, and an ``.npz`` of recorded calls
     (``"<call>/<input name>"``: one array per graph input per call).
Out: the Q/DQ graph at the output path (external data beside it) and, last, JOB's ``result`` file:
     ``{"modelopt": VERSION}`` (its absence says the run did not finish).

This file imports nothing of seer-trt: ModelOpt pins onnx and onnxruntime-gpu versions that seer-trt's own
environment does not hold, so it runs under that environment's Python as a plain script.
"""

from __future__ import annotations

import json
import sys

import numpy as np


class RecordedCalls:
    """The recorded calls, in the reader protocol ModelOpt's calibrators use (ONNX Runtime's
    ``CalibrationDataReader``, plus ``get_first`` and iteration, which its int8 and int4 paths also call)."""

    def __init__(self, calls: list[dict[str, np.ndarray]]):
        self.calls = calls
        self.rewind()

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def get_first(self) -> dict[str, np.ndarray]:
        return self.calls[0]

    def rewind(self) -> None:
        self._it = iter(self.calls)

    def __iter__(self):
        return iter(self.calls)

    def __len__(self) -> int:
        return len(self.calls)


def read_calls(path: str) -> list[dict[str, np.ndarray]]:
    calls: dict[int, dict[str, np.ndarray]] = {}
    with np.load(path) as data:
        for key in data.files:
            index, name = key.split("/", 1)
            calls.setdefault(int(index), {})[name] = data[key]
    return [calls[i] for i in sorted(calls)]


def main(job_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    import modelopt
    from modelopt.onnx.quantization import quantize

    quantize(
        job["onnx"],
        quantize_mode=job["mode"],
        calibration_method=job["method"],
        calibration_data_reader=RecordedCalls(read_calls(job["samples"])),
        calibration_eps=["cpu"],  # the CPU provider: calibration needs no GPU
        op_types_to_quantize=["MatMul"],
        nodes_to_quantize=job["nodes_to_quantize"],
        nodes_to_exclude=job["nodes_to_exclude"],
        high_precision_dtype=job["high_precision_dtype"],  # what is not quantized keeps the export's precision
        dq_only=job["mode"] != "int4",  # weights stored quantized (int4 always is), so the file shrinks too
        use_external_data_format=True,
        output_path=job["output"],
        log_level="WARNING",
    )
    with open(job["result"], "w") as f:
        json.dump({"modelopt": modelopt.__version__}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
