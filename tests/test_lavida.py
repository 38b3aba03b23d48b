"""LaViDa-LLaDA (docs/DESIGN.md "Model families"): a random checkpoint under LaViDa's official names and config keys
loads strictly and only as ``--model lavida-llada``; every tile's projected map is pooled bilinearly (27 -> 14 at full
size; 7 -> 4 here) before the anyres merge; the export passes parity and records the family; the runtime's tokens
equal the PyTorch reference on 40 prompts with images of many shapes, under LaViDa's own loop (nothing suppressed),
early stop and Seer."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from adapter_checks import (
    calibrates,
    export_of,
    runtime_equals_reference,
    samples_with_images,
    serves_in_triton_repositories,
)
from tiny_models import tiny_lavida_config

from seer_export.models import registry
from seer_export.models.families import FAMILIES
from seer_export.models.loading import INDEX_FILE, load_model
from seer_export.models.random_checkpoint import write_random_checkpoint
from seer_trt.contracts.errors import CheckpointError, ConfigError
from seer_trt.runtime.image import anyres_tiles

SIZES = [(12, 40), (50, 30), (20, 20), (33, 90), (90, 33), (64, 64), (7, 70), (100, 45), (28, 28), (40, 120)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("lavida") / "ckpt"
    return write_random_checkpoint(folder, tiny_lavida_config(), dtype=torch.float32, seed=5, gain=4.0,
                                   shard_bytes=40_000)  # fmt: skip


def test_checkpoint_is_stored_under_lavidas_names_and_loads_only_as_lavida(checkpoint, tmp_path):
    names = set(json.loads((checkpoint / INDEX_FILE).read_text())["weight_map"])
    text = {n for n in names if not n.startswith(("model.vision_tower.", "model.mm_projector.", "model.image_newline"))}
    assert text and all(n.startswith("model.transformer.") for n in text), sorted(text - {"model.transformer."})[:4]
    assert {"model.transformer.wte.weight", "model.transformer.ff_out.weight", "model.transformer.ln_f.weight",
            "model.transformer.blocks.2.ff_proj.weight", "model.mm_projector.2.weight", "model.image_newline",
            "model.vision_tower.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"} <= names  # fmt: skip
    data = json.loads((checkpoint / "config.json").read_text())
    assert {"d_model", "n_layers", "mlp_hidden_size", "mm_hidden_size"} <= set(data) and "hidden_size" not in data

    model, _ = registry.load("lavida-llada", checkpoint)
    assert (model.config.family, model.config.naming, model.config.feature_side) == ("lavida-llada", "llada-native", 4)
    # a real LaViDa config.json has no "family": its native keys beside a vision tower's say it
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in checkpoint.iterdir():
        (bare / f.name).symlink_to(f)
    (bare / "config.json").unlink()
    (bare / "config.json").write_text(json.dumps({k: v for k, v in data.items() if k != "family"}))
    assert load_model(bare).config == model.config

    with pytest.raises(ConfigError, match="holds a lavida-llada checkpoint.*--model lavida-llada"):
        registry.load("llada-v", checkpoint)
    with pytest.raises(ConfigError, match="holds a llada-v checkpoint.*--model llada-v"):
        registry.load("lavida-llada", registry.FIXTURE_DIR)
    text_only = {k: v for k, v in data.items() if k not in ("family", "mm_hidden_size")}
    (bare / "config.json").unlink()
    (bare / "config.json").write_text(json.dumps(text_only))
    with pytest.raises(ConfigError, match="native keys .* without a vision tower"):
        load_model(bare)


def test_a_missing_tensor_is_named_as_the_checkpoint_names_it(checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    broken.mkdir()
    for f in checkpoint.iterdir():
        if not f.name.endswith(".safetensors"):
            (broken / f.name).write_bytes(f.read_bytes())
    index = json.loads((checkpoint / INDEX_FILE).read_text())
    gone = "model.transformer.blocks.1.up_proj.weight"
    for shard in sorted({v for v in index["weight_map"].values()}):
        tensors = {k: v for k, v in load_file(checkpoint / shard).items() if k != gone}
        save_file(tensors, str(broken / shard), metadata={"format": "pt"})
    del index["weight_map"][gone]
    (broken / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=gone.replace(".", r"\.")):
        registry.load("lavida-llada", broken)


def bilinear(grid: np.ndarray, out: int) -> np.ndarray:
    """[C, H, W] -> [C, out, out]: half-pixel centres, edges clamped (PyTorch's bilinear, align_corners=False)."""

    def weights(size: int) -> np.ndarray:
        w = np.zeros((out, size))
        for i in range(out):
            src = max((i + 0.5) * size / out - 0.5, 0.0)
            lo = min(int(math.floor(src)), size - 1)
            hi, frac = min(lo + 1, size - 1), src - lo
            w[i, lo] += 1 - frac
            w[i, hi] += frac
        return w

    rows, cols = weights(grid.shape[1]), weights(grid.shape[2])
    return np.einsum("ih,chw,jw->cij", rows, grid, cols)


def test_every_tile_is_pooled_bilinearly_after_the_projector(checkpoint):
    model = load_model(checkpoint)
    pixels = torch.randn(3, 3, 28, 28, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        projected = model.model.mm_projector(model.model.vision_tower(pixels)).numpy()  # [3, 49, D]
        pooled = model.tile_features(pixels).numpy()
    assert projected.shape[1] == 49 and pooled.shape == (3, 16, 32)
    for tile in range(3):
        want = bilinear(projected[tile].T.reshape(32, 7, 7), 4).reshape(32, 16).T
        # fp32 sums of features up to ~450 in size: the rounding is relative to the largest, not to each result
        np.testing.assert_allclose(pooled[tile], want, rtol=1e-5, atol=1e-7 * np.abs(projected).max())


def test_anyres_images_merge_at_the_pooled_side(checkpoint):
    """Plain anyres: the base tile's 16 features, then the grid's pooled map cropped to the image, each row ending
    with image_newline (no shrinking: LaViDa's configuration names no anyres_max)."""
    model = load_model(checkpoint)
    rng = np.random.default_rng(1)
    for h, w in SIZES:
        image = anyres_tiles(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), 28, model.config.grid_pinpoints)
        layout = image.feature_layout(4, None)
        cols, rows = image.grid
        top, bottom, left, right = layout.crop
        assert layout.size == (bottom - top, right - left) and layout.size[0] <= rows * 4 and layout.size[1] <= cols * 4
        with torch.no_grad():
            emb = model.embed_prompt([1, -200, 2], [image])
        assert emb.shape[0] == 2 + 16 + layout.size[0] * (layout.size[1] + 1) == 2 + layout.tokens, (h, w)


# --- the export and the runtime -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def export(checkpoint, tmp_path_factory):
    return export_of("lavida-llada", checkpoint, tmp_path_factory.mktemp("lavida-export") / "engines")


@pytest.mark.slow
def test_export_passes_parity_and_records_the_family(export):
    out, manifest = export
    assert manifest.parity.status == "passed", manifest.parity.note
    assert manifest.model.name == "lavida-llada" and manifest.model.family == "lavida-llada"
    v = manifest.vision
    assert (v.tokens_per_tile, v.pool_stride, v.image_aspect_ratio, v.anyres_max_tiles) == (16, 2, "anyres", None)
    assert v.grid_pinpoints == ((28, 56), (56, 28), (56, 56), (84, 28), (28, 84))
    vision = manifest.graph("vision").spec.outputs[0]
    assert vision.shape[1] == 16  # the pool is inside the graph


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["lavida_loop", "early_stop", "seer"])
def test_runtime_tokens_equal_the_pytorch_reference(export, checkpoint, mode):
    """40 held-out prompts, 13 with an image (grids 1 x 2 to 3 x 1, crops either way)."""
    from seer_export.reference.fixture import TaskEncoder
    from seer_trt.runtime.pipeline import SeerPipeline

    out, manifest = export
    model = load_model(checkpoint)
    pipe = SeerPipeline.from_manifest(out)
    default = manifest.generation  # LaViDa's loop: one token a step in blocks of min(128, N)
    assert (default.gen_length, default.steps, default.block_length) == (256, 256, 128)
    gen = pipe.settings(gen_length=16)
    assert (gen.steps, gen.block_length) == (16, 16)
    if mode == "lavida_loop":  # LaViDa's own: the fixed rule, one token a step (seer-trt's default is factor:1)
        gen = pipe.settings(gen_length=16, decoding="fixed")
        assert gen == FAMILIES["lavida-llada"].own_loop(16)
    long = pipe.settings(gen_length=256)
    assert (pipe.settings(gen_length=64).block_length, long.steps, long.block_length) == (64, 256, 128)
    samples = samples_with_images(SIZES, 7, 4)
    ref = runtime_equals_reference(pipe, manifest, model, TaskEncoder(checkpoint, model.config), samples, gen, mode)
    pipe.close()
    if mode == "lavida_loop":
        assert set(ref.steps.tolist()) == {gen.gen_length}  # no stop: every position, one a step
    if mode == "seer":
        assert min(ref.kept) < gen.gen_length  # Seer cut some windows


