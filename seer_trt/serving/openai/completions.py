"""seer-serve's chat route, ``POST /v1/chat/completions``: a body checked, submitted to the engine and answered
whole or streamed (docs/DESIGN.md "Serving and embedding").

In:  the parsed body (``seer_trt.serving.openai.chat``, the wire schema); an engine behind ``EngineClient``
     (``seer_trt.runtime.engine``), which checks the request and tokenizes its prompt once.
Out: OpenAI's ``chat.completion`` body, or Server-Sent Events with one chunk per newly final prefix; every failure
     as an ``ApiError``.

    body ─► chat.parse ─► image URLs fetched (the request checked first) ─► chat.to_request ─► engine.check
         ─► engine.submit ─► engine thread: on_prefix(ids) / the ticket's future
         ─► loop.call_soon_threadsafe ─► asyncio.Queue ─► JSON body, or SSE chunks

A client that disconnects cancels its ticket (the row leaves at the next step boundary). Stop sequences cut the
answer by one rule, whole or streamed (``seer_trt.serving.stops``); their scans run in a worker thread, so a request
with long ones never holds the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import Request as HttpRequest
from fastapi.responses import Response, StreamingResponse

from seer_trt.contracts.errors import ConfigError, InputError
from seer_trt.runtime.engine import Cancelled, DeadlineExceeded, EngineClient, Limits, QueueFull, Ticket
from seer_trt.runtime.pipeline import Checked
from seer_trt.runtime.request import Result
from seer_trt.serving.openai import chat
from seer_trt.serving.openai.chat import ApiError
from seer_trt.serving.stops import cut_at_stop

if TYPE_CHECKING:
    from seer_trt.serving.openai.metrics import Metrics


@dataclasses.dataclass
class Service:
    """What every request of one app shares."""

    engine: EngineClient
    model: str  # the model name clients send
    eot_id: int  # <|eot_id|>: an answer that reached it inside the window finished with "stop"
    metrics: Metrics
    decode: Callable[[list[int]], str]  # answer ids -> text, special tokens dropped (as Result.text)
    limits: Limits  # what a request may hold: its image's bytes, its stop sequences' characters
    allow_image_urls: bool  # fetch http(s) image URLs (else: 400)
    timeout_s: float | None  # each request's deadline from its arrival
    draining: bool = False  # uvicorn is shutting down: requests on open connections get 503
    image_url_timeout_s: float = 10.0  # one image URL's whole fetch, redirects included

    def ready(self) -> None:
        if self.draining or not self.engine.running:
            raise ApiError("the server is not ready (starting or shutting down); retry later", 503,
                           code="not_ready")  # fmt: skip

    def unknown_model(self, name: str) -> ApiError:
        shown = repr(name) if len(name) <= 80 else f"{name[:77]!r}... ({len(name)} characters)"
        return ApiError(f"the model {shown} does not exist; this server has {self.model!r}", 404, "model",
                        "model_not_found")  # fmt: skip


async def complete(service: Service, http: HttpRequest):
    """``POST /v1/chat/completions``: the body checked, queued, and answered whole or streamed."""
    service.ready()
    body = chat.parse(await http.body())
    if body.model != service.model:
        raise service.unknown_model(body.model)
    fetched = None
    if service.allow_image_urls:
        remote = chat.remote_images(body)
        if remote:  # the whole request checked first, its image URLs unread: a request that will be refused fetches
            try:  # nothing, and one that passes holds one image (one fetch)
                chat.to_request(body, service.limits, dict.fromkeys((u for u, _ in remote), b""))
            except (InputError, ConfigError) as err:
                raise ApiError(str(err), 400) from None
        fetched = {url: await fetch_image(url, param, service.limits.max_image_bytes, service.image_url_timeout_s)
                   for url, param in remote}  # fmt: skip
    try:
        request = chat.to_request(body, service.limits, fetched)
        # settings and prompt checked before queueing (cheap; tokenizing off the event loop): a bad one is a 400
        # without a queue slot; the ids are the usage's prompt tokens and go on to the engine as they are
        checked = await asyncio.to_thread(service.engine.check, request)
    except (InputError, ConfigError) as err:
        raise ApiError(str(err), 400) from None
    events: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()

    def post(item) -> None:  # from the engine thread; a closed loop (shutdown) drops it
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(events.put_nowait, item)

    on_prefix = (lambda ids: post(("ids", ids))) if body.stream else None
    try:
        ticket = service.engine.submit(checked, on_prefix, service.timeout_s)
    except QueueFull as err:
        raise ApiError(str(err), 429, code="queue_full", retry_after_s=1) from None
    ticket.future.add_done_callback(lambda f: post(("done", f)))
    gone = asyncio.ensure_future(disconnected(http.receive))
    reply = Reply(ticket, events, gone, checked, service, chat.stops(body, service.limits.max_answer_chars))
    if body.stream:
        return await reply.stream(body.stream_options is not None and body.stream_options.include_usage)
    return await reply.whole()


async def fetch_image(url: str, param: str, max_bytes: int, timeout_s: float) -> bytes:
    """The bytes at an http(s) image URL, read only up to ``max_bytes`` and within ``timeout_s`` in all.

    Raises:
        ApiError: 400 naming the URL and why: an HTTP status other than 200, a body past ``max_bytes``, no
            answer in time, or a connection that failed.
    """
    import httpx

    shown = url if len(url) <= 80 else url[:77] + "..."
    try:
        async with asyncio.timeout(timeout_s):
            async with httpx.AsyncClient(follow_redirects=True, max_redirects=3, timeout=timeout_s) as client:
                async with client.stream("GET", url) as response:
                    if response.status_code != 200:
                        raise ApiError(f"fetching the image {shown} answered HTTP {response.status_code}", 400,
                                       param)  # fmt: skip
                    declared = response.headers.get("content-length", "")
                    if declared.isdigit() and int(declared) > max_bytes:
                        raise ApiError(f"the image {shown} is {declared} bytes, more than the {max_bytes} accepted",
                                       400, param)  # fmt: skip
                    data = bytearray()
                    async for chunk in response.aiter_bytes():
                        data += chunk
                        if len(data) > max_bytes:
                            raise ApiError(f"the image {shown} is more than the {max_bytes} bytes accepted", 400,
                                           param)  # fmt: skip
                    return bytes(data)
    except TimeoutError:
        raise ApiError(f"the image {shown} did not arrive within {timeout_s:g} s", 400, param) from None
    except httpx.HTTPError as err:
        raise ApiError(f"cannot fetch the image {shown} ({type(err).__name__}: {err})", 400, param) from None


async def disconnected(receive) -> None:
    """Returns once the client has gone away."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def next_event(events: asyncio.Queue, gone: asyncio.Future) -> tuple[str, Any] | None:
    """The next event of a ticket, or None once the client has gone away."""
    get = asyncio.ensure_future(events.get())
    done, _ = await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
    if get in done:
        return get.result()
    get.cancel()
    return None


