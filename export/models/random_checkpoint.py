"""A checkpoint folder of random weights in LLaDA-V's layout: for export tests and the 8B-path memory check.

In:  an ``DiffusionMLLMConfig`` (e.g. LLaDA-V's or LaViDa-LLaDA's own dims with fewer layers, ``model_layout``; its
     ``naming`` picks LLaDA-V's or LLaDA's native parameter names and config keys), a dtype, a seed.
Out: a Hugging Face style folder: ``config.json``, ``model-0000i-of-0000n.safetensors`` shards with
     ``model.safetensors.index.json``, and the fixture's tokenizer files (its special ids fit any vocab >= 103).

Tensors are drawn one at a time and written shard by shard, so memory stays near one shard. Norm weights are
ones, everything else N(0, (gain / sqrt(fan_in))^2), which keeps activations O(1) at any width; the LM head's row of
the mask token is zeros, so its logit is 0 where the others spread around it: a trained model never predicts the mask
token (it is never a target), and an answer holding it is refused as a broken export's (``seer_trt.runtime.
detokenize``), so a random one must not predict it either.

    python -m seer_export.models.random_checkpoint --out /tmp/llada-v-8l --layers 8   # LLaDA-V dims, 8 layers, fp16
    python -m seer_export.models.random_checkpoint --model lavida-llada --out /tmp/lavida-4l --layers 4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sys
from pathlib import Path

import torch

from seer_export.models.config import DiffusionMLLMConfig, TextConfig, VisionConfig
from seer_export.models.families import FAMILIES, special_tokens
from seer_export.models.loading import INDEX_FILE
from seer_export.models.magvit import IMAGE_TOKENIZER_DIR, IMAGE_TOKENIZER_FILES, MagvitConfig, MagvitTokenizer
from seer_export.models.mllm import DiffusionMLLM
from seer_export.models.names import NAMINGS, to_checkpoint, to_module
from seer_export.models.registry import FIXTURE_DIR
from seer_export.reference.fixture import write_tokenizer
from seer_trt.cli.common import Parser, add_verbose, run_main
from seer_trt.contracts.errors import ConfigError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def write_random_checkpoint(
    folder: str | Path,
    cfg: DiffusionMLLMConfig,
    dtype: torch.dtype = torch.float16,
    seed: int = 0,
    gain: float = 1.0,
    shard_bytes: int = 2 * 2**30,
    tokenizer_from: Path = FIXTURE_DIR,
    image_tokenizer: MagvitConfig | None = None,
) -> Path:
    """Write a random-weight checkpoint of ``cfg`` into ``folder`` (created); returns the folder. A family with an
    image tokenizer (MMaDA) also gets one in ``folder/image_tokenizer`` (``image_tokenizer``: its dims, MAGVIT-v2's
    by default), with a decoder tensor and the quantizer's buffers beside the encoder, as showlab/magvitv2 stores them.

    Args:
        folder: where to write.
        cfg: the model config; its ``seer`` / ``generation`` go into config.json as they are.
        dtype: dtype of the stored tensors.
        seed: seeds every tensor (drawn in state-dict order).
        gain: weights are N(0, (gain / sqrt(fan_in))^2); a gain above 1 makes a random model's predictions
            differ clearly between positions (fewer near-ties in tests).
        shard_bytes: start a new shard past this size.
        tokenizer_from: folder whose tokenizer files are copied.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    family = FAMILIES[cfg.family]
    if family.special_strings and Path(tokenizer_from) == FIXTURE_DIR:  # Dream's ChatML tokens, not LLaDA's
        write_tokenizer(folder, cfg.family)
    else:
        for file in TOKENIZER_FILES:
            shutil.copy2(Path(tokenizer_from) / file, folder / file)
    special = special_tokens(cfg.family, folder / "tokenizer.json")
    with torch.device("meta"):  # stored under the checkpoint's names: LLaDA-V's, or LLaDA's native (cfg.naming)
        shapes = {to_checkpoint(n, cfg.naming): tuple(t.shape) for n, t in DiffusionMLLM(cfg).state_dict().items()}
    head = to_checkpoint("lm_head.weight", cfg.naming)
    head = {head: special.mask_id} if special.mask_id < cfg.text.vocab_size else {}  # the mask token's logit: 0
    _write_tensors(folder, shapes, lambda name: "norm" in to_module(name, cfg.naming), dtype, seed, gain, shard_bytes,
                   head)  # fmt: skip
    data = cfg.to_dict()
    if cfg.naming == "llada-native" or family.special_strings:  # the token ids the modeling code reads from config
        data |= {"eos_token_id": special.endoftext_id, "pad_token_id": special.endoftext_id,
                 "mask_token_id": special.mask_id}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(data, indent=2) + "\n")
    if family.front_end == "magvitv2":
        write_image_tokenizer(folder / IMAGE_TOKENIZER_DIR, image_tokenizer or MagvitConfig(), dtype, seed + 1, gain)
    return folder


