"""One graph to ONNX: trace on the meta device, attach the checkpoint's tensors lazily, check axes and precision,
point the initializers into the shared weights file, save the structure (docs/DESIGN.md "Graphs and their contract",
"Toolchain facts").

    module on the meta device ─► torch.onnx.export(dynamo, optimize=False)
    safetensors headers ─► every initializer becomes a LazyTensor that reads its checkpoint tensor on demand
                           (a weight used only through Transpose is replaced by a lazily transposed one)
    ─► optimize ─► axis names and precision checked against the spec
    ─► initializers pointed into the shared weights file ─► save the graph's structure
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import warnings
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np
import torch

from seer_export.models.loading import CheckpointTensors
from seer_export.models.mllm import DiffusionMLLM
from seer_export.models.names import to_checkpoint
from seer_export.onnx.modules import PROBE_INITIALIZER, _Graph, build
from seer_export.onnx.options import ExportError
from seer_export.onnx.shared_weights import SharedWeights
from seer_export.onnx.source import Source
from seer_trt.contracts.graphs import GraphSpec
from seer_trt.contracts.manifest import (
    GraphEntry,
)

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


def attach_weights(graph, tensors: CheckpointTensors, prefix: str, extra: dict[str, np.ndarray] | None = None,
                   naming: str = "llada-v") -> None:  # fmt: skip
    """Point every initializer at its checkpoint tensor, read only when stored (``onnx_ir.LazyTensor``, named by
    its checkpoint key, ``KEY.T`` when transposed: ``seer_export.onnx.shared_weights`` stores each name once).
    ``extra``: initializers that are no checkpoint tensor (the probe's weights), by name. ``naming``: the
    checkpoint's parameter names (``seer_export.models.names``); the graph's carry the modules' names.

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
        key = to_checkpoint(name.removeprefix(prefix), naming)
        if key not in tensors:  # an initializer the exporter renamed after a graph output (image_newline)
            key = to_checkpoint(value.metadata_props.get(ORIGINAL_NAME, name).removeprefix(prefix), naming)
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
    its statistics in ``stash_type`` (1 = float32); the vocabulary log-sum-exp (``seer_export.onnx.modules.greedy``) is
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
            f"(docs/DESIGN.md, 'Graphs and their contract') is broken for this torch/onnxscript version"
        )


def export_graph(
    spec: GraphSpec, precision: str, source: Source, opset: int, path: Path, weights: SharedWeights,
    verbose: bool = False,
) -> tuple[GraphEntry, dict[str, int]]:  # fmt: skip
    """Trace one graph on the meta device, attach lazy weights, optimise, store its tensors and save it to ``path``.

    Args:
        spec: the graph's resolved contract (``seer_trt.contracts.graphs.graph_specs``).
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
        model = DiffusionMLLM(source.config).to(TORCH_DTYPES[precision])
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
        attach_weights(program.model.graph, source.tensors, module.PREFIX, extra, source.config.naming)
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


Log = Callable[[str], None]
