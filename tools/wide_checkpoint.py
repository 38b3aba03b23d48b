"""Export a random LLaDA-V-shaped checkpoint wide enough that its MatMuls dominate a step:

    python tools/wide_checkpoint.py OUT     # hidden 2048, MLP 6144 (LLaDA-V's 3x), 16 heads, 4 layers

Random weights under the official parameter names (``seer_export.models.random_checkpoint``), exported by
``seer_export.onnx.run.run_export`` without parity checks (about 75 s and 0.9 GB on the CPU machine). Issue 23's
per-step and size figures (docs/results.md).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path


def main(out: str) -> int:
    import torch

    from seer_export.models.config import DiffusionMLLMConfig, TextConfig, VisionConfig
    from seer_export.models.random_checkpoint import write_random_checkpoint
    from seer_export.onnx.options import ExportOptions
    from seer_export.onnx.run import run_export
    from seer_trt.contracts.config import GenerationConfig, SeerConfig

    cfg = DiffusionMLLMConfig(
        text=TextConfig(vocab_size=83, hidden_size=2048, intermediate_size=6144, num_hidden_layers=4,
                        num_attention_heads=16, num_key_value_heads=16),
        vision=VisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=1,
                            image_size=32, patch_size=2),
        image_aspect_ratio="pad", seer=SeerConfig(probe_layer=0, label="random weights"),
        generation=GenerationConfig(), system_prompt=None,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_random_checkpoint(Path(tmp) / "ckpt", cfg, dtype=torch.float32, seed=0)
        run_export(ExportOptions(checkpoint=ckpt, out=Path(out), validate=False), log=print)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
