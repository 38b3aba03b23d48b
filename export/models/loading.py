"""Checkpoint loading: find a LLaDA-V checkpoint offline, read its safetensors lazily, build the model (docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch").

In:  a checkpoint folder in Hugging Face layout (``config.json`` plus ``model.safetensors``, or shards
     ``model-0000x-of-0000y.safetensors`` with ``model.safetensors.index.json``), given directly or found in
     the local Hugging Face cache, offline: nothing here touches the network.
Out: ``DiffusionMLLM`` with every parameter loaded under a strict check of names and shapes; the names are LLaDA-V's or
     LLaDA's native ones, as the checkpoint's ``config.json`` says (``seer_export.models.names``).

Memory stays near one copy of the weights, which an 8B export on a 24 GB machine needs: the config.json's dims are
checked against the tensors the safetensors headers list (``check_config``: layer counts, widths, heads, vocabulary)
before anything is built, the module is then built on the ``meta`` device (no storage), every name and shape is
checked against the headers before a byte of weight is read, then tensors are read one at a time, cast to the
requested dtype and attached (``load_state_dict(assign=True)``), so no second copy of the model ever exists.
Everything up to building the module runs without torch, which is imported only then.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from seer_export.models.config import (
    IMAGE_TOKENIZER_DIR,
    IMAGE_TOKENIZER_FILES,
    IMAGE_TOKENIZER_REPO,
    UNUSED_PREFIXES,
    DiffusionMLLMConfig,
    MagvitConfig,
)
from seer_export.models.families import FAMILIES
from seer_export.models.names import NATIVE_CONFIG_KEYS, to_checkpoint, to_module
from seer_trt.contracts.config import read_json
from seer_trt.contracts.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    import torch

    from seer_export.models.mllm import DiffusionMLLM

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_INDEX_BYTES = 64 * 2**20  # a safetensors index lists names and shard files: an 8B model's is about 60 KB
LIST_LIMIT = 8  # names shown per kind of mismatch before "... (+N more)"
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache folder, read from the environment at call time.

    Same precedence as ``huggingface_hub``: ``HF_HUB_CACHE``, ``HUGGINGFACE_HUB_CACHE``, ``HF_HOME``/hub,
    ``XDG_CACHE_HOME``/huggingface/hub, ``~/.cache/huggingface/hub``. ``huggingface_hub.constants`` is frozen
    at import, so a variable set later (a test, a launcher) would be missed there.

    Returns:
        The cache folder; it may not exist.
    """
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def _cached_snapshot(repo_id: str, cache: Path) -> Path | None:
    """The snapshot folder of ``repo_id`` in ``cache`` that holds ``config.json``, or None. Offline."""
    from huggingface_hub import try_to_load_from_cache

    hit = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache)
    if isinstance(hit, str):  # refs/main names a snapshot that has config.json
        return Path(hit).parent
    # A cache copied without refs/ (or holding only pinned revisions): take the newest complete-looking snapshot.
    repo_dir = cache / f"models--{repo_id.replace('/', '--')}"
    snapshots = [p.parent for p in repo_dir.glob("snapshots/*/config.json")]
    return max(snapshots, key=lambda p: p.stat().st_mtime) if snapshots else None


