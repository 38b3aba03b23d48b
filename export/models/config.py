"""LLaDA-V configuration read from a checkpoint's ``config.json`` (docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch").

In:  the ``config.json`` of a LLaDA-V checkpoint (``GSAI-ML/LLaDA-V`` layout) or of the bundled fixture, or one in
     LLaDA's native (OLMo) keys (``d_model``, ``n_layers``, ...), as LLaDA's own checkpoints and the models built on
     them without renaming write it.
Out: ``DiffusionMLLMConfig``: language-model dims, the parameter naming of the weights beside it (``seer_export.models.names``),
     the SigLIP tower (after LLaDA-V drops its last layer), the projector, and the product's own keys ``seer``
     (calibration) and ``generation`` (defaults); ``MagvitConfig``: an image tokenizer's own config.json (MMaDA's).
     Nothing here imports torch: a config is read, and checked against the checkpoint's tensors
     (``seer_export.models.loading.check_config``), before any model is built.

The real checkpoint's config names no vision dims (LLaVA-OneVision hard-codes SigLIP so400m-patch14-384);
a ``vision_config`` object, as the fixture writes, overrides those defaults. Images: ``image_aspect_ratio``
"pad" gives one tile per image, "anyres" / "anyres_max_N" the tiling of ``image_grid_pinpoints``.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from seer_export.models.families import FAMILIES, LLADA_V_SYSTEM, get_family, infer_family
from seer_export.models.names import NAMINGS, NATIVE_CONFIG_KEYS, NATIVE_REQUIRED, NATIVE_WRITTEN
from seer_trt.contracts.config import DEFAULT_DECODING, GenerationConfig, SeerConfig, is_whole, read_json
from seer_trt.contracts.errors import ConfigError
from seer_trt.contracts.geometry import LLADA_V_PINPOINTS, parse_pinpoints

# MMaDA's image tokenizer (seer_export.models.magvit): its own folder's config.json, and where its files lie
UNUSED_PREFIXES = ("decoder.", "quantize.")  # in showlab/magvitv2's checkpoint; not part of the encoder


@dataclasses.dataclass(frozen=True)
class MagvitConfig:
    """``VQGANEncoder``'s defaults as MAGVIT-v2 builds it (``MAGVITv2.__init__`` passes none)."""

    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 2, 2, 4, 4)
    num_res_blocks: tuple[int, ...] = (4, 3, 4, 3, 4)
    z_channels: int = 13  # bits per code: 2^13 = 8192 codes
    image_size: int = 512  # MMaDA's preprocessing resolution

    def __post_init__(self) -> None:
        object.__setattr__(self, "ch_mult", tuple(self.ch_mult))
        object.__setattr__(self, "num_res_blocks", tuple(self.num_res_blocks))
        widths = all(is_whole(v) and v >= 1 for v in (self.ch, *self.ch_mult))
        blocks = all(is_whole(b) and b >= 0 for b in self.num_res_blocks)
        if not (widths and blocks and is_whole(self.z_channels) and 1 <= self.z_channels <= 30):
            raise ConfigError(f"image tokenizer: ch {self.ch}, ch_mult {self.ch_mult}, num_res_blocks "
                              f"{self.num_res_blocks}, z_channels {self.z_channels}; expected whole numbers >= 1 "
                              f"(blocks >= 0) and 1 <= z_channels <= 30 (2^z codes)")  # fmt: skip
        if len(self.ch_mult) != len(self.num_res_blocks):
            raise ConfigError(f"image tokenizer: ch_mult {self.ch_mult} and num_res_blocks {self.num_res_blocks} "
                              f"differ in length")  # fmt: skip
        if any((self.ch * m) % 32 for m in (1, *self.ch_mult)):
            raise ConfigError(f"image tokenizer: every width ch x ch_mult must be a multiple of 32 (GroupNorm(32)); "
                              f"ch {self.ch}, ch_mult {self.ch_mult}")  # fmt: skip
        if self.image_size % self.downsampling:
            raise ConfigError(f"image tokenizer: image_size {self.image_size} is not a multiple of "
                              f"{self.downsampling}")  # fmt: skip

    @property
    def downsampling(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    @property
    def tokens(self) -> int:
        """Codes per image: 1024 at 512 px."""
        return (self.image_size // self.downsampling) ** 2

    @property
    def codebook_size(self) -> int:
        return 2**self.z_channels

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MagvitConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: data[k] for k in names if k in data})

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


