"""Plan, write and check a Triton model repository for an export folder (docs/DESIGN.md "Serving and embedding"; ``seer-triton``).

In:  an export folder (``manifest.json``, ONNX graphs, ``tokenizer/``; TensorRT plans when ``seer-build`` ran),
     a flavour ("gpu" or "cpu") and the orchestrator's name.
Out: REPO/, written to a temporary folder, checked, then moved into place:

    REPO/.seer-triton.json           marks the folder as seer-triton's: --force replaces nothing else

  --orchestration engine (default): one model
    REPO/NAME/config.pbtxt           decoupled Python backend, one instance (templates/model.py, role "decoupled")
    REPO/NAME/1/export/              the whole export (hard links): what SeerPipeline.from_manifest opens

  --orchestration bls:
    REPO/NAME/config.pbtxt           orchestrator: Python backend, dynamic batching, BLS to the components
    REPO/NAME/1/model.py             the Python-backend entry (templates/model.py), role "orchestrator"
    REPO/NAME/1/export/              manifest.json + tokenizer/: what SeerPipeline reads
    REPO/NAME_GRAPH/config.pbtxt     one per graph the pipeline calls (embed, vision, step_zero, denoise, ...)
    REPO/NAME_GRAPH/1/...            cpu: model.py (role "component") + GRAPH.onnx, run by ONNX Runtime;
                                     gpu: GRAPH.plan (tensorrt_plan, its optimization profiles listed), or
                                     GRAPH.onnx (onnxruntime_onnx with the TensorRT accelerator) without plans

Component inputs and outputs are the manifest's ``GraphSpec``s (``seer_trt.contracts.graphs``), the one source of truth;
``check_repository`` reads a written repository back and holds it against the manifest copied into it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import seer_trt
from seer_trt.contracts.confined import MAX_TOKENIZER_BYTES, export_file, inside
from seer_trt.contracts.errors import ConfigError, ManifestError
from seer_trt.contracts.graphs import GraphSpec, image_graph
from seer_trt.contracts.manifest import MANIFEST_FILE, Manifest, read_weights_index
from seer_trt.contracts.outfolder import (
    check_target,
    is_repository,
    replace_folder,
    repository_files,
    write_repository_marker,
)
from seer_trt.contracts.policies import DEFAULT_CACHE, DEFAULT_POLICY, CacheConfig, check_cache
from seer_trt.runtime.step_zero import step_zero_graph
from seer_trt.serving.triton import pbtxt
from seer_trt.serving.triton.orchestrator import REQUEST_INPUTS, RESPONSE_OUTPUTS
from seer_trt.serving.triton.pbtxt import Accelerator, InstanceGroup, ModelSpec, TensorConfig

FLAVOURS = ("gpu", "cpu")
ORCHESTRATIONS = ("engine", "bls")  # engine: one decoupled model running the export in-process; bls: components
VERSION = "1"  # every model has one version folder
EXPORT_DIR = "export"  # inside the orchestrator's version folder
MODEL_PY = Path(__file__).with_name("templates") / "model.py"
ENGINE_BACKEND = "tensorrt"  # the manifest's engines key seer-build writes plans under
BATCH_DELAY_US = 5000  # dynamic batching: how long the orchestrator waits to gather requests into one batch
# The orchestrator's BLS calls pass every tensor through host memory, so a cache would cross to the device at every
# cached step (more bytes than the prompt it saves, at 8B): no cache by default there. The engine orchestration keeps
# the K/V in its backend's memory, as seer-serve does, and takes seer-run's default.
TRITON_CACHE = CacheConfig("none")


@dataclasses.dataclass(frozen=True)
class Engine:
    """A TensorRT plan seer-build recorded for one graph."""

    file: str  # relative to the export folder
    profiles: int  # optimization profiles in the plan (1 when the record does not say)


@dataclasses.dataclass(frozen=True)
class RepositoryPlan:
    name: str  # the orchestrator's model name; components are NAME_GRAPH
    flavour: str  # "gpu" | "cpu"
    source: Path  # the export folder
    models: tuple[ModelSpec, ...]  # orchestrator first, then one per graph

    @property
    def components(self) -> dict[str, str]:
        """Graph -> component model name."""
        return json.loads(self.models[0].parameter("components"))


def served_graphs(manifest: Manifest) -> list[str]:
    """The graphs the pipeline can call for this export: embed, vision, step_zero (unless the calibration reads
    the end token at full depth, which runs denoise), denoise, and denoise_logits when exported (--sampling)."""
    image = image_graph(manifest.vision.encoder)  # vision, or image_tokens for an image tokenizer (MMaDA)
    wanted = list(
        dict.fromkeys(
            ["embed", *([image] if image else []), step_zero_graph(manifest.seer), "denoise", "denoise_logits"]
        )
    )
    for required in ("embed", step_zero_graph(manifest.seer), "denoise"):
        manifest.graph(required)  # raises with the re-export command when absent
    return [g for g in wanted if g in manifest.graphs]


def engines(manifest: Manifest) -> dict[str, Engine]:
    """The TensorRT plans seer-build recorded, by graph ({} when it has not run).

    Read from the manifest's ``builds["tensorrt"]`` (plan file and profiles per graph) when present, else from its
    ``engines["tensorrt"]`` record, where a graph's value is its plan file or an object with ``file`` and
    ``profiles`` (a count or a list). TensorRT-RTX plans are not served: Triton's TensorRT backend is the full
    TensorRT of its container.
    """
    build = getattr(manifest, "builds", {}).get(ENGINE_BACKEND)
    if build is not None:
        return {g: Engine(e.file, len(e.profiles)) for g, e in build.engines.items() if g in manifest.graphs}
    record: Mapping[str, Any] = manifest.engines.get(ENGINE_BACKEND, {})
    if isinstance(record.get("graphs"), Mapping):
        record = record["graphs"]
    out = {}
    for graph, value in record.items():
        if graph not in manifest.graphs:
            continue
        if isinstance(value, str):
            out[graph] = Engine(value, 1)
        elif isinstance(value, Mapping) and isinstance(value.get("file"), str):
            profiles = value.get("profiles", 1)
            out[graph] = Engine(value["file"], len(profiles) if isinstance(profiles, list) else int(profiles))
        else:
            raise ManifestError(
                f"manifest engines.{ENGINE_BACKEND}.{graph} is {value!r}; expected a plan file or an object with "
                f"'file'; rebuild with seer-build"
            )
    return out


def graph_tensors(spec: GraphSpec) -> tuple[tuple[TensorConfig, ...], tuple[TensorConfig, ...]]:
    """A graph's inputs and outputs as Triton tensors: its own batch axis included (max_batch_size 0)."""

    def one(t) -> TensorConfig:
        return TensorConfig(t.name, pbtxt.DATA_TYPES[t.dtype], tuple(-1 if isinstance(a, str) else a for a in t.shape))

    return tuple(one(t) for t in spec.inputs), tuple(one(t) for t in spec.outputs)


