"""seer_export: offline tooling — the PyTorch LLaDA-V reference, Seer reference path, fixture, calibration.

May import seer_trt; seer_trt never imports this package.
"""

import os

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")  # as seer_trt does: ONNX Runtime's telemetry off unless asked for