IMAGE_TOKENIZER_DIR = "image_tokenizer"  # a checkpoint folder's subfolder holding its image tokenizer
IMAGE_TOKENIZER_REPO = "showlab/magvitv2"  # looked up in the local Hugging Face cache otherwise
# single-file weights as MMaDA's ModelMixin saves them (SAFETENSORS_WEIGHTS_NAME), or diffusers / transformers spell them
IMAGE_TOKENIZER_FILES = ("pytorch_model.safetensors", "diffusion_pytorch_model.safetensors", "model.safetensors")


@dataclasses.dataclass(frozen=True)
class TextConfig:
    vocab_size: int = 126464
    hidden_size: int = 4096
    intermediate_size: int = 12288
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 32
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    qkv_bias: bool = False  # biases on q_proj, k_proj, v_proj (Qwen2's and Dream's attention; o_proj has none)

    def __post_init__(self) -> None:
        _whole(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads"), "")  # fmt: skip
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """SigLIP(2) so400m patch14 384 by default; ``num_hidden_layers`` is the tower's own count."""

    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_hidden_layers: int = 27
    num_attention_heads: int = 16
    image_size: int = 384
    patch_size: int = 14
    layer_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        _whole(self, ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "image_size",
                      "patch_size"), "vision_config.")  # fmt: skip
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"vision_config.hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                              f"{self.num_attention_heads}")  # fmt: skip

    @property
    def kept_layers(self) -> int:
        """LLaDA-V deletes the tower's last encoder layer and takes the output of the one before."""
        return self.num_hidden_layers - 1

    @property
    def tokens_per_tile(self) -> int:
        return (self.image_size // self.patch_size) ** 2  # 729 for so400m at 384 px


@dataclasses.dataclass(frozen=True)
class DiffusionMLLMConfig:
    """Every family's model configuration (``family`` names which; ``seer_export.models.families``)."""

    text: TextConfig
    vision: VisionConfig
    projector_type: str = "mlp2x_gelu"
    patch_merge_type: str = "spatial_unpad"
    image_aspect_ratio: str = "anyres_max_4"
    # "(AxB),...,(CxD)" tile range, or (width, height) px pairs as a trained checkpoint's config.json lists them
    image_grid_pinpoints: str | tuple[tuple[int, int], ...] = LLADA_V_PINPOINTS
    seer: SeerConfig = SeerConfig()
    generation: GenerationConfig = GenerationConfig(decoding=DEFAULT_DECODING)
    system_prompt: str | None = LLADA_V_SYSTEM
    naming: str = "llada-v"  # the checkpoint's parameter names: "llada-v" (HF) | "llada-native" (OLMo)
    family: str = "llada-v"  # seer_export.models.families: "llada-v" | "lavida-llada" | "mmada"
    # an image tokenizer's front end (MMaDA): ids around the image's codes, codebook size, where code 0 sits in the
    # vocabulary (None: the tokenizer's length, as MMaDA's ``get_code(...) + len(text_tokenizer)``)
    image_prefix_ids: tuple[int, ...] = ()
    image_suffix_ids: tuple[int, ...] = ()
    codebook_size: int = 0
    image_token_offset: int | None = None
    magvit: MagvitConfig | None = None  # the image tokenizer's dims, from its own folder's config.json (from_file)

    def __post_init__(self) -> None:
        if self.naming not in NAMINGS:
            raise ConfigError(f"parameter naming {self.naming!r} is not one of {list(NAMINGS)}")
        family = get_family(self.family)  # raises ConfigError when unknown
        object.__setattr__(self, "image_prefix_ids", tuple(self.image_prefix_ids))
        object.__setattr__(self, "image_suffix_ids", tuple(self.image_suffix_ids))
        if family.front_end == "magvitv2":
            if self.codebook_size < 2:
                raise ConfigError(f"{self.family}: codebook_size {self.codebook_size}; expected the image tokenizer's "
                                  f"code count (MMaDA: 8192)")  # fmt: skip
            top = (self.image_token_offset or 0) + self.codebook_size
            if top > self.text.vocab_size:
                raise ConfigError(f"{self.family}: image codes {self.image_token_offset} + {self.codebook_size} reach "
                                  f"past the vocabulary ({self.text.vocab_size} rows)")  # fmt: skip
        if self.projector_type != "mlp2x_gelu":
            raise ConfigError(f"mm_projector_type {self.projector_type!r} is not supported; LLaDA-V uses 'mlp2x_gelu'")
        if self.image_aspect_ratio.startswith("anyres_max") and self.anyres_max_tiles is None:
            raise ConfigError(
                f"image_aspect_ratio {self.image_aspect_ratio!r} names no tile budget; expected e.g. 'anyres_max_4'"
            )
        parse_pinpoints(self.image_grid_pinpoints, self.vision.image_size)  # raises ConfigError when malformed
        if not isinstance(self.image_grid_pinpoints, str):  # a JSON list of lists, frozen into tuples
            object.__setattr__(self, "image_grid_pinpoints", tuple(tuple(p) for p in self.image_grid_pinpoints))
        if not self.seer.probe_layer < self.text.num_hidden_layers:
            raise ConfigError(
                f"seer.probe_layer {self.seer.probe_layer} is past the last layer ({self.text.num_hidden_layers - 1})"
            )

    @property
    def grid_pinpoints(self) -> list[tuple[int, int]]:
        """Candidate (width, height) px resolutions of the anyres grid."""
        return parse_pinpoints(self.image_grid_pinpoints, self.vision.image_size)

    @property
    def has_tower(self) -> bool:
        """True for a SigLIP tower + projector front end; False for an image tokenizer's ids (MMaDA)."""
        return FAMILIES[self.family].front_end == "siglip"

    @property
    def shift_logits(self) -> bool:
        """True when position i's logits come from hidden state i - 1 (Dream's, ``Family.shift_logits``)."""
        return FAMILIES[self.family].shift_logits

    @property
    def image_pool_stride(self) -> int:
        """1: tile features as projected; s: each tile's patch map bilinearly pooled to ceil(side / s) a side."""
        return FAMILIES[self.family].image_pool_stride

    @property
    def feature_side(self) -> int:
        """Features per side of one tile's map as the language model sees it: 27, or 14 after LaViDa's pool."""
        return -(-(self.vision.image_size // self.vision.patch_size) // self.image_pool_stride)

    @property
    def features_per_tile(self) -> int:
        """Features one tile contributes (before newlines): 729 for LLaDA-V, 196 for LaViDa at 384 px."""
        return self.feature_side**2

    @property
    def anyres_max_tiles(self) -> int | None:
        """N of ``anyres_max_N``: the grid's patch map is downsampled past about N tiles' worth; else None."""
        found = re.fullmatch(r"anyres_max_(\d+)", self.image_aspect_ratio)
        return int(found.group(1)) if found else None

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config.json") -> DiffusionMLLMConfig:
        naming = "llada-v"
        native = "d_model" in data and "num_hidden_layers" not in data  # LLaDA's native config: OLMo's keys
        family = get_family(infer_family(data, native))
        if native:
            data, naming = _from_native(data, where), "llada-native"
        else:
            _refuse_unbuilt(data, where)
        text_names = {f.name for f in dataclasses.fields(TextConfig)}
        missing = sorted(n for n in ("vocab_size", "hidden_size", "num_hidden_layers") if n not in data)
        if missing:
            raise ConfigError(f"{where} lacks {missing}; is this a LLaDA-V checkpoint's config.json?")
        text = TextConfig(**{**family.text_defaults, **{k: data[k] for k in text_names if k in data}})
        vision_data = data.get("vision_config") or family.vision_defaults
        vision_names = {f.name for f in dataclasses.fields(VisionConfig)}
        vision = VisionConfig(**{k: vision_data[k] for k in vision_names if k in vision_data})
        if data.get("mm_hidden_size", vision.hidden_size) != vision.hidden_size:
            raise ConfigError(
                f"{where}: mm_hidden_size {data['mm_hidden_size']} differs from the vision width {vision.hidden_size}"
            )
        return cls(
            text=text,
            vision=vision,
            projector_type=data.get("mm_projector_type", "mlp2x_gelu"),
            patch_merge_type=data.get("mm_patch_merge_type", "spatial_unpad"),
            image_aspect_ratio=data.get("image_aspect_ratio", family.image_aspect_ratio),
            image_grid_pinpoints=data.get("image_grid_pinpoints") or family.image_grid_pinpoints,
            seer=SeerConfig.from_dict(data["seer"]) if "seer" in data else SeerConfig(),
            generation=GenerationConfig.from_dict({"decoding": DEFAULT_DECODING, **data["generation"]})
            if "generation" in data
            else family.generation,
            system_prompt=data.get("system_prompt", family.system_prompt),
            naming=naming,
            family=family.name,
            image_prefix_ids=data.get("image_prefix_ids", family.image_prefix_ids),
            image_suffix_ids=data.get("image_suffix_ids", family.image_suffix_ids),
            codebook_size=data.get("codebook_size", 0),
            image_token_offset=data.get("image_token_offset"),
        )

    @classmethod
    def from_file(cls, path: str | Path) -> DiffusionMLLMConfig:
        """``from_dict`` of a config.json; a checkpoint's whole config, with its image tokenizer's, is
        ``seer_export.models.loading.read_config``."""
        return cls.from_dict(read_json(path), str(path))

    def to_dict(self) -> dict[str, Any]:
        """The ``config.json`` form: text dims at the top level (HF's keys, or OLMo's for the native naming),
        product keys alongside."""
        text = dataclasses.asdict(self.text)
        if self.naming == "llada-native":
            back = {v: k for k, v in NATIVE_CONFIG_KEYS.items()}
            text = {back.get(k, k): v for k, v in text.items()}
            text |= {"embedding_size": self.text.vocab_size, **NATIVE_REQUIRED, **NATIVE_WRITTEN}
        model_type = {"mmada": "mmada", "dream": "Dream", "lavida-dream": "llava_dream"}.get(self.family, "llava_llada")
        return {
            "model_type": model_type,
            "family": self.family,
            **text,
            **(
                {
                    "mm_hidden_size": self.vision.hidden_size,
                    "mm_projector_type": self.projector_type,
                    "mm_patch_merge_type": self.patch_merge_type,
                }
                if self.has_tower
                else {}
            ),
            "image_aspect_ratio": self.image_aspect_ratio,
            "image_grid_pinpoints": (
                self.image_grid_pinpoints
                if isinstance(self.image_grid_pinpoints, str)
                else [list(p) for p in self.image_grid_pinpoints]
            ),
            "vision_config": dataclasses.asdict(self.vision),
            **(
                {}
                if self.has_tower or FAMILIES[self.family].front_end == "none"
                else {
                    "codebook_size": self.codebook_size,
                    "image_prefix_ids": list(self.image_prefix_ids),
                    "image_suffix_ids": list(self.image_suffix_ids),
                    "image_token_offset": self.image_token_offset,
                }
            ),
            "system_prompt": self.system_prompt,
            "seer": self.seer.to_dict(),
            "generation": self.generation.to_dict(),
        }


def _whole(cfg: Any, names: tuple[str, ...], prefix: str) -> None:
    """Refuse a dim of ``cfg`` that is no whole number >= 1 (a config.json's 0, -3, 2.5 or "64"), naming the key."""
    bad = {prefix + n: getattr(cfg, n) for n in names if not is_whole(getattr(cfg, n)) or getattr(cfg, n) < 1}
    if bad:
        raise ConfigError(f"config.json {bad}: expected whole numbers >= 1 (the model's dims); restore the "
                          f"checkpoint's own config.json")  # fmt: skip


def _refuse_unbuilt(data: dict[str, Any], where: str) -> None:
    """Refuse Hugging Face config options the one language model does not implement (Qwen2's and Dream's keys), so
    such a checkpoint is not exported as something else.

    Raises:
        ConfigError: RoPE scaling, sliding-window attention, an activation other than SiLU.
    """
    other = {k: data[k] for k in ("rope_scaling",) if data.get(k) is not None}
    if data.get("use_sliding_window"):
        other["use_sliding_window"] = True
    if data.get("hidden_act", "silu") != "silu":
        other["hidden_act"] = data["hidden_act"]
    if other:
        raise ConfigError(f"{where}: {other} is not implemented: the language model has plain RoPE, full attention "
                          f"and SiLU (rope_scaling null, use_sliding_window false, hidden_act silu)")  # fmt: skip


def _from_native(data: dict[str, Any], where: str) -> dict[str, Any]:
    """A native (OLMo-keyed) config as LLaDA-V's keys; options the one language model does not implement refused.

    Raises:
        ConfigError: a native option with another value than LLaDA's (biases, tied weights, another block).
    """
    other = {k: data[k] for k, v in NATIVE_REQUIRED.items() if k in data and data[k] != v}
    if other:
        raise ConfigError(f"{where}: {other} is not LLaDA's language model, which has {dict(NATIVE_REQUIRED)} "
                          f"for these keys; only LLaDA-architecture checkpoints load")  # fmt: skip
    out = {k: v for k, v in data.items() if k not in NATIVE_CONFIG_KEYS}
    out |= {NATIVE_CONFIG_KEYS[k]: v for k, v in data.items() if k in NATIVE_CONFIG_KEYS}
    out.setdefault("num_key_value_heads", out.get("num_attention_heads"))
    # the embedding rows are embedding_size when set (a vocabulary padded or grown, as MMaDA's), else vocab_size
    if data.get("embedding_size"):
        out["vocab_size"] = data["embedding_size"]
    if data.get("new_vocab_size"):  # MMaDA: the text vocabulary grown by the image codes (134,656 rows)
        out["vocab_size"] = data["new_vocab_size"]
    return out