def resolve_checkpoint(name_or_path: str | Path | None, repo_id: str) -> Path:
    """Find a checkpoint folder without touching the network.

    Args:
        name_or_path: a checkpoint folder (``--checkpoint DIR``), a Hugging Face repo id to look up in the
            local cache, or None to look up ``repo_id`` there.
        repo_id: the Hugging Face id searched in the local cache when ``name_or_path`` is None.

    Returns:
        A folder holding ``config.json`` (a local folder, or a snapshot inside the Hugging Face cache).

    Raises:
        CheckpointError: nothing was found; the one-line message says where it looked and how to provide one.
    """
    if name_or_path is not None:
        path = Path(os.path.expandvars(str(name_or_path))).expanduser()
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise CheckpointError(
                    f"checkpoint folder {path} has no config.json (found {_listing(path)}); expected a Hugging "
                    f"Face layout: config.json plus model.safetensors or model-*-of-*.safetensors with {INDEX_FILE}"
                )
            return path
        if path.exists():
            raise CheckpointError(f"checkpoint {path} is a file; pass --checkpoint DIR, the folder holding config.json")
        if not _REPO_ID.match(str(name_or_path)):
            raise CheckpointError(
                f"checkpoint folder {path} does not exist; pass --checkpoint DIR with an existing folder holding "
                f"config.json and the *.safetensors weights"
            )
        repo_id = str(name_or_path)  # "org/name" that is no local folder: a repo id for the cache
    cache = hf_cache_dir()
    found = _cached_snapshot(repo_id, cache)
    if found is not None:
        return found
    given = f"folder {Path(str(name_or_path)).expanduser()} (absent) and " if name_or_path is not None else ""
    raise CheckpointError(
        f"no checkpoint of {repo_id}: looked in {given}the Hugging Face cache {cache} (offline, "
        f"models--{repo_id.replace('/', '--')}/snapshots/*/config.json); pass --checkpoint DIR (a folder with "
        f"config.json and *.safetensors), or run `huggingface-cli download {repo_id}` (`hf download` in newer "
        f"huggingface_hub) on a connected machine and copy its cache to {cache} (or point HF_HUB_CACHE at the copy)"
    )


def _listing(folder: Path, limit: int = 6) -> str:
    names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    return _names(names, limit) if names else "an empty folder"


def _names(items: list[str], limit: int = LIST_LIMIT) -> str:
    """``[a, b, c] (+N more)``: a bounded listing for one-line error messages."""
    shown = ", ".join(items[:limit])
    return f"[{shown}]" + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


