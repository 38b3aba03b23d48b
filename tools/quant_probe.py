"""Quantize an export's window graph with ONNX Runtime's own tools, for measuring before ``seer-quantize`` exists.

    python tools/quant_probe.py EXPORT OUT       # writes OUT/int8 and OUT/int4: copies of EXPORT

``int8``: ``quantize_dynamic``, MatMul weights per channel (``MatMulConstBOnly``); ``int4``:
``MatMulNBitsQuantizer``, block 32, symmetric. Only ``denoise`` is quantized; step zero (what Seer reads), embed and
vision stay as exported, still reading the shared weights file. The copies record no checksums (open them with
``SeerPipeline.from_manifest(..., verify=False)``, or ``seer-eval``, which does not verify). Issue 23 measured with it
(docs/results.md); the product's command will write a real manifest record instead.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path


def quantize(src: Path, dst: Path, scheme: str) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    shutil.copytree(src, dst)
    model = onnx.load(str(src / "denoise.onnx"))  # with its external data
    (dst / "denoise.onnx").unlink()
    if scheme == "int8":
        with tempfile.TemporaryDirectory() as tmp:
            fp32 = Path(tmp) / "denoise.onnx"
            onnx.save(model, str(fp32), save_as_external_data=True, location="denoise.data")
            quantize_dynamic(str(fp32), str(dst / "denoise.onnx"), weight_type=QuantType.QInt8,
                             op_types_to_quantize=["MatMul"], per_channel=True,
                             extra_options={"MatMulConstBOnly": True}, use_external_data_format=True)  # fmt: skip
    else:
        q = MatMulNBitsQuantizer(model, block_size=32, is_symmetric=True)
        q.process()
        q.model.save_model_to_file(str(dst / "denoise.onnx"), use_external_data_format=True)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["checksums"] = {}
    manifest["weights"] = None  # no tensor sharing: the quantized graph holds its own; the others read weights.data
    manifest["graphs"]["denoise"]["external_data"] = "denoise.onnx.data"
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=1))


def main(src: str, out: str) -> int:
    for scheme in ("int8", "int4"):
        dst = Path(out) / scheme
        if dst.exists():
            print(f"{dst} exists; pass a new OUT", file=sys.stderr)
            return 2
        quantize(Path(src), dst, scheme)
        size = (dst / "denoise.onnx.data").stat().st_size
        print(f"{scheme}: {dst} (window graph weights {size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
