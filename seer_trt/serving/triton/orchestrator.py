"""The orchestrator model: ``SeerPipeline`` inside Triton's Python backend, its graphs called through BLS (DESIGN "Serving and embedding").

In:  (at load) the export copied into the version folder (``manifest.json``, ``tokenizer/``) and the
     ``components`` parameter (graph -> component model name); then requests of REQUEST_INPUTS.
Out: one response per request with RESPONSE_OUTPUTS, or an error response naming what was wrong: a client's
     error (its own input was bad) with Triton's INVALID_ARG code (gRPC INVALID_ARGUMENT, HTTP 400), any other
     failure with INTERNAL (gRPC INTERNAL, HTTP 500).

    execute(requests) ─► Request per row ─► Engine.submit, Engine.run_until (the one engine seer-serve runs,
                         seer_trt.runtime.engine) ─► BlsBackend.run(graph, feeds) ─► InferenceRequest(component).exec()

Every request of one ``execute`` call (Triton's dynamic batcher gathers them) is submitted to the model instance's
engine, which ``execute`` then steps on its own thread until all are answered (Triton allows BLS calls only there):
the rows are admitted together, step zero batched and the truncated windows routed as seer-serve's engine does.
A request may carry several rows (a leading batch axis); its answers come back in the same order. A row's prompt
and image are measured in bytes before anything decodes them (``ByteLimits``), so an oversized one costs the server
no more than receiving it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from seer_trt.backends.base import HostMemory, axis_sizes, host_view, selected
from seer_trt.contracts.backend import DeviceArray, Transfers
from seer_trt.contracts.errors import InputError, ManifestError, SeerError
from seer_trt.contracts.graphs import GraphSpec
from seer_trt.contracts.manifest import Manifest
from seer_trt.contracts.policies import CacheConfig
from seer_trt.contracts.profiles import LengthBuckets, max_sizes
from seer_trt.serving.triton.pbtxt import TensorConfig

# The orchestrator's contract with clients; every tensor has a leading batch axis (rows), not listed in dims.
REQUEST_INPUTS = (
    TensorConfig("prompt", "TYPE_STRING", (1,)),  # UTF-8 question; "<image>" marks where the image goes
    TensorConfig("image", "TYPE_STRING", (1,), optional=True),  # encoded PNG/JPEG bytes; empty: no image
    TensorConfig("gen_length", "TYPE_INT32", (1,), optional=True),  # answer window N; 0: the export's default
    TensorConfig("steps", "TYPE_INT32", (1,), optional=True),  # denoising steps over N; 0: the default
    TensorConfig("seer", "TYPE_BOOL", (1,), optional=True),  # False: the padded baseline; default True
    TensorConfig("decoding", "TYPE_STRING", (1,), optional=True),  # fixed | threshold:TAU | factor:F; empty: default
    TensorConfig("early_stop", "TYPE_BOOL", (1,), optional=True),  # LLaDA-V's stop at <|eot_id|>; default False
    # low_confidence | Dream's topk_margin | entropy (random: sampling exports); empty: the export's default
    TensorConfig("remasking", "TYPE_STRING", (1,), optional=True),
)
RESPONSE_OUTPUTS = (
    TensorConfig("text", "TYPE_STRING", (1,)),  # the answer, special tokens dropped
    TensorConfig("token_ids", "TYPE_INT64", (-1,)),  # answer ids before <|eot_id|>; rows padded with -1
    TensorConfig("kept", "TYPE_INT32", (1,)),  # L*: answer positions denoised (N without Seer)
    TensorConfig("denoise_steps", "TYPE_INT32", (1,)),  # denoising steps used
)
PAD_ID = -1  # fills token_ids rows shorter than the request's longest
ENGINE_BUILDER = "tensorrt"  # the build whose plans Triton's TensorRT backend serves (the manifest's builds key)
UTF8_MAX_BYTES = 4  # the most bytes UTF-8 spends on one character (RFC 3629)


@dataclasses.dataclass(frozen=True)
class ByteLimits:
    """What one row may send, checked on its raw bytes before they are decoded (``read_request``)."""

    prompt_chars: int  # characters of message text the pipeline accepts (PromptFormat.max_chars)
    image_bytes: int  # an encoded image file's bytes (the pipeline's image limit: the manifest's max_image_bytes)

    @property
    def prompt_bytes(self) -> int:
        """UTF-8 bytes of the longest prompt that can hold ``prompt_chars`` characters."""
        return UTF8_MAX_BYTES * self.prompt_chars

    @classmethod
    def of(cls, pipeline: Any) -> ByteLimits:
        """The limits of a ``SeerPipeline``."""
        return cls(pipeline.prompts.max_chars, pipeline.image_limits.bytes)


class ServingError(SeerError):
    """A component model answered a BLS call with an error."""


class BlsBackend:
    """``seer_trt.contracts.backend.Backend`` whose graphs are Triton models, called from inside the server (BLS)."""

    name = "triton-bls"

    def __init__(self, pb: Any, manifest: Manifest, models: Mapping[str, str], plans: Sequence[str] = ()) -> None:
        """
        Args:
            pb: the ``triton_python_backend_utils`` module.
            manifest: the export's manifest (graph contracts, and the TensorRT build's profiles).
            models: graph name -> component model name.
            plans: graphs served as TensorRT plans (``tensorrt_plan`` models): their calls must fit the profiles
                the manifest's ``builds["tensorrt"]`` records.
        """
        self.pb = pb
        self.manifest = manifest
        self.models = dict(models)
        build = manifest.builds.get(ENGINE_BUILDER)
        served = [g for g in plans if build is not None and g in build.engines]
        self.limits = {g: max_sizes(build.engines[g].profiles) for g in served}
        self._buckets = build.buckets if served else None
        self.request_memory = {}  # outputs in host memory even from GPU models: the pipeline works on numpy arrays
        if hasattr(pb, "PreferredMemory"):
            self.request_memory["preferred_memory"] = pb.PreferredMemory(pb.TRITONSERVER_MEMORY_CPU, 0)
        # the orchestrator's own memory is the host's: every tensor, the prompt K/V included, crosses to the component
        # model at each call and is counted as such (docs/DESIGN.md "Serving and embedding")
        self.transfers = Transfers()
        self.memory = HostMemory(self.transfers)

    def spec(self, graph: str) -> GraphSpec:
        return self.manifest.graph(graph).spec

    def max_shape(self, graph: str) -> dict[str, int] | None:
        """The largest sizes of a plan-served graph's profiles (packed calls are split to fit); None otherwise."""
        return self.limits.get(graph)

    def buckets(self) -> LengthBuckets | None:
        return self._buckets

    def run(self, graph: str, feeds: Mapping[str, np.ndarray | DeviceArray], outputs: Collection[str] | None = None,
            into: Mapping[str, DeviceArray] | None = None) -> dict[str, np.ndarray]:  # fmt: skip
        spec = self.spec(graph)
        axis_sizes(spec, feeds)  # the same checks as a local backend, before anything is sent
        into = into or {}
        wanted = selected(spec, outputs, into)  # the component model sends back only these (and ``into``'s)
        feeds = {k: host_view(v) if isinstance(v, DeviceArray) else v for k, v in feeds.items()}
        if graph not in self.models:
            raise ManifestError(
                f"this repository serves no {graph!r} model (it has {sorted(self.models)}); regenerate it with "
                f"seer-triton from an export holding that graph"
            )
        pb = self.pb
        inputs = [pb.Tensor(t.name, np.ascontiguousarray(feeds[t.name])) for t in spec.inputs]
        request = pb.InferenceRequest(
            model_name=self.models[graph],
            inputs=inputs,
            requested_output_names=[*wanted, *into],
            **self.request_memory,
        )
        response = request.exec()
        if response.has_error():
            raise ServingError(f"model {self.models[graph]!r} ({graph}) failed: {response.error().message()}")
        out = {name: pb.get_output_tensor_by_name(response, name).as_numpy() for name in (*wanted, *into)}
        for name, target in into.items():
            np.copyto(host_view(target), out.pop(name))
        self.transfers.count(feeds, {**out, **{n: host_view(t) for n, t in into.items()}})
        return out

    def close(self) -> None:
        pass


