"""Build TensorRT plans from an export's ONNX graphs, one engine per graph holding all its profiles (docs/DESIGN.md "Engines and profiles").

In:  ``BuildOptions``: the export folder (``seer-export``), the TensorRT flavour, which graphs, ``--profiles``
     overrides of the manifest's length buckets, a timing cache.
Out: ``DIR/{tensorrt,tensorrt-rtx}/{graph}.plan`` (+ ``timing.cache``), and in ``DIR/manifest.json`` the record of
     the build (``seer_trt.contracts.manifest.EngineBuild``: TensorRT version, GPU, profiles per plan and the buckets they were
     planned from, ONNX sha256). The graph files are first checked against the export's checksums.

    manifest ─► ProfilePlan (seer_trt.contracts.profiles) ─► per graph: parse ONNX ─► inputs checked against the spec
             ─► one optimization profile per planned range ─► build_serialized_network ─► plan
             ─► all plans + updated manifest written in a staging folder ─► swapped into place at the end
                (``seer_trt.contracts.outfolder``: an engine folder holding anything but plans is refused, not replaced)

Precision is the graph's: TensorRT 11 networks are strongly typed (its FP16 / BF16 builder flags are gone), so
an fp16 export builds an fp16 engine and nothing here chooses a precision. Plans run only under the TensorRT
version and on the GPU kind they were built with, which the record names (``seer_trt.backends.tensorrt.check_build``
refuses anything else). TensorRT-RTX builds without a GPU (ahead of time, plans portable across RTX GPUs): CI
exercises this whole path with it. A failed build leaves the previous plans and manifest untouched.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from seer_trt.backends.cuda import cuda_device
from seer_trt.backends.tensorrt import BUILDERS, import_tensorrt
from seer_trt.contracts.errors import ConfigError, SeerError
from seer_trt.contracts.integrity import verify
from seer_trt.contracts.manifest import MANIFEST_FILE, SCHEMA_VERSION, EngineBuild, EngineFile, GraphEntry, Manifest
from seer_trt.contracts.outfolder import check_target, replace_folder
from seer_trt.contracts.profiles import ProfilePlan, parse_overrides, plan_profiles, tiles_per_image

ENGINE_DIRS = {"tensorrt": "tensorrt", "tensorrt-rtx": "tensorrt-rtx"}  # builder -> folder under the export
TIMING_CACHE = "timing.cache"  # default timing cache, inside the engine folder (so it is swapped with the plans)

Log = Callable[[str], None]


class BuildError(SeerError):
    """An engine could not be built (export folder, ONNX parse, TensorRT build, output folder)."""


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """What ``seer-build`` was asked to do; CLI flags map one to one onto these fields."""

    engines: Path  # the export folder: manifest.json and the ONNX graphs; plans go into a folder inside it
    builder: str = "tensorrt"  # "tensorrt" (needs a GPU; plans for that GPU) | "tensorrt-rtx" (no GPU needed)
    graphs: tuple[str, ...] = ()  # graphs to build; () = every graph of the export
    profiles: tuple[str, ...] = ()  # overrides: "AXIS=SIZES" (batch, prompt, answer), "split=AXES"
    timing_cache: Path | None = None  # None: DIR/<engine folder>/timing.cache
    opt_level: int | None = None  # TensorRT builder optimization level 0-5; None: TensorRT's default (3)
    dry_run: bool = False  # print the plan, build nothing
    verbose: bool = False  # TensorRT's warnings, and tracebacks

    def __post_init__(self) -> None:
        if self.builder not in BUILDERS:
            raise ConfigError(f"--builder {self.builder!r} is not one of {sorted(BUILDERS)}")
        if self.opt_level is not None and not 0 <= self.opt_level <= 5:
            raise ConfigError(f"--opt-level {self.opt_level} is outside 0-5; TensorRT's default is 3")
        object.__setattr__(self, "engines", Path(self.engines))
        object.__setattr__(self, "graphs", tuple(dict.fromkeys(self.graphs)))


def onnx_sha256(folder: Path, entry: GraphEntry) -> str:
    """sha256 of a graph's .onnx file followed by its external data file (when it has one)."""
    digest = hashlib.sha256()
    for name in (entry.file, entry.external_data):
        if name is None:
            continue
        with open(folder / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()


def plan_build(manifest: Manifest, options: BuildOptions) -> ProfilePlan:
    """The profiles of every graph ``options`` selects, from the manifest's buckets and the overrides.

    Raises:
        ConfigError: a bad ``--profiles`` item, or a graph the export does not hold.
    """
    graphs = options.graphs or tuple(manifest.graphs)
    for g in graphs:
        manifest.graph(g)  # ManifestError naming the re-export command
    buckets, split = parse_overrides(options.profiles, manifest.buckets)
    v = manifest.vision
    inputs = {g: [(t.name, t.shape) for t in manifest.graph(g).spec.inputs] for g in graphs}
    tiles = tiles_per_image(v.image_aspect_ratio, v.image_size, v.grid_pinpoints)
    return plan_profiles(inputs, buckets, tiles, split, manifest.model.logit_shift)


def _network_flags(trt) -> int:
    # TensorRT 10 builds weakly typed networks unless asked; 11 and TensorRT-RTX are strongly typed always (the
    # flag may remain, harmless). Strong typing keeps the graph's own precision: fp32 RMSNorm and statistics.
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    return 0 if flag is None else 1 << int(flag)


def parse_graph(trt, builder, logger, entry: GraphEntry, onnx: Path):
    """A TensorRT network of one graph, its inputs checked against the manifest's spec.

    Returns (network, parser): the parser owns the weights the network points at, so keep it as long.

    Raises:
        BuildError: TensorRT cannot parse the file, or its inputs are not the manifest's.
    """
    spec = entry.spec
    network = builder.create_network(_network_flags(trt))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx)):
        errors = "; ".join(str(parser.get_error(i)).replace("\n", " ") for i in range(parser.num_errors))
        raise BuildError(f"graph {spec.name!r}: TensorRT cannot parse {onnx}: {errors[:400]}; check the export "
                         f"(re-export with seer-export), or rerun with --verbose")  # fmt: skip
    found = [
        (t.name, np.dtype(trt.nptype(t.dtype)).name) for t in (network.get_input(i) for i in range(network.num_inputs))
    ]
    expected = [(t.name, t.dtype) for t in spec.inputs]
    if found != expected:
        raise BuildError(f"graph {spec.name!r}: {onnx} has inputs {found}, the manifest {expected}; re-export it "
                         f"with seer-export")  # fmt: skip
    return network, parser