def graph_files(folder: Path, manifest: Manifest, graph: str) -> tuple[tuple[str, Path], ...]:
    """The ONNX file of a graph and its external weights, if any."""
    entry = manifest.graph(graph)
    names = [entry.file] + ([entry.external_data] if entry.external_data else [])
    return tuple((n, folder / n) for n in names)


def check_export_files(folder: Path, manifest: Manifest) -> None:
    """What the repository copies and the orchestrator reads is what the runtime would accept: every file the manifest
    names (graphs and their data, TensorRT plans, the weights), every file of the tokenizer folder (bounded as the
    runtime bounds it; a FIFO there would block the copy) and the weights index (parsed, bounded) are regular files
    inside the export.

    Raises:
        ManifestError: naming the export and the first entry that is not.
    """
    for entry, name in manifest.paths():
        if entry != "tokenizer" and not entry.startswith("checksums."):  # graphs, their data, plans, the weights
            with contextlib.suppress(FileNotFoundError):  # a missing file is plan_repository's own error
                export_file(folder, name, entry)
    root = Path(folder).resolve()  # as ``inside`` resolves the paths below it, links and a relative folder alike
    tokenizer = inside(folder, manifest.tokenizer, "tokenizer")
    for path in sorted(tokenizer.rglob("*")):
        name = path.relative_to(root).as_posix()
        if inside(folder, name, "tokenizer").is_dir():
            continue
        export_file(folder, name, "tokenizer", MAX_TOKENIZER_BYTES)
    if manifest.weights is not None:
        read_weights_index(folder, manifest.weights)


