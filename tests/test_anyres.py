"""LLaVA-OneVision "anyres_max_N" tiling and "spatial_unpad" merging, as LLaDA-V uses them.

Expected values are worked out by hand from the upstream semantics (``mm_utils.select_best_resolution``,
``resize_and_pad_image``, ``divide_to_patches``, ``llava_arch.unpad_image`` and the anyres_max branch of
``prepare_inputs_labels_for_multimodal``), or re-derived here in a different form than the code under test.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from seer_trt.contracts.config import SeerConfig
from seer_trt.contracts.errors import ConfigError, InputError, SeerError
from seer_trt.contracts.geometry import (
    LLADA_V_PINPOINTS,
    AnyresImage,
    anyres_layout,
    parse_pinpoints,
    select_best_resolution,
)
from seer_trt.runtime.image import anyres_tiles, pixel_tiles, resize_and_pad

# ---------------------------------------------------------------------------------------------- pinpoints


def test_range_pinpoints_expand_like_upstream():
    grid = parse_pinpoints(LLADA_V_PINPOINTS, 384)
    assert len(grid) == 36
    assert grid[:3] == [(384, 384), (384, 768), (384, 1152)]  # widths vary slowest, as upstream's comprehension
    assert grid[-1] == (2304, 2304)
    # only the first and last pair matter
    assert parse_pinpoints("(1x1),(9x9),(2x3)", 10) == [(10, 10), (10, 20), (10, 30), (20, 10), (20, 20), (20, 30)]


def test_explicit_pinpoints_list_and_literal():
    pairs = [(384, 768), (768, 384)]
    assert parse_pinpoints([[384, 768], [768, 384]], 384) == pairs  # config.json after training
    assert parse_pinpoints("[(384, 768), (768, 384)]", 384) == pairs


@pytest.mark.parametrize(
    "spec,tile",
    [
        ("(3x3),...,(1x1)", 16),  # empty range
        ("(0x1),...,(2x2)", 16),  # zero tiles
        ("banana", 16),  # neither form
        ([[100, 384]], 384),  # not a multiple of the tile
        ([], 384),
        ([[384]], 384),
        (LLADA_V_PINPOINTS, 0),
    ],
)
def test_bad_pinpoints_raise_config_error(spec, tile):
    with pytest.raises(ConfigError):
        parse_pinpoints(spec, tile)


# ------------------------------------------------------------------------------------- best resolution

LLADA_V_GRID = parse_pinpoints(LLADA_V_PINPOINTS, 384)


@pytest.mark.parametrize(
    "size,best",
    [
        ((100, 100), (384, 384)),  # tiny square: every candidate keeps all pixels, the smallest wastes least
        ((10, 20), (384, 384)),  # tiny tall
        ((1000, 300), (1152, 384)),  # wide: width needs 3 tiles, height 1
        ((300, 1000), (384, 1152)),  # tall
        ((800, 600), (1152, 768)),  # 4:3 -> 3 x 2 tiles; (768, 768) would keep only 768*576 px
        ((1000, 1000), (1152, 1152)),  # square
        ((4000, 3000), (2304, 1920)),  # too big: width-limited at 2304, the shortest height that fits 1728
    ],
)
def test_select_best_resolution_hand_cases(size, best):
    assert select_best_resolution(size, LLADA_V_GRID) == best


def test_select_best_resolution_tie_keeps_first():
    assert select_best_resolution((5, 5), [(20, 10), (10, 20)]) == (20, 10)


def _best_by_sorting(size, candidates):
    """Spec re-derivation: maximise fitted pixels (capped at the original), then minimise waste, then order."""
    w0, h0 = size

    def key(item):
        k, (w, h) = item
        s = min(w / w0, h / h0)
        kept = min(int(w0 * s) * int(h0 * s), w0 * h0)
        return (-kept, w * h - kept, k)

    return min(enumerate(candidates), key=key)[1]


def test_select_best_resolution_matches_spec_on_many_sizes():
    rng = np.random.default_rng(0)
    for w, h in rng.integers(1, 3000, size=(300, 2)):
        assert select_best_resolution((int(w), int(h)), LLADA_V_GRID) == _best_by_sorting((w, h), LLADA_V_GRID)


# ------------------------------------------------------------------------------------------------ tiles


def _image(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def _norm(pixels: np.ndarray) -> np.ndarray:
    """SigLipImageProcessor: rescale by 1/255 in float64, cast to float32, then (x - 0.5) / 0.5."""
    x = (pixels.astype(np.float64) * (1 / 255)).astype(np.float32)
    return ((x - np.float32(0.5)) / np.float32(0.5)).transpose(2, 0, 1)


@pytest.mark.parametrize(
    "hw,grid",
    [
        ((10, 10), (1, 1)),
        ((12, 40), (3, 1)),  # W=40 needs 3 tiles of 16; (48, 16) keeps all 480 px
        ((40, 12), (1, 3)),
        ((50, 30), (2, 4)),  # (32, 64): (32, 48) would keep only 28*48 px
    ],
)
def test_tile_count_and_shape(hw, grid):
    out = anyres_tiles(_image(*hw), 16, LLADA_V_PINPOINTS)
    cols, rows = grid
    assert out.grid == grid
    assert out.original_size == (hw[1], hw[0])
    assert out.tiles.shape == (1 + cols * rows, 3, 16, 16)
    assert out.tiles.dtype == np.float32 and out.tiles.flags.c_contiguous


def test_llada_v_sized_image():
    out = anyres_tiles(_image(600, 800), 384)  # LLaDA-V defaults
    assert out.grid == (3, 2)
    assert out.tiles.shape == (7, 3, 384, 384)
    assert out.feature_layout(27, 4).tokens == 729 + 46 * (62 + 1)


def test_tiles_are_row_major_crops_without_resize():
    img = _image(32, 32)
    out = anyres_tiles(img, 16, [[32, 32]])  # exact fit: no resize, no padding
    assert out.grid == (2, 2)
    crops = [img[:16, :16], img[:16, 16:], img[16:, :16], img[16:, 16:]]  # TL, TR, BL, BR
    for k, crop in enumerate(crops, start=1):
        np.testing.assert_array_equal(out.tiles[k], _norm(crop))


def test_padding_is_black_and_centred():
    img = _image(8, 32)
    out = anyres_tiles(img, 16, [[32, 32]])  # width fills; 8 rows centred in 32: rows 12..19 of the canvas
    padded = np.zeros((32, 32, 3), np.uint8)
    padded[12:20] = img
    np.testing.assert_array_equal(resize_and_pad(img, (32, 32)), padded)
    assert (out.tiles[1][:, :12] == -1).all()  # black normalises to -1
    np.testing.assert_array_equal(out.tiles[1][:, 12:16], _norm(img[:4, :16]))
    np.testing.assert_array_equal(out.tiles[3][:, :4], _norm(img[4:, :16]))


def test_resize_and_pad_rounds_up_the_scaled_side():
    # 3 x 7 into (16, 16): width fills, height ceil(3 * 16/7) = ceil(6.857) = 7, pasted at row (16 - 7) // 2 = 4
    out = resize_and_pad(np.full((3, 7, 3), 200, np.uint8), (16, 16))
    rows = np.flatnonzero(out[:, :, 0].any(axis=1))
    assert rows.tolist() == list(range(4, 11))


def test_base_tile_is_the_whole_image_squashed():
    img = _image(12, 40)
    out = anyres_tiles(img, 16, LLADA_V_PINPOINTS)
    np.testing.assert_array_equal(out.tiles[0], pixel_tiles(img, 16)[0])


def test_normalisation_values():
    img = np.zeros((16, 16, 3), np.uint8)
    img[0, 0] = (0, 255, 51)
    out = anyres_tiles(img, 16, [[16, 16]])
    assert out.tiles[1][:, 0, 0].tolist() == pytest.approx([-1.0, 1.0, -0.6], abs=1e-7)
    levels = np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, axis=2)
    np.testing.assert_array_equal(anyres_tiles(levels, 16, [[16, 16]]).tiles[1], _norm(levels))


@pytest.mark.parametrize(
    "bad",
    [np.zeros((16, 16), np.uint8), np.zeros((16, 16, 4), np.uint8), np.zeros((0, 16, 3), np.uint8)],
)
def test_bad_images_raise_input_error(bad):
    with pytest.raises(InputError):
        anyres_tiles(bad, 16)
    with pytest.raises(SeerError):
        pixel_tiles(bad, 16)


def test_float_image_is_refused():
    with pytest.raises(InputError, match="uint8"):
        anyres_tiles(np.zeros((16, 16, 3), np.float32), 16)


# ------------------------------------------------------------------------------------- feature layout


@pytest.mark.parametrize(
    "grid,side,size,max_tiles,crop,out",
    [
        # 2x1 grid of 3x3 maps (a 3 x 6 map, aspect 2) for a 3:1 image: int(100 * 6/300) = 2 rows of image,
        # padding (3 - 2) // 2 = 0 on each end -> all 3 rows kept
        ((2, 1), 3, (300, 100), None, (0, 3, 0, 6), (3, 6)),
        # same with 4x4 maps: int(100 * 8/300) = 2 rows, padding (4 - 2) // 2 = 1 -> rows 1..2
        ((2, 1), 4, (300, 100), None, (1, 3, 0, 8), (2, 8)),
        # tall: padding in the width
        ((1, 2), 4, (100, 300), None, (0, 8, 1, 3), (8, 2)),
        # same aspect as the grid: nothing removed
        ((2, 1), 3, (200, 100), None, (0, 3, 0, 6), (3, 6)),
        # LLaDA-V 800x600: 54 x 81 map, int(800 * 54/600) = 72 cols, padding 4 -> 54 x 73;
        # t = sqrt(54*73 / (4*729)) = 1.163 > 1.1 -> (54 // t, 73 // t) = (46, 62)
        ((3, 2), 27, (800, 600), 4, (0, 54, 4, 77), (46, 62)),
        # 2x2 square: t = 1 -> no downsampling
        ((2, 2), 27, (700, 700), 4, (0, 54, 0, 54), (54, 54)),
        # 3x3 square: t = sqrt(6561 / 2916) = 1.5 -> 54 x 54; plain "anyres" keeps 81 x 81
        ((3, 3), 27, (1000, 1000), 4, (0, 81, 0, 81), (54, 54)),
        ((3, 3), 27, (1000, 1000), None, (0, 81, 0, 81), (81, 81)),
        # just past the 1.1 margin: 3 x 4 kept, t = sqrt(12/9) = 1.155 -> (2, 3)
        ((2, 1), 3, (400, 300), 1, (0, 3, 1, 5), (2, 3)),
        # a 1 x 18 sliver with one tile allowed: t = sqrt(2) > 1 row; upstream fails here, we keep 1 row
        ((6, 1), 3, (1800, 100), 1, (1, 2, 0, 18), (1, 12)),
    ],
)
def test_anyres_layout_hand_cases(grid, side, size, max_tiles, crop, out):
    layout = anyres_layout(grid, side, size, max_tiles)
    assert layout.crop == crop
    assert layout.size == out
    assert layout.tokens == side**2 + out[0] * (out[1] + 1)


@pytest.mark.parametrize(
    "size,crop,out",
    [
        # 2x1 grid of 10x10 maps, one tile allowed. 120x100: int(120 * 10/100) = 12 cols, padding 4 -> 10 x 12,
        # t = sqrt(120 / 100) = 1.095 <= 1.1: kept as is although larger than one tile
        ((120, 100), (0, 10, 4, 16), (10, 12)),
        # 140x100: 14 cols, padding 3 -> 10 x 14, t = sqrt(1.4) = 1.183 -> (10 // t, 14 // t) = (8, 11)
        ((140, 100), (0, 10, 3, 17), (8, 11)),
    ],
)
def test_downsampling_only_past_the_1_1_margin(size, crop, out):
    layout = anyres_layout((2, 1), 10, size, 1)
    assert (layout.crop, layout.size) == (crop, out)


# ------------------------------------------------------------------------------------- torch merging


def _tiny(image_size: int = 16, patch_size: int = 8, **kw):
    import torch  # the export extra, always installed for the tests

    from seer_export.models import DiffusionMLLM, DiffusionMLLMConfig, TextConfig, VisionConfig

    cfg = DiffusionMLLMConfig(
        text=TextConfig(
            vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=2,
        ),
        vision=VisionConfig(
            hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=image_size,
            patch_size=patch_size,
        ),
        seer=SeerConfig(probe_layer=1),  # two layers only
        system_prompt=None,
        **kw,
    )  # fmt: skip
    torch.manual_seed(0)
    model = DiffusionMLLM(cfg).eval()
    with torch.no_grad():
        model.model.image_newline.copy_(torch.full((32,), -1.0))
    return model


def _fake_image(grid, size, side):
    cols, rows = grid
    return AnyresImage(tiles=np.zeros((1 + cols * rows, 3, side, side), np.float32), grid=grid, original_size=size)


def _coordinate_features(grid, side, dim=32):
    """Tile features whose channels 0/1 are the patch's global row/col in the grid, channel 2 a 1 marker."""
    import torch

    cols, rows = grid
    feats = torch.zeros(1 + cols * rows, side * side, dim)
    feats[0, :, 2] = 7.0  # the base tile
    for r in range(rows):
        for c in range(cols):
            for pr in range(side):
                for pc in range(side):
                    feats[1 + r * cols + c, pr * side + pc, :3] = torch.tensor([r * side + pr, c * side + pc, 1.0])
    return feats


