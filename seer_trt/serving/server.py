"""uvicorn as seer-serve runs it: connections that cannot hold the server (docs/DESIGN.md "Serving and embedding").

In:  the ASGI app (``seer_trt.serving.http.create_app``) and the connection bounds.
Out: a ``uvicorn.Config`` whose HTTP protocol closes a connection that has not finished a request's headers within
     ``header_timeout_s`` (from its opening, or from its previous response): unfinished or trickled headers (one
     byte every few seconds) hold a connection for that long at most, and never count against the requests in
     flight, which the app bounds itself (``middleware.Guard``: 503 with ``Retry-After``). uvicorn's own
     ``limit_concurrency`` counted open connections, so 340 unfinished ones made every request and ``/health`` a
     503 (issue 37).
"""

from __future__ import annotations

from typing import Any

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