@dataclasses.dataclass(frozen=True, eq=False)
class CheckpointTensors:
    """The tensors of a checkpoint, known from the safetensors headers; data is read only on demand.

    Supports ``name in ckpt``, ``len(ckpt)``, ``ckpt.keys()`` and ``ckpt[name]`` (reads one tensor);
    ``read()`` streams them all, opening each shard once.
    """

    folder: Path  # the checkpoint folder
    files: dict[str, Path]  # tensor name -> the .safetensors file holding it
    shapes: dict[str, tuple[int, ...]]  # tensor name -> shape, from the file header
    dtypes: dict[str, str]  # tensor name -> safetensors dtype ("BF16", "F32", ...), from the file header
    stored: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> its name in the file, where they differ

    def merged(self, other: CheckpointTensors, prefix: str, skip: tuple[str, ...] = ()) -> CheckpointTensors:
        """These tensors and ``other``'s under ``prefix`` (those starting with ``skip`` left out): a model whose
        parts come from two checkpoints (MMaDA's language model and its image tokenizer) checks and reads one set."""
        names = [n for n in other.keys() if not n.startswith(skip)]
        return CheckpointTensors(
            self.folder,
            {**self.files, **{prefix + n: other.files[n] for n in names}},
            {**self.shapes, **{prefix + n: other.shapes[n] for n in names}},
            {**self.dtypes, **{prefix + n: other.dtypes[n] for n in names}},
            {**self.stored, **{prefix + n: other.stored.get(n, n) for n in names}},
        )

    def keys(self) -> list[str]:
        return list(self.files)

    def __contains__(self, name: object) -> bool:
        return name in self.files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.files:
            raise KeyError(name)
        return next(self.read([name]))[1]

    def read(
        self,
        names: list[str] | None = None,
        dtype: torch.dtype | None = None,
        device: str | torch.device = "cpu",
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(name, tensor)`` one at a time, shard by shard.

        Args:
            names: the tensors to read (all by default).
            dtype: cast floating-point tensors to this dtype as they are read; others keep theirs.
            device: where the tensors are created.

        Raises:
            CheckpointError: a shard could not be read; the message names the file.
        """
        import torch
        from safetensors import SafetensorError, safe_open

        wanted = self.keys() if names is None else names
        by_file: dict[Path, list[str]] = {}
        for name in wanted:
            by_file.setdefault(self.files[name], []).append(name)
        for path, group in by_file.items():
            try:
                with safe_open(str(path), framework="pt", device=str(torch.device(device))) as f:
                    for name in group:
                        tensor = f.get_tensor(self.stored.get(name, name))
                        if dtype is not None and tensor.is_floating_point():
                            tensor = tensor.to(dtype)
                        yield name, tensor
            except (SafetensorError, OSError) as err:
                raise CheckpointError(f"cannot read {path}: {err}; re-download or re-copy that file") from err


def _header(path: Path) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """Shapes and dtypes of every tensor in one .safetensors file; reads the header only (safetensors checks it: at
    most 100 MB, every tensor's bytes inside the file), without torch."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing; re-download or re-copy it")
    try:
        with safe_open(str(path), framework="numpy") as f:
            slices = {name: f.get_slice(name) for name in f.keys()}
            return {n: tuple(s.get_shape()) for n, s in slices.items()}, {n: s.get_dtype() for n, s in slices.items()}
    except (SafetensorError, OSError) as err:
        raise CheckpointError(
            f"checkpoint file {path} is not a readable safetensors file ({err}); it is truncated or corrupt, "
            f"re-download or re-copy it"
        ) from err


def _weight_map(folder: Path) -> dict[str, Path]:
    """Tensor name -> shard file, from ``model.safetensors.index.json``; every shard it names must exist."""
    index_path = folder / INDEX_FILE
    size = index_path.stat().st_size
    if size > MAX_INDEX_BYTES:
        raise CheckpointError(f"{index_path} is {size} bytes, more than the {MAX_INDEX_BYTES} a safetensors index may "
                              f"be (it lists names and shard files); re-download or re-copy it")  # fmt: skip
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(
            f"{index_path} is not a safetensors index ({type(err).__name__}: {err}); expected "
            f'{{"metadata": {{...}}, "weight_map": {{tensor name: shard file}}}}; re-download or re-copy it'
        ) from err
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index_path}: weight_map is empty or not an object; re-download or re-copy it")
    shards = sorted(set(weight_map.values()))
    missing = [s for s in shards if not (folder / s).is_file()]
    if missing:
        raise CheckpointError(
            f"{index_path} names {len(shards)} shard(s) but {len(missing)} are missing from {folder}: "
            f"{_names(missing)}; download or copy the missing file(s)"
        )
    return {name: folder / shard for name, shard in weight_map.items()}


def load_state(folder: str | Path, single: tuple[str, ...] = (SINGLE_FILE,)) -> CheckpointTensors:
    """Index a checkpoint's tensors from their safetensors headers; no weight data is read.

    Args:
        folder: a folder holding ``model.safetensors``, or shards plus ``model.safetensors.index.json``
            (the index wins when both are present, as in ``transformers``).

    Returns:
        ``CheckpointTensors``: each tensor's file, shape and dtype; read the data with ``read()``.

    Raises:
        CheckpointError: no weights file, an unreadable index, a missing or corrupt shard, or an index entry
            its shard does not hold; the message names the file.
    """
    folder = Path(folder)
    if not (folder / INDEX_FILE).is_file():
        for name in single:
            if (folder / name).is_file():
                shapes, dtypes = _header(folder / name)
                return CheckpointTensors(folder, {n: folder / name for n in shapes}, shapes, dtypes)
        shards = sorted(p.name for p in folder.glob("model-*-of-*.safetensors"))
        hint = f"shards {_names(shards, 3)} are there but {INDEX_FILE} is not; copy it too" if shards else ""
        raise CheckpointError(
            f"no {' / '.join(single)} or {INDEX_FILE} in {folder} (found {_listing(folder)}); "
            + (hint or "only safetensors checkpoints are supported: convert .bin weights or re-download")
        )
    files = _weight_map(folder)
    shapes, dtypes = {}, {}
    for path in sorted(set(files.values())):
        file_shapes, file_dtypes = _header(path)
        names = [n for n, p in files.items() if p == path]  # the index is the source of truth, as in transformers
        claimed = sorted(n for n in names if n not in file_shapes)
        if claimed:
            raise CheckpointError(
                f"{folder / INDEX_FILE} places {len(claimed)} tensor(s) in {path.name} that it does not hold: "
                f"{_names(claimed)}; the index and shards come from different downloads, re-copy both"
            )
        shapes.update({n: file_shapes[n] for n in names})
        dtypes.update({n: file_dtypes[n] for n in names})
    return CheckpointTensors(folder=folder, files=files, shapes=shapes, dtypes=dtypes)


def check_state(model: torch.nn.Module, ckpt: CheckpointTensors, naming: str = "llada-v",
                what: str | None = None) -> None:  # fmt: skip
    """Strict check of a checkpoint against a model's ``state_dict``: names and shapes, all at once.

    Works on a ``meta`` model: only shapes are compared. Names are compared, and reported, as the checkpoint
    spells them under ``naming`` (``seer_export.models.names``).

    Raises:
        CheckpointError: one message naming every missing, unexpected and mis-shaped tensor, with counts.
    """
    expected = {to_checkpoint(name, naming): tuple(t.shape) for name, t in model.state_dict().items()}
    missing = sorted(set(expected) - set(ckpt.shapes))
    unexpected = sorted(set(ckpt.shapes) - set(expected))
    misshaped = sorted(
        f"{n}: checkpoint {list(ckpt.shapes[n])}, model {list(expected[n])}"
        for n in set(expected) & set(ckpt.shapes)
        if ckpt.shapes[n] != expected[n]
    )
    if not (missing or unexpected or misshaped):
        return
    parts = [
        f"{len(items)} {kind} {_names(items)}"
        for kind, items in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped))
        if items
    ]
    raise CheckpointError(
        f"checkpoint {ckpt.folder} does not match the model its config.json describes: {'; '.join(parts)}; "
        f"expected {len(expected)} tensors, found {len(ckpt.shapes)}. Check that config.json belongs to these "
        f"weights (layer counts, hidden sizes, vocab_size) and that the folder holds a "
        f"{what or ('LLaDA-V' if naming == 'llada-v' else 'LLaDA (native names)')} checkpoint"
    )


