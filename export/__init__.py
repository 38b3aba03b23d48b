"""seer_export: offline tooling — the PyTorch LLaDA-V reference, Seer reference path, fixture, calibration.

May import seer_trt; seer_trt never imports this package.
"""
