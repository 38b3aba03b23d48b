"""``seer-quantize``: a copy of an export whose window graphs hold quantized weights (docs/DESIGN.md "Quantized
exports").

In:  ``--engines SRC`` (a ``seer-export`` folder, verified against its checksums), ``--scheme``, ``--out DST``
     (default: SRC's name with ``-SCHEME``), ``--force``, ``--check N`` held-out prompts; for the trt-* schemes
     ``--calibrate N`` held-out prompts or ``--calibration-prompts FILE``.
Out: DST: SRC's graphs, tokenizer and shared weights, with ``denoise`` (and ``denoise_logits``) rewritten; each such
     graph's manifest entry records the scheme, the runtime that runs its quantized ops, the tool and the method;
     checksums of every file the graphs read. The step-zero graph (what Seer reads: the probe's residual stream,
     the MLP statistic), embed and vision stay as exported, so Seer's cut is the source's. Before the folder is
     swapped in, ``--check`` prompts run through SRC and DST on ONNX Runtime's CPU provider and the share of equal
     answers is printed and recorded (the fixture task only; other models are not checked).

Schemes:

    int8      ONNX Runtime CPU: ``quantize_dynamic``, MatMul weights int8 per output channel (``MatMulConstBOnly``),
              activations quantized per call (``DynamicQuantizeLinear`` + ``MatMulInteger``)
    int4      ONNX Runtime CPU: ``MatMulNBitsQuantizer``, MatMul weights int4 in blocks of 32, symmetric
              (``MatMulNBits``)
    trt-int8  TensorRT: NVIDIA ModelOpt's Q/DQ (``seer_export.qdq``), calibrated on the source's own calls
    trt-fp8   (int8 / FP8 weights and activations, int4 weights only); ``seer-build`` builds them, ONNX
    trt-int4  Runtime's CPU provider runs them too (dequantizing: the check's and seer-eval's accuracy)

TensorRT parses neither MatMulInteger nor MatMulNBits, so ``seer-build`` refuses int8 and int4. Nothing is written
outside a staging folder that replaces DST only when complete (``replace_folder``).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seer_export import qdq
from seer_trt.cli.common import Parser, add_verbose, run_main
from seer_trt.contracts.errors import ConfigError, InputError

PROG = "seer-quantize"
SCHEMES = {
    "int8": "ONNX Runtime CPU: quantize_dynamic, MatMul weights int8 per channel, activations per call (MatMulInteger)",
    "int4": "ONNX Runtime CPU: MatMulNBitsQuantizer, MatMul weights int4, blocks of 32, symmetric (MatMulNBits)",
    **{name: s.about for name, s in qdq.SCHEMES.items()},
}
QUANTIZED_GRAPHS = ("denoise", "denoise_logits")  # the loop's graphs; step zero, embed and vision stay as exported
RUNTIMES = {"int8": "onnxruntime-cpu", "int4": "onnxruntime-cpu"}  # what runs a scheme's ops; trt-*: "tensorrt"
PRECISIONS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}  # a graph's precision, in ModelOpt's words
# how calibration prompts are answered: greedy (sampling runs denoise_logits, whose calls are not recorded), the
# fixed rule, no prompt cache (the window graph sees the whole prompt)
CALIBRATION_REQUEST = {"temperature": 0.0, "remasking": "low_confidence", "decoding": "fixed", "cache": "none"}
CHECK_SEED, CALIBRATION_SEED = 7, 11  # held-out sets of the fixture task, apart from each other and seer-eval's


@dataclasses.dataclass(frozen=True)
class QuantizeOptions:
    engines: Path
    scheme: str
    out: Path | None = None
    force: bool = False
    check: int = 16
    calibrate: int = 16  # trt-*: held-out fixture prompts whose denoise calls calibrate the activations
    calibration_prompts: Path | None = None  # trt-*: a text file, one prompt per line, instead of the fixture's


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog=PROG, description="Write a copy of an export whose window graphs (denoise, denoise_logits) "
                "hold quantized MatMul weights: int8 / int4 by ONNX Runtime's own tools, for its CPU provider, or "
                "trt-int8 / trt-fp8 / trt-int4 Q/DQ graphs by NVIDIA ModelOpt (in its own venv: python -m "
                "seer_export.qdq setup), for seer-build's TensorRT plans, calibrated on the source's own calls. "
                "Step zero, embed and vision stay as exported, so Seer's cut is unchanged. The runtime runs every "
                "copy with no other change (seer-run, seer-serve, seer-eval --engines DST; ONNX Runtime runs the "
                "Q/DQ graphs by dequantizing).")  # fmt: skip
    ap.add_argument("--engines", type=Path, required=True, help="the export to quantize (seer-export --out)")
    ap.add_argument("--scheme", required=True, choices=sorted(SCHEMES),
                    help="; ".join(f"{k}: {v}" for k, v in SCHEMES.items()))  # fmt: skip
    ap.add_argument("--out", type=Path, help="the quantized export (default: next to --engines, its name + -SCHEME)")
    ap.add_argument("--force", action="store_true", help="replace --out when it is an export seer-trt wrote")
    ap.add_argument("--check", type=int, default=16, metavar="N",
                    help="held-out prompts answered by both exports before the copy is kept; their agreement is "
                    "printed and recorded (default 16; 0: none; fixture-task exports only)")  # fmt: skip
    ap.add_argument("--calibrate", type=int, default=16, metavar="N",
                    help="trt-* schemes: held-out prompts of the fixture task answered by the source export; "
                    "every denoise call they make is recorded and calibrates the activations (default 16)")  # fmt: skip
    ap.add_argument("--calibration-prompts", type=Path, metavar="FILE",
                    help="trt-* schemes: a UTF-8 text file, one prompt per line (text only), answered instead of "
                    "the fixture's held-out prompts: what a real model calibrates on")  # fmt: skip
    add_verbose(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, build_parser(), work, argv, signals=True)


def work(args: argparse.Namespace) -> int:
    if args.check < 0:
        raise InputError(f"--check {args.check} must be at least 0")
    if args.scheme not in qdq.SCHEMES and args.calibration_prompts is not None:
        raise InputError(f"--calibration-prompts calibrates the trt-* schemes; {args.scheme} quantizes weights only "
                         f"and takes none: drop it")  # fmt: skip
    if args.calibrate < 1:
        raise InputError(f"--calibrate {args.calibrate} must be at least 1")
    options = QuantizeOptions(args.engines, args.scheme, args.out, args.force, args.check, args.calibrate,
                              args.calibration_prompts)  # fmt: skip
    out = run_quantize(options, lambda line: print(line, file=sys.stderr, flush=True))
    print(out)
    return 0


def quantize_graph(src: Path, dst: Path, scheme: str) -> None:
    """``src`` (an ONNX file and its external data) quantized into ``dst`` and ``dst.data``."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from seer_export.onnx.shared_weights import CONSTANT_PREFIX, load_inlined

    model, weights = load_inlined(src)
    # only the checkpoint's weights are quantized; a MatMul by a constant of the graph's own (RoPE's exact +-1
    # rotation) stays as exported
    exclude = [n.name for n in model.graph.node if n.op_type == "MatMul"
               and (n.input[1] not in weights or n.input[1].startswith(CONSTANT_PREFIX))]  # fmt: skip
    if scheme == "int8":
        with tempfile.TemporaryDirectory(dir=dst.parent) as tmp:  # quantize_dynamic reads a file
            whole = Path(tmp) / "whole.onnx"
            onnx.save(model, str(whole), save_as_external_data=True, location="whole.data")
            quantize_dynamic(str(whole), str(dst), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                             per_channel=True, extra_options={"MatMulConstBOnly": True}, nodes_to_exclude=exclude,
                             use_external_data_format=True)  # fmt: skip
    else:
        quantizer = MatMulNBitsQuantizer(model, block_size=32, is_symmetric=True, nodes_to_exclude=exclude)
        quantizer.process()
        quantizer.model.save_model_to_file(str(dst), use_external_data_format=True)


