"""A component model of the CPU flavour: one exported graph on ONNX Runtime, inside the Python backend.

In:  (at load) the model's folder, its config (inputs/outputs written from the manifest's ``GraphSpec``) and
     parameters ``model_file`` (the ONNX file in the version folder) and ``threads``; then requests carrying
     the graph's inputs by name.
Out: one response per request with the graph's outputs by name, or the error ONNX Runtime gave for that request:
     INVALID_ARG for a missing input or one ONNX Runtime refuses (shape, type), INTERNAL for anything else.

The Triton build that runs on CPU machines (bundled in nvidia-pytriton) has no ONNX Runtime backend, so this
model is what the orchestrator's BLS calls there; the GPU flavour uses Triton's own TensorRT / ONNX Runtime
backends instead, with the same names and I/O.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class Model:
    """Runs one ONNX graph per request."""

    def __init__(self, args: dict[str, Any], config: dict[str, Any]) -> None:
        import onnxruntime as ort

        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.name = config["name"]
        path = Path(args["model_repository"]) / args["model_version"] / params["model_file"]
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = int(params.get("threads", "0"))
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.inputs = [t["name"] for t in config["input"]]
        self.outputs = [t["name"] for t in config["output"]]
        found = ([i.name for i in self.session.get_inputs()], [o.name for o in self.session.get_outputs()])
        if found != (self.inputs, self.outputs):
            raise RuntimeError(
                f"model {self.name!r}: {path.name} has inputs/outputs {found}, its config.pbtxt "
                f"{(self.inputs, self.outputs)}; regenerate the repository with seer-triton"
            )

    def execute(self, requests: list) -> list:
        import triton_python_backend_utils as pb
        from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

        from seer_trt.serving.triton.orchestrator import error_response

        responses = []
        for request in requests:
            tensors = {n: pb.get_input_tensor_by_name(request, n) for n in self.inputs}
            missing = [n for n, t in tensors.items() if t is None]  # not enforced for a batched Python model
            if missing:
                responses.append(error_response(pb, f"model {self.name!r}: the request lacks input(s) {missing}; "
                                                    f"send every input of its config", "input"))  # fmt: skip
                continue
            try:
                values = self.session.run(self.outputs, {n: t.as_numpy() for n, t in tensors.items()})
            except Exception as err:  # ONNX Runtime's own exception types: a bad shape or value in this request
                kind = "input" if isinstance(err, InvalidArgument) else "internal"
                responses.append(error_response(pb, f"model {self.name!r}: {err}", kind))
                continue
            responses.append(pb.InferenceResponse([pb.Tensor(n, v) for n, v in zip(self.outputs, values, strict=True)]))
        return responses

    def finalize(self) -> None:
        self.session = None