def plan_repository(folder: str | Path, flavour: str = "gpu", name: str = "seer", instances: int = 2,
                    threads: int = 0, cache: CacheConfig | None = None, gpus: tuple[int, ...] = (),
                    per_gpu: int = 1, orchestration: str = "engine") -> RepositoryPlan:  # fmt: skip
    """What ``seer-triton`` writes for an export folder.

    Args:
        folder: the export folder (relative to the working folder, or absolute; links followed).
        flavour: "gpu" (TensorRT plans, or ONNX Runtime with the TensorRT accelerator) or "cpu" (Python-backend
            models running ONNX Runtime).
        name: the orchestrator's model name.
        instances: bls: orchestrator instances (each runs its own pipeline; requests are spread over them); the
            engine orchestration has one instance, its one engine.
        threads: ONNX Runtime intra-op threads per CPU component (0: its default).
        cache: the orchestrator's prompt K/V cache policy (None: seer-run's default for the engine orchestration,
            none for bls: see TRITON_CACHE).
        gpus: gpu flavour: the devices every component runs on (one instance group naming them; () = every GPU
            Triton sees); a machine of several GPUs then serves data-parallel, Triton spreading calls over them.
        per_gpu: gpu flavour: instances of each component on each of those GPUs.
        orchestration: "engine" (default): one decoupled model whose one engine runs the export's own backend
            in-process (ONNX Runtime; the TensorRT plans on gpu when seer-build made them) and streams; "bls": the
            orchestrator reaches one component model per graph through BLS, per instance, whole answers only.

    Raises:
        ConfigError: an unknown flavour, a bad name or instance count.
        ManifestError: no export at ``folder``, or a graph / plan it names is missing.
    """
    # resolved once, as every path the export names is (``inside``), and as recorded in the repository: a relative
    # folder means nothing to a server started elsewhere
    folder = Path(folder).expanduser().resolve()
    if flavour not in FLAVOURS:
        raise ConfigError(f"unknown flavour {flavour!r}; choose from {FLAVOURS}")
    if orchestration not in ORCHESTRATIONS:
        raise ConfigError(f"unknown orchestration {orchestration!r}; choose from {ORCHESTRATIONS}")
    if not name or not all(c.isalnum() or c in "_-" for c in name):
        raise ConfigError(f"model name {name!r} must be letters, digits, '_' or '-'; e.g. --name seer")
    if instances < 1 or threads < 0:
        raise ConfigError(f"--instances {instances} / --threads {threads}: expected >= 1 / >= 0")
    if per_gpu < 1 or ((gpus or per_gpu > 1) and flavour != "gpu"):
        raise ConfigError(f"--gpus / --component-instances {per_gpu}: for --flavour gpu, with >= 1 instance per GPU")
    manifest = Manifest.read(folder)
    check_export_files(folder, manifest)
    plans = engines(manifest) if flavour == "gpu" else {}
    code_path = str(Path(seer_trt.__file__).resolve().parents[1])  # the folder holding the seer_trt package
    if orchestration == "engine":
        cache = check_cache(cache or DEFAULT_CACHE, manifest)
        return RepositoryPlan(name, flavour, folder, (engine_model(folder, manifest, flavour, name, threads, cache,
                                                                   plans, code_path),))  # fmt: skip
    cache = cache or TRITON_CACHE
    components: dict[str, str] = {}
    models = []
    for graph in served_graphs(manifest):
        components[graph] = f"{name}_{graph}"
        inputs, outputs = graph_tensors(manifest.graph(graph).spec)
        common = dict(name=components[graph], max_batch_size=0, inputs=inputs, outputs=outputs)
        if flavour == "cpu":
            files = graph_files(folder, manifest, graph)
            params = (("seer_role", "component"), ("seer_trt_path", code_path), ("model_file", files[0][0]),
                      ("threads", str(threads)))  # fmt: skip
            models.append(ModelSpec(**common, backend="python", platform=None, parameters=params,
                                    instance_groups=(InstanceGroup(1, "KIND_CPU"),),
                                    files=(("model.py", MODEL_PY), *files)))  # fmt: skip
        elif graph in plans:
            plan = plans[graph]
            # One group listing every profile: each instance holds one execution context per profile and Triton
            # picks the covering one per request (a group per single profile would receive requests of any shape).
            group = InstanceGroup(per_gpu, "KIND_GPU", tuple(str(i) for i in range(plan.profiles)), gpus)
            models.append(ModelSpec(**common, backend="tensorrt", platform="tensorrt_plan", instance_groups=(group,),
                                    default_model_filename=Path(plan.file).name,
                                    files=((Path(plan.file).name, folder / plan.file),)))  # fmt: skip
        else:
            files = graph_files(folder, manifest, graph)
            mode = "FP16" if manifest.graph(graph).precision == "float16" else "FP32"
            trt = Accelerator("tensorrt", (("precision_mode", mode), ("max_workspace_size_bytes", str(1 << 32))))
            models.append(ModelSpec(**common, backend="onnxruntime", platform="onnxruntime_onnx",
                                    instance_groups=(InstanceGroup(per_gpu, "KIND_GPU", gpus=gpus),), accelerator=trt,
                                    default_model_filename=files[0][0], files=files))  # fmt: skip
    export_files = ((f"{EXPORT_DIR}/{MANIFEST_FILE}", folder / MANIFEST_FILE),
                    (f"{EXPORT_DIR}/{manifest.tokenizer}", folder / manifest.tokenizer))  # fmt: skip
    orchestrator = orchestrator_spec(
        name,
        manifest,
        instances,
        parameters=(
            ("seer_role", "orchestrator"),
            ("seer_trt_path", code_path),
            ("export", EXPORT_DIR),
            ("components", json.dumps(components)),
            ("plans", json.dumps([g for g in components if g in plans])),  # their calls fit the built profiles
            ("policy", DEFAULT_POLICY),  # cost_model: measured through the components at the first batch of rows
            ("cache", json.dumps(check_cache(cache, manifest).to_dict())),
        ),  # fmt: skip
        batch_delay_us=BATCH_DELAY_US,
        files=(("model.py", MODEL_PY), *export_files),
    )
    for model in (orchestrator, *models):
        missing = [str(src) for _, src in model.files if not src.exists()]
        if missing:
            raise ManifestError(f"model {model.name!r} needs {missing}, which do not exist; re-export (seer-export) "
                                f"or rebuild (seer-build) into {folder}")  # fmt: skip
    return RepositoryPlan(name, flavour, folder, (orchestrator, *models))