def run_quantize(options: QuantizeOptions, log: Callable[[str], None]) -> Path:
    """Write the quantized copy; returns its folder.

    Raises:
        ConfigError: an unknown scheme, an export already quantized or without a window graph, --out its own source.
        ManifestError / IntegrityError: the source is no export, or its files are not the manifest's.
        FolderError: --out cannot be written (a folder of the user's, a file).
    """
    import onnxruntime

    from seer_trt.contracts.integrity import checksums, verify
    from seer_trt.contracts.manifest import MANIFEST_FILE, SCHEMA_VERSION, Manifest
    from seer_trt.contracts.outfolder import check_target, export_files, is_export, replace_folder

    start = time.perf_counter()

    def stage(text: str) -> None:
        log(f"[{time.perf_counter() - start:7.1f}s] {text}")

    if options.scheme not in SCHEMES:
        raise ConfigError(f"unknown scheme {options.scheme!r}; choose from {sorted(SCHEMES)}")
    src = options.engines.resolve()
    manifest = Manifest.read(src)
    done = sorted(n for n, g in manifest.graphs.items() if g.quantization is not None)
    if done:
        raise ConfigError(f"{src} is quantized already ({', '.join(done)}: "
                          f"{manifest.graphs[done[0]].quantization['scheme']}); quantize the export it came from")  # fmt: skip
    graphs = [g for g in QUANTIZED_GRAPHS if g in manifest.graphs]
    if not graphs:
        raise ConfigError(f"{src} has no window graph to quantize (it has {sorted(manifest.graphs)})")
    out = (options.out or src.with_name(f"{src.name}-{options.scheme}")).resolve()
    if out == src:
        raise ConfigError(f"--out {out} is the export being quantized; pass another folder")
    target = check_target(out, options.force, is_export, "--out", "an export", legacy=export_files)
    install = qdq.ModeloptInstall.find() if options.scheme in qdq.SCHEMES else None  # before any work
    prompts = read_prompts(options.calibration_prompts) if install and options.calibration_prompts else None
    checked = verify(src, manifest, log=stage)
    stage(f"{src}: {checked} file(s) match the manifest's sha256; quantizing {', '.join(graphs)} to {options.scheme}")
    with replace_folder(target) as staging:
        for name in (*{f for e in manifest.graphs.values() for f in (e.file, e.external_data) if f},
                     *([manifest.weights.index] if manifest.weights else []), MANIFEST_FILE):  # fmt: skip
            if name not in {manifest.graphs[g].file for g in graphs}:
                shutil.copy2(src / name, staging / name)
        shutil.copytree(src / manifest.tokenizer, staging / manifest.tokenizer)
        entries = dict(manifest.graphs)
        calls, calibration = calibration_calls(src, options, prompts, stage) if install else ([], {})
        for g in graphs:
            entry = manifest.graph(g)
            record: dict[str, Any] = {"scheme": options.scheme, "method": SCHEMES[options.scheme]}
            if install is None:
                quantize_graph(src / entry.file, staging / entry.file, options.scheme)
                record.update(
                    runtime=RUNTIMES[options.scheme], tool=f"onnxruntime.quantization {onnxruntime.__version__}"
                )
            else:
                with tempfile.TemporaryDirectory(dir=staging) as work:
                    version, used = qdq.quantize_graph(src / entry.file, staging / entry.file, options.scheme, calls,
                                                      PRECISIONS[entry.precision], install, Path(work), stage)  # fmt: skip
                record.update(runtime="tensorrt", tool=f"nvidia-modelopt {version}",
                              calibration={**calibration, "calls_used": used})  # fmt: skip
            data = f"{entry.file}.data"
            size = (staging / data).stat().st_size
            entries[g] = dataclasses.replace(entry, external_data=data, size_bytes=size, quantization=record)
            stage(f"{g}: {entry.size_bytes / 2**20:.1f} MiB of weights -> {size / 2**20:.1f} MiB ({options.scheme})")
        # the plans of the source are fp32/fp16 engines of other graphs: none is copied
        # written by this version, so it says this version's schema (a 2.5 source gains 2.6's window rule and
        # calibration, read from what its own manifest implies)
        quantized = dataclasses.replace(manifest, schema_version=SCHEMA_VERSION, graphs=entries, engines={}, builds={},
                                        checksums={})  # fmt: skip
        quantized = dataclasses.replace(quantized, checksums=checksums(staging, quantized))
        quantized.write(staging)
        agreement = check(src, staging, options.check, stage)
        if agreement is not None:
            for g in graphs:
                entries[g].quantization["check"] = agreement
            quantized.write(staging)
    stage(f"done: {out}")
    return out


