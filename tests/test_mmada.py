"""MMaDA (docs/DESIGN.md "Model families"): a random checkpoint under MMaDA's official names and config keys, with a
MAGVIT-v2 image tokenizer under showlab/magvitv2's, loads strictly and only as ``--model mmada``; the lookup-free
codes; MMaDA's centre crop; the export holds an ``image_tokens`` graph (no vision tower) and passes parity; the
runtime places <|mmu|><|soi|> ids <|eoi|> before the question and its tokens equal the PyTorch reference on 40 prompts
with images of many shapes, under MMaDA's own loop, early stop and Seer."""

from __future__ import annotations

import json
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
from tiny_models import tiny_magvit, tiny_mmada_config

from seer_export.models import registry
from seer_export.models.families import FAMILIES
from seer_export.models.loading import INDEX_FILE, load_model
from seer_export.models.magvit import IMAGE_TOKENIZER_DIR
from seer_export.models.random_checkpoint import write_random_checkpoint
from seer_trt.contracts.errors import CheckpointError, ConfigError, InputError
from seer_trt.runtime.image import center_crop_tile

SIZES = [(12, 40), (50, 30), (20, 20), (33, 90), (90, 33), (64, 64), (7, 70), (100, 45), (16, 16), (40, 120)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("mmada") / "ckpt"
    return write_random_checkpoint(folder, tiny_mmada_config(), dtype=torch.float32, seed=5, gain=4.0,
                                   shard_bytes=40_000, image_tokenizer=tiny_magvit())  # fmt: skip


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_checkpoint_is_stored_under_mmadas_names_and_loads_only_as_mmada(checkpoint, tmp_path):
    names = set(json.loads((checkpoint / INDEX_FILE).read_text())["weight_map"])
    assert names and all(n.startswith("model.transformer.") for n in names)  # no vision tower, no projector
    from safetensors.torch import load_file

    stored = load_file(checkpoint / IMAGE_TOKENIZER_DIR / "pytorch_model.safetensors")  # MMaDA's ModelMixin's name
    vq = set(stored)
    assert {"encoder.conv_in.weight", "encoder.down.0.downsample.conv.weight", "encoder.mid.attn_1.q.weight",
            "encoder.down.1.block.0.nin_shortcut.weight", "encoder.quant_conv.weight", "decoder.conv_in.weight",
            "quantize.embedding"} <= vq  # fmt: skip
    assert stored["quantize.power_vals"].tolist() == [8, 4, 2, 1]  # the buffers as LFQuantizer derives them
    assert stored["quantize.embedding"][5].tolist() == [-1, 1, -1, 1]  # 0101
    model, _ = registry.load("mmada", checkpoint)
    cfg = model.config
    assert (cfg.family, cfg.naming, cfg.image_token_offset, cfg.features_per_tile) == ("mmada", "llada-native", 83, 64)
    assert not hasattr(model.model, "vision_tower") and hasattr(model.model, "image_tokenizer")
    assert not any(n.startswith("model.image_tokenizer.decoder") for n in model.state_dict())  # decoder unread

    # a real MMaDA config.json has no "family": native keys beside an image codebook say it
    bare = _copy(checkpoint, tmp_path / "bare")
    data = json.loads((bare / "config.json").read_text())
    del data["family"]
    (bare / "config.json").write_text(json.dumps({**data, "model_type": "mmada"}))
    assert load_model(bare).config == cfg
    with pytest.raises(ConfigError, match="holds a mmada checkpoint.*--model mmada"):
        registry.load("lavida-llada", checkpoint)

    lone = _copy(checkpoint, tmp_path / "lone")
    (lone / IMAGE_TOKENIZER_DIR / "config.json").unlink()
    with pytest.raises(CheckpointError, match="image tokenizer.*image_tokenizer/config.json"):
        load_model(lone)
    wrong = _copy(checkpoint, tmp_path / "wrong")
    vq_cfg = json.loads((wrong / IMAGE_TOKENIZER_DIR / "config.json").read_text())
    (wrong / IMAGE_TOKENIZER_DIR / "config.json").write_text(json.dumps({**vq_cfg, "z_channels": 5}))
    with pytest.raises(ConfigError, match="64 codes of 32 .* expects 64 of 16"):
        load_model(wrong)


def test_a_missing_encoder_tensor_is_named(checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    broken = _copy(checkpoint, tmp_path / "broken")
    file = broken / IMAGE_TOKENIZER_DIR / "pytorch_model.safetensors"
    gone = "encoder.mid.block_2.conv1.weight"
    save_file({k: v for k, v in load_file(file).items() if k != gone}, str(file))
    with pytest.raises(CheckpointError, match=r"missing \[model\.image_tokenizer\.encoder\.mid\.block_2\.conv1"):
        load_model(broken)


def test_codes_are_the_sign_bits_of_the_encoder_output_and_ids_follow_the_text(checkpoint):
    model = load_model(checkpoint)
    pixels = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        z = model.model.image_tokenizer.encoder(pixels)  # [3, 4, 8, 8]
        ids = model.image_ids(pixels)
    assert z.shape == (3, 4, 8, 8) and ids.shape == (3, 64)
    bits = (z > 0).long().permute(0, 2, 3, 1).reshape(3, 64, 4)  # row-major positions, channel 0 the top bit
    want = bits[..., 0] * 8 + bits[..., 1] * 4 + bits[..., 2] * 2 + bits[..., 3]
    assert torch.equal(ids, want + 83)
    assert 83 <= int(ids.min()) and int(ids.max()) < 83 + 16 and len(set(ids.flatten().tolist())) > 4


def test_center_crop_keeps_the_middle_of_the_long_side():
    """A 20 x 40 image, red | green | blue in quarters-half-quarter: the short side goes to 16 px, the long one to 32,
    and the centre crop keeps columns 8-23 of it: the green half only."""
    image = np.zeros((20, 40, 3), dtype=np.uint8)
    image[:, :10] = (255, 0, 0)
    image[:, 10:30] = (0, 255, 0)
    image[:, 30:] = (0, 0, 255)
    tile = center_crop_tile(image, 16)
    assert tile.shape == (1, 3, 16, 16)
    green = (tile[0, 1] + 1) / 2  # back to 0..1
    assert green[:, 2:-2].min() > 0.9 and (tile[0, 0, :, 2:-2] < -0.9).all()  # no red left inside
    tall = center_crop_tile(image.transpose(1, 0, 2).copy(), 16)  # 40 x 20: rows are cropped instead
    np.testing.assert_allclose(tall[0].transpose(0, 2, 1), tile[0], atol=1e-6)


# --- the export and the runtime -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def export(checkpoint, tmp_path_factory):
    return export_of("mmada", checkpoint, tmp_path_factory.mktemp("mmada-export") / "engines")


@pytest.mark.slow
def test_export_holds_the_image_tokenizer_graph_and_passes_parity(export):
    out, manifest = export
    assert manifest.parity.status == "passed", manifest.parity.note
    assert "vision" not in manifest.graphs and "image_tokens" in manifest.graphs
    rows = [r for r in manifest.parity.rows if r.graph == "image_tokens"]
    assert rows and all(r.passed for r in rows)
    v = manifest.vision
    assert (manifest.model.family, v.encoder, v.placement, v.newline) == ("mmada", "magvitv2", "before_prompt", "none")
    assert (v.prefix_ids, v.suffix_ids, v.tokens_per_tile, v.image_aspect_ratio) == ((99, 100), (101,), 64,
                                                                                      "center_crop")  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["mmada_loop", "early_stop", "seer"])
def test_runtime_tokens_equal_the_pytorch_reference(export, checkpoint, mode):
    """40 held-out prompts, 13 with an image of ten shapes, centre-cropped."""
    from seer_export.reference.fixture import TaskEncoder
    from seer_trt.runtime.pipeline import SeerPipeline

    out, manifest = export
    model = load_model(checkpoint)
    enc = TaskEncoder(checkpoint, model.config)
    pipe = SeerPipeline.from_manifest(out)
    samples = samples_with_images(SIZES, 8, 2)
    with_image = next(s for s in samples if s.image is not None)
    assert pipe.prompts.ids(with_image.question, True)[:4] == [99, 100, -200, 101]  # <|mmu|><|soi|> image <|eoi|>
    assert pipe.prompts.ids(with_image.question, True) == enc.prompt_ids(with_image)
    gen = pipe.settings(gen_length=16)  # a request's N keeps MMaDA's shape: N / 2 steps in 4 blocks
    assert (gen.steps, gen.block_length) == (8, 4)
    with pytest.raises(InputError, match="splits the window into 4 blocks"):
        pipe.settings(gen_length=18)
    if mode == "mmada_loop":  # inference_mmu.py's, with the fixed rule (seer-trt's default is factor:1)
        gen = pipe.settings(gen_length=16, decoding="fixed")
        assert gen == FAMILIES["mmada"].own_loop(16)
    ref = runtime_equals_reference(pipe, manifest, model, enc, samples, gen, mode)
    pipe.close()
    if mode == "mmada_loop":
        assert set(ref.steps.tolist()) == {8}  # no stop: two tokens a step


@pytest.mark.slow
def test_seer_calibrate_runs_on_the_adapter(checkpoint, tmp_path):
    calibrates("mmada", checkpoint, tmp_path / "cal")


@pytest.mark.slow
def test_triton_repository_serves_the_front_end_graph(export, tmp_path):
    serves_in_triton_repositories(*export, "image_tokens", tmp_path)


def test_a_config_in_mmadas_own_keys_gets_the_familys_defaults():
    """Gen-Verse/MMaDA-8B's config.json: LLaDA's native keys and the codebook's, no product key: the family fills in
    the 512 px / 16x image geometry, the centre crop, the marker ids, no system prompt and its loop."""
    from seer_export.models.config import DiffusionMLLMConfig
    from seer_export.models.names import NATIVE_REQUIRED

    data = {"model_type": "mmada", "d_model": 4096, "n_heads": 32, "n_kv_heads": 32, "n_layers": 32,
            "mlp_hidden_size": 12288, "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "vocab_size": 126464,
            "embedding_size": 126464, "new_vocab_size": 134656, "llm_vocab_size": 126464, "codebook_size": 8192,
            "num_vq_tokens": 1024, **NATIVE_REQUIRED}  # fmt: skip
    cfg = DiffusionMLLMConfig.from_dict(data)
    assert (cfg.family, cfg.naming, cfg.text.vocab_size, cfg.codebook_size) == ("mmada", "llada-native", 134656, 8192)
    assert (cfg.features_per_tile, cfg.image_aspect_ratio, cfg.system_prompt) == (1024, "center_crop", None)
    assert (cfg.image_prefix_ids, cfg.image_suffix_ids) == ((126089, 126084), (126085,))
    g = cfg.generation
    assert (g.gen_length, g.steps, g.block_length) == (512, 256, 128) and not cfg.has_tower


@pytest.mark.slow
def test_an_fp16_export_keeps_the_image_tokenizer_in_fp32(checkpoint, tmp_path):
    """The codes are sign bits of the encoder's output, which fp16 rounding flips near zero: image_tokens stays fp32
    (MMaDA runs its tokenizer in fp32) and its ids equal PyTorch's exactly; the rest is fp16. (No validation: a random
    model's near-ties make fp16 token agreement a coin toss, test_export.py's fp16 check uses the trained fixture.)"""
    from seer_export.onnx.options import ExportOptions
    from seer_export.onnx.run import run_export
    from seer_trt.backends.onnxruntime import OrtBackend
    from seer_trt.runtime.pipeline import SeerPipeline
    from seer_trt.runtime.request import Request

    out = tmp_path / "fp16"
    options = ExportOptions(model="mmada", checkpoint=checkpoint, out=out, dtype="fp16", validate=False)
    manifest = run_export(options, log=lambda line: None)
    assert manifest.graphs["image_tokens"].precision == "float32" and manifest.graphs["denoise"].precision == "float16"
    assert [t.dtype for t in manifest.graph("image_tokens").spec.inputs] == ["float32"]
    pixels = np.random.default_rng(0).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)
    backend = OrtBackend(out, manifest)
    got = backend.run("image_tokens", {"pixel_values": pixels})["image_ids"]
    with torch.no_grad():
        want = load_model(checkpoint).image_ids(torch.from_numpy(pixels)).numpy()
    np.testing.assert_array_equal(got, want)
    pipe = SeerPipeline(out, manifest, backend)
    (result,) = pipe.generate([Request("count the shapes .", np.zeros((20, 30, 3), dtype=np.uint8), gen_length=16)])
    pipe.close()
    assert result.ok, result.error