def orchestrator_spec(name: str, manifest: Manifest, instances: int, **spec: Any) -> ModelSpec:
    """The model clients call (either layout): a Python-backend model of the request inputs and response outputs."""
    return ModelSpec(name=name, backend="python", platform=None, max_batch_size=manifest.buckets.batch[-1],
                     inputs=REQUEST_INPUTS, outputs=RESPONSE_OUTPUTS,
                     instance_groups=(InstanceGroup(instances, "KIND_CPU"),), **spec)  # fmt: skip


def engine_model(folder: Path, manifest: Manifest, flavour: str, name: str, threads: int, cache: CacheConfig,
                 plans: Mapping[str, Engine], code_path: str) -> ModelSpec:  # fmt: skip
    """The decoupled orchestrator (``seer_trt.serving.triton.decoupled``): one instance whose engine runs the whole
    export, copied (hard-linked) into its version folder, on the export's own backend."""
    backend, provider = ("tensorrt", "cpu") if plans else ("onnxruntime", "cuda" if flavour == "gpu" else "cpu")
    names = dict.fromkeys([MANIFEST_FILE, *(path for _, path in manifest.paths())])
    files = tuple((f"{EXPORT_DIR}/{n}", folder / n) for n in names)
    return orchestrator_spec(
        name,
        manifest,
        1,  # one engine: every request in its steps
        parameters=(
            ("seer_role", "decoupled"),
            ("seer_trt_path", code_path),
            ("export", EXPORT_DIR),
            ("backend", backend),
            ("provider", provider),
            ("threads", str(threads)),
            ("policy", DEFAULT_POLICY),
            ("cache", json.dumps(cache.to_dict())),
        ),
        decoupled=True,
        files=(("model.py", MODEL_PY), *files),
    )


