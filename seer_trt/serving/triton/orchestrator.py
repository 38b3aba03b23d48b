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
from seer_trt.serving.stops import cut_at_stop, ids_holding
from seer_trt.serving.triton.wire import (  # noqa: F401 - REQUEST_INPUTS, RESPONSE_OUTPUTS: the contract's old home
    REQUEST_INPUTS,
    RESPONSE_OUTPUTS,
    ByteLimits,
    error_kind,
    error_response,
    message,
    read_reply,
    read_request,
    write_outputs,
)

ENGINE_BUILDER = "tensorrt"  # the build whose plans Triton's TensorRT backend serves (the manifest's builds key)


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
        limits = ByteLimits.of(self.pipeline, self.engine.limits.max_answer_chars)
        rows: list[list | Result] = []  # per request: its pipeline Requests, or why it cannot be run
        stops: list[tuple] = []  # per request: each row's stop sequences
        for request in requests:
            try:
                rows.append(read_request(pb, request, limits))
                reply = read_reply(pb, request, limits)
                if reply.stream:
                    raise InputError(
                        "stream is set, but this repository's orchestrator (--orchestration bls) "
                        "answers whole; send stream false, or regenerate it with --orchestration engine"
                    )
                stops.append(reply.stops)
            except Exception as err:  # noqa: BLE001 - any failure of one request is that request's error
                # its Requests, when read_reply failed after read_request, give way to its error
                rows[len(stops) :] = [Result.failed(message(err), error_kind(err))]
                stops.append(())
        flat = [r for group in rows if isinstance(group, list) for r in group]
        results = iter(self.run(flat))  # a failed shared call: the engine's retry policy
        responses = []
        for group, seqs in zip(rows, stops, strict=True):
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
            responses.append(
                pb.InferenceResponse(write_outputs(pb, *cut(answers, seqs, lambda ids: self.engine.decode(ids))))
            )
        return responses

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


def cut(answers: list, stops: tuple[tuple[str, ...], ...], decode) -> tuple[list, list[str]]:
    """Each answer with its text cut before its first stop sequence (``seer_trt.serving.stops``), its ids those the
    text holds."""
    out, texts = [], []
    for answer, seqs in zip(answers, stops, strict=True):
        text, stopped = cut_at_stop(answer.text, seqs) if seqs else (answer.text, False)
        if stopped:
            answer = dataclasses.replace(
                answer, token_ids=answer.token_ids[: ids_holding(answer.token_ids, text, decode)]
            )
        out.append(answer)
        texts.append(text)
    return out, texts