def outcome(future) -> Result:
    """A finished ticket's ``Result``, or the ``ApiError`` it answers with."""
    try:
        result = future.result()
    except Cancelled as err:
        raise ApiError(f"the request was cancelled: {err}", 503, code="cancelled") from None
    except DeadlineExceeded as err:
        raise ApiError(f"{err}; send a shorter request or retry later", 504, code="timeout") from None
    if not result.ok:
        if result.error_kind == "input":
            raise ApiError(result.error, 400)
        raise ApiError(f"the server failed to answer this request: {result.error}", 500)
    return result


class Reply:
    """One chat completion's answer, whole or streamed, from its ticket's events."""

    def __init__(self, ticket: Ticket, events: asyncio.Queue, gone: asyncio.Future, checked: Checked,
                 service: Service, stop: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.ticket, self.events, self.gone = ticket, events, gone  # gone: done once the client went away
        self.request, self.gen, self.cache = checked.request, checked.gen, checked.cache.mode
        self.prompt_tokens = len(checked.ids)
        self.stop = stop
        self.model, self.eot_id, self.metrics = service.model, service.eot_id, service.metrics
        self.decode = service.decode
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = chat.now()

    def result(self, future):
        result = outcome(future)
        self.metrics.steps.observe(result.steps)
        self.metrics.kept.observe(result.kept)
        return result

    def _end(self) -> None:
        self.gone.cancel()
        if not self.ticket.future.done():
            self.ticket.cancel()

    async def _text(self, fn, *args):
        """``fn(*args)``, the answer's text work (decoding, stop sequences): in a worker thread when the request has
        stop sequences, whose scans grow with the text and build tables as long as the sequences, so the event loop
        keeps answering meanwhile; inline otherwise (a decode of the ids so far)."""
        return await asyncio.to_thread(fn, *args) if self.stop else fn(*args)

    def _cut(self, result: Result) -> tuple[str, bool, chat.Usage]:
        """The whole answer's text cut at its first stop sequence, whether one cut it, and the usage it returns."""
        text, stopped = cut_at_stop(result.text, self.stop)
        return text, stopped, chat.usage(self.prompt_tokens, result, text, self.decode)

    async def whole(self):
        try:
            event = await next_event(self.events, self.gone)
            if event is None:
                return Response(status_code=499)  # nobody is listening
            result = self.result(event[1])
        finally:
            self._end()
        text, stopped, usage = await self._text(self._cut, result)
        return chat.ChatCompletion(
            id=self.id, created=self.created, model=self.model,
            choices=[chat.Choice(message=chat.AssistantMessage(content=text),
                                 finish_reason="stop" if stopped else chat.finish_reason(result, self.eot_id))],
            usage=usage, seer=chat.seer_info(self.request, self.gen, self.cache, result),
        ).model_dump()  # fmt: skip

    async def stream(self, include_usage: bool):
        """SSE chunks; a request that fails before its first final id is answered with its error status instead."""
        try:
            first = await next_event(self.events, self.gone)
            if first is None:
                self._end()
                return Response(status_code=499)
            if first[0] == "done":
                outcome(first[1])  # raises its ApiError, before any byte of a stream
        except BaseException:
            self._end()
            raise
        return StreamingResponse(self._chunks(first, include_usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip

    def _chunk(self, delta: chat.Delta, finish=None, usage=None, seer=None, choices=True) -> str:
        chunk = chat.ChatCompletionChunk(id=self.id, created=self.created, model=self.model, usage=usage, seer=seer,
                                         choices=[chat.ChunkChoice(delta=delta, finish_reason=finish)] if choices
                                         else [])  # fmt: skip
        return f"data: {chunk.model_dump_json(exclude_none=True)}\n\n"

    async def _chunks(self, event, include_usage: bool):
        try:
            text = await self._text(chat.TextStream, self.decode, self.stop)
            yield self._chunk(chat.Delta(role="assistant", content=""))
            while event is not None:
                kind, value = event
                if kind == "ids":
                    delta = await self._text(text.push, value)
                    if delta:
                        yield self._chunk(chat.Delta(content=delta))
                    event = await next_event(self.events, self.gone)
                    continue
                try:
                    result = self.result(value)
                except ApiError as err:  # past its first id (a deadline, a shutdown): the error as an event
                    self.metrics.errors.labels(err.body()["error"]["type"]).inc()
                    yield f"data: {json.dumps(err.body())}\n\n"
                    yield "data: [DONE]\n\n"
                    return
                rest = await self._text(text.finish, result.text)
                if rest:
                    yield self._chunk(chat.Delta(content=rest))
                finish = "stop" if text.stopped else chat.finish_reason(result, self.eot_id)
                yield self._chunk(chat.Delta(), finish,
                                  seer=chat.seer_info(self.request, self.gen, self.cache, result))  # fmt: skip
                if include_usage:  # what was sent: the whole answer, or its text before the stop sequence
                    usage = await self._text(chat.usage, self.prompt_tokens, result, text.sent, self.decode)
                    yield self._chunk(chat.Delta(), usage=usage, choices=False)
                yield "data: [DONE]\n\n"
                return
        finally:
            self._end()