def read_prompts(path: Path) -> list[str]:
    """The calibration prompts of ``--calibration-prompts``: one per line, blank lines skipped.

    Raises:
        ConfigError: the file cannot be read, or holds no prompt.
    """
    try:
        prompts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"--calibration-prompts {path} cannot be read ({err}); pass a UTF-8 text file, one prompt "
                          f"per line") from None  # fmt: skip
    if not prompts:
        raise ConfigError(f"--calibration-prompts {path} holds no prompt; write one per line")
    return prompts


def calibration_calls(src: Path, options: QuantizeOptions, prompts: list[str] | None,
                      stage: Callable[[str], None]) -> tuple[list, dict]:  # fmt: skip
    """The ``denoise`` calls the source export makes answering the calibration prompts (``prompts``, else the
    fixture task's held-out ones; Seer, the fixed rule, no cache), and their record for the manifest.

    Raises:
        ConfigError: no prompts and a model that does not speak the fixture task; a prompt that failed.
    """
    from seer_trt.eval.accuracy import fixture_samples
    from seer_trt.runtime.pipeline import SeerPipeline
    from seer_trt.runtime.request import Request

    pipe = SeerPipeline.from_manifest(src, threads=1)
    try:
        if prompts is not None:
            requests = [Request(text, **CALIBRATION_REQUEST) for text in prompts]
            path = options.calibration_prompts.resolve()
            source = f"{path} (sha256 {hashlib.sha256(path.read_bytes()).hexdigest()[:16]})"
        else:
            try:
                samples = fixture_samples(pipe, options.calibrate, CALIBRATION_SEED)
            except ConfigError as err:
                raise ConfigError(f"{err}; calibrate it on its own prompts with --calibration-prompts FILE") from None
            requests = [Request(s.question, s.image, **CALIBRATION_REQUEST) for s in samples]
            source = f"fixture held-out seed {CALIBRATION_SEED}"
        stage(f"calibration: answering {len(requests)} prompt(s) ({source}) with the source export")
        calls, made = qdq.record_calls(pipe, requests)
    finally:
        pipe.close()
    stage(f"calibration: {made} denoise calls made, {len(calls)} recorded")
    return calls, {"prompts": len(requests), "source": source, "requests": CALIBRATION_REQUEST, "calls_made": made,
                   "calls_recorded": len(calls)}  # fmt: skip


