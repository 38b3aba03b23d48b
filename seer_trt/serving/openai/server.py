"""uvicorn as seer-serve runs it: connections that cannot hold the server (docs/DESIGN.md "Serving and embedding").

In:  ``Settings``: the export, where to listen, the key, the engine's and the app's bounds (``seer-serve``'s flags).
Out: ``run``: the server up until a signal, then shut down gracefully (requests in flight answered within the
     grace, the engine closed, the pipeline released). Under it, ``config``: a ``uvicorn.Config`` whose HTTP protocol closes a connection that has not finished a request's headers within
     ``header_timeout_s`` (from its opening, or from its previous response): unfinished or trickled headers (one
     byte every few seconds) hold a connection for that long at most, and never count against the requests in
     flight, which the app bounds itself (``middleware.Guard``: 503 with ``Retry-After``). uvicorn's own
     ``limit_concurrency`` counted open connections, so 340 unfinished ones made every request and ``/health`` a
     503 (issue 37).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from seer_trt.contracts.errors import InputError

HEADER_TIMEOUT_S = 10.0  # a request's headers arrive within this, or its connection is closed
GRACE_S = 30.0  # what a shutdown waits for requests in flight before it ends them (``--grace``)


def bounded_protocol(header_timeout_s: float):
    """uvicorn's h11 protocol with the header deadline (a class per deadline, as ``uvicorn.Config(http=...)`` takes)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderDeadline(H11Protocol):
        """Closes the connection when a request's headers are not complete ``header_timeout_s`` after the connection
        opened or its last response ended (uvicorn's keep-alive timer restarts on every byte, so a trickle defeats
        it)."""

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._deadline = self.loop.call_later(header_timeout_s, self._late)

        def _late(self) -> None:
            waiting = self.cycle is None or self.cycle.response_complete  # no request past its headers now
            if waiting and not self.transport.is_closing():
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._deadline.cancel()
            if not self.transport.is_closing():
                self._deadline = self.loop.call_later(header_timeout_s, self._late)

        def connection_lost(self, exc) -> None:
            self._deadline.cancel()
            super().connection_lost(exc)

    return HeaderDeadline


def config(app, header_timeout_s: float = HEADER_TIMEOUT_S, grace_s: float = GRACE_S, **options: Any):
    """The ``uvicorn.Config`` of ``app``: the bounded h11 protocol, no connection-count limit (the app bounds the
    requests in flight), the shutdown grace; ``options``: more of uvicorn's (``log_level``)."""
    import uvicorn

    return uvicorn.Config(app, http=bounded_protocol(header_timeout_s), limit_concurrency=None,
                          timeout_graceful_shutdown=grace_s, **options)  # fmt: skip


def server(cfg, on_grace_end=None):
    """A ``uvicorn.Server`` over ``cfg`` that, once a shutdown's grace is nearly spent, calls ``on_grace_end`` (the
    engine's close: every request still queued or denoising fails with "the server is shutting down") so those
    requests end as answers, the OpenAI error body whole or an error event and ``[DONE]`` streamed, before uvicorn
    cancels what is left (a plain-text 500 and cut streams)."""
    import asyncio

    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            handle = None
            if on_grace_end is not None:
                loop = asyncio.get_running_loop()
                at = max(0.0, self.config.timeout_graceful_shutdown - 1.0)  # a second to write the answers
                handle = loop.call_later(at, lambda: loop.run_in_executor(None, on_grace_end))
            try:
                await super().shutdown(sockets)
            finally:
                if handle is not None:
                    handle.cancel()

    return Server(cfg)


@dataclasses.dataclass(frozen=True)
class Settings:
    """What ``run`` serves, and how (``seer-serve``'s flags, checked)."""

    engines: Path  # a seer-export folder
    host: str
    port: int  # 0: any free port
    api_key: str | None  # None: no key asked
    pipeline: dict[str, Any]  # SeerPipeline.from_manifest's options (backend, threads, policy, cache, kv budget)
    model_name: str | None = None  # None: the export folder's name
    max_rows: int | None = None  # the engine's bounds (None: its defaults)
    max_queue: int | None = None
    timeout_s: float | None = None  # each request's deadline
    allow_image_urls: bool = False
    image_url_timeout_s: float = 10.0
    max_held_bytes: int | None = None
    header_timeout_s: float = HEADER_TIMEOUT_S
    grace_s: float = GRACE_S
    binding_cache_bytes: int | None = None  # the onnxruntime backend's binding cache; None: its default


def listen(host: str, port: int):
    """The listening socket, bound here so a taken port is one line (``OSError``) rather than uvicorn's exit."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and without it each
    # response's body waits for the client's delayed ACK of its headers (40 ms a request on Linux)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise InputError(
            f"cannot listen on {host}:{port} ({err.strerror or err}); pick another --host / --port"
        ) from None
    return sock


def run(settings: Settings, prog: str = "seer-serve") -> int:
    """Serve ``settings.engines`` until SIGINT, SIGTERM or SIGHUP; then stop taking connections, answer what is in
    flight within the grace, close the engine (what is left fails with "the server is shutting down") and the
    pipeline. Returns 0; a signal ends it as ``Interrupted``."""
    import signal

    from seer_trt.contracts.signals import Interrupted
    from seer_trt.runtime.engine import Engine
    from seer_trt.runtime.pipeline import SeerPipeline
    from seer_trt.serving.openai.http import create_app

    sock = listen(settings.host, settings.port)
    pipe = SeerPipeline.from_manifest(settings.engines, **settings.pipeline)
    if settings.binding_cache_bytes is not None:
        if not hasattr(pipe.backend, "cache_bytes"):
            raise InputError(f"--binding-cache-mib applies to the onnxruntime backend, not "
                             f"{settings.pipeline.get('backend')}")  # fmt: skip
        pipe.backend.cache_bytes = settings.binding_cache_bytes
    bounds = {k: v for k, v in (("max_rows", settings.max_rows), ("max_queue", settings.max_queue)) if v is not None}
    engine = Engine(pipe, **bounds).start()
    name = settings.model_name or settings.engines.resolve().name
    app = create_app(engine, name, settings.api_key, timeout_s=settings.timeout_s,
                     allow_image_urls=settings.allow_image_urls, image_url_timeout_s=settings.image_url_timeout_s,
                     max_held_bytes=settings.max_held_bytes)  # fmt: skip
    # requests past what the queue and the rows can hold are refused (503) by the app; connections that do not finish
    # their headers within the header timeout are closed (bounded_protocol)
    uv = server(config(app, settings.header_timeout_s, settings.grace_s, log_level="info"), on_grace_end=engine.close)

    def stop(signum, frame):  # uvicorn hands a signal it caught back once it has shut down: end here, not killed
        raise Interrupted(signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)
    host, port = sock.getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    print(f"{prog}: serving {name!r} from {settings.engines} on http://{host}:{port}/v1 (API key "
          f"{'required' if settings.api_key else 'not required'})", file=sys.stderr, flush=True)  # fmt: skip
    try:
        uv.run(sockets=[sock])
    finally:
        engine.close()
        pipe.close()
    return 0