def _layer_count(shapes: dict[str, tuple[int, ...]], prefix: str) -> int:
    """How many numbered blocks ``prefix{i}.`` the tensor names hold."""
    found = re.compile(re.escape(prefix) + r"(\d+)\.")
    return len({m.group(1) for m in map(found.match, shapes) if m})


def check_config(cfg: DiffusionMLLMConfig, ckpt: CheckpointTensors, where: str | Path = "config.json") -> None:
    """The dims config.json gives against the tensors the checkpoint holds (its safetensors headers), before any model
    is built: what the config says is then bounded by what is on disk (docs/DESIGN.md "Bounds and output folders").
    Layer counts against the numbered blocks of the tensor names (decoder, vision encoder, image tokenizer levels and
    blocks); vocabulary, widths and heads against the shapes of the tensors they set (the embeddings and the head,
    layer 0's projections, the vision tower's patch and position embeddings, the projector). A tensor the checkpoint
    lacks is left to ``check_state``, which names every missing one once the (now bounded) model is built.

    Raises:
        CheckpointError: naming each config.json key that disagrees, what it implies and what the tensors hold.
    """
    shapes = {to_module(n, cfg.naming): tuple(s) for n, s in ckpt.shapes.items()}
    back = {v: k for k, v in NATIVE_CONFIG_KEYS.items()} if cfg.naming == "llada-native" else {}
    t, v, wrong = cfg.text, cfg.vision, []
    image = f"{IMAGE_TOKENIZER_DIR}/config.json"

    def keys(*names: str) -> str:  # "hidden_size 4096, ..." as the config.json spells the keys
        return ", ".join(f"{back.get(n, n)} {getattr(t, n)}" for n in names)

    def layers(prefix: str, want: int, says: str, spelled: str | None = None) -> bool:
        n = _layer_count(shapes, prefix)
        if n != want:
            wrong.append(f"{says}, the tensors hold {n} ({spelled or prefix}N.*)")
        return n == want

    def shape(name: str, want: tuple[int, ...], says: str) -> None:
        if name in shapes and shapes[name] != want:
            wrong.append(f"{says} give {to_checkpoint(name, cfg.naming)} {list(want)}, the checkpoint holds "
                         f"{list(shapes[name])}")  # fmt: skip

    blocks = to_checkpoint("model.layers.0.input_layernorm.weight", cfg.naming).partition("0.")[0]
    layers("model.layers.", t.num_hidden_layers, f"{keys('num_hidden_layers')} (decoder layers)", blocks)
    shape("model.embed_tokens.weight", (t.vocab_size, t.hidden_size), keys("vocab_size", "hidden_size"))
    shape("lm_head.weight", (t.vocab_size, t.hidden_size), keys("vocab_size", "hidden_size"))
    shape("model.layers.0.self_attn.q_proj.weight", (t.hidden_size, t.hidden_size), keys("hidden_size"))
    shape("model.layers.0.self_attn.k_proj.weight", (t.num_key_value_heads * t.head_dim, t.hidden_size),
          keys("num_key_value_heads", "num_attention_heads", "hidden_size"))  # fmt: skip
    shape("model.layers.0.mlp.gate_proj.weight", (t.intermediate_size, t.hidden_size),
          keys("intermediate_size", "hidden_size"))  # fmt: skip
    if cfg.has_tower:
        tower, vision = "model.vision_tower.vision_tower.vision_model.", f"vision_config.hidden_size {v.hidden_size}"
        layers(f"{tower}encoder.layers.", v.kept_layers, f"vision_config.num_hidden_layers {v.num_hidden_layers} "
               f"({v.kept_layers} encoder layers, the last one dropped)")  # fmt: skip
        patch = f"{vision}, patch_size {v.patch_size}"
        shape(f"{tower}embeddings.patch_embedding.weight", (v.hidden_size, 3, v.patch_size, v.patch_size), patch)
        shape(f"{tower}embeddings.position_embedding.weight", (v.tokens_per_tile, v.hidden_size),
              f"{patch}, image_size {v.image_size}")  # fmt: skip
        shape(f"{tower}encoder.layers.0.mlp.fc1.weight", (v.intermediate_size, v.hidden_size),
              f"{vision}, intermediate_size {v.intermediate_size}")  # fmt: skip
        shape("model.mm_projector.0.weight", (t.hidden_size, v.hidden_size), f"{keys('hidden_size')}, {vision}")
    if cfg.magvit is not None:
        g, enc = cfg.magvit, "model.image_tokenizer.encoder."
        if layers(f"{enc}down.", len(g.ch_mult), f"{image} ch_mult {list(g.ch_mult)} ({len(g.ch_mult)} levels)"):
            for level, blocks in enumerate(g.num_res_blocks):
                layers(f"{enc}down.{level}.block.", blocks, f"{image} num_res_blocks[{level}] {blocks} (blocks)")
        shape(f"{enc}conv_in.weight", (g.ch, 3, 3, 3), f"{image} ch {g.ch}")
        shape(f"{enc}quant_conv.weight", (g.z_channels, g.z_channels, 1, 1), f"{image} z_channels {g.z_channels}")
    if wrong:
        raise CheckpointError(f"{where} does not describe the tensors of {ckpt.folder}: {'; '.join(wrong[:LIST_LIMIT])}; "
                              f"config.json and the weights come from different models: restore the checkpoint's "
                              f"own config.json, or pass --checkpoint the folder these weights belong to")  # fmt: skip