def check(src: Path, dst: Path, n: int, stage: Callable[[str], None]) -> dict[str, Any] | None:
    """``n`` held-out prompts through both exports (Seer, the fixed rule, cache none): how many answers are equal."""
    if n == 0:
        return None
    from seer_trt.eval.accuracy import fixture_samples
    from seer_trt.runtime.pipeline import SeerPipeline
    from seer_trt.runtime.request import Request

    before, after = SeerPipeline.from_manifest(src, threads=1), SeerPipeline.from_manifest(dst, threads=1)
    try:
        try:
            prompts = fixture_samples(before, n, CHECK_SEED)
        except ConfigError:  # not the fixture task: no held-out prompts to speak it
            stage("check skipped: the held-out prompts are the fixture task's, which this model does not speak")
            return None
        requests = [Request(s.question, s.image, decoding="fixed", cache="none") for s in prompts]
        a, b = before.generate(requests), after.generate(requests)
    finally:
        before.close()
        after.close()
    same = sum(x.token_ids == y.token_ids for x, y in zip(a, b, strict=True))
    kept = sum(x.kept == y.kept for x, y in zip(a, b, strict=True))
    stage(f"check: {same}/{n} answers equal to the source's, {kept}/{n} kept windows equal (Seer, fixed rule)")
    return {"prompts": n, "same_answers": same, "same_kept": kept}


if __name__ == "__main__":
    sys.exit(main())
