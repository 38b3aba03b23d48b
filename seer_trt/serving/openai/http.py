"""``seer-serve``'s HTTP API: OpenAI-compatible chat completions over an engine (docs/DESIGN.md "Serving and
embedding"), on FastAPI and uvicorn.

In:  HTTP requests; a started engine behind ``EngineClient`` (``seer_trt.runtime.engine``; the caller owns it).
Out: ``POST /v1/chat/completions`` (one JSON body, or Server-Sent Events with ``stream``), ``GET /v1/models``,
     ``GET /health``, ``GET /metrics`` (Prometheus text); every error as OpenAI's ``{"error": {...}}`` body.

    client ─► Guard (seer_trt.serving.openai.middleware: API key, body and request bounds) ─► route
           ─► the chat route (seer_trt.serving.openai.completions) over the wire schema (seer_trt.serving.openai.chat)

This file builds the app: its routes and error handlers, over the metrics of ``seer_trt.serving.openai.metrics``.
"""

from __future__ import annotations

import contextlib

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from seer_trt.runtime.engine import EngineClient
from seer_trt.serving.openai import chat
from seer_trt.serving.openai.chat import ApiError
from seer_trt.serving.openai.completions import Service, complete
from seer_trt.serving.openai.metrics import Metrics
from seer_trt.serving.openai.middleware import HELD_BODIES, ROUTES, Guard, body_limit, error_response

__all__ = ["ROUTES", "Metrics", "create_app"]


def create_app(engine: EngineClient, model_name: str, api_key: str | None = None, timeout_s: float | None = None,
               allow_image_urls: bool = False, max_body_bytes: int | None = None,
               image_url_timeout_s: float = 10.0, max_requests: int | None = None,
               body_timeout_s: float = 30.0, max_held_bytes: int | None = None) -> FastAPI:  # fmt: skip
    """The HTTP app over an engine (started and closed by the caller).

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
    limits = engine.limits
    service = Service(engine, model_name, engine.eot_id, Metrics(engine), engine.decode, limits, allow_image_urls,
                      timeout_s, image_url_timeout_s=image_url_timeout_s)  # fmt: skip
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

    max_body = max_body_bytes or body_limit(limits.max_prompt_chars, limits.max_image_bytes, limits.max_answer_chars)
    most = max_requests or engine.capacity + 16
    app.add_middleware(Guard, api_key=api_key, max_body=max_body, metrics=metrics, max_requests=most,
                       body_timeout_s=body_timeout_s, max_held_bytes=max_held_bytes or HELD_BODIES * max_body)  # fmt: skip
    return app