def test_each_familys_own_loop_comes_from_its_fields_not_its_name():
    """``Family.own_loop`` reads ``own_tokens_per_step``, ``loop_blocks`` and ``own_block_max`` (issue 36): the
    official loops (MMaDA two tokens a step in four blocks, LaViDa blocks of min(128, N), LLaDA-V one block), and a
    family renamed keeps its loop; a gen_length the loop cannot spread evenly is one ConfigError."""
    import dataclasses

    from seer_trt.contracts.errors import ConfigError

    shape = lambda f, n: (f.own_loop(n).steps, f.own_loop(n).block_length)  # noqa: E731
    assert shape(FAMILIES["mmada"], 64) == (32, 16)
    assert shape(FAMILIES["lavida-llada"], 256) == (256, 128) and shape(FAMILIES["lavida-llada"], 64) == (64, 64)
    assert shape(FAMILIES["llada-v"], 256) == (256, 256)
    for name in ("mmada", "lavida-llada", "llada-v"):
        renamed = dataclasses.replace(FAMILIES[name], name="renamed")
        assert renamed.own_loop(128) == FAMILIES[name].own_loop(128)
    with pytest.raises(ConfigError, match="mmada family's own loop .* gen_length 12"):
        FAMILIES["mmada"].own_loop(12)
    with pytest.raises(ConfigError, match="gen_length 200"):
        FAMILIES["lavida-llada"].own_loop(200)
