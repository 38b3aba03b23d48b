"""The graph contract and ``manifest.json`` (docs/DESIGN.md "Graphs and their contract"): specs, JSON round trip, version policy, error messages.

Runtime tier: nothing here imports torch; the manifest is built by hand from ``seer_trt`` types.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from seer_trt.contracts.config import (
    CALIBRATION_SHAPES,
    MAX_CALIBRATION_REPEATS,
    MAX_CALIBRATION_SHAPES,
    CostCalibration,
    GenerationConfig,
    SeerConfig,
    SpecialTokens,
    WindowRule,
)
from seer_trt.contracts.errors import ConfigError, ManifestError, SeerError
from seer_trt.contracts.graphs import (
    GRAPH_NAMES,
    GRAPHS,
    SERVING_GRAPHS,
    TOLERANCES,
    WEIGHTS_FILE,
    TensorSpec,
    graph_specs,
    tolerance,
)
from seer_trt.contracts.manifest import (
    MANIFEST_FILE,
    SCHEMA_VERSION,
    EndToEnd,
    GraphEntry,
    Manifest,
    ModelInfo,
    ParityReport,
    ParityRow,
    StoredTensor,
    Versions,
    VisionInfo,
    WeightsInfo,
    read_weights_index,
    write_weights_index,
)
from seer_trt.contracts.profiles import LengthBuckets

DIMS = {"hidden": 128, "vocab": 103, "layers": 8, "kv_heads": 4, "head_dim": 32, "image_size": 32, "tile_tokens": 16}


def make_manifest(precision: str = "float16") -> Manifest:
    specs = graph_specs(DIMS, precision, GRAPH_NAMES, probe=True)
    graphs = {name: GraphEntry(spec, f"{name}.onnx", precision, 20, WEIGHTS_FILE, 1234) for name, spec in specs.items()}
    row = ParityRow("denoise", "x0", "packed 2 rows", "index", 0.0, 0.0, 1.0, 0.0, 0.0, 0.98, True)
    e2e = EndToEnd(16, 7, 64, 64, "paper: mlp_sparsity", 1.0, 0.98, 1.0, 1.0, 0.99, True)
    return Manifest(
        schema_version=SCHEMA_VERSION,
        model=ModelInfo("tiny-llada-v", "llava_llada", 128, 384, 8, 4, 103),
        vision=VisionInfo(32, 8, 16, "pad", "spatial_unpad", ((32, 32), (64, 32)), None, "unpad"),
        special_tokens=SpecialTokens(101, 98, 97, 100, 99, 102),
        tokenizer="tokenizer",
        system_prompt=None,
        seer=SeerConfig(
            signal="probe", probe_layer=2, probe_weights=(0.5, -1.25) * 64, probe_bias=-3.0, label="calibrated"
        ),
        generation=GenerationConfig(gen_length=64, steps=64, block_length=64),
        precision=precision,
        graphs=graphs,
        buckets=LengthBuckets(),
        versions=Versions("0.1.0", "2.13.0", "1.23.2", "0.7.2", "1.32.0", 20),
        parity=ParityReport("passed", "PyTorch float32", (row,), e2e, ""),
        weights=WeightsInfo(WEIGHTS_FILE, "weights.json", 7_340_032, 117),
        engines={"onnxruntime-cpu": {"denoise": "denoise.onnx"}},
    )


# --- graph specs -------------------------------------------------------------------------------------------------


def test_every_graph_has_the_contracted_io():
    assert GRAPH_NAMES == ("embed", "vision", "image_tokens", "step_zero", "denoise", "denoise_logits")
    assert SERVING_GRAPHS == ("embed", "vision", "step_zero", "denoise")  # denoise_logits only with --sampling
    assert [t.name for t in GRAPHS["image_tokens"].outputs] == ["image_ids"]  # MMaDA's front end: ids, not features
    window = ["prefix_embeds", "gen_ids", "segment_ids", "position_ids"]
    for name in ("step_zero", "denoise", "denoise_logits"):
        assert [t.name for t in GRAPHS[name].inputs] == window
    assert [t.name for t in GRAPHS["step_zero"].outputs] == ["sparsity", "probe_score"]
    # one window graph; Dream's scores only where the family's loop ranks by one (graph_specs(scores=True))
    assert [t.name for t in GRAPHS["denoise"].outputs] == ["x0", "log_confidence", "p_end", "log_margin", "neg_entropy"]
    assert [t.name for t in GRAPHS["denoise_logits"].outputs] == ["logits"]


def test_step_zero_returns_a_probe_score_only_for_a_probe_calibration():
    assert [t.name for t in graph_specs(DIMS, "float32")["step_zero"].outputs] == ["sparsity"]
    assert [t.name for t in graph_specs(DIMS, "float32", probe=True)["step_zero"].outputs] == [
        "sparsity",
        "probe_score",
    ]


def test_graph_specs_resolve_precision_and_model_axes():
    specs = graph_specs(DIMS, "float16", GRAPH_NAMES)
    denoise = specs["denoise"]
    assert denoise.input("prefix_embeds") == TensorSpec("prefix_embeds", "float16", ("batch", "prompt", 128))
    assert denoise.input("segment_ids").dtype == "int32" and denoise.input("position_ids").dtype == "int64"
    assert denoise.output("x0").dtype == "int64" and denoise.output("x0").kind == "index"
    assert denoise.output("log_confidence").dtype == "float32"  # statistics stay fp32 in fp16 graphs
    assert specs["step_zero"].output("sparsity").dtype == "float32"
    assert denoise.output("p_end").dtype == "float32" and denoise.output("p_end").shape == ("batch", "answer")
    assert specs["denoise_logits"].output("logits").shape == ("batch", "answer", 103)
    assert specs["vision"].input("pixel_values").shape == ("tiles", 3, 32, 32)
    assert denoise.input("segment_ids").dynamic_axes == {0: "batch", 1: "seq"}
    assert specs["vision"].output("image_features").dynamic_axes == {0: "tiles"}


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: graph_specs({"hidden": 1}, "float32"), "lack"),
        (lambda: graph_specs(DIMS, "bfloat16"), "precision"),
        (lambda: graph_specs(DIMS, "float32", ("decode",)), "unknown graph"),
        (lambda: TensorSpec("x", "float64", ("batch",)), "dtype"),
        (lambda: TensorSpec("x", "float32", ("rows",)), "axis"),
        (lambda: LengthBuckets(answer=(32, 16)), "increasing"),
        (lambda: tolerance("float64", "value"), "no tolerance"),
    ],
)
def test_bad_specs_raise_config_errors(call, match):
    with pytest.raises(ConfigError, match=match):
        call()


def test_tolerance_table_is_looser_for_fp16():
    for kind in ("value", "fraction", "index"):
        assert TOLERANCES[("float16", kind)].atol > TOLERANCES[("float32", kind)].atol
        assert TOLERANCES[("float16", kind)].rtol >= TOLERANCES[("float32", kind)].rtol


def test_buckets_cover_the_window_and_one_image():
    b = LengthBuckets.for_model(gen_length=128, longest_image=3780)
    assert b.answer == (16, 32, 64, 128, 256)
    assert b.prompt[0] == 64 and b.prompt[-1] >= 3780 + 256
    assert LengthBuckets.from_dict(b.to_dict()) == b


# --- manifest ----------------------------------------------------------------------------------------------------


def test_round_trip_through_json(tmp_path: Path):
    manifest = make_manifest()
    path = manifest.write(tmp_path)
    assert path.name == MANIFEST_FILE
    data = json.loads(path.read_text())
    assert data["schema_version"] == SCHEMA_VERSION == "2.6"
    assert data["graphs"]["denoise"]["inputs"][2] == {
        "name": "segment_ids", "dtype": "int32", "shape": ["batch", "seq"], "kind": "value"
    }  # fmt: skip
    back = Manifest.read(tmp_path)
    assert back == manifest
    assert back.graph("denoise").external_data == back.graph("step_zero").external_data == WEIGHTS_FILE
    assert back.special_tokens.suppressed_ids == (98, 97, 99, 102)
    assert back.seer.probe_weights == (0.5, -1.25) * 64 and data["seer"]["probe_weights"][:2] == [0.5, -1.25]
    assert back.weights == manifest.weights


def _written(tmp_path: Path, **changes) -> Path:
    data = make_manifest().to_dict()
    data.update(changes)
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(data))
    return tmp_path


@pytest.mark.parametrize("version", ["1.1", "3.0"])  # 1.x: three full-depth graphs, each with its own weights
def test_unknown_major_version_is_refused_with_the_fix(tmp_path: Path, version):
    with pytest.raises(ManifestError) as err:
        Manifest.read(_written(tmp_path, schema_version=version))
    message = str(err.value)
    assert version in message and SCHEMA_VERSION in message and "re-export" in message and "\n" not in message


def test_newer_minor_version_is_accepted_and_its_new_keys_ignored(tmp_path: Path):
    data = make_manifest().to_dict()
    major, minor = SCHEMA_VERSION.split(".")
    newer = f"{major}.{int(minor) + 1}"
    data["schema_version"] = newer
    data["kv_cache"] = {"layers": 8}  # a key a later 2.x writer may add
    data["model"]["rope_scaling"] = None
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(data))
    back = Manifest.read(tmp_path)
    assert back.schema_version == newer and back.model == make_manifest().model


def test_the_window_rule_and_the_calibration_shapes_are_written_and_read(tmp_path: Path):
    """Schema 2.6 writes how a request's gen_length shapes the window and what the cost model times (issue 36: both
    runtimes read them from the manifest); a rule set apart from what loop_blocks implies is what is read back."""
    manifest = Manifest(**{**make_manifest().__dict__, "lengths": WindowRule("cap", size=8),
                           "cost_calibration": CostCalibration(((2, 16, 8), (1, 64, 16)), repeats=2)})  # fmt: skip
    data = json.loads(manifest.write(tmp_path).read_text())
    assert data["lengths"] == {"blocks": "cap", "size": 8}
    assert data["cost_calibration"] == {"shapes": [[2, 16, 8], [1, 64, 16]], "repeats": 2}
    back = Manifest.read(tmp_path)
    assert back.lengths == WindowRule("cap", size=8) and back.cost_calibration.shapes == ((2, 16, 8), (1, 64, 16))
    assert back.lengths.shape(12, back.generation)[0] == 8  # min(8, 12), where the defaults' whole block gave 12


@pytest.mark.parametrize(
    "gen, loop_blocks, rule, shapes",
    [
        (GenerationConfig(gen_length=64, steps=64, block_length=64), None, WindowRule("whole"), {16: (16, 16), 128: (128, 128)}),
        (GenerationConfig(gen_length=256, steps=256, block_length=128), None, WindowRule("cap", size=128),
         {64: (64, 64), 512: (128, 512)}),
        (GenerationConfig(gen_length=256, steps=128, block_length=64), 4, WindowRule("split", count=4),
         {16: (4, 8), 512: (128, 256)}),
    ],
)  # fmt: skip
def test_a_manifest_before_2_6_reads_the_rule_its_defaults_imply(tmp_path: Path, gen, loop_blocks, rule, shapes):
    """No ``lengths`` or ``cost_calibration`` (schema 2.5): LLaDA-V's one block, LaViDa's blocks of at most the
    default's, MMaDA's loop_blocks; the calibration is CALIBRATION_SHAPES, 5 repeats."""
    data = make_manifest().to_dict()
    data["schema_version"] = "2.5"
    data["generation"], data["model"]["loop_blocks"] = gen.to_dict(), loop_blocks
    del data["lengths"], data["cost_calibration"]
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(data))
    back = Manifest.read(tmp_path)
    assert back.lengths == rule and back.cost_calibration == CostCalibration(CALIBRATION_SHAPES, 5)
    assert {n: rule.shape(n, gen) for n in shapes} == shapes
    if rule.blocks == "split":
        with pytest.raises(ValueError, match="splits the window into 4 blocks; ask for a multiple of 4"):
            rule.shape(18, gen)


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("lengths", {"blocks": "halves"}, "not one of"),
        ("lengths", {"blocks": "cap"}, "needs size"),
        ("lengths", {"blocks": "whole", "count": 2}, "takes no count"),
        ("lengths", {"blocks": "split", "count": 0}, "count must be a whole number"),
        ("cost_calibration", {"shapes": [], "repeats": 5}, "one or more"),
        ("cost_calibration", {"shapes": [[1, 0, 4]], "repeats": 5}, "one or more"),
        ("cost_calibration", {"shapes": [[1, "a", 4]], "repeats": 5}, "rows, prompt, answer"),
        ("cost_calibration", {"shapes": [[1, 16, 4]], "repeats": 0}, "repeats"),
        ("cost_calibration", {"shapes": [[1, 16.5, 4]], "repeats": 5}, "one or more"),  # as C++ refuses them
        ("cost_calibration", {"shapes": [[1, "16", 4]], "repeats": 5}, "one or more"),
        ("cost_calibration", {"shapes": [[True, 16, 4]], "repeats": 5}, "one or more"),
        ("lengths", {}, "lacks \\['blocks'\\]"),
    ],
)
def test_a_bad_window_rule_or_calibration_is_a_manifest_error(tmp_path: Path, key, value, match):
    with pytest.raises(ManifestError, match=match):
        Manifest.read(_written(tmp_path, **{key: value}))


def test_a_null_calibration_is_the_default_and_a_bad_loop_blocks_names_the_manifest(tmp_path: Path):
    """What the C++ runtime reads alike (cpp/src/manifest.cpp): ``cost_calibration: null`` is the default shapes, and a
    manifest's ``model.loop_blocks`` must be a whole number >= 1 or null."""
    assert Manifest.read(_written(tmp_path, cost_calibration=None)).cost_calibration == CostCalibration()
    data = make_manifest().to_dict()
    for bad in (0, -2, 1.5, True):
        data["model"]["loop_blocks"] = bad
        (tmp_path / MANIFEST_FILE).write_text(json.dumps(data))
        with pytest.raises(ManifestError, match="model.loop_blocks is"):
            Manifest.read(tmp_path)


