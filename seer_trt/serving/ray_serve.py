"""seer-serve on Ray Serve: the same OpenAI routes over replicas, one engine each (docs/DESIGN.md "Scaling out").

In:  an export folder and the replica settings; a running Ray cluster (``ray start --head``, more nodes with
     ``ray start --address``).
Out: a Ray Serve application whose ingress is seer-serve's own FastAPI app (``seer_trt.serving.openai.http.create_app``),
     built in each replica over that replica's ``Engine``; Ray Serve's proxy routes each request to a replica (least
     loaded of two sampled, its default), its controller restarts a replica that dies and scales on ongoing requests.

    client ─► Ray Serve proxy (one per node, 127.0.0.1:PORT here) ─► a SeerReplica ─► its seer-serve app ─► its Engine

Start it with ``serve run seer_trt.serving.ray_serve:build engines=DIR replicas=2`` or
``seer-serve --engines DIR --ray auto --replicas 2`` (which also removes it on Ctrl-C or SIGTERM). What a replica
holds: one pipeline (its own sessions over the export's shared weights) and one engine; nothing is shared between replicas, so a replica that dies loses only the
requests it was answering, which its clients see as a 5xx or a closed connection and send again (Serve's proxy
retries nothing that reached a replica). A replica being stopped (scale-down, redeploy) stops taking requests and
finishes those it holds within ``graceful_shutdown_timeout_s``. Every answer carries ``X-Seer-Replica``: the replica
that made it.
"""

from __future__ import annotations

from typing import Any

from ray import serve

TARGET_ONGOING = 16  # autoscaling target per replica: the rows a step batches cheaply (the largest batch bucket)
REPLICA_HEADER = "X-Seer-Replica"
APP = "seer"  # the application's (and its deployment's) name on the cluster


@serve.ingress()
class SeerReplica:
    """One replica: a pipeline and its engine, behind seer-serve's app.

    Args:
        pipeline: ``SeerPipeline.from_manifest``'s keyword arguments (backend, provider, threads ...).
        serving: ``create_app``'s keyword arguments (timeout_s, allow_image_urls ...).
    """

    def __init__(self, engines: str, name: str, api_key: str | None = None, pipeline: dict | None = None,
                 serving: dict | None = None, max_rows: int | None = None, max_queue: int = 256) -> None:  # fmt: skip
        from seer_trt.runtime.engine import Engine
        from seer_trt.runtime.pipeline import SeerPipeline

        self.pipe = SeerPipeline.from_manifest(engines, **(pipeline or {}))
        self.engine = Engine(self.pipe, max_rows, max_queue).start()
        self.name, self.api_key, self.serving = name, api_key, dict(serving or {})
        self.replica = serve.get_replica_context().replica_id.unique_id

    def __serve_build_asgi_app__(self):
        from seer_trt.serving.openai.http import create_app

        app = create_app(self.engine, self.name, self.api_key, **self.serving)
        replica = self.replica.encode()

        class Named:  # every answer names the replica that made it
            def __init__(self, inner) -> None:
                self.inner = inner

            async def __call__(self, scope, receive, send) -> None:
                async def named(message) -> None:
                    if message["type"] == "http.response.start":
                        message = {**message, "headers": [*message.get("headers", []),
                                                          (REPLICA_HEADER.lower().encode(), replica)]}  # fmt: skip
                    await send(message)

                await self.inner(scope, receive, named if scope["type"] == "http" else send)

        return Named(app)

    def check_health(self) -> None:
        """Ray Serve's health check: the engine's own (its loop is up)."""
        if not self.engine.running:
            raise RuntimeError("the replica's engine loop is not running")

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()
            self.pipe.close()


def application(engines: str, replicas: int | None = 1, autoscale: tuple[int, int] | None = None,
                name: str | None = None, num_gpus: float = 0, num_cpus: float = 1, api_key: str | None = None,
                grace_s: float = 30.0, pipeline: dict | None = None, serving: dict | None = None,
                max_rows: int | None = None, max_queue: int = 256):  # fmt: skip
    """The Ray Serve application: ``replicas`` fixed, or ``autoscale`` = (min, max) replicas scaled on ongoing
    requests per replica (``TARGET_ONGOING``); ``num_gpus`` 1 on GPUs (one engine per GPU), CPUs here."""
    from pathlib import Path

    options: dict[str, Any] = {
        "name": APP, "ray_actor_options": {"num_cpus": num_cpus, "num_gpus": num_gpus},
        "health_check_period_s": 2, "health_check_timeout_s": 30,
        "graceful_shutdown_timeout_s": grace_s, "graceful_shutdown_wait_loop_s": 1,
        "max_ongoing_requests": 4 * TARGET_ONGOING,
        "max_queued_requests": max_queue,  # past it Serve answers 503 (retriable) instead of queueing without bound
    }  # fmt: skip
    if autoscale is None:
        options["num_replicas"] = replicas
    else:
        options["autoscaling_config"] = {"min_replicas": autoscale[0], "max_replicas": autoscale[1],
                                         "target_ongoing_requests": TARGET_ONGOING}  # fmt: skip
    folder = str(Path(engines).resolve())
    model = name or Path(folder).name
    return serve.deployment(SeerReplica, **options).bind(folder, model, api_key, pipeline, serving, max_rows,
                                                         max_queue)  # fmt: skip


def build(args: dict[str, str]):
    """``serve run seer_trt.serving.ray_serve:build engines=DIR [replicas=N | min_replicas=A max_replicas=B]
    [name=M] [threads=T] [num_gpus=G]``."""
    known = {"engines", "replicas", "min_replicas", "max_replicas", "name", "threads", "num_gpus"}
    unknown = sorted(set(args) - known)
    if unknown or "engines" not in args:
        raise ValueError(f"serve run ...:build takes engines=DIR and optionally {sorted(known - {'engines'})}; got "
                         f"{sorted(args)}")  # fmt: skip
    auto = None
    if "min_replicas" in args or "max_replicas" in args:
        auto = (int(args.get("min_replicas", 1)), int(args.get("max_replicas", 1)))
    return application(
        args["engines"],
        int(args.get("replicas", 1)),
        auto,
        args.get("name"),
        float(args.get("num_gpus", 0)),
        pipeline={"threads": int(args.get("threads", 0))},
    )
