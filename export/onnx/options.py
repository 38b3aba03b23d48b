"""What ``seer-export`` was asked to do (``ExportOptions``, one field per CLI flag), checked on construction."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from seer_trt.contracts.errors import ConfigError, SeerError
from seer_trt.contracts.graphs import GRAPH_NAMES, PRECISIONS, SAMPLING_GRAPHS, SERVING_GRAPHS
from seer_trt.contracts.outfolder import is_collection

OPSETS = (
    20,
    21,
    22,
)  # 23 turns SDPA into the ONNX Attention op, poorly supported by ORT CPU / TensorRT (DESIGN "Toolchain facts")


class ExportError(SeerError):
    """The export could not be completed (output folder, parity, precision policy)."""


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """What ``seer-export`` was asked to do; CLI flags map one to one onto these fields."""

    model: str = "tiny-llada-v"  # registry name
    checkpoint: Path | None = None  # overrides where the weights come from
    out: Path | None = None  # output folder, replaced only when complete; None: engines/{model}-{dtype}
    dtype: str = "fp32"  # "fp32" | "fp16"
    opset: int = 20
    graphs: tuple[str, ...] = SERVING_GRAPHS
    sampling: bool = False  # also export denoise_logits (temperature > 0, random remasking)
    validate: bool = True  # ONNX Runtime vs PyTorch per graph, and a Seer generation through the graphs
    force: bool = False  # replace a non-empty ``out``
    save_goldens: bool = False  # Polygraphy JSON inputs / outputs of the parity cases
    samples: int = 16  # fixture prompts of the end-to-end check
    verbose: bool = False  # exporter chatter and tracebacks

    def __post_init__(self) -> None:
        if self.dtype not in PRECISIONS:
            raise ConfigError(f"--dtype {self.dtype!r} is not supported; choose from {sorted(PRECISIONS)}")
        if self.opset not in OPSETS:
            raise ConfigError(
                f"--opset {self.opset} is outside {OPSETS[0]}-{OPSETS[-1]}; opset 23+ emits the ONNX Attention op "
                f"that ONNX Runtime CPU and TensorRT handle poorly, and < 20 lacks ops the graphs use; pass --opset 20"
            )
        unknown = [g for g in self.graphs if g not in GRAPH_NAMES]
        if unknown or not self.graphs:
            raise ConfigError(f"--graphs {list(self.graphs)}: unknown or none; choose from {list(GRAPH_NAMES)}")
        if self.save_goldens and not self.validate:
            raise ConfigError("--save-goldens stores the validation's inputs and outputs; drop --no-validate")
        if self.samples < 1:
            raise ConfigError(f"--samples must be >= 1, got {self.samples}")
        object.__setattr__(
            self, "graphs", tuple(dict.fromkeys(self.graphs + (SAMPLING_GRAPHS if self.sampling else ())))
        )
        if self.out is None:  # a folder per export: engines/ itself holds a tracked README.md
            object.__setattr__(self, "out", Path("engines") / f"{self.model}-{self.dtype}")
        elif is_collection(self.out):  # --out engines/: the export goes into its own folder inside
            object.__setattr__(self, "out", self.out / f"{self.model}-{self.dtype}")

    @property
    def precision(self) -> str:
        return PRECISIONS[self.dtype]
