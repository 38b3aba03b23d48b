"""seer-serve's Prometheus metrics (docs/DESIGN.md "Serving and embedding").

In:  the engine's load figures (``EngineClient``: queue depth, live rows, rows and window-graph calls of each step,
     the K/V pool's slots and bytes) and what the app counts (requests by route and status, errors by type,
     latencies, steps and kept positions per answer).
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
        self.calls = Histogram("seer_calls_per_step", "window-graph calls of each engine step (read at each scrape)",
                               registry=r, buckets=(0, 1, 2, 3, 4, 6, 8, 16))  # fmt: skip
        kv = engine.kv  # the K/V pool (admission by memory): a request joins the loop when its slot fits the budget
        Gauge("seer_kv_slots", "prompt K/V slots held (one per admitted row that caches its prompt)",
              registry=r).set_function(lambda: engine.kv["slots"])  # fmt: skip
        Gauge("seer_kv_bytes", "bytes the rows' prompt K/V slots hold (within the budget)",
              registry=r).set_function(lambda: engine.kv["bytes"])  # fmt: skip
        Gauge("seer_kv_buffer_bytes", "bytes the engine's call buffers hold (the K/V its calls read and write)",
              registry=r).set_function(lambda: engine.kv["buffer_bytes"])  # fmt: skip
        Gauge("seer_kv_budget_bytes", "the K/V pool's budget (--kv-budget-mib)",
              registry=r).set(kv["budget"])  # fmt: skip
        Gauge("seer_kv_waiting", "requests started and waiting for their K/V slot to fit the budget",
              registry=r).set_function(lambda: engine.kv["waiting"])  # fmt: skip
        self.steps = Histogram("seer_denoise_steps", "denoising steps per answered request", registry=r,
                               buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))  # fmt: skip
        self.kept = Histogram("seer_kept_positions", "L* (answer positions denoised) per answered request",
                              registry=r, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))  # fmt: skip
        self.engine = engine
        self._seen = engine.steps

    def render(self) -> bytes:
        """The registry as Prometheus text, after observing the steps run since the last scrape."""
        from prometheus_client import generate_latest

        steps, window, calls = self.engine.steps, self.engine.rows_per_step, self.engine.calls_per_step
        new = min(steps - self._seen, len(window))
        for rows in window[len(window) - new :]:
            self.rows.observe(rows)
        for count in calls[len(calls) - min(new, len(calls)) :]:
            self.calls.observe(count)
        self._seen = steps
        return generate_latest(self.registry)