@pytest.mark.parametrize(
    "grid,size",
    [((2, 1), (300, 100)), ((1, 2), (100, 300)), ((2, 2), (100, 100)), ((3, 2), (250, 100)), ((2, 3), (100, 250))],
)
def test_merge_places_patches_spatially_then_unpads(grid, size):
    side = 3
    model = _tiny(image_size=24, patch_size=8, image_aspect_ratio="anyres")  # side 3, no downsampling
    image = _fake_image(grid, size, side)
    out = model.merge_anyres(_coordinate_features(grid, side), image)
    top, bottom, left, right = anyres_layout(grid, side, size).crop
    expect = [[0.0, 0.0, 7.0]] * side**2
    for y in range(top, bottom):
        expect += [[float(y), float(x), 1.0] for x in range(left, right)] + [[-1.0, -1.0, -1.0]]
    assert out[:, :3].tolist() == expect
    h = bottom - top
    assert int((out[:, 2] == -1).sum()) == h  # one newline per kept row, none after the base


def test_merge_3_to_1_image_keeps_expected_rows():
    model = _tiny(image_size=24, patch_size=8, image_aspect_ratio="anyres")
    out = model.merge_anyres(_coordinate_features((2, 1), 3), _fake_image((2, 1), (300, 100), 3))
    assert out.shape[0] == 9 + 3 * (6 + 1)  # 3 rows of 6 patches, each with its newline