class Model:
    """The orchestrator: requests in, Seer answers out."""

    def __init__(self, args: dict[str, Any], config: dict[str, Any]) -> None:
        import triton_python_backend_utils as pb

        from seer_trt.runtime.pipeline import SeerPipeline

        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        folder = Path(args["model_repository"]) / args["model_version"] / params["export"]
        manifest = Manifest.read(folder)
        backend = BlsBackend(pb, manifest, json.loads(params["components"]), json.loads(params.get("plans", "[]")))
        cache = CacheConfig.from_dict(json.loads(params.get("cache", "{}")))  # a repository before 2.1: none
        self.serve(pb, SeerPipeline(folder, manifest, backend, policy=params["policy"], cache=cache))

    def serve(self, pb: Any, pipeline: Any) -> None:
        """Answer through ``pipeline`` (``__init__`` builds it from Triton's arguments; tests build it directly):
        its engine is stepped by hand in ``execute`` and prepares every request there, so no graph call leaves
        ``execute``'s thread."""
        from seer_trt.runtime.engine import Engine

        self.pb, self.pipeline = pb, pipeline
        self.engine = Engine(pipeline, max_queue=0, prepare_threads=0)  # max_queue 0: execute's batch, unbounded

    def execute(self, requests: list) -> list:
        from seer_trt.runtime.request import Result

        pb = self.pb
        limits = ByteLimits.of(self.pipeline)
        rows: list[list | Result] = []  # per request: its pipeline Requests, or why it cannot be run
        for request in requests:
            try:
                rows.append(read_request(pb, request, limits))
            except Exception as err:  # noqa: BLE001 - any failure of one request is that request's error
                rows.append(Result.failed(message(err), error_kind(err)))
        flat = [r for group in rows if isinstance(group, list) for r in group]
        results = iter(self.answer(flat))
        responses = []
        for group in rows:
            if isinstance(group, Result):
                responses.append(error_response(pb, group.error, group.error_kind))
                continue
            answers = [next(results) for _ in group]
            failed = [(i, a) for i, a in enumerate(answers) if not a.ok]
            if failed:
                i, a = failed[0]  # the first failed row names the error, and its kind the status code
                where = f"row {i}: " if len(group) > 1 else ""
                responses.append(error_response(pb, where + a.error, a.error_kind))
                continue
            responses.append(pb.InferenceResponse(write_outputs(pb, answers)))
        return responses

    def answer(self, flat: list) -> list:
        """One ``Result`` per pipeline request, through the engine. The batch runs together; a request that failed
        in it for an internal reason (a component failed on a shape one request brought, which fails every row of
        that step) runs again alone, so only the ones that fail alone keep an error."""
        results = self.run(flat)
        if len(flat) > 1:
            for i, r in enumerate(results):
                if not r.ok and r.error_kind == "internal":
                    results[i] = self.run([flat[i]])[0]
        return results

    def run(self, requests: list) -> list:
        """Each request's ``Result`` from the engine, stepped here (``Engine.run_until``)."""
        from seer_trt.runtime.request import Result

        tickets = [self.engine.submit(r) for r in requests]
        self.engine.run_until(tickets)
        return [Result.failed(message(e), error_kind(e)) if (e := t.future.exception()) else t.future.result()
                for t in tickets]  # fmt: skip

    def finalize(self) -> None:
        self.engine.close()
        self.pipeline.close()


