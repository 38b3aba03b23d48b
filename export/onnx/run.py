"""Export a LLaDA-V checkpoint to the ONNX graphs of ``seer_trt.contracts.graphs`` plus ``manifest.json`` (docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch", "Graphs and their contract", "Toolchain facts").

In:  ``ExportOptions``: a registered model (or ``--checkpoint DIR``), the graphs, fp32 or fp16, the opset, the
     output folder.
Out: ``OUT/{graph}.onnx`` (structure), ``OUT/weights.data`` (every graph's tensors, each stored once; index in
     ``OUT/weights.json``; ``seer_export.onnx.shared_weights``), ``OUT/tokenizer/``, ``OUT/manifest.json`` (with the
     parity report of ``seer_export.onnx.parity``) and optionally Polygraphy goldens in ``OUT/goldens/``.

One path for every model size, so the tiny fixture exercises what the 8B export runs:

    config.json ─► DiffusionMLLM on the meta device (no storage) ─► torch.onnx.export(dynamo, optimize=False)
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
import json
import math
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from seer_export.models.config import DiffusionMLLMConfig
from seer_export.models.families import FAMILIES, ranks_by_score
from seer_export.onnx.options import ExportError, ExportOptions
from seer_export.onnx.shared_weights import SharedWeights
from seer_export.onnx.source import TOKENIZER_FILES, Source, model_dims, open_source
from seer_trt.contracts.config import CostCalibration, WindowRule
from seer_trt.contracts.graphs import for_front_end, graph_precision, graph_specs
from seer_trt.contracts.integrity import checksums
from seer_trt.contracts.manifest import (
    SCHEMA_VERSION,
    TOKENIZER_DIR,
    GraphEntry,
    Manifest,
    ModelInfo,
    ParityReport,
    Versions,
    VisionInfo,
)
from seer_trt.contracts.outfolder import check_target, export_files, is_export, replace_folder
from seer_trt.contracts.profiles import LengthBuckets

Log = Callable[[str], None]


def versions(opset: int) -> Versions:
    import onnx
    import onnxruntime
    import onnxscript
    import torch

    import seer_trt

    return Versions(
        seer_trt=seer_trt.__version__,
        torch=torch.__version__,
        onnx=onnx.__version__,
        onnxscript=onnxscript.__version__,
        onnxruntime=onnxruntime.__version__,
        opset=opset,
    )


def vision_info(v: DiffusionMLLMConfig) -> VisionInfo:
    """How the runtime cuts images into tiles and splices their features (``DiffusionMLLM.image_features`` /
    ``merge_anyres``)."""
    return VisionInfo(
        image_size=v.vision.image_size,
        patch_size=v.vision.patch_size,
        tokens_per_tile=v.features_per_tile,  # after the family's pool: the runtime reads the side from it
        image_aspect_ratio=v.image_aspect_ratio,
        patch_merge_type=v.patch_merge_type,
        grid_pinpoints=tuple(v.grid_pinpoints),
        anyres_max_tiles=v.anyres_max_tiles,
        newline="unpad" if "unpad" in v.patch_merge_type and v.has_tower else "none",
        pool_stride=v.image_pool_stride,
        encoder=FAMILIES[v.family].front_end,
        placement=FAMILIES[v.family].image_placement,
        prefix_ids=v.image_prefix_ids,
        suffix_ids=v.image_suffix_ids,
    )


def default_buckets(cfg: DiffusionMLLMConfig) -> LengthBuckets:
    """Answer buckets over the generation window; prompt buckets over one image's features plus text."""
    side = cfg.feature_side
    per_tile = cfg.features_per_tile + side  # a tile's features plus at most one newline per feature row
    if cfg.image_aspect_ratio in ("pad", "center_crop"):
        tiles = 1
    else:  # the base tile plus the grid (anyres_max_N shrinks the grid to about N tiles)
        tiles = 1 + (cfg.anyres_max_tiles or max(w * h for w, h in cfg.grid_pinpoints) // cfg.vision.image_size**2)
    return LengthBuckets.for_model(cfg.generation.gen_length, tiles * per_tile)


def model_info(name: str, cfg: DiffusionMLLMConfig, folder: Path | None = None) -> ModelInfo:
    """``folder``: the checkpoint, whose config.json may name the synthetic task family a fixture was trained on."""
    t = cfg.text
    family = None
    if folder is not None and (folder / "config.json").is_file():
        family = json.loads((folder / "config.json").read_text()).get("task_family")
    return ModelInfo(
        name=name,
        architecture="llava_llada",
        hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size,
        num_layers=t.num_hidden_layers,
        num_heads=t.num_attention_heads,
        vocab_size=t.vocab_size,
        task_family=family,
        family=cfg.family,
        loop_blocks=FAMILIES[cfg.family].loop_blocks,
        logit_shift=int(FAMILIES[cfg.family].shift_logits),
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
    """The absolute output folder, if it may be written (``seer_trt.contracts.outfolder.check_target``): new, empty, or an
    export (``--force``); never a folder holding anything seer-export did not write.

    Raises:
        FolderError: ``out`` is a file or under one, holds the user's files, is an export and ``force`` is not
            set, or is not writable.
    """
    return check_target(out, force, is_export, "--out", "an export", legacy=export_files).path


@contextlib.contextmanager
def staging_folder(out: Path, force: bool) -> Iterator[Path]:
    """A temporary folder next to ``out`` (inside it when it is a mount point), moved onto ``out`` only if the
    block completes; removed otherwise, Ctrl-C and SIGTERM included.

    Raises:
        FolderError: see ``check_out``; or the folder cannot be created.
    """
    with replace_folder(check_target(out, force, is_export, "--out", "an export", legacy=export_files)) as staging:
        yield staging


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
    source = open_source(options.model, options.checkpoint)  # its config checked against its tensors, then built
    from seer_export.onnx.export import export_graph  # torch and the exporter: only for a checkpoint that fits

    stage(f"checkpoint {source.folder}: {len(source.tensors)} tensors, config and tokenizer checked")
    if options.validate:
        check_validation_memory(source, options)
    seer = source.config.seer
    names = for_front_end(options.graphs, FAMILIES[source.config.family].front_end)
    specs = graph_specs(model_dims(source.config), options.precision, names, probe=seer.signal == "probe",
                        scores=ranks_by_score(source.config.family))  # Dream's: denoise returns its scores  # fmt: skip
    with staging_folder(options.out, options.force) as staging:
        entries: dict[str, GraphEntry] = {}
        weights = SharedWeights(staging)
        try:
            for name, spec in specs.items():
                path = staging / f"{name}.onnx"
                before = weights.size
                precision = graph_precision(name, options.precision)  # image_tokens: fp32 always
                entry, ops = export_graph(spec, precision, source, options.opset, path, weights, options.verbose)
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
            model=model_info(options.model, source.config, source.folder),
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
            # written once here, read by both runtimes: how a request's gen_length shapes the window, and what the
            # cost model's calibration times
            lengths=WindowRule.of(source.config.generation, FAMILIES[source.config.family].loop_blocks),
            cost_calibration=CostCalibration(),
        )
        if options.validate:
            from seer_export.onnx.parity import summary_table, validate

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