def write_image_tokenizer(folder: Path, cfg: MagvitConfig, dtype: torch.dtype, seed: int, gain: float) -> Path:
    """A random MAGVIT-v2 in showlab/magvitv2's layout: one ``pytorch_model.safetensors`` (MMaDA's ``ModelMixin``
    name) holding the encoder, one decoder tensor and the quantizer's buffers."""
    folder.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        shapes = {n: tuple(t.shape) for n, t in MagvitTokenizer(cfg).state_dict().items()}
    shapes["decoder.conv_in.weight"] = (cfg.ch, cfg.z_channels, 3, 3)
    tensors = _random_tensors(shapes, lambda name: "norm" in name and name.endswith(".weight"), dtype, seed, gain)
    # the quantizer's buffers as LFQuantizer derives them: 2^(z-1) .. 1 (int64), and every code's bits as -1 / +1
    tensors["quantize.power_vals"] = 2 ** torch.arange(cfg.z_channels - 1, -1, -1)
    bits = (torch.arange(cfg.codebook_size)[:, None] >> torch.arange(cfg.z_channels - 1, -1, -1)) & 1
    tensors["quantize.embedding"] = bits.float() * 2 - 1
    from safetensors.torch import save_file

    save_file(tensors, str(folder / IMAGE_TOKENIZER_FILES[0]), metadata={"format": "pt"})  # one file, as MMaDA saves
    data = {"_class_name": "MAGVITv2", **{k: v for k, v in cfg.to_dict().items() if k != "image_size"}}
    (folder / "config.json").write_text(json.dumps(data, indent=2) + "\n")
    return folder