def test_merge_downsamples_bilinearly_past_the_max():
    import torch  # the export extra, always installed for the tests

    model = _tiny(image_size=24, patch_size=8, image_aspect_ratio="anyres_max_1")
    grid, side = (2, 2), 3
    feats = torch.randn(5, 9, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model.merge_anyres(feats, _fake_image(grid, (100, 100), side))
    # t = sqrt(36 / 9) = 2: a 6x6 map shrinks to 3x3; bilinear with half-pixel centres at exactly 2x is the
    # mean of each 2x2 block
    full = np.zeros((6, 6, 32), np.float32)
    for t in range(4):
        r, c = divmod(t, 2)
        full[r * 3 : r * 3 + 3, c * 3 : c * 3 + 3] = feats[1 + t].numpy().reshape(3, 3, 32)
    pooled = full.reshape(3, 2, 3, 2, 32).mean(axis=(1, 3))
    grid_part = out[9:].reshape(3, 4, 32)
    np.testing.assert_allclose(grid_part[:, :3].numpy(), pooled, atol=1e-6)
    assert (grid_part[:, 3] == -1).all()
    np.testing.assert_array_equal(out[:9].numpy(), feats[0].numpy())


def test_merge_without_downsampling_keeps_values():
    import torch  # the export extra, always installed for the tests

    model = _tiny(image_size=24, patch_size=8, image_aspect_ratio="anyres_max_4")  # 2x2 of 3x3: t = 1
    feats = torch.randn(5, 9, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model.merge_anyres(feats, _fake_image((2, 2), (100, 100), 3))
    assert out.shape == (9 + 6 * 7, 32)
    first_row = out[9:16].numpy()  # patch row 0 of tile (0, 0), then of tile (0, 1), then the newline
    np.testing.assert_array_equal(first_row[:3], feats[1, :3].numpy())
    np.testing.assert_array_equal(first_row[3:6], feats[2, :3].numpy())
    assert (first_row[6] == -1).all()


def test_merge_errors():
    import torch  # the export extra, always installed for the tests

    model = _tiny(image_size=24, patch_size=8)
    with pytest.raises(InputError, match="2x1 grid"):
        model.merge_anyres(torch.zeros(2, 9, 32), _fake_image((2, 1), (300, 100), 3))
    pad = _tiny(image_size=24, patch_size=8, image_aspect_ratio="pad")
    with pytest.raises(ConfigError, match="pixel_tiles"):
        pad.merge_anyres(torch.zeros(3, 9, 32), _fake_image((2, 1), (300, 100), 3))


# ----------------------------------------------------------------------------------- prompt embedding


def test_single_tile_path_still_works():
    import torch  # the export extra, always installed for the tests

    model = _tiny()
    ids = [1, 2, -200, 3]
    pixels = torch.from_numpy(pixel_tiles(_image(20, 20), 16))
    with torch.no_grad():
        emb = model.embed_prompt(ids, pixels)
        feats = model.image_features(pixels)
    assert emb.shape == (3 + 4 + 1, 32)  # 2 + 1 text tokens, 4 patches, the newline
    torch.testing.assert_close(emb[2:7], feats[0])
    assert (emb[6] == -1).all()


def test_anyres_path_through_embed_prompt():
    import torch  # the export extra, always installed for the tests

    model = _tiny()
    cfg = model.config
    images = [anyres_tiles(_image(12, 40, 1), 16, cfg.image_grid_pinpoints), anyres_tiles(_image(50, 30, 2), 16)]
    ids = [1, -200, 2, -200]
    with torch.no_grad():
        emb = model.embed_prompt(ids, images)
        alone = [model.merge_anyres(model.tile_features(torch.from_numpy(im.tiles)), im) for im in images]
    tokens = [im.feature_layout(2, cfg.anyres_max_tiles).tokens for im in images]
    # 40x12 -> 3x1 grid, a 2 x 6 map: int(12 * 6/40) = 1 image row, padding (2 - 1) // 2 = 0, all kept.
    # 30x50 -> 2x4 grid, an 8 x 4 map: int(50 * 4/30) = 6 rows, padding 1 -> 6 x 4; t = sqrt(24 / 16) = 1.22
    # -> (6 // t, 4 // t) = (4, 3)
    assert tokens == [4 + 2 * (6 + 1), 4 + 4 * (3 + 1)]
    assert emb.shape == (2 + sum(tokens), 32)
    torch.testing.assert_close(emb[1 : 1 + tokens[0]], alone[0])
    torch.testing.assert_close(emb[2 + tokens[0] :], alone[1])
    with pytest.raises(InputError, match="1 image"):
        model.embed_prompt(ids, images[:1])


# ------------------------------------------------------------------------------------------------ config


def test_config_pinpoints_round_trip():
    from seer_export.models import DiffusionMLLMConfig

    base = _tiny().config
    assert base.image_grid_pinpoints == LLADA_V_PINPOINTS and base.anyres_max_tiles == 4
    data = json.loads(json.dumps(base.to_dict()))
    assert data["image_grid_pinpoints"] == LLADA_V_PINPOINTS
    assert DiffusionMLLMConfig.from_dict(data) == base
    data["image_grid_pinpoints"] = [[16, 16], [16, 32]]  # the trained checkpoint's list form
    listed = DiffusionMLLMConfig.from_dict(data)
    assert listed.image_grid_pinpoints == ((16, 16), (16, 32))
    assert listed.grid_pinpoints == [(16, 16), (16, 32)]
    assert DiffusionMLLMConfig.from_dict(json.loads(json.dumps(listed.to_dict()))) == listed
    del data["image_grid_pinpoints"]
    data["image_aspect_ratio"] = "pad"  # the fixture's config.json: no pinpoints, single tiles
    pad = DiffusionMLLMConfig.from_dict(data)
    assert pad.image_grid_pinpoints == LLADA_V_PINPOINTS and pad.anyres_max_tiles is None
    with pytest.raises(ConfigError, match="anyres_max"):
        DiffusionMLLMConfig.from_dict({**data, "image_aspect_ratio": "anyres_max_"})
    with pytest.raises(ConfigError, match="multiple"):
        DiffusionMLLMConfig.from_dict({**data, "image_grid_pinpoints": [[10, 16]]})
