"""One external-data file for every graph of an export: each tensor stored once (docs/DESIGN.md "Graphs and their contract", "weights stored once").

In:  the graphs of one export as ONNX IR models, one after another; their initializers are the checkpoint's
     tensors (``onnx_ir.LazyTensor`` named by checkpoint key, ``KEY.T`` when stored transposed) and the
     exporter's own constants.
Out: ``WEIGHTS_FILE`` in the export folder, appended to as graphs come; every graph's initializers point into it
     by offset (ONNX external data: location, offset, length) under one canonical name per tensor, and
     ``WEIGHTS_INDEX`` beside it (name -> offset, length, dtype, shape: what the runtime shares its loaded
     tensors by) and the manifest's ``WeightsInfo``.

    graph 1 initializers ─┐ canonical name: checkpoint key (KEY / KEY.T), or const.<digest> for the exporter's own
    graph 2 initializers ─┼► already stored? ─ no ─► append (aligned) ─► index[name] = (offset, length, dtype, shape)
    ...                  ─┘                  └ yes ─────────────────────┴► initializer := ExternalTensor(offset)

A checkpoint tensor is read (lazily, one at a time) only the first time a graph uses it, so memory stays near one
tensor; as it is written, every value is checked finite (one pass, in chunks), so a NaN or infinite weight is refused
by name even under ``--no-validate`` (it would turn every prediction into the mask id). The exporter's constants larger than ``INLINE_BYTES`` (a folded position embedding, say) are keyed by
their content, so two graphs folding the same constant share it too; smaller ones (shapes, scalars) stay inline.
``load_inlined`` reads one graph back with every stored tensor in the model (what seer-quantize rewrites).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from seer_export.onnx.options import ExportError
from seer_trt.contracts.graphs import WEIGHTS_FILE
from seer_trt.contracts.manifest import WEIGHTS_INDEX, StoredTensor, WeightsInfo, write_weights_index

INLINE_BYTES = 256  # exporter constants up to this size stay in their .onnx file (onnx_ir's own default)
ALIGN_LARGE = 4096  # tensors from 64 KiB on start on a page: memory-mapped views of them are page-aligned
ALIGN_SMALL = 64  # the rest on a cache line, which every CPU kernel's alignment needs are met by
LARGE_TENSOR = 64 * 1024

CONSTANT_PREFIX = "const."  # a stored tensor of the graph's own (RoPE's rotation), not of the checkpoint
FINITE_CHUNK = 1 << 22  # values checked finite at a time: a 4 MiB mask, whatever the tensor's size


def check_finite(name: str, array: np.ndarray) -> None:
    """Refuse a checkpoint tensor holding a NaN or an infinity (as the graph stores it: a value past float16's range
    becomes one when cast), counted in chunks of ``FINITE_CHUNK`` values.

    Raises:
        ExportError: naming the tensor, how many of its values are not finite, and the fix.
    """
    if array.dtype.kind != "f":
        return
    flat = array.reshape(-1)
    chunks = range(0, flat.size, FINITE_CHUNK)
    bad = flat.size - sum(int(np.count_nonzero(np.isfinite(flat[i : i + FINITE_CHUNK]))) for i in chunks)
    if bad:
        cast = " (or its values exceed float16's range: export with --dtype fp32)" if array.dtype == np.float16 else ""
        raise ExportError(f"checkpoint tensor {name} holds {bad} of {flat.size} values that are not finite (NaN or "
                          f"infinity) as {array.dtype}; expected finite weights: the checkpoint is corrupt, re-download "
                          f"or re-copy it{cast}")  # fmt: skip


class SharedWeights:
    """The append-only weights file of one export being written."""

    def __init__(self, folder: Path, file: str = WEIGHTS_FILE) -> None:
        self.path = Path(folder) / file
        self._out = open(self.path, "wb")  # noqa: SIM115 - closed by close(), after the last graph
        self.index: dict[str, StoredTensor] = {}

    @property
    def size(self) -> int:
        """Bytes written so far."""
        return self._out.tell()

    def _append(self, data: bytes) -> int:
        align = ALIGN_LARGE if len(data) >= LARGE_TENSOR else ALIGN_SMALL
        end = self._out.tell()
        padding = -end % align
        self._out.write(b"\0" * padding)
        self._out.write(data)
        return end + padding

    def store(self, graph) -> int:
        """Point every initializer of ``graph`` (an ``onnx_ir.Graph``) into the shared file, writing the tensors it
        is the first to use. Returns the bytes this graph reads from the file."""
        import onnx_ir as ir

        used = 0
        for value in list(graph.initializers.values()):
            tensor = value.const_value
            if isinstance(tensor, ir.LazyTensor):
                name = tensor.name  # the checkpoint key (KEY.T when transposed): the same tensor in every graph
            elif tensor is None or tensor.nbytes <= INLINE_BYTES:
                continue
            else:
                digest = hashlib.sha256(f"{tensor.dtype}{tuple(tensor.shape)}".encode() + tensor.tobytes())
                name = f"{CONSTANT_PREFIX}{digest.hexdigest()[:24]}"
            if name not in self.index:
                array = np.ascontiguousarray(tensor.numpy())
                if isinstance(tensor, ir.LazyTensor):  # the checkpoint's; the exporter's own constants may hold -inf
                    check_finite(name.removesuffix(".T"), array)
                data = array.tobytes()
                self.index[name] = StoredTensor(self._append(data), len(data), str(value.dtype.numpy()),
                                                tuple(int(d) for d in value.shape))  # fmt: skip
            stored = self.index[name]
            twin = graph.initializers.get(name)
            if twin is not None and twin is not value:  # the same bytes twice in one graph: keep one initializer
                value.replace_all_uses_with(twin)
                graph.initializers.pop(value.name)
                continue
            value.name = name
            value.const_value = ir.ExternalTensor(
                self.path.name, stored.offset, stored.length, value.dtype, shape=value.shape, name=name,
                base_dir=self.path.parent,
            )  # fmt: skip
            used += stored.length
        return used

    def close(self) -> WeightsInfo:
        """Flush the file and write its index (``WEIGHTS_INDEX``) next to it; returns the manifest's record."""
        self._out.close()
        write_weights_index(self.path.parent / WEIGHTS_INDEX, self.index)
        return WeightsInfo(file=self.path.name, index=WEIGHTS_INDEX, size_bytes=self.path.stat().st_size,
                           tensors=len(self.index))  # fmt: skip


def load_inlined(src: Path) -> tuple[Any, set[str]]:
    """``src`` with every external initializer read into the model, and the names of those initializers.

    Read here, not by ``onnx.load``: onnx refuses external data with more than one hard link, and an export's shared
    weights file may well have several (a Triton repository links it rather than copying gigabytes).
    """
    import onnx
    from onnx.external_data_helper import uses_external_data

    from seer_trt.contracts.errors import ConfigError

    model = onnx.load(str(src), load_external_data=False)
    root = src.parent.resolve()
    names = set()
    for tensor in model.graph.initializer:
        if not uses_external_data(tensor):
            continue
        names.add(tensor.name)
        info = {e.key: e.value for e in tensor.external_data}
        path = (root / info["location"]).resolve()
        if path.parent != root:
            raise ConfigError(f"{src}: tensor {tensor.name} reads {info['location']}, outside the export")
        offset, length = int(info.get("offset", 0)), int(info["length"])
        with path.open("rb") as f:
            f.seek(offset)
            tensor.raw_data = f.read(length)
        if len(tensor.raw_data) != length:
            raise ConfigError(f"{path} ends before tensor {tensor.name} (offset {offset}, length {length})")
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
    return model, names