def _random_tensors(shapes: dict[str, tuple[int, ...]], is_norm, dtype: torch.dtype, seed: int, gain: float,
                    gen: torch.Generator | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
    """1-D norm weights (``is_norm``) ones, the rest N(0, (gain / sqrt(fan_in))^2), drawn in order."""
    gen = gen or torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        if is_norm(name) and len(shape) == 1:  # ones, under either naming
            out[name] = torch.ones(shape, dtype=dtype)
        else:
            fan_in = math.prod(shape[1:]) if len(shape) > 1 else shape[0]
            out[name] = (torch.randn(shape, generator=gen) * (gain / math.sqrt(fan_in))).to(dtype)
    return out


def _write_tensors(folder: Path, shapes: dict[str, tuple[int, ...]], is_norm, dtype: torch.dtype, seed: int,
                   gain: float, shard_bytes: int = 2 * 2**30, zero_rows: dict[str, int] | None = None) -> None:  # fmt: skip
    """Random tensors of ``shapes`` in safetensors shards with their index: 1-D norm weights (``is_norm``) ones, the
    rest N(0, (gain / sqrt(fan_in))^2), drawn in order from ``seed``; ``zero_rows``: tensor name -> a row set to zeros
    after the draw (the others' values stay those of the seed)."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    groups: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = math.prod(shape) * dtype.itemsize
        if groups[-1] and size + nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    weight_map = {}
    for i, names in enumerate(groups):
        shard = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = _random_tensors({n: shapes[n] for n in names}, is_norm, dtype, seed, gain, gen)
        for name, row in (zero_rows or {}).items():
            if name in tensors:
                tensors[name][row] = 0
        weight_map |= dict.fromkeys(names, shard)
        save_file(tensors, str(folder / shard), metadata={"format": "pt"})
        del tensors
    total = sum(math.prod(s) * dtype.itemsize for s in shapes.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def llada_v_layout(layers: int) -> DiffusionMLLMConfig:
    """LLaDA-V's dims (hidden 4096, MLP 12288, 32 heads, vocab 126464, SigLIP so400m) with ``layers`` layers."""
    return DiffusionMLLMConfig(text=TextConfig(num_hidden_layers=layers), vision=VisionConfig())


def model_layout(model: str, layers: int) -> DiffusionMLLMConfig:
    """A family's full-size layout with ``layers`` decoder layers: LLaDA-8B's language model and SigLIP so400m
    under ``model``'s names, config keys, image settings and loop (``seer_export.models.families``)."""
    if model == "llada-v":
        return llada_v_layout(layers)
    family = FAMILIES[model]
    base = llada_v_layout(layers)
    extra = {}
    if family.shift_logits:  # Dream-7B: Qwen2.5-7B's language model, under Hugging Face's names
        text = TextConfig(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=layers,
                          num_attention_heads=28, num_key_value_heads=4, rms_norm_eps=1e-6, rope_theta=1e6,
                          qkv_bias=True)  # fmt: skip
        return dataclasses.replace(base, text=text, family=model, image_aspect_ratio=family.image_aspect_ratio,
                                   image_grid_pinpoints=family.image_grid_pinpoints, generation=family.generation,
                                   system_prompt=family.system_prompt)  # fmt: skip
    if family.front_end == "magvitv2":  # MMaDA: 126,464 text rows + 8,192 codes, padded to 134,656
        extra = dict(text=dataclasses.replace(base.text, vocab_size=134656), vision=VisionConfig(**family.vision_defaults),
                     codebook_size=8192, image_prefix_ids=family.image_prefix_ids,
                     image_suffix_ids=family.image_suffix_ids, image_token_offset=126349)  # fmt: skip
    return dataclasses.replace(base, naming="llada-native", family=model, image_aspect_ratio=family.image_aspect_ratio,
                               image_grid_pinpoints=family.image_grid_pinpoints, generation=family.generation,
                               system_prompt=family.system_prompt, **extra)  # fmt: skip


PROG = "python -m seer_export.models.random_checkpoint"


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog=PROG, description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="checkpoint folder to write")
    ap.add_argument("--model", default="llada-v", choices=list(FAMILIES),
                    help="whose layout, parameter names and config keys: llada-v (default) or lavida-llada "
                    "(LLaDA's native names, SigLIP, pooled tiles, LaViDa's pinpoints)")  # fmt: skip
    ap.add_argument("--layers", type=int, default=8, help="decoder layers (the 8B models have 32; default 8)")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "fp32"], help="weights' dtype (default fp16)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    ap.add_argument("--naming", default=None, choices=NAMINGS,
                    help="parameter names and config keys (default: the model's own): llada-v (LLaDA-V's) or "
                    "llada-native (LLaDA's own OLMo names, as LaViDa-LLaDA and MMaDA store them)")  # fmt: skip
    add_verbose(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, build_parser(), work, argv, atomic=False)  # files are written in place


def work(args: argparse.Namespace) -> int:
    if args.layers < 1:
        raise ConfigError(f"--layers {args.layers}: expected at least 1 decoder layer")
    cfg = model_layout(args.model, args.layers)
    if args.naming is not None:
        cfg = dataclasses.replace(cfg, naming=args.naming)
    dtype = torch.float16 if args.dtype == "fp16" else torch.float32
    write_random_checkpoint(args.out, cfg, dtype=dtype, seed=args.seed)
    with torch.device("meta"):
        params = sum(p.numel() for p in DiffusionMLLM(cfg).parameters())
    print(f"wrote {args.out}: {cfg.family}, {params / 1e9:.2f}B parameters, {dataclasses.asdict(cfg.text)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
