"""The models seer-trt knows by name, and where each one's checkpoint comes from (docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch", "The fixture model").

In:  a model name (``--model``) and optionally a checkpoint folder (``--checkpoint DIR``).
Out: the checkpoint folder (``resolve``) or the loaded ``DiffusionMLLM`` with it (``load``).

A bundled model ships inside the package (the ``tiny-llada-v`` fixture, ``tiny-llada-v-hard``, trained on the
harder ``hard`` task family so that its confidences spread as a real model's do, and ``tiny-llada-v-vqa``, trained on
the public easy-vqa set); a downloaded one is found in a folder
the user names or in the local Hugging Face cache, offline. Each entry names its model family
(``seer_export.models.families``): a checkpoint whose config.json is of another family is refused, so a LaViDa
checkpoint is never run as LLaDA-V. Later adapters (LaViDa-Dream, LLaDA-8B) add entries here, not code paths.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from seer_export.models.config import DiffusionMLLMConfig
from seer_export.models.loading import SINGLE_FILE, load_model, read_config, resolve_checkpoint
from seer_trt.contracts.errors import CheckpointError, ConfigError

if TYPE_CHECKING:  # torch is imported where a model is built (load), not to look a checkpoint up
    import torch

    from seer_export.models.mllm import DiffusionMLLM

FIXTURE_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "tiny-llada-v"  # the bundled fixture
HARD_FIXTURE_DIR = FIXTURE_DIR.parent / "tiny-llada-v-hard"  # the second one: the "hard" task family
DREAM_FIXTURE_DIR = FIXTURE_DIR.parent / "tiny-dream"  # the Dream family's: shifted logits, GQA, the "text" tasks
VQA_FIXTURE_DIR = FIXTURE_DIR.parent / "tiny-llada-v-vqa"  # trained on easy-vqa's train split: 64 px pictures


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    name: str  # the --model value
    repo_id: str | None  # Hugging Face id looked up in the local cache (offline); None for bundled models
    bundled: Path | None  # checkpoint folder shipped inside the package; None for downloaded models
    description: str  # one line for --help and listings
    family: str = "llada-v"  # seer_export.models.families

    def __post_init__(self) -> None:
        if (self.repo_id is None) == (self.bundled is None):
            raise ConfigError(f"model {self.name!r}: give exactly one of repo_id and bundled folder")


MODELS = MappingProxyType(
    {
        e.name: e
        for e in (
            ModelEntry(
                "tiny-llada-v", None, FIXTURE_DIR, "1.8M-parameter LLaDA-V trained on the synthetic task (bundled)"
            ),
            ModelEntry(
                "tiny-llada-v-hard",
                None,
                HARD_FIXTURE_DIR,
                "the same architecture trained on the harder task family: spread confidences (bundled)",
            ),
            ModelEntry(
                "tiny-llada-v-vqa",
                None,
                VQA_FIXTURE_DIR,
                "the same architecture, its tower on 64 px pictures, trained on easy-vqa's train split (bundled)",
            ),
            ModelEntry(
                "tiny-dream",
                None,
                DREAM_FIXTURE_DIR,
                "1.6M-parameter Dream-family model (shifted logits, GQA, q/k/v biases) trained on the text tasks "
                "(bundled)",
                family="dream",
            ),
            ModelEntry(
                "llada-v", "GSAI-ML/LLaDA-V", None, "LLaDA-V 8B; --checkpoint DIR or the local Hugging Face cache"
            ),
            ModelEntry(
                "lavida-llada",
                "jacklishufan/lavida-llada-v1.0-instruct",
                None,
                "LaViDa-LLaDA 8B (LLaDA's native names, SigLIP, pooled tiles); --checkpoint DIR or the HF cache",
                family="lavida-llada",
            ),
            ModelEntry(
                "mmada",
                "Gen-Verse/MMaDA-8B-MixCoT",
                None,
                "MMaDA 8B (LLaDA's native names, MAGVIT-v2 image ids from image_tokenizer/ or showlab/magvitv2); "
                "--checkpoint DIR or the HF cache",
                family="mmada",
            ),
            ModelEntry(
                "dream",
                "Dream-org/Dream-v0-Instruct-7B",
                None,
                "Dream 7B, text only (Qwen2.5-7B's shapes: grouped-query attention, q/k/v biases; shifted logits); "
                "--checkpoint DIR or the HF cache",
                family="dream",
            ),
            ModelEntry(
                "lavida-dream",
                "jacklishufan/lavida-dream-v1.0-instruct",
                None,
                "LaViDa-Dream 7B (Dream with LaViDa's SigLIP, pooled tiles and projector); --checkpoint DIR or the "
                "HF cache",
                family="lavida-dream",
            ),
        )
    }
)


def get_entry(name: str) -> ModelEntry:
    """The registry entry of ``name``.

    Raises:
        ConfigError: unknown name; the message lists the known ones.
    """
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")
    return MODELS[name]


def check_family(name: str, cfg: DiffusionMLLMConfig, where: Path) -> None:
    """Refuse a checkpoint of another family than model ``name``'s.

    Raises:
        ConfigError: the families differ; the message names the --model that fits.
    """
    want = get_entry(name).family
    if cfg.family != want:
        fits = [e.name for e in MODELS.values() if e.family == cfg.family and e.repo_id is not None]
        raise ConfigError(f"{where} holds a {cfg.family} checkpoint, not a {want} one (--model {name}); pass "
                          f"--model {fits[0] if fits else cfg.family}")  # fmt: skip


def resolve(name: str, checkpoint: str | Path | None = None) -> Path:
    """The checkpoint folder of model ``name``, found offline.

    Args:
        name: a registry name, e.g. ``tiny-llada-v`` or ``llada-v``.
        checkpoint: a folder overriding where the weights come from (``--checkpoint DIR``).

    Returns:
        A folder holding ``config.json`` and the weights.

    Raises:
        ConfigError: unknown name.
        CheckpointError: no checkpoint found; the message says where it looked and how to provide one.
    """
    entry = get_entry(name)
    if checkpoint is not None or entry.bundled is None:
        return resolve_checkpoint(checkpoint, entry.repo_id or entry.name)
    if not (entry.bundled / "config.json").is_file() or not (entry.bundled / SINGLE_FILE).is_file():
        raise CheckpointError(
            f"bundled model {name!r} is incomplete: {entry.bundled} needs config.json and {SINGLE_FILE}; reinstall "
            f"the package, train it with `python tools/train_fixture.py --out {entry.bundled}`, or pass "
            f"--checkpoint DIR"
        )
    return entry.bundled


def load(
    name: str,
    checkpoint: str | Path | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> tuple[DiffusionMLLM, Path]:
    """Load model ``name`` (see ``resolve``) with a strict check of its tensors.

    Args:
        name: a registry name.
        checkpoint: a folder overriding where the weights come from (``--checkpoint DIR``).
        dtype: floating-point dtype of the parameters (None: float32).
        device: where the parameters live.

    Returns:
        The model in eval mode and the folder it came from.

    Raises:
        ConfigError: unknown name or invalid config.json.
        CheckpointError: no checkpoint found, or its tensors do not match the model.
    """
    folder = resolve(name, checkpoint)
    check_family(name, read_config(folder), folder / "config.json")  # before a byte of weights is read
    return load_model(folder, dtype=dtype, device=device), folder