def test_lavidas_loop_suppresses_no_special_id(checkpoint):
    """LLaDA-V's generate_with_embeds bans <|endoftext|>, <|startoftext|> and the header ids at masked positions;
    LaViDa's generate.py bans nothing: its graphs and the reference sampler leave those logits alone."""
    from seer_export.onnx.modules import build, greedy
    from seer_export.reference.sampler import suppress_special
    from seer_trt.contracts.config import SpecialTokens

    model = load_model(checkpoint)
    special = SpecialTokens.from_tokenizer(checkpoint / "tokenizer.json")
    assert build("denoise", model, special, model.config.seer).suppressed == ()
    fixture = load_model(registry.FIXTURE_DIR)
    assert build("denoise", fixture, special, fixture.config.seer).suppressed == special.suppressed_ids
    logits = torch.zeros(1, 2, 103)
    logits[..., special.endoftext_id] = 5.0  # the most likely id, at a masked and an unmasked position
    gen_ids = torch.tensor([[special.mask_id, 7]])
    lavida, llada_v = greedy(logits, gen_ids, special, ()), greedy(logits, gen_ids, special)
    assert lavida[0].tolist() == [[special.endoftext_id] * 2]
    assert llada_v[0].tolist()[0][0] != special.endoftext_id and llada_v[0].tolist()[0][1] == special.endoftext_id
    torch.testing.assert_close(lavida[2], llada_v[2])  # p_end reads the unsuppressed softmax either way
    assert torch.equal(suppress_special(logits, gen_ids == special.mask_id, special, ()), logits)


