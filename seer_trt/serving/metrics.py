"""seer-serve's Prometheus metrics (docs/DESIGN.md "Serving and embedding").

In:  the engine's load figures (``EngineClient``: queue depth, live rows, rows of each step) and what the app counts
     (requests by route and status, errors by type, latencies, steps and kept positions per answer).
Out: ``Metrics``, a registry of the app's own (several apps may live in one process), rendered at ``/metrics``.
"""

from __future__ import annotations

from seer_trt.runtime.engine import EngineClient


class Metrics:
    """What ``/metrics`` shows, in a registry of the app's own (several apps may live in one process)."""

    def __init__(self, engine: EngineClient) -> None:
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