def find_image_tokenizer(checkpoint: Path) -> Path:
    """The image tokenizer's folder: the checkpoint's ``image_tokenizer/``, or ``showlab/magvitv2`` in the local
    Hugging Face cache, offline.

    Raises:
        CheckpointError: none found; the message says where it looked.
    """
    if (checkpoint / IMAGE_TOKENIZER_DIR / "config.json").is_file():
        return checkpoint / IMAGE_TOKENIZER_DIR
    try:
        return resolve_checkpoint(None, IMAGE_TOKENIZER_REPO)
    except CheckpointError as err:
        raise CheckpointError(f"MMaDA's image tokenizer: no {checkpoint / IMAGE_TOKENIZER_DIR}/config.json; copy "
                              f"{IMAGE_TOKENIZER_REPO} there ({err})") from None  # fmt: skip


def read_config(folder: Path) -> DiffusionMLLMConfig:
    """A checkpoint's ``DiffusionMLLMConfig``; for an image tokenizer's family (MMaDA) with its tokenizer's dims
    (``magvit``) and, when config.json names none, ``image_token_offset`` = the length of the tokenizer beside it
    (MMaDA's ``get_code(...) + len(text_tokenizer)``: 126,349).

    Raises:
        ConfigError: an invalid config.json, or an image tokenizer whose codes do not fit the config.
        CheckpointError: no image tokenizer found.
    """
    path = folder / "config.json"
    cfg = DiffusionMLLMConfig.from_file(path)
    if cfg.has_tower or FAMILIES[cfg.family].front_end == "none":  # no image tokenizer to read
        return cfg
    if cfg.image_token_offset is None:
        if not (folder / "tokenizer.json").is_file():
            raise CheckpointError(f"{folder} has no tokenizer.json: MMaDA's image ids start at the tokenizer's length "
                                  f"(len(text_tokenizer)); copy the model's tokenizer files there, or set "
                                  f"image_token_offset in config.json")  # fmt: skip
        from tokenizers import Tokenizer

        size = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
        cfg = dataclasses.replace(cfg, image_token_offset=size)
    image_tokenizer = find_image_tokenizer(folder)
    data = read_json(image_tokenizer / "config.json")
    magvit = MagvitConfig.from_dict({**data, "image_size": cfg.vision.image_size})
    if (magvit.tokens, magvit.codebook_size) != (cfg.features_per_tile, cfg.codebook_size):
        raise ConfigError(f"{image_tokenizer}: {magvit.tokens} codes of {magvit.codebook_size} per "
                          f"{cfg.vision.image_size} px image, but {path} expects {cfg.features_per_tile} of "
                          f"{cfg.codebook_size} (vision_config image_size / patch_size, codebook_size)")  # fmt: skip
    return dataclasses.replace(cfg, magvit=magvit)