@pytest.mark.slow
def test_seer_calibrate_runs_on_the_adapter(checkpoint, tmp_path):
    calibrates("lavida-llada", checkpoint, tmp_path / "cal")


@pytest.mark.slow
def test_triton_repository_serves_the_front_end_graph(export, tmp_path):
    serves_in_triton_repositories(*export, "vision", tmp_path)


def test_a_config_in_lavidas_own_keys_gets_the_familys_defaults():
    """jacklishufan/lavida-llada-v1.0-instruct's config.json: LLaDA's native keys beside the LLaVA ones its training
    wrote, no product key: the family fills in the pool, LaViDa's loop and LLaDA-V's (and LaViDa's) system prompt."""
    from seer_export.models.config import DiffusionMLLMConfig
    from seer_export.models.families import LAVIDA_PINPOINTS, LLADA_V_SYSTEM
    from seer_export.models.names import NATIVE_REQUIRED

    data = {"model_type": "llava_llada", "d_model": 4096, "n_heads": 32, "n_kv_heads": 32, "n_layers": 32,
            "mlp_hidden_size": 12288, "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "vocab_size": 126464,
            "embedding_size": 126464, "mm_hidden_size": 1152, "mm_projector_type": "mlp2x_gelu",
            "mm_vision_tower": "google/siglip-so400m-patch14-384", "mm_patch_merge_type": "spatial_unpad",
            "image_aspect_ratio": "anyres", "image_grid_pinpoints": [list(p) for p in LAVIDA_PINPOINTS],
            **NATIVE_REQUIRED}  # fmt: skip
    cfg = DiffusionMLLMConfig.from_dict(data)
    assert (cfg.family, cfg.naming, cfg.feature_side, cfg.features_per_tile) == (
        "lavida-llada",
        "llada-native",
        14,
        196,
    )
    assert cfg.grid_pinpoints == list(LAVIDA_PINPOINTS) and cfg.system_prompt == LLADA_V_SYSTEM
    g = cfg.generation
    assert (g.gen_length, g.steps, g.block_length) == (256, 256, 128) and cfg.has_tower
