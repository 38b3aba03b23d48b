"""``seer-serve``'s HTTP API: OpenAI-compatible chat completions over a ``Engine`` (docs/DESIGN.md "Serving
and embedding"), on FastAPI and uvicorn.

In:  HTTP requests; a started ``Engine`` over one ``SeerPipeline`` (the caller owns both).
Out: ``POST /v1/chat/completions`` (one JSON body, or Server-Sent Events with ``stream``), ``GET /v1/models``,
     ``GET /health``, ``GET /metrics`` (Prometheus text); every error as OpenAI's ``{"error": {...}}`` body.

    client ─► Guard (API key; body bytes bounded before parsing) ─► route ─► chat.parse ─► Request
           ─► engine.submit ─► engine thread: on_prefix(ids) / the ticket's future
           ─► loop.call_soon_threadsafe ─► asyncio.Queue ─► JSON body, or one SSE chunk per newly final prefix

A client that disconnects cancels its ticket (the row leaves at the next step boundary).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from seer_trt.contracts.config import GenerationConfig
from seer_trt.contracts.errors import ConfigError, InputError
from seer_trt.runtime.engine import Cancelled, DeadlineExceeded, Engine, QueueFull, Ticket
from seer_trt.runtime.request import Request, Result
from seer_trt.serving import chat
from seer_trt.serving.chat import ApiError

BODY_SLACK = 2**16  # bytes of a request body besides its text and image: field names, settings, JSON syntax


HELD_BODIES = 8  # the default budget of body bytes held at once, all requests together: this many of the largest
TRIM_AFTER_BYTES = 2**20  # a body this large answered, and none held: the heap is given back to the system


_trim = threading.Lock()
_trimmed_at = [0.0]


def trim_heap() -> None:
    """glibc's ``malloc_trim(0)``: free pages of every arena back to the system. The pieces a large body leaves
    (its chunks, the base64 text, the decoded image) are freed but stay in the arenas of the threads that made them;
    64 bodies of 46 MB at once left RSS at 535-666 MB without it, 478-613 MB with it, from 225 MB (docs/results.md).
    One trim at a time and at most one a second: it walks every arena under its lock."""
    import ctypes

    if not _trim.acquire(blocking=False):
        return
    try:
        if time.monotonic() - _trimmed_at[0] < 1.0:
            return
        _trimmed_at[0] = time.monotonic()
        with contextlib.suppress(AttributeError):  # not glibc: nothing to do
            ctypes.CDLL(None).malloc_trim(0)
    finally:
        _trim.release()


def body_limit(max_chars: int, max_image_bytes: int) -> int:
    """The most bytes a request body may take: its text at ``max_chars`` characters as JSON escapes at worst (12
    bytes: a surrogate pair of ``\\uXXXX``, as a JSONL line), the largest image as base64, and ``BODY_SLACK``."""
    return 12 * max_chars + -(-4 * max_image_bytes // 3) + BODY_SLACK


def error_response(err: ApiError) -> JSONResponse:
    headers = None if err.retry_after_s is None else {"Retry-After": str(err.retry_after_s)}
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


class Metrics:
    """What ``/metrics`` shows, in a registry of the app's own (several apps may live in one process)."""

    def __init__(self, engine: Engine) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        r = self.registry = CollectorRegistry()
        self.requests = Counter("seer_http_requests", "HTTP requests answered, by route and status",
                                ["route", "status"], registry=r)  # fmt: skip
        self.errors = Counter("seer_http_errors", "error answers, by OpenAI error type", ["type"], registry=r)
        self.latency = Histogram("seer_http_request_seconds", "from the request's arrival to its last byte",
                                 ["route"], registry=r,
                                 buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))  # fmt: skip
        Gauge("seer_queue_depth", "requests waiting for admission", registry=r).set_function(lambda: engine.depth)
        Gauge("seer_live_rows", "rows being denoised", registry=r).set_function(lambda: len(engine.rows))
        self.rows = Histogram("seer_rows_per_step", "live rows of each engine step (read at each scrape)",
                              registry=r, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))  # fmt: skip
        self.steps = Histogram("seer_denoise_steps", "denoising steps per answered request", registry=r,
                               buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))  # fmt: skip
        self.kept = Histogram("seer_kept_positions", "L* (answer positions denoised) per answered request",
                              registry=r, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))  # fmt: skip
        self.engine = engine
        self._seen = engine.steps

    def render(self) -> bytes:
        """The registry as Prometheus text, after observing the steps run since the last scrape."""
        from prometheus_client import generate_latest

        steps, window = self.engine.steps, self.engine.rows_per_step
        for rows in window[len(window) - min(steps - self._seen, len(window)) :]:
            self.rows.observe(rows)
        self._seen = steps
        return generate_latest(self.registry)