def write_repository(plan: RepositoryPlan, out: str | Path, force: bool = False) -> Path:
    """Write ``plan`` to ``out``: into a staging folder, checked, then moved into place (``seer_trt.contracts.outfolder``).

    ``force`` replaces only a repository seer-triton wrote (its marker file, ``REPOSITORY_MARKER``); a folder
    holding anything else is refused whatever ``force`` says.

    Raises:
        FolderError: ``out`` is a file, holds the user's files, or is a repository and ``force`` is not set.
        ConfigError: the written repository fails its checks (nothing is moved into place then).
    """
    target = check_target(out, force, is_repository, "--out", "a model repository", legacy=repository_files)
    with replace_folder(target) as tmp:
        for model in plan.models:
            version = tmp / model.name / VERSION
            version.mkdir(parents=True)
            (tmp / model.name / "config.pbtxt").write_text(pbtxt.render(model, str(plan.source)))
            for dest, src in model.files:
                place(src, version / dest)
        check_repository(tmp, plan.name)
        write_repository_marker(tmp, {"name": plan.name, "flavour": plan.flavour, "source": str(plan.source)})
    return target.path


def place(src: Path, dest: Path) -> None:
    """Copy a file or folder; large graph files are hard-linked when the file system allows it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dest)
        return
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def check_repository(repo: str | Path, name: str = "seer") -> list[str]:
    """Check a written repository against the manifest copied into its orchestrator; returns the model names.

    Every ``config.pbtxt`` parses into tritonclient's ``ModelConfig``; each model's name is its folder's; every
    graph the orchestrator calls has a model whose inputs and outputs (names, order, dtypes, dims) are the
    manifest's; TensorRT profile indices exist in the plan's record; every file a config refers to exists.

    Raises:
        ConfigError: the problems found, in one message.
    """
    repo = Path(repo)
    problems: list[str] = []
    configs = {}
    for folder in sorted(p for p in repo.iterdir() if p.is_dir()):
        path = folder / "config.pbtxt"
        if not path.is_file():
            problems.append(f"{folder.name}/ has no config.pbtxt")
            continue
        configs[folder.name] = config = pbtxt.parse(path.read_text(), str(path))
        if config.name != folder.name:
            problems.append(f"{path}: name {config.name!r} differs from its folder {folder.name!r}")
        problems += check_files(folder, config)
    if name not in configs:
        raise ConfigError(f"{repo} has no orchestrator model {name!r} (models: {sorted(configs)}); pass its --name")
    export = repo / name / VERSION / pbtxt.parameters(configs[name]).get("export", EXPORT_DIR)
    if (
        pbtxt.parameters(configs[name]).get("seer_role") == "decoupled"
        and not configs[name].model_transaction_policy.decoupled
    ):
        problems.append(f"{name}: the engine orchestrator must be decoupled (model_transaction_policy)")
    manifest = Manifest.read(export)
    if [t.name for t in pbtxt.tensors(configs[name], "input")] != [t.name for t in REQUEST_INPUTS]:
        problems.append(f"{name}: inputs differ from the orchestrator's {[t.name for t in REQUEST_INPUTS]}")
    tokenizer = export / manifest.tokenizer / "tokenizer.json"
    if not tokenizer.is_file():
        problems.append(f"{name}: {tokenizer.relative_to(repo)} is missing")
    records = engines(manifest)
    for graph, model in json.loads(pbtxt.parameters(configs[name]).get("components", "{}")).items():
        if model not in configs:
            problems.append(f"{name} calls {model!r} for {graph!r}, but the repository has no such model")
            continue
        problems += check_component(repo / model, configs[model], manifest, graph, records.get(graph))
    if problems:
        raise ConfigError(f"model repository {repo} fails its checks: " + "; ".join(problems))
    return sorted(configs)


def check_component(folder: Path, config, manifest: Manifest, graph: str, engine: Engine | None) -> list[str]:
    """A component's I/O against the manifest's graph contract, its profile indices against the plan, and the
    external weights of an ONNX graph next to it."""
    model = folder.name
    if graph not in manifest.graphs:
        return [f"{model} serves {graph!r}, which the manifest does not hold"]
    problems = []
    external = manifest.graph(graph).external_data
    if config.platform != "tensorrt_plan" and external and not (folder / VERSION / external).is_file():
        problems.append(f"{model}: {VERSION}/{external} (the graph's external weights) is missing")
    expected = graph_tensors(manifest.graph(graph).spec)
    for which, want in zip(("input", "output"), expected, strict=True):
        found = [(t.name, t.data_type, t.dims) for t in pbtxt.tensors(config, which)]
        if found != [(t.name, t.data_type, t.dims) for t in want]:
            problems.append(f"{model}: {which}s {found} differ from the manifest's {graph!r} graph "
                            f"{[(t.name, t.data_type, t.dims) for t in want]}")  # fmt: skip
    if config.max_batch_size != 0:
        problems.append(f"{model}: max_batch_size {config.max_batch_size}, expected 0 (the batch axis is in dims)")
    profiles = {p for g in config.instance_group for p in g.profile}
    if profiles and config.platform != "tensorrt_plan":
        problems.append(f"{model}: instance groups name profiles {sorted(profiles)} but it is no TensorRT plan")
    if config.platform == "tensorrt_plan":
        count = engine.profiles if engine else 0
        bad = sorted(p for p in profiles if not p.isdigit() or int(p) >= count)
        if engine is None or bad:
            problems.append(f"{model}: profile indices {bad} do not exist (the plan records {count} profiles)")
    return problems


def check_files(folder: Path, config) -> list[str]:
    """The files a model's config refers to exist in its version folder."""
    version = folder / VERSION
    params = pbtxt.parameters(config)
    needed = []
    if config.backend == "python":
        needed.append("model.py")
        if params.get("seer_role") == "component":
            needed.append(params.get("model_file", "?"))
        elif params.get("seer_role") in ("orchestrator", "decoupled"):
            needed += [f"{params.get('export', EXPORT_DIR)}/{MANIFEST_FILE}"]
    elif config.default_model_filename:
        needed.append(config.default_model_filename)
    else:
        needed.append({"tensorrt_plan": "model.plan", "onnxruntime_onnx": "model.onnx"}.get(config.platform, "?"))
    return [f"{folder.name}: {VERSION}/{n} is missing" for n in needed if not (version / n).exists()]
