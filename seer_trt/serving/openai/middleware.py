"""seer-serve's ASGI middleware: what every request meets before a route (docs/DESIGN.md "Serving and
embedding", "Safety and limits").

In:  the ASGI app, the API key, the body bounds (one request's, and all requests' together), the request limit.
Out: ``Guard``: the API key checked (not on ``/health``), the body read whole up to its bound before any parsing
     (413 past it; 408 when it does not arrive in time; 429 with ``Retry-After`` when the bodies held together pass
     their budget), requests in flight bounded (503 with ``Retry-After``), and every answer counted in the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import threading
import time
from typing import TYPE_CHECKING

from fastapi.responses import JSONResponse

from seer_trt.contracts.requests import MAX_STOPS
from seer_trt.serving.openai import chat
from seer_trt.serving.openai.chat import ApiError

if TYPE_CHECKING:
    from seer_trt.serving.openai.metrics import Metrics

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


def body_limit(max_chars: int, max_image_bytes: int, max_stop_chars: int = 0) -> int:
    """The most bytes a request body may take: its text, ``max_chars`` characters of messages and ``MAX_STOPS``
    stop sequences of ``max_stop_chars`` (``Limits.max_answer_chars``), as JSON escapes at worst (12 bytes: a
    surrogate pair of ``\\uXXXX``, as a JSONL line), the largest image as base64, and ``BODY_SLACK``."""
    return 12 * (max_chars + MAX_STOPS * max_stop_chars) + -(-4 * max_image_bytes // 3) + BODY_SLACK


def error_response(err: ApiError) -> JSONResponse:
    headers = None if err.retry_after_s is None else {"Retry-After": str(err.retry_after_s)}
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


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
                        f"prompt and stop sequences and the largest image as base64); send a smaller one", 413,
                        code="request_too_large")  # fmt: skip