def test_unknown_key_in_our_own_version_is_an_error(tmp_path: Path):
    with pytest.raises(ManifestError, match="unknown key"):
        Manifest.read(_written(tmp_path, kv_cache={}))


@pytest.mark.parametrize(
    "setup, match",
    [
        (lambda d: d, "not an export folder"),  # empty folder
        (lambda d: (d / MANIFEST_FILE).write_text("{not json"), "not readable JSON"),
        (lambda d: (d / MANIFEST_FILE).write_text("[1, 2]"), "expected a JSON object"),
        (lambda d: _written(d, schema_version="one"), "MAJOR.MINOR"),
        (lambda d: _written(d, model={"name": "x"}), "lacks"),
        (lambda d: _written(d, generation={**GenerationConfig().to_dict(), "steps": 0}), "steps"),
    ],
)
def test_missing_or_corrupt_manifest_is_one_clear_error(tmp_path: Path, setup, match):
    setup(tmp_path)
    with pytest.raises(ManifestError, match=match) as err:
        Manifest.read(tmp_path)
    assert isinstance(err.value, SeerError) and "\n" not in str(err.value)


def test_missing_graph_names_the_fix():
    manifest = make_manifest()
    small = Manifest(**{**manifest.__dict__, "graphs": {"denoise": manifest.graphs["denoise"]}})
    with pytest.raises(ManifestError, match="seer-export --graphs"):
        small.graph("step_zero")
    with pytest.raises(ManifestError, match="seer-export --sampling"):
        small.graph("denoise_logits")