def message(err: BaseException) -> str:
    """A client's one-line error: our own errors as they are, anything else named by type, no object reprs (as the
    engine words a failure: ``seer_trt.runtime.engine.why``)."""
    from seer_trt.runtime.engine import why

    return why(err)


def error_kind(err: BaseException) -> str:
    """``Result.error_kind`` of a failure: "input" when the request's own input was bad, "internal" otherwise."""
    return "input" if isinstance(err, InputError) else "internal"


def error_response(pb: Any, text: str, kind: str | None) -> Any:
    """An error response: INVALID_ARG for a client's error (``kind`` "input"), INTERNAL (the default) otherwise.

    A Python backend older than error codes (its ``TritonError`` has no ``INVALID_ARG``) answers INTERNAL for both.
    """
    code = getattr(pb.TritonError, "INVALID_ARG", None) if kind == "input" else None
    error = pb.TritonError(text) if code is None else pb.TritonError(text, code)
    return pb.InferenceResponse(error=error)


def read_request(pb: Any, request: Any, limits: ByteLimits | None = None) -> list:
    """The pipeline ``Request``s of one Triton request, one per row.

    Args:
        limits: the most bytes a row's prompt and image may hold, checked before they are decoded; None: none.

    Raises:
        InputError: text that is not UTF-8, a prompt or image past ``limits``, or rows that disagree in number.
    """
    from seer_trt.runtime.request import Request

    prompt_tensor = pb.get_input_tensor_by_name(request, "prompt")
    if prompt_tensor is None:  # the Python backend does not enforce required inputs of a batched model
        raise InputError("the request has no 'prompt' input; send the question as a BYTES tensor 'prompt' [rows, 1]")
    prompts = prompt_tensor.as_numpy().reshape(-1).tolist()
    rows = len(prompts)

    def column(name: str) -> list | None:
        tensor = pb.get_input_tensor_by_name(request, name)
        if tensor is None:
            return None
        values = tensor.as_numpy().reshape(-1).tolist()
        if len(values) != rows:
            raise InputError(f"input {name!r} has {len(values)} rows, 'prompt' has {rows}; send one value per row")
        return values

    images, lengths, steps, seer, decodings, stops, remaskings = (
        column(n) for n in ("image", "gen_length", "steps", "seer", "decoding", "early_stop", "remasking")
    )
    out = []
    for i, prompt in enumerate(prompts):
        where = f"row {i}: " if rows > 1 else ""
        if not isinstance(prompt, bytes):
            raise InputError(f"{where}prompt is a {type(prompt).__name__}; send the question as BYTES (UTF-8 text)")
        if limits is not None and len(prompt) > limits.prompt_bytes:
            raise InputError(f"{where}prompt is {len(prompt)} bytes, more than the {limits.prompt_bytes} accepted "
                             f"({UTF8_MAX_BYTES} per character of the {limits.prompt_chars} max_prompt_chars); "
                             f"shorten it")  # fmt: skip
        try:
            text = prompt.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InputError(f"{where}prompt is not UTF-8 ({err.reason} at byte {err.start}); send UTF-8 "
                             f"text") from None  # fmt: skip
        image = images[i] if images else None
        if image is not None and not isinstance(image, bytes):
            raise InputError(f"{where}image is a {type(image).__name__}; send the encoded PNG/JPEG file as BYTES")
        if image is not None and limits is not None and len(image) > limits.image_bytes:
            raise InputError(f"{where}image is {len(image)} bytes, more than the {limits.image_bytes} accepted "
                             f"(max_image_bytes); send a smaller file")  # fmt: skip
        decoding = decodings[i] if decodings else None
        if decoding is not None and not isinstance(decoding, bytes):
            raise InputError(f"{where}decoding is a {type(decoding).__name__}; send it as BYTES, e.g. b'factor:1'")
        remasking = remaskings[i] if remaskings else None
        if remasking is not None and not isinstance(remasking, bytes):
            raise InputError(f"{where}remasking is a {type(remasking).__name__}; send it as BYTES, e.g. b'entropy'")
        try:
            out.append(
                Request(
                    text,
                    image=image or None,  # an empty image: none
                    gen_length=int(lengths[i]) if lengths and lengths[i] else None,
                    steps=int(steps[i]) if steps and steps[i] else None,
                    seer=bool(seer[i]) if seer is not None else True,
                    decoding=decoding.decode("utf-8", "replace") if decoding else None,  # empty: the default
                    early_stop=bool(stops[i]) if stops is not None else False,
                    remasking=remasking.decode("utf-8", "replace")[:32] if remasking else None,  # empty: the default
                )
            )
        except InputError as err:
            raise InputError(f"{where}{err}") from None
    return out


def write_outputs(pb: Any, answers: list) -> list:
    """RESPONSE_OUTPUTS tensors of one request's answers (rows in order)."""
    width = max(len(a.token_ids) for a in answers)
    ids = np.full((len(answers), width), PAD_ID, dtype=np.int64)
    for i, a in enumerate(answers):
        ids[i, : len(a.token_ids)] = a.token_ids
    return [
        pb.Tensor("text", np.array([[a.text.encode("utf-8")] for a in answers], dtype=np.object_)),
        pb.Tensor("token_ids", ids),
        pb.Tensor("kept", np.array([[a.kept] for a in answers], dtype=np.int32)),
        pb.Tensor("denoise_steps", np.array([[a.steps] for a in answers], dtype=np.int32)),
    ]