def model_state(folder: Path, cfg: DiffusionMLLMConfig) -> CheckpointTensors:
    """The tensors of the whole model ``cfg`` describes: the checkpoint's, and for an image tokenizer's family
    (MMaDA) its tokenizer's encoder under ``model.image_tokenizer.`` (``seer_export.models.magvit``)."""
    ckpt = load_state(folder)
    if cfg.magvit is None:
        return ckpt
    tokenizer = load_state(find_image_tokenizer(folder), IMAGE_TOKENIZER_FILES)
    return ckpt.merged(tokenizer, "model.image_tokenizer.", UNUSED_PREFIXES)


def load_model(
    folder: str | Path, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
) -> DiffusionMLLM:
    """Build ``DiffusionMLLM`` from a checkpoint folder with about one copy of the weights in memory.

    Args:
        folder: a checkpoint folder (``config.json`` plus safetensors), e.g. from ``resolve_checkpoint``.
        dtype: floating-point dtype of the loaded parameters (the checkpoint's are cast as they are read); None:
            float32.
        device: where the parameters live.

    Returns:
        The model in eval mode, every parameter read from the checkpoint.

    Raises:
        CheckpointError: missing config.json or weights, a corrupt shard, or tensors that do not match.
        ConfigError: an invalid config.json or a non-floating ``dtype``.
    """
    import torch

    from seer_export.models.mllm import DiffusionMLLM

    folder, dtype = Path(folder), torch.float32 if dtype is None else dtype
    if not dtype.is_floating_point:
        raise ConfigError(f"dtype {dtype} is not a floating-point type; pass torch.float32, float16 or bfloat16")
    if not (folder / "config.json").is_file():
        raise CheckpointError(
            f"{folder} has no config.json (found {_listing(folder)}); pass --checkpoint DIR with a LLaDA-V "
            f"checkpoint folder: config.json plus the *.safetensors weights"
        )
    cfg = read_config(folder)
    ckpt = model_state(folder, cfg)
    check_config(cfg, ckpt, folder / "config.json")  # before the model is built: its size is what the tensors say
    with torch.device("meta"):
        model = DiffusionMLLM(cfg)
    non_persistent = {n for n, _ in model.named_buffers()} - set(model.state_dict())
    # A non-persistent buffer is not in the checkpoint and would stay on meta; compute it in forward instead.
    assert not non_persistent, f"non-persistent buffers cannot be loaded from a checkpoint: {sorted(non_persistent)}"
    check_state(model, ckpt, cfg.naming)
    # the only copy: assign=True hands these to the model, under the modules' names
    state = {to_module(name, cfg.naming): t for name, t in ckpt.read(dtype=dtype, device=device)}
    model.load_state_dict(state, strict=True, assign=True)
    del state
    on_meta = [n for n, t in model.state_dict().items() if t.is_meta]
    assert not on_meta, f"tensors left on the meta device after loading: {on_meta[:LIST_LIMIT]}"
    return model.eval()