def test_weights_index_round_trips_one_line_per_tensor(tmp_path: Path):
    index = {"model.embed_tokens.weight": StoredTensor(0, 42496, "float32", (83, 128)),
             "model.layers.0.mlp.up_proj.weight.T": StoredTensor(45056, 196608, "float16", (128, 384))}  # fmt: skip
    info = WeightsInfo(WEIGHTS_FILE, "weights.json", 241664, 2)
    write_weights_index(tmp_path / info.index, index)
    assert len((tmp_path / info.index).read_text().splitlines()) == 4
    assert read_weights_index(tmp_path, info) == index
    (tmp_path / info.index).write_text('{"x": [1]}')
    with pytest.raises(ManifestError, match="not a weights index"):
        read_weights_index(tmp_path, info)


# --- engine builds ----------------------------------------------------------------------------------


def _with_build() -> Manifest:
    from seer_trt.contracts.manifest import EngineBuild, EngineFile
    from seer_trt.contracts.profiles import Profile, Range

    profiles = tuple(
        Profile((("batch", Range(1, 4, 16)), ("prompt", Range(1, 128, 512)), ("answer", Range(lo, hi, hi))))
        for lo, hi in ((1, 16), (17, 64))
    )
    engine = EngineFile("tensorrt/denoise.plan", "ab" * 32, profiles, 4096, 1.5)
    build = EngineBuild("tensorrt", "11.1.0", "NVIDIA H200", "9.0", "tensorrt/timing.cache", "2026-11-30T10:00:00+00:00",
                        {"denoise": engine})  # fmt: skip
    return Manifest(**{**make_manifest().__dict__, "builds": {"tensorrt": build}})


