"""The graph contract and ``manifest.json`` (docs/DESIGN.md "Graphs and their contract"): specs, JSON round trip, version policy, error messages.

Runtime tier: nothing here imports torch; the manifest is built by hand from ``seer_trt`` types.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seer_trt.contracts.config import GenerationConfig, SeerConfig, SpecialTokens
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
    assert data["schema_version"] == SCHEMA_VERSION == "2.5"
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
