"""The decoupled orchestrator: one engine inside Triton's Python backend, every request in its steps (docs/DESIGN.md
"Serving and embedding").

In:  (at load) the export copied into the version folder, whole, and the parameters ``backend``, ``provider``,
     ``threads``, ``policy``, ``cache``; then requests of ``wire.REQUEST_INPUTS``, from any number of Triton calls.
Out: per request, through its response sender: with ``stream``, one response per newly final text (``text`` only),
     then the last, flagged final, with the rest of the text and ``token_ids``, ``kept``, ``denoise_steps``; without,
     the last alone, holding the whole text. A client's error answers INVALID_ARG, any other failure INTERNAL.

    execute(requests) ─► wire.read_request / read_reply ─► Engine.check ─► Engine.submit (returns at once)
    engine thread:  Engine.step over every live row, whichever call submitted it ─► on_prefix ─► TextStream
                    ─► response_sender.send(text) ... ─► the ticket's Result ─► send(last, FINAL)

The model runs the export's own backend in-process (ONNX Runtime, or the TensorRT plans ``seer-build`` made), as
Triton's vLLM backend runs vLLM: one instance, one ``Engine`` on its own thread (``Engine.start``), so requests of
separate ``execute`` calls share each step's graph calls, as they do in seer-serve. A cancelled request (the client
closed its stream) is seen by a watcher thread and leaves the engine at the next step boundary.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

from seer_trt.contracts.policies import CacheConfig
from seer_trt.serving.stops import TextStream, cut_at_stop, ids_holding
from seer_trt.serving.triton.wire import (
    ByteLimits,
    Reply,
    error_kind,
    error_response,
    message,
    read_reply,
    read_request,
    text_response,
    write_outputs,
)

CANCEL_POLL_S = 0.005  # how often the watcher asks Triton which requests were cancelled: under one fixture step


class Answer:
    """One Triton request in flight: its rows' tickets, its response sender, what its stream has sent."""

    def __init__(self, model: Model, request: Any, reply: Reply, checked: list) -> None:
        self.model, self.request, self.reply = model, request, reply
        self.sender = request.get_response_sender()
        self.texts = [TextStream(model.engine.decode, stops) for stops in reply.stops]
        self.lock = threading.Lock()  # the final response is sent once, by whichever row finishes last
        self.left = len(checked)
        self.results: list = [None] * len(checked)
        self.closed = False
        self.tickets = [
            model.engine.submit(c, on_prefix=(lambda ids, i=i: self.prefix(i, ids)) if reply.stream else None)
            for i, c in enumerate(checked)
        ]
        for i, ticket in enumerate(self.tickets):
            ticket.future.add_done_callback(lambda f, i=i: self.finished(i, f))

    def prefix(self, row: int, ids: list[int]) -> None:
        """Engine thread: newly final ids of a streamed row; their new text, if any, is a response."""
        delta = self.texts[row].push(ids)
        if delta:
            self.sender.send(text_response(self.model.pb, delta))

    def finished(self, row: int, future: Any) -> None:
        """A row's ticket is answered; the last row's sends the final response."""
        from seer_trt.runtime.request import Result

        err = future.exception()
        self.results[row] = Result.failed(message(err), error_kind(err)) if err else future.result()
        response = self.response() if self.left == 1 else None
        with self.lock:  # held while the final response goes: no is_cancelled() after it (the server frees the
            self.left -= 1  # request then; asking later crashed tritonserver 2.51 in ResponseFactoryIsCancelled)
            if self.left:
                return
            self.closed = True
            self.sender.send(response or self.response(), flags=self.model.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        self.model.forget(self)

    def response(self) -> Any:
        pb = self.model.pb
        failed = [(i, r) for i, r in enumerate(self.results) if not r.ok]
        if failed:
            i, r = failed[0]  # the first failed row names the error, and its kind the status code
            return error_response(pb, (f"row {i}: " if len(self.results) > 1 else "") + r.error, r.error_kind)
        answers, texts = [], []
        for result, stream in zip(self.results, self.texts, strict=True):
            text, stopped = cut_at_stop(result.text, stream.scan.seqs) if stream.scan.seqs else (result.text, False)
            if stopped:  # the ids the returned text holds, as seer-serve's usage counts them
                held = ids_holding(result.token_ids, text, self.model.engine.decode)
                result = dataclasses.replace(result, token_ids=result.token_ids[:held])
            answers.append(result)
            texts.append(stream.finish(result.text) if self.reply.stream else text)
        return pb.InferenceResponse(write_outputs(pb, answers, texts))

    def cancelled(self) -> bool:
        """Whether Triton says the client cancelled this request (a Python backend without the call: never); asked
        only before its final response is sent."""
        check = getattr(self.request, "is_cancelled", None)
        with self.lock:
            return not self.closed and check is not None and bool(check())


class Model:
    """The orchestrator: requests in, streamed Seer answers out, one engine for all."""

    def __init__(self, args: dict[str, Any], config: dict[str, Any]) -> None:
        import triton_python_backend_utils as pb

        from seer_trt.runtime.pipeline import SeerPipeline

        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        folder = Path(args["model_repository"]) / args["model_version"] / params["export"]
        cache = CacheConfig.from_dict(json.loads(params.get("cache", "{}")))
        pipeline = SeerPipeline.from_manifest(folder, backend=params.get("backend", "onnxruntime"),
                                              provider=params.get("provider", "cpu"),
                                              threads=int(params.get("threads", "0")), policy=params["policy"],
                                              cache=cache)  # fmt: skip
        self.serve(pb, pipeline, int(params.get("max_queue", "256")))

    def serve(self, pb: Any, pipeline: Any, max_queue: int = 256) -> None:
        """Answer through ``pipeline`` (``__init__`` builds it from Triton's arguments; tests build it directly):
        its engine runs on its own thread from now on."""
        from seer_trt.runtime.engine import Engine

        self.pb, self.pipeline = pb, pipeline
        self.engine = Engine(pipeline, max_queue=max_queue).start()
        self.limits = ByteLimits.of(pipeline, self.engine.limits.max_answer_chars)
        self.live: set[Answer] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="seer-cancel", daemon=True)
        self._watcher.start()

    def execute(self, requests: list) -> None:
        """Read and submit each request; the engine's thread answers them through their response senders."""
        for request in requests:
            try:
                rows = read_request(self.pb, request, self.limits)
                reply = read_reply(self.pb, request, self.limits)
                checked = [self.engine.check(r) for r in rows]
            except Exception as err:  # noqa: BLE001 - any failure of one request is that request's error
                self.refuse(request, err)
                continue
            try:
                answer = Answer(self, request, reply, checked)
            except Exception as err:  # noqa: BLE001 - the queue is full (QueueFull): this request's error
                self.refuse(request, err)
                continue
            with self._lock:
                if not answer.closed:
                    self.live.add(answer)
        return None

    def refuse(self, request: Any, err: BaseException) -> None:
        request.get_response_sender().send(error_response(self.pb, message(err), error_kind(err)),
                                           flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)  # fmt: skip

    def forget(self, answer: Answer) -> None:
        with self._lock:
            self.live.discard(answer)

    def _watch(self) -> None:
        """Cancel the tickets of requests Triton says were cancelled (they leave at the next step boundary)."""
        while not self._stop.wait(CANCEL_POLL_S):
            with self._lock:
                live = list(self.live)
            for answer in live:
                if answer.cancelled():
                    for ticket in answer.tickets:
                        ticket.cancel()

    def finalize(self) -> None:
        self._stop.set()
        self.engine.close()
        self.pipeline.close()