def build_plan(trt, builder, logger, entry: GraphEntry, onnx: Path, plan: ProfilePlan, cache, opt_level: int | None):
    """Parse one graph, add its profiles and build the plan.

    Returns the serialized plan (TensorRT's host memory: a buffer, written without a copy).
    """
    spec = entry.spec
    network, parser = parse_graph(trt, builder, logger, entry, onnx)
    config = builder.create_builder_config()
    if opt_level is not None:
        config.builder_optimization_level = opt_level
    if cache is not None:
        config.set_timing_cache(cache, False)
    for profile in plan.profiles(spec.name):
        p = builder.create_optimization_profile()
        for name, (low, opt, high) in profile.shapes([(t.name, t.shape) for t in spec.inputs]).items():
            p.set_shape(name, low, opt, high)
        config.add_optimization_profile(p)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise BuildError(f"graph {spec.name!r}: TensorRT could not build the plan; rerun with --verbose for its log")
    del parser  # the plan holds its own copy of the weights now
    return serialized


def _open_timing_cache(config, path: Path, log: Log):
    """A timing cache holding ``path``'s entries when it is readable, else an empty one."""
    data = b""
    if path.is_file():
        try:
            data = path.read_bytes()
        except OSError as err:
            log(f"timing cache {path} not readable ({err.strerror}); starting an empty one")
    try:
        cache = config.create_timing_cache(data)
    except Exception:  # TensorRT raises its own types for a cache it cannot read
        cache = None
    if cache is None and data:
        log(f"timing cache {path} does not load (another TensorRT, or corrupt); starting an empty one")
        cache = config.create_timing_cache(b"")
    return cache