def test_build_record_round_trips_with_its_profiles(tmp_path: Path):
    manifest = _with_build()
    manifest.write(tmp_path)
    data = json.loads((tmp_path / MANIFEST_FILE).read_text())
    assert data["builds"]["tensorrt"]["engines"]["denoise"]["profiles"][1] == {
        "batch": [1, 4, 16], "prompt": [1, 128, 512], "answer": [17, 64, 64]
    }  # fmt: skip
    back = Manifest.read(tmp_path)
    assert back == manifest
    assert back.builds["tensorrt"].engines["denoise"].profiles[1].range("seq").max == 576


def test_a_manifest_without_builds_reads_with_none(tmp_path: Path):
    data = make_manifest().to_dict()
    del data["builds"]
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(data))
    back = Manifest.read(tmp_path)
    assert back.builds == {} and back.engines == make_manifest().engines


def test_a_malformed_build_record_names_where(tmp_path: Path):
    data = _with_build().to_dict()
    del data["builds"]["tensorrt"]["version"]
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=r"builds.tensorrt lacks \['version'\]"):
        Manifest.read(tmp_path)


def test_the_c_runtimes_legacy_calibration_shapes_are_pythons():
    """A manifest before 2.6 names no calibration shapes: the C++ runtime's stand-in (cpp/src/manifest.cpp) must be
    CALIBRATION_SHAPES, which every 2.6 export writes."""
    source = (Path(__file__).parents[1] / "cpp" / "src" / "manifest.cpp").read_text()
    table = source[source.index("LEGACY_CALIBRATION_SHAPES[] = {") :].split(";", 1)[0]
    shapes = tuple(tuple(int(v) for v in m.split(",")) for m in re.findall(r"\{(\d+, \d+, \d+)\}", table))
    assert shapes == CALIBRATION_SHAPES


