"""Export a LLaDA-V checkpoint to the ONNX graphs of ``seer_trt.graphs`` plus ``manifest.json`` (docs/DESIGN.md §3, §5, §11).

In:  ``ExportOptions``: a registered model (or ``--checkpoint DIR``), the graphs, fp32 or fp16, the opset, the
     output folder.
Out: ``OUT/{graph}.onnx`` (structure), ``OUT/weights.data`` (every graph's tensors, each stored once; index in
     ``OUT/weights.json``; ``seer_export.shared_weights``), ``OUT/tokenizer/``, ``OUT/manifest.json`` (with the
     parity report of ``seer_export.parity``) and optionally Polygraphy goldens in ``OUT/goldens/``.

One path for every model size, so the tiny fixture exercises what the 8B export runs:

    config.json ─► LLaDAV on the meta device (no storage) ─► torch.onnx.export(dynamo, optimize=False)
    safetensors headers ─► every initializer becomes a LazyTensor that reads its checkpoint tensor on demand
                           (a weight used only through Transpose is replaced by a lazily transposed one)
    ─► optimize ─► axis names and precision checked against the spec
    ─► initializers pointed into the shared weights file (a tensor is read and appended the first time a graph
       uses it) ─► save the graph's structure

so peak memory stays near one tensor plus the exporter's graph, not the model, and the export's files hold each
tensor once whatever the number of graphs. Everything is written into a
temporary folder next to ``OUT`` and moved into place only when complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import math
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np
import torch

from seer_export.graphs import PROBE_INITIALIZER, _Graph, build
from seer_export.models.config import LLaDAVConfig
from seer_export.models.llada_v import LLaDAV
from seer_export.models.loading import CheckpointTensors, check_state, load_state
from seer_export.models.registry import get_entry, resolve
from seer_export.shared_weights import SharedWeights
from seer_trt.config import SpecialTokens
from seer_trt.errors import CheckpointError, ConfigError, SeerError
from seer_trt.graphs import (
    GRAPH_NAMES,
    PRECISIONS,
    SAMPLING_GRAPHS,
    SERVING_GRAPHS,
    GraphSpec,
    LengthBuckets,
    graph_specs,
)
from seer_trt.integrity import checksums
from seer_trt.manifest import (
    SCHEMA_VERSION,
    TOKENIZER_DIR,
    GraphEntry,
    Manifest,
    ModelInfo,
    ParityReport,
    Versions,
    VisionInfo,
)
from seer_trt.outfolder import check_target, is_collection, is_export, replace_folder

OPSETS = (20, 21, 22)  # 23 turns SDPA into the ONNX Attention op, poorly supported by ORT CPU / TensorRT (§11)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")  # required; special_tokens_map.json if present
# distinct, > 1: nothing specialises (past and prompt may be 0 at run time: ONNX keeps no guards)
EXAMPLE_SIZES = {"batch": 2, "prompt": 11, "answer": 7, "past": 13, "history": 3, "tiles": 2, "tokens": 5}
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16}
ORIGINAL_NAME = "pkg.torch.onnx.original_node_name"
VOCAB_REDUCTIONS = (
    "Softmax",
    "ReduceMax",
    "ReduceSum",
    "ReduceLogSumExp",
    "ArgMax",
)  # fp32 over the vocabulary  # an output-renamed initializer's parameter name


class ExportError(SeerError):
    """The export could not be completed (output folder, parity, precision policy)."""


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """What ``seer-export`` was asked to do; CLI flags map one to one onto these fields."""

    model: str = "tiny-llada-v"  # registry name
    checkpoint: Path | None = None  # overrides where the weights come from
    out: Path | None = None  # output folder, replaced only when complete; None: engines/{model}-{dtype}
    dtype: str = "fp32"  # "fp32" | "fp16"
    opset: int = 20
    graphs: tuple[str, ...] = SERVING_GRAPHS
    sampling: bool = False  # also export denoise_logits (temperature > 0, random remasking)
    validate: bool = True  # ONNX Runtime vs PyTorch per graph, and a Seer generation through the graphs
    force: bool = False  # replace a non-empty ``out``
    save_goldens: bool = False  # Polygraphy JSON inputs / outputs of the parity cases
    samples: int = 16  # fixture prompts of the end-to-end check
    verbose: bool = False  # exporter chatter and tracebacks

    def __post_init__(self) -> None:
        if self.dtype not in PRECISIONS:
            raise ConfigError(f"--dtype {self.dtype!r} is not supported; choose from {sorted(PRECISIONS)}")
        if self.opset not in OPSETS:
            raise ConfigError(
                f"--opset {self.opset} is outside {OPSETS[0]}-{OPSETS[-1]}; opset 23+ emits the ONNX Attention op "
                f"that ONNX Runtime CPU and TensorRT handle poorly, and < 20 lacks ops the graphs use; pass --opset 20"
            )
        unknown = [g for g in self.graphs if g not in GRAPH_NAMES]
        if unknown or not self.graphs:
            raise ConfigError(f"--graphs {list(self.graphs)}: unknown or none; choose from {list(GRAPH_NAMES)}")
        if self.save_goldens and not self.validate:
            raise ConfigError("--save-goldens stores the validation's inputs and outputs; drop --no-validate")
        if self.samples < 1:
            raise ConfigError(f"--samples must be >= 1, got {self.samples}")
        object.__setattr__(
            self, "graphs", tuple(dict.fromkeys(self.graphs + (SAMPLING_GRAPHS if self.sampling else ())))
        )
        if self.out is None:  # a folder per export: engines/ itself holds a tracked README.md
            object.__setattr__(self, "out", Path("engines") / f"{self.model}-{self.dtype}")
        elif is_collection(self.out):  # --out engines/: the export goes into its own folder inside
            object.__setattr__(self, "out", self.out / f"{self.model}-{self.dtype}")

    @property
    def precision(self) -> str:
        return PRECISIONS[self.dtype]


@dataclasses.dataclass(frozen=True)
class Source:
    """The checkpoint an export reads, checked before any graph is traced."""

    folder: Path  # config.json, safetensors, tokenizer files
    config: LLaDAVConfig
    special: SpecialTokens  # resolved from the tokenizer by token string
    tensors: CheckpointTensors  # lazy: headers only


def open_source(model: str, checkpoint: Path | None) -> Source:
    """Find and check a checkpoint without reading a byte of weights.

    Raises:
        ConfigError: unknown model name or invalid config.json.
        CheckpointError: no checkpoint, no tokenizer, unreadable or mismatching tensors.
    """
    get_entry(model)  # unknown name: one line listing the known ones
    folder = resolve(model, checkpoint)
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder} has no config.json; pass --checkpoint DIR with a LLaDA-V checkpoint folder")
    missing = [f for f in TOKENIZER_FILES if not (folder / f).is_file()]
    if missing:
        raise CheckpointError(
            f"checkpoint {folder} lacks {missing}; the export copies the tokenizer and its chat template next to "
            f"the graphs: copy those files from the model's Hugging Face repo into {folder}"
        )
    cfg = LLaDAVConfig.from_file(folder / "config.json")
    special = SpecialTokens.from_tokenizer(folder / "tokenizer.json")
    tensors = load_state(folder)
    with torch.device("meta"):
        check_state(LLaDAV(cfg), tensors)  # names and shapes, all at once
    if max(special.to_dict().values()) >= cfg.text.vocab_size:
        raise CheckpointError(
            f"tokenizer ids {special.to_dict()} reach past vocab_size {cfg.text.vocab_size} of {folder / 'config.json'}"
            f"; the tokenizer and the weights come from different models"
        )
    return Source(folder, cfg, special, tensors)


def model_dims(cfg: LLaDAVConfig) -> dict[str, int]:
    """Sizes of the model axes of ``seer_trt.graphs``."""
    return {
        "hidden": cfg.text.hidden_size,
        "vocab": cfg.text.vocab_size,
        "layers": cfg.text.num_hidden_layers,
        "kv_heads": cfg.text.num_key_value_heads,
        "head_dim": cfg.text.head_dim,
        "image_size": cfg.vision.image_size,
        "tile_tokens": cfg.vision.tokens_per_tile,
    }


# --------------------------------------------------------------------------------------------------- one graph


@contextlib.contextmanager
def quiet_exporter(verbose: bool) -> Iterator[None]:
    """Silence the exporter's progress prints, warnings and log lines (shown with ``--verbose``)."""
    if verbose:
        yield
        return
    sink = io.StringIO()
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._export", "onnxscript")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels, strict=True):
                lg.setLevel(level)