def _ours(live: Path) -> bool:
    """An engine folder holds only what seer-build writes there: plans and the timing cache."""
    return all(p.is_file() and (p.suffix == ".plan" or p.name == TIMING_CACHE) for p in live.iterdir()
               if not p.name.startswith("."))  # fmt: skip


def _plans(live: Path) -> set[str]:
    """What an engine folder written before ``FILES_RECORD`` holds of ours: its plans and timing cache."""
    return {p.name for p in live.iterdir() if p.is_file() and (p.suffix == ".plan" or p.name == TIMING_CACHE)}


def _build_all(trt, manifest: Manifest, plan: ProfilePlan, options: BuildOptions, staging: Path, live: Path,
               rtx: bool, device, stage: Log) -> dict[str, EngineFile]:  # fmt: skip
    """Every plan, the timing cache and the updated manifest (``.manifest.json.next``), written into ``staging``."""
    folder = options.engines
    logger = trt.Logger(trt.Logger.WARNING if options.verbose else trt.Logger.ERROR)
    builder = trt.Builder(logger)
    cache_path = options.timing_cache or live / TIMING_CACHE
    cache = None
    if rtx:
        stage("timing cache: not used by TensorRT-RTX (it selects kernels on the device at run time)")
    else:
        cache = _open_timing_cache(builder.create_builder_config(), cache_path, stage)
    engines: dict[str, EngineFile] = {}
    for graph, profiles in plan.graphs.items():
        entry = manifest.graph(graph)
        t0 = time.perf_counter()
        sha = onnx_sha256(folder, entry)
        serialized = build_plan(trt, builder, logger, entry, folder / entry.file, plan, cache, options.opt_level)
        name = f"{graph}.plan"
        with open(staging / name, "wb") as f:
            f.write(serialized)
        size = (staging / name).stat().st_size
        del serialized
        seconds = time.perf_counter() - t0
        engines[graph] = EngineFile(f"{live.name}/{name}", sha, profiles, size, round(seconds, 2))
        stage(f"built {live.name}/{name}: {len(profiles)} profile(s), {size / 2**20:.1f} MiB, {seconds:.1f} s")
    total = sum(e.size_bytes for e in engines.values())
    if manifest.weights is not None:  # a plan holds its own copy of every tensor its graph reads
        stage(f"plans hold {total / 2**20:.1f} MiB in all for {manifest.weights.size_bytes / 2**20:.1f} MiB of weights "
              f"({total / manifest.weights.size_bytes:.2f}x): each plan carries its own copy of the tensors its graph "
              f"reads, and its kernels")  # fmt: skip
    cache_file = None
    if cache is not None:
        target = staging / TIMING_CACHE if options.timing_cache is None else options.timing_cache
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")
        partial.write_bytes(bytes(cache.serialize()))
        os.replace(partial, target)
        cache_file = f"{live.name}/{TIMING_CACHE}" if options.timing_cache is None else str(target.absolute())
        stage(f"timing cache saved: {target if options.timing_cache else cache_file}")
    record = EngineBuild(
        builder=options.builder,
        version=trt.__version__,
        device="" if rtx else device.name,
        compute_capability="" if rtx else device.compute_capability,
        timing_cache=cache_file,
        built_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        engines=engines,
        buckets=plan.buckets,  # what the runtime dispatches to: the buckets these profiles were planned from
    )
    manifest = dataclasses.replace(
        manifest,
        schema_version=SCHEMA_VERSION,
        engines={**manifest.engines, options.builder: {g: e.file for g, e in engines.items()}},
        builds={**manifest.builds, options.builder: record},
    )
    manifest.write(staging)
    return engines