ROUTES = ("/v1/chat/completions", "/v1/models", "/health", "/metrics")


class Guard:
    """ASGI middleware in front of every route: the API key (not on /health), the request body read whole up to
    its bound before any parsing (413 past it, by Content-Length or by count), and the request metrics."""

    def __init__(self, app, api_key: str | None, max_body: int, metrics: Metrics, max_requests: int,
                 body_timeout_s: float, max_held_bytes: int) -> None:  # fmt: skip
        self.app = app
        self.key = None if api_key is None else b"Bearer " + api_key.encode("utf-8")
        self.max_body = max_body
        self.metrics = metrics
        self.max_requests = max_requests
        self.body_timeout_s = body_timeout_s
        self.in_flight = 0  # requests past their headers and not yet answered (health and metrics aside)
        self.max_held = max_held_bytes
        self.held = 0  # body bytes of the requests in flight, read so far

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        path = scope["path"]
        route = path if path in ROUTES else "/v1/models/{id}" if path.startswith("/v1/models/") else "other"

        async def counted(message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(route, str(message["status"])).inc()
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                self.metrics.latency.labels(route).observe(time.monotonic() - start)
            await send(message)

        counts = path not in ("/health", "/metrics")
        if counts and self.in_flight >= self.max_requests:
            err = ApiError(f"the server holds {self.in_flight} requests, as many as it may; retry shortly", 503,
                           code="overloaded", retry_after_s=1)  # fmt: skip
            self.metrics.errors.labels(chat.ERROR_TYPES.get(err.status, "server_error")).inc()
            await error_response(err)(scope, receive, counted)
            return
        self.in_flight += counts
        try:
            await self._serve(scope, receive, counted)
        finally:
            self.in_flight -= counts

    async def _serve(self, scope, receive, counted) -> None:
        mine = [0]  # this request's share of ``held``, returned when it is answered
        try:
            await self._answer(scope, receive, counted, mine)
        finally:
            self.held -= mine[0]
            if mine[0] >= TRIM_AFTER_BYTES and self.held == 0:
                asyncio.get_running_loop().run_in_executor(None, trim_heap)

    async def _answer(self, scope, receive, counted, mine: list[int]) -> None:
        try:
            async with asyncio.timeout(self.body_timeout_s):
                body = await self._read(scope, receive, mine)
        except TimeoutError:
            body, err = None, ApiError(f"the request body did not arrive within {self.body_timeout_s:g} s", 408,
                                       code="body_timeout")  # fmt: skip
        except ApiError as caught:
            body, err = None, caught
        else:
            err = None
        if err is not None:
            self.metrics.errors.labels(chat.ERROR_TYPES.get(err.status, "server_error")).inc()
            await error_response(err)(scope, receive, counted)
            return
        if body is None:  # the client went away while sending
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()  # what follows the body: the client's disconnect
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, counted)

    async def _read(self, scope, receive, mine: list[int]) -> bytes | None:
        headers = dict(scope["headers"])
        if self.key is not None and scope["path"] != "/health":
            if not hmac.compare_digest(headers.get(b"authorization", b""), self.key):
                raise ApiError("missing or wrong API key; send the header Authorization: Bearer <key>", 401,
                               code="invalid_api_key")  # fmt: skip
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit():
                raise ApiError(f"Content-Length is {length[:20]!r}; expected a byte count", 400)
            if int(length) > self.max_body:
                raise self._too_large(int(length))
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise self._too_large(size, more=True)
            self.held += len(chunk)
            mine[0] += len(chunk)
            if mine[0] > self.max_held:  # could never be held, however idle the server: not worth a retry
                raise ApiError(f"the request body is more than the {self.max_held} bytes this server holds for all "
                               f"requests together; send a smaller one", 413, code="request_too_large")  # fmt: skip
            if self.held > self.max_held:  # the bodies in flight together: memory, not one request, is the bound
                raise ApiError(f"the server holds {self.held - len(chunk)} bytes of requests in flight, as many as it "
                               f"may; retry shortly", 429, code="overloaded", retry_after_s=1)  # fmt: skip
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    def _too_large(self, size: int, more: bool = False) -> ApiError:
        what = f"more than {size}" if more else str(size)
        return ApiError(f"the request body is {what} bytes, more than the {self.max_body} accepted (the longest "
                        f"prompt and the largest image as base64); send a smaller one", 413,
                        code="request_too_large")  # fmt: skip


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