def example_inputs(spec: GraphSpec, device: str | torch.device = "meta") -> tuple[torch.Tensor, ...]:
    """Inputs of ``spec``'s shapes at EXAMPLE_SIZES, on ``device`` (meta: shapes only)."""
    cached = any("past" in t.shape for t in spec.inputs)
    seq = (EXAMPLE_SIZES["past"] if cached else 0) + EXAMPLE_SIZES["prompt"] + EXAMPLE_SIZES["answer"]
    sizes = {**EXAMPLE_SIZES, "seq": seq}
    dtypes = {"float32": torch.float32, "float16": torch.float16, "int64": torch.int64, "int32": torch.int32}
    return tuple(
        torch.zeros([sizes[a] if isinstance(a, str) else a for a in t.shape], dtype=dtypes[t.dtype], device=device)
        for t in spec.inputs
    )


def dynamic_shapes(spec: GraphSpec, module: torch.nn.Module) -> tuple:
    """``torch.export`` dynamic shapes in the structure of ``module.forward``'s arguments (the cached graphs take
    the per-layer K/V as one ``*past`` argument): one ``Dim`` per axis name; ``seq`` is derived."""
    import inspect

    from torch.export import Dim

    dims = {name: Dim(name, min=1) for name in EXAMPLE_SIZES}
    shapes = [{i: (Dim.AUTO if a == "seq" else dims[a]) for i, a in t.dynamic_axes.items()} for t in spec.inputs]
    params = inspect.signature(module.forward).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        fixed = sum(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
        return (*shapes[:fixed], tuple(shapes[fixed:]))
    return tuple(shapes)


def _read_weight(tensors: CheckpointTensors, key: str, dtype: torch.dtype, transpose: bool):
    """One checkpoint tensor as an ONNX IR tensor in the graph's dtype, read now (a LazyTensor calls this)."""
    import onnx_ir as ir

    tensor = tensors[key].to(dtype)
    if transpose:
        tensor = tensor.T.contiguous()
    return ir.Tensor(tensor.numpy(), name=key)


def attach_weights(graph, tensors: CheckpointTensors, prefix: str, extra: dict[str, np.ndarray] | None = None) -> None:
    """Point every initializer at its checkpoint tensor, read only when stored (``onnx_ir.LazyTensor``, named by
    its checkpoint key, ``KEY.T`` when transposed: ``seer_export.shared_weights`` stores each name once).
    ``extra``: initializers that are no checkpoint tensor (the probe's weights), by name.

    The exporter writes ``x @ W.T`` as ``MatMul(x, Transpose(W))``; the optimizer would fold that Transpose by
    reading and copying every weight into memory. A weight whose only use is that Transpose is replaced here by
    an initializer that reads W and transposes it on demand, so nothing is materialised before ``save``.
    """
    import onnx_ir as ir

    extra = extra or {}
    for name, value in list(graph.initializers.items()):
        if name in extra:
            value.const_value = ir.Tensor(extra[name], name=name)
            continue
        key = name.removeprefix(prefix)
        if key not in tensors:  # an initializer the exporter renamed after a graph output (image_newline)
            key = value.metadata_props.get(ORIGINAL_NAME, name).removeprefix(prefix)
        if key not in tensors:
            raise ExportError(f"the traced graph holds {name!r}, which the checkpoint lacks; this is a seer-export bug")
        dtype = TORCH_DTYPES[value.dtype.numpy().name]
        uses = list(value.uses())
        node = uses[0].node if len(uses) == 1 else None
        if node is not None and node.op_type == "Transpose" and list(node.attributes["perm"].value) == [1, 0]:
            rows, cols = value.shape
            folded = ir.Value(name=f"{key}.T", shape=ir.Shape([cols, rows]), type=ir.TensorType(value.dtype))
            folded.const_value = ir.LazyTensor(
                partial(_read_weight, tensors, key, dtype, True), value.dtype, ir.Shape([cols, rows]), name=f"{key}.T"
            )
            node.outputs[0].replace_all_uses_with(folded)
            graph.remove(node, safe=True)
            graph.initializers.pop(name)
            graph.register_initializer(folded)
        else:
            value.const_value = ir.LazyTensor(
                partial(_read_weight, tensors, key, dtype, False), value.dtype, value.shape, name=key
            )


def detach_constant_outputs(graph) -> None:
    """An output that is a weight itself (``image_newline``) gets an Identity node in front of it.

    The exporter renames such an initializer after the output; the Identity gives the output a producer (a
    constant as a graph output is mishandled by some consumers) and the weight its checkpoint name back.
    """
    import onnx_ir as ir

    for i, value in enumerate(list(graph.outputs)):
        if value.producer() is not None or value.name not in graph.initializers:
            continue
        out_name = value.name
        graph.initializers.pop(out_name)
        value.name = value.metadata_props.get(ORIGINAL_NAME, out_name)
        graph.register_initializer(value)
        node = ir.Node("", "Identity", [value], name=f"node_{out_name}")
        node.outputs[0].name = out_name
        node.outputs[0].dtype, node.outputs[0].shape = value.dtype, value.shape
        graph.append(node)
        graph.outputs[i] = node.outputs[0]


def strip_trace_metadata(graph) -> None:
    """Drop the exporter's per-node trace (stack traces, FX nodes, module paths: about 1.3 KB per node, most of a
    graph file's structure, and local paths in a shipped artifact); ``--verbose`` keeps it for debugging."""
    for node in graph.all_nodes():
        node.metadata_props.clear()


def weights_bytes(graph) -> int:
    """Bytes of every initializer, from shapes and dtypes (reads no data)."""
    return sum(int(math.prod(v.shape.numpy())) * int(v.dtype.itemsize) for v in graph.initializers.values())


def stamp_axes(model, spec: GraphSpec) -> None:
    """Give the graph's inputs and outputs the spec's axis names and check their dtypes and fixed sizes."""
    import onnx_ir as ir

    graph = model.graph
    for values, tensors in ((graph.inputs, spec.inputs), (graph.outputs, spec.outputs)):
        if [v.name for v in values] != [t.name for t in tensors]:
            raise ExportError(f"{spec.name}: graph I/O {[v.name for v in values]} differ from the spec; a bug")
        for value, t in zip(values, tensors, strict=True):
            fixed = [(a, d) for a, d in zip(t.shape, value.shape, strict=True) if isinstance(a, int)]
            if value.dtype != ir.DataType.from_numpy(np.dtype(t.dtype)) or any(
                isinstance(d, int) and d != a for a, d in fixed
            ):
                raise ExportError(
                    f"{spec.name}.{t.name}: exported as {value.dtype} {value.shape}, spec says {t.dtype} {t.shape}"
                )
            value.shape = ir.Shape(list(t.shape))


def check_precision(model, spec: GraphSpec, vocab: int) -> None:
    """In fp16 graphs the normalisation statistics, the vocabulary reductions and the Seer statistics stay fp32.

    RMSNorm's mean of squares and the statistic's mean are ReduceMean nodes; LayerNormalization (vision) keeps
    its statistics in ``stash_type`` (1 = float32); the vocabulary log-sum-exp (``seer_export.graphs.greedy``) is
    the Softmax / ReduceMax / ReduceSum / ReduceLogSumExp / ArgMax over an input whose last axis has size V.

    Raises:
        ExportError: a node that must compute in float32 does not; the message names it.
    """
    import onnx_ir as ir

    bad = []
    for node in model.graph.all_nodes():
        out = node.outputs[0] if node.outputs else None
        if node.op_type == "ReduceMean" and out is not None and out.dtype != ir.DataType.FLOAT:
            bad.append(f"{node.name} (ReduceMean -> {out.dtype})")
        if node.op_type == "LayerNormalization" and node.attributes.get_int("stash_type", 1) != 1:
            bad.append(f"{node.name} (LayerNormalization stash_type != float32)")
        source = node.inputs[0] if node.inputs else None
        if node.op_type in VOCAB_REDUCTIONS and source is not None and source.shape is not None and source.shape:
            if source.shape[-1] == vocab and source.dtype != ir.DataType.FLOAT:
                bad.append(f"{node.name} (vocabulary {node.op_type} over {source.dtype})")
    if bad:
        raise ExportError(
            f"{spec.name}: {len(bad)} node(s) that must compute in float32 do not: {bad[:4]}; the precision policy "
            f"(docs/DESIGN.md §5) is broken for this torch/onnxscript version"
        )


def export_graph(
    spec: GraphSpec, precision: str, source: Source, opset: int, path: Path, weights: SharedWeights,
    verbose: bool = False,
) -> tuple[GraphEntry, dict[str, int]]:  # fmt: skip
    """Trace one graph on the meta device, attach lazy weights, optimise, store its tensors and save it to ``path``.

    Args:
        spec: the graph's resolved contract (``seer_trt.graphs.graph_specs``).
        precision: "float32" or "float16": the dtype of weights and activations.
        source: the checked checkpoint.
        opset: ONNX opset (20-22).
        path: the ``.onnx`` file to write (the graph's structure and its small constants).
        weights: the export's shared weights file; the graph's tensors are appended to it unless already there.
        verbose: show the exporter's own output.

    Returns:
        Its manifest entry and a count of its ONNX ops by type.
    """
    import onnx_ir as ir

    with torch.device("meta"):
        model = LLaDAV(source.config).to(TORCH_DTYPES[precision])
        module: _Graph = build(spec.name, model, source.special, source.config.seer)
    extra = {}
    if hasattr(module, PROBE_INITIALIZER):  # the probe's weights come from the calibration, not the checkpoint
        extra[PROBE_INITIALIZER] = np.asarray(source.config.seer.probe_weights, dtype=np.float32)
    with quiet_exporter(verbose), torch.no_grad():
        program = torch.onnx.export(
            module,
            example_inputs(spec),
            dynamo=True,
            dynamic_shapes=dynamic_shapes(spec, module),
            input_names=[t.name for t in spec.inputs],
            output_names=[t.name for t in spec.outputs],
            opset_version=opset,
            optimize=False,
            verbose=verbose,
        )
        attach_weights(program.model.graph, source.tensors, module.PREFIX, extra)
        program.optimize()
        detach_constant_outputs(program.model.graph)  # after optimize, which removes Identity nodes
    if program.model.opset_imports.get("") != opset:
        raise ExportError(f"{spec.name}: exported with opset {program.model.opset_imports.get('')}, asked for {opset}")
    stamp_axes(program.model, spec)
    check_precision(program.model, spec, source.config.text.vocab_size)
    if not verbose:
        strip_trace_metadata(program.model.graph)
    size = weights_bytes(program.model.graph)
    shared = weights.store(program.model.graph)
    with quiet_exporter(verbose):
        ir.save(program.model, path)  # external tensors keep their place in the shared file
    ops: dict[str, int] = {}
    for node in program.model.graph.all_nodes():
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    entry = GraphEntry(
        spec=spec,
        file=path.name,
        precision=precision,
        opset=opset,
        external_data=weights.path.name if shared else None,
        size_bytes=size,
    )
    return entry, ops


# ------------------------------------------------------------------------------------------------ whole export


def versions(opset: int) -> Versions:
    import onnx
    import onnxruntime
    import onnxscript

    import seer_trt

    return Versions(
        seer_trt=seer_trt.__version__,
        torch=torch.__version__,
        onnx=onnx.__version__,
        onnxscript=onnxscript.__version__,
        onnxruntime=onnxruntime.__version__,
        opset=opset,
    )


def vision_info(v: LLaDAVConfig) -> VisionInfo:
    """How the runtime cuts images into tiles and splices their features (``LLaDAV.image_features`` /
    ``merge_anyres``)."""
    return VisionInfo(
        image_size=v.vision.image_size,
        patch_size=v.vision.patch_size,
        tokens_per_tile=v.vision.tokens_per_tile,
        image_aspect_ratio=v.image_aspect_ratio,
        patch_merge_type=v.patch_merge_type,
        grid_pinpoints=tuple(v.grid_pinpoints),
        anyres_max_tiles=v.anyres_max_tiles,
        newline="unpad" if "unpad" in v.patch_merge_type else "none",
    )


def default_buckets(cfg: LLaDAVConfig) -> LengthBuckets:
    """Answer buckets over the generation window; prompt buckets over one image's features plus text."""
    side = cfg.vision.image_size // cfg.vision.patch_size
    per_tile = cfg.vision.tokens_per_tile + side  # a tile's features plus at most one newline per patch row
    if cfg.image_aspect_ratio == "pad":
        tiles = 1
    else:  # the base tile plus the grid (anyres_max_N shrinks the grid to about N tiles)
        tiles = 1 + (cfg.anyres_max_tiles or max(w * h for w, h in cfg.grid_pinpoints) // cfg.vision.image_size**2)
    return LengthBuckets.for_model(cfg.generation.gen_length, tiles * per_tile)


def model_info(name: str, cfg: LLaDAVConfig) -> ModelInfo:
    t = cfg.text
    return ModelInfo(
        name=name,
        architecture="llava_llada",
        hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size,
        num_layers=t.num_hidden_layers,
        num_heads=t.num_attention_heads,
        vocab_size=t.vocab_size,
    )


def _available_ram() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_validation_memory(source: Source, options: ExportOptions) -> None:
    """Validation holds the fp32 PyTorch model and the graphs' ONNX Runtime sessions: refuse up front if too big.

    Raises:
        ExportError: the estimate exceeds the available memory; the fix is ``--no-validate``.
    """
    params = sum(math.prod(s) for s in source.tensors.shapes.values())
    need = params * 4 + params * (2 if options.dtype == "fp16" else 4) * 2  # reference + sessions (prepacked)
    have = _available_ram()
    if have is not None and need > have:
        raise ExportError(
            f"validating {options.model} needs about {need / 2**30:.0f} GiB of RAM (PyTorch fp32 reference plus "
            f"ONNX Runtime sessions), {have / 2**30:.0f} GiB are available; pass --no-validate (and compare on a "
            f"larger machine, or against --save-goldens outputs) or free memory"
        )


def check_out(out: Path, force: bool) -> Path:
    """The absolute output folder, if it may be written (``seer_trt.outfolder.check_target``): new, empty, or an
    export (``--force``); never a folder holding anything seer-export did not write.

    Raises:
        FolderError: ``out`` is a file or under one, holds the user's files, is an export and ``force`` is not
            set, or is not writable.
    """
    return check_target(out, force, is_export, "--out", "an export").path


@contextlib.contextmanager
def staging_folder(out: Path, force: bool) -> Iterator[Path]:
    """A temporary folder next to ``out`` (inside it when it is a mount point), moved onto ``out`` only if the
    block completes; removed otherwise, Ctrl-C and SIGTERM included.

    Raises:
        FolderError: see ``check_out``; or the folder cannot be created.
    """
    with replace_folder(check_target(out, force, is_export, "--out", "an export")) as staging:
        yield staging


Log = Callable[[str], None]


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if nbytes < 1024:
            return f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} GiB"


def run_export(options: ExportOptions, log: Log = print) -> Manifest:
    """Export, validate and write everything ``options`` asks for; returns the written manifest.

    Raises:
        SeerError subclasses: bad options, checkpoint or output folder, a precision or parity failure. Nothing is
        left at ``options.out`` (or the previous export there stays) when one is raised.
    """
    start = time.perf_counter()

    def stage(text: str) -> None:
        log(f"[{time.perf_counter() - start:7.1f}s] {text}")

    check_out(options.out, options.force)  # before any work: a refused --out costs nothing
    source = open_source(options.model, options.checkpoint)
    stage(f"checkpoint {source.folder}: {len(source.tensors)} tensors, config and tokenizer checked")
    if options.validate:
        check_validation_memory(source, options)
    seer = source.config.seer
    specs = graph_specs(model_dims(source.config), options.precision, options.graphs, probe=seer.signal == "probe")
    with staging_folder(options.out, options.force) as staging:
        entries: dict[str, GraphEntry] = {}
        weights = SharedWeights(staging)
        try:
            for name, spec in specs.items():
                path = staging / f"{name}.onnx"
                before = weights.size
                entry, ops = export_graph(spec, options.precision, source, options.opset, path, weights,
                                          options.verbose)  # fmt: skip
                entries[name] = entry
                added = weights.size - before
                stage(
                    f"exported {name}.onnx ({options.dtype}, {_size(entry.size_bytes)} of weights, "
                    f"{_size(added)} new in {weights.path.name}, {ops.get('MatMul', 0)} MatMul)"
                )
        finally:
            stored = weights.close()
        stage(f"{stored.file}: {stored.tensors} tensors, {_size(stored.size_bytes)}, each stored once for "
              f"{len(entries)} graph(s)")  # fmt: skip
        (staging / TOKENIZER_DIR).mkdir()
        for file in (*TOKENIZER_FILES, "special_tokens_map.json"):
            if (source.folder / file).is_file():
                shutil.copy2(source.folder / file, staging / TOKENIZER_DIR / file)
        manifest = Manifest(
            schema_version=SCHEMA_VERSION,
            model=model_info(options.model, source.config),
            vision=vision_info(source.config),
            special_tokens=source.special,
            tokenizer=TOKENIZER_DIR,
            system_prompt=source.config.system_prompt,
            seer=seer,
            generation=source.config.generation,
            precision=options.precision,
            graphs=entries,
            buckets=default_buckets(source.config),
            versions=versions(options.opset),
            parity=ParityReport(status="skipped", reference="", note="--no-validate"),
            weights=stored,
        )
        if options.validate:
            from seer_export.parity import summary_table, validate

            parity = validate(staging, manifest, source.folder, options, stage)
            log(summary_table(parity.rows, options.precision))
            manifest = dataclasses.replace(manifest, parity=parity)
            if parity.status == "failed":
                raise ExportError(
                    f"parity check failed: {parity.note}; {options.out} was left as it was (rerun with --verbose "
                    f"for the exporter's output, or compare against the fp32 export)"
                )
        manifest = dataclasses.replace(manifest, checksums=checksums(staging, manifest))  # seer-build verifies them
        manifest.write(staging)
        stage(f"wrote {len(entries)} graph(s), tokenizer/ and manifest.json")
    stage(f"done: {options.out}")
    return manifest