# What a manifest says of its ids, layers and calibration, bounded by its own model (issue 42): (a "key.key" path into
# the manifest, the value written there, what both runtimes say). tests/test_cpp.py runs the same cases through C++.
BOUNDS = {
    "negative mask id": ("special_tokens.mask_id", -1, "special_tokens {'mask_id': -1}: expected token ids, whole "
                         "numbers >= 0"),
    "eot id past the vocabulary": ("special_tokens.eot_id", 10**6, "special_tokens {'eot_id': 1000000} lie outside "
                                   "the vocabulary [0, "),
    "image marker past the vocabulary": ("vision.prefix_ids", [5, 10**6], "vision image marker ids [1000000] "
                                         "(prefix_ids, suffix_ids) lie outside the vocabulary [0, "),
    "probe layer past the model": ("seer.probe_layer", 99, "seer.probe_layer 99 is not a layer of the model: "
                                   "expected 0 <= probe_layer < 8 (model.num_layers)"),
    "negative probe layer": ("seer.probe_layer", -1, "seer.probe_layer must be a whole number >= 0, got -1"),
    "no hidden units": ("model.hidden_size", 0, "model {'hidden_size': 0}: expected whole numbers >= 1"),
    "a billion repeats": ("cost_calibration.repeats", 10**9, "calibration repeats must be a whole number in [1, 20] "
                          "(the timed steps per shape), got 1000000000"),
    "too many shapes": ("cost_calibration.shapes", [[1, 16, 4]] * 33, "calibration shapes: 33 are given; expected "
                        "at most 32 [rows, prompt, answer] of at most [4096, 1048576, 65536]"),
    "a shape past every bucket": ("cost_calibration.shapes", [[1, 2**21, 4]], "calibration shapes: [1, 2097152, 4] "
                                  "is past the buckets' ceilings"),
}  # fmt: skip