def run_build(options: BuildOptions, log: Log = print) -> Manifest | ProfilePlan:
    """Build what ``options`` asks for; returns the updated manifest (``dry_run``: the plan, nothing built).

    Raises:
        SeerError subclasses: no export or a bad manifest, bad overrides, TensorRT missing, no GPU for full
        TensorRT, a parse or build failure, an unwritable folder. The previous plans and manifest stay as they
        were when one is raised.
    """
    start = time.perf_counter()

    def stage(text: str) -> None:
        log(f"[{time.perf_counter() - start:7.1f}s] {text}")

    folder = options.engines
    manifest = Manifest.read(folder)
    major, minor = (int(v) for v in manifest.schema_version.split("."))
    if (major, minor) > tuple(int(v) for v in SCHEMA_VERSION.split(".")):
        raise BuildError(f"{folder / MANIFEST_FILE} has schema {manifest.schema_version}, newer than this seer-trt's "
                         f"{SCHEMA_VERSION}: rewriting it would drop what this version does not know; upgrade seer-trt")  # fmt: skip
    plan = plan_build(manifest, options)
    for graph in plan.graphs:
        entry = manifest.graph(graph)
        missing = [f for f in (entry.file, entry.external_data) if f is not None and not (folder / f).is_file()]
        if missing:
            raise BuildError(f"graph {graph!r}: {[str(folder / f) for f in missing]} missing from the export; re-export "
                             f"with seer-export --out {folder}")  # fmt: skip
        stage(f"{graph}: {entry.file} ({entry.precision}, opset {entry.opset}), {len(plan.profiles(graph))} profile(s)")
    log(plan.describe())
    cpu_only = {g: manifest.graph(g).quantization for g in plan.graphs
                if (manifest.graph(g).quantization or {}).get("runtime") == "onnxruntime-cpu"}  # fmt: skip
    for g, q in cpu_only.items():
        log(f"{g}: quantized {q['scheme']} for ONNX Runtime's CPU provider ({q.get('method', '')}); TensorRT's parser "
            f"does not take its ops, so it is not built")  # fmt: skip
    for g in plan.graphs:
        q = manifest.graph(g).quantization or {}
        if q.get("runtime") == "tensorrt":
            log(f"{g}: {q['scheme']} Q/DQ graph ({q.get('tool', '')}): TensorRT builds its quantized MatMuls "
                f"{'(FP8 needs compute capability 8.9+)' if 'fp8' in q['scheme'] else ''}".rstrip())  # fmt: skip
    if options.dry_run:
        return plan
    if cpu_only:
        raise BuildError(f"graph(s) {sorted(cpu_only)} of {folder} are quantized for ONNX Runtime's CPU provider "
                         f"(seer-quantize); TensorRT cannot build them: build the export they came from, or pass "
                         f"--graphs without them")  # fmt: skip
    live = folder / ENGINE_DIRS[options.builder]
    # before any work: never the user's files; the engine folder belongs inside its export
    target = check_target(live, True, _ours, "the engine folder", "plans", legacy=_plans, nested=True)
    checked = verify(folder, manifest, log=stage)  # a graph swapped since the export would build the wrong engine
    if checked:
        stage(f"{checked} graph file(s) match the export's sha256")
    trt = import_tensorrt(options.builder)
    rtx = options.builder == "tensorrt-rtx"
    device = cuda_device()
    if device is None and not rtx:
        raise BuildError(
            "TensorRT builds plans for the GPU it runs on and this machine has none; build on the GPU machine that "
            "will run them, or pass --builder tensorrt-rtx (builds without a GPU; its plans run on RTX GPUs only)"
        )
    if rtx:
        stage(f"TensorRT-RTX {trt.__version__}: ahead-of-time plans, portable across RTX GPUs (no GPU needed)")
    else:
        stage(f"TensorRT {trt.__version__} on {device}")
    try:
        with replace_folder(target) as staging:
            engines = _build_all(trt, manifest, plan, options, staging, live, rtx, device, stage)
            os.replace(staging / MANIFEST_FILE, staging / f".{MANIFEST_FILE}.next")  # leaves with the plans
        # last: the record names plans now in place
        os.replace(live / f".{MANIFEST_FILE}.next", folder / MANIFEST_FILE)
    except OSError as err:
        raise BuildError(f"writing the engines under {folder} failed ({err}); free space or fix permissions, then "
                         f"rebuild") from None  # fmt: skip
    manifest = Manifest.read(folder)
    stage(f"done: {len(engines)} plan(s) in {live}, recorded in {folder / MANIFEST_FILE}")
    return manifest