@dataclasses.dataclass
class Service:
    """What every request of one app shares."""

    engine: Engine
    model: str  # the model name clients send
    eot_id: int  # <|eot_id|>: an answer that reached it inside the window finished with "stop"
    metrics: Metrics
    decode: Callable[[list[int]], str]  # answer ids -> text, special tokens dropped (as Result.text)
    image_bytes: int  # the largest encoded image
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


def create_app(engine: Engine, model_name: str, api_key: str | None = None, timeout_s: float | None = None,
               allow_image_urls: bool = False, max_body_bytes: int | None = None,
               image_url_timeout_s: float = 10.0, max_requests: int | None = None,
               body_timeout_s: float = 30.0, max_held_bytes: int | None = None) -> FastAPI:  # fmt: skip
    """The HTTP app over a engine (started and closed by the caller).

    Args:
        model_name: the only ``model`` the app answers (404 for others), what ``/v1/models`` lists.
        api_key: every route but ``/health`` requires ``Authorization: Bearer <api_key>``; None: open.
        timeout_s: each request's deadline from its arrival; None: none.
        allow_image_urls: fetch http(s) image URLs (within the image byte bound and ``image_url_timeout_s``);
            otherwise they are answered 400. data: URLs always work.
        max_body_bytes: the largest request body (default ``body_limit`` of the pipeline's bounds).
        max_requests: requests in flight at most (their bodies held, queued or denoising); past it 503 with
            ``Retry-After`` (``/health`` and ``/metrics`` never count). Default: the engine's queue and rows, and 16.
        body_timeout_s: a request's body arrives within this from its headers, or 408.
        max_held_bytes: request bodies held at once, all requests together; past it 429 with ``Retry-After``
            (default: 8 of the largest bodies).
    """
    pipe = engine.pipe
    tokenizer = pipe.prompts.tokenizer
    service = Service(engine, model_name, pipe.manifest.special_tokens.eot_id, Metrics(engine),
                      lambda ids: tokenizer.decode(ids, skip_special_tokens=True), pipe.image_limits.bytes,
                      allow_image_urls, timeout_s, image_url_timeout_s=image_url_timeout_s)  # fmt: skip
    metrics, created = service.metrics, chat.now()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        service.draining = True

    app = FastAPI(title="seer-serve", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)

    @app.exception_handler(ApiError)
    async def api_error(request, err: ApiError):
        metrics.errors.labels(err.body()["error"]["type"]).inc()
        return error_response(err)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, err: StarletteHTTPException):
        message = {404: f"no route {request.url.path}; this server has {list(ROUTES)}",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(err.status_code, str(err.detail))  # fmt: skip
        return await api_error(request, ApiError(message, err.status_code))

    @app.exception_handler(Exception)
    async def internal(request, err: Exception):  # never a traceback to a client; uvicorn logs it
        return await api_error(request, ApiError(f"internal error ({type(err).__name__})", 500))

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        service.ready()
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return chat.ModelList(data=[chat.ModelCard(id=model_name, created=created)]).model_dump()

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        if name != model_name:
            raise service.unknown_model(name)
        return chat.ModelCard(id=model_name, created=created).model_dump()

    @app.post("/v1/chat/completions")
    async def completions(http: HttpRequest):
        return await complete(service, http)

    max_body = max_body_bytes or body_limit(pipe.prompts.max_chars, pipe.image_limits.bytes)
    most = max_requests or engine.queue.maxsize + engine.max_rows + 16
    app.add_middleware(Guard, api_key=api_key, max_body=max_body, metrics=metrics, max_requests=most,
                       body_timeout_s=body_timeout_s, max_held_bytes=max_held_bytes or HELD_BODIES * max_body)  # fmt: skip
    return app


async def complete(service: Service, http: HttpRequest):
    """``POST /v1/chat/completions``: the body checked, queued, and answered whole or streamed."""
    service.ready()
    body = chat.parse(await http.body())
    if body.model != service.model:
        raise service.unknown_model(body.model)
    pipe = service.engine.pipe
    fetched = None
    if service.allow_image_urls:
        remote = chat.remote_images(body)
        if remote:  # the whole request checked first, its image URLs unread: a request that will be refused fetches
            try:  # nothing, and one that passes holds one image (one fetch)
                chat.to_request(body, service.image_bytes, dict.fromkeys((u for u, _ in remote), b""))
            except (InputError, ConfigError) as err:
                raise ApiError(str(err), 400) from None
        fetched = {url: await fetch_image(url, param, service.image_bytes, service.image_url_timeout_s)
                   for url, param in remote}  # fmt: skip
    try:
        request = chat.to_request(body, service.image_bytes, fetched)
        # settings and prompt checked before queueing (cheap; tokenizing off the event loop): a bad one is a 400
        # without a queue slot, and the prompt's ids are its usage
        gen, cache, prompt_ids = await asyncio.to_thread(
            lambda: (pipe.generation(request), pipe.cache_for(request),
                     pipe.prompts.ids(request.prompt, request.image is not None, request.system,
                                      request.history)))  # fmt: skip
    except (InputError, ConfigError) as err:
        raise ApiError(str(err), 400) from None
    events: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()

    def post(item) -> None:  # from the engine thread; a closed loop (shutdown) drops it
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(events.put_nowait, item)

    on_prefix = (lambda ids: post(("ids", ids))) if body.stream else None
    try:
        ticket = service.engine.submit(request, on_prefix, service.timeout_s)
    except QueueFull as err:
        raise ApiError(str(err), 429, code="queue_full", retry_after_s=1) from None
    ticket.future.add_done_callback(lambda f: post(("done", f)))
    gone = asyncio.ensure_future(disconnected(http.receive))
    reply = Reply(ticket, events, gone, request, gen, cache.mode, len(prompt_ids), service, chat.stops(body))
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


class Reply:
    """One chat completion's answer, whole or streamed, from its ticket's events."""

    def __init__(self, ticket: Ticket, events: asyncio.Queue, gone: asyncio.Future, request: Request,
                 gen: GenerationConfig, cache: str, prompt_tokens: int, service: Service,
                 stop: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.ticket, self.events, self.gone = ticket, events, gone  # gone: done once the client went away
        self.request, self.gen, self.cache, self.prompt_tokens = request, gen, cache, prompt_tokens
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

    async def whole(self):
        try:
            event = await next_event(self.events, self.gone)
            if event is None:
                return Response(status_code=499)  # nobody is listening
            result = self.result(event[1])
        finally:
            self._end()
        text, stopped = chat.cut_at_stop(result.text, self.stop)
        return chat.ChatCompletion(
            id=self.id, created=self.created, model=self.model,
            choices=[chat.Choice(message=chat.AssistantMessage(content=text),
                                 finish_reason="stop" if stopped else chat.finish_reason(result, self.eot_id))],
            usage=chat.usage(self.prompt_tokens, result), seer=chat.seer_info(self.request, self.gen, self.cache, result),
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
        text = chat.TextStream(self.decode, self.stop)
        try:
            yield self._chunk(chat.Delta(role="assistant", content=""))
            while event is not None:
                kind, value = event
                if kind == "ids":
                    delta = text.push(value)
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
                rest = text.finish(result.text)
                if rest:
                    yield self._chunk(chat.Delta(content=rest))
                finish = "stop" if text.stopped else chat.finish_reason(result, self.eot_id)
                yield self._chunk(chat.Delta(), finish,
                                  seer=chat.seer_info(self.request, self.gen, self.cache, result))  # fmt: skip
                if include_usage:
                    yield self._chunk(chat.Delta(), usage=chat.usage(self.prompt_tokens, result), choices=False)
                yield "data: [DONE]\n\n"
                return
        finally:
            self._end()