def edited(data: dict, path: str, value) -> dict:
    """``data`` (a manifest's JSON) with ``value`` at the dotted ``path``."""
    *parents, key = path.split(".")
    node = data
    for part in parents:
        node = node[part]
    node[key] = value
    return data


@pytest.mark.parametrize("case", list(BOUNDS))
def test_what_a_manifest_says_is_bounded_by_its_own_model(tmp_path: Path, case):
    """Special ids and image marker ids are rows of the vocabulary, the probe layer a layer of the model, the model's
    dims whole numbers >= 1, and the cost model's calibration at most 32 shapes inside the buckets' ceilings, timed at
    most 20 times each: refused when the manifest is read, before anything is allocated or timed, naming the file."""
    path, value, message = BOUNDS[case]
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(edited(make_manifest().to_dict(), path, value)))
    with pytest.raises(ManifestError) as err:
        Manifest.read(tmp_path)
    assert message in str(err.value) and str(err.value).startswith(str(tmp_path / MANIFEST_FILE))
    assert "re-" in str(err.value)  # the fix: re-export or re-calibrate


def test_a_manifest_built_in_code_is_bounded_alike():
    """The same bounds hold for a manifest seer-export or seer-calibrate builds before writing it."""
    base = make_manifest()
    with pytest.raises(SeerError, match="lie outside the vocabulary"):
        Manifest(**{**base.__dict__, "special_tokens": SpecialTokens(101, 98, 97, 103, 99, 102)})
    with pytest.raises(SeerError, match="is not a layer of the model"):
        Manifest(**{**base.__dict__, "seer": base.seer.replace(probe_layer=8)})
    assert Manifest(**{**base.__dict__, "seer": base.seer.replace(probe_layer=7)}).seer.probe_layer == 7


def test_the_calibration_ceilings_are_the_c_runtimes():
    """cpp/src/manifest.hpp's CostCalibration::MAX_SHAPES and MAX_REPEATS are Python's ceilings, and the legacy
    shapes fit them."""
    header = (Path(__file__).parents[1] / "cpp" / "src" / "manifest.hpp").read_text()
    assert re.search(rf"MAX_SHAPES = {MAX_CALIBRATION_SHAPES};", header)
    assert re.search(rf"MAX_REPEATS = {MAX_CALIBRATION_REPEATS};", header)
    assert CostCalibration(CALIBRATION_SHAPES, MAX_CALIBRATION_REPEATS).repeats == MAX_CALIBRATION_REPEATS
