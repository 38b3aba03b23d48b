"""``seer-serve``: an OpenAI-compatible HTTP server over an export (docs/DESIGN.md "Serving and embedding").

In:  ``--engines DIR`` (a ``seer-export`` folder), where to listen, the API key (``--api-key`` or ``SEER_API_KEY``),
     the engine's bounds (``--max-queue``, ``--max-rows``) and each request's deadline (``--timeout``).
Out: a server on ``--host``:``--port`` (``seer_trt.serving.openai``: ``/v1/chat/completions``, ``/v1/models``,
     ``/health``, ``/metrics``) until Ctrl-C or SIGTERM, which stop it gracefully: no new connections, open ones
     answered, then the engine closed. Exit status 2 and one line for a bad flag, export or address.

This module parses and checks the flags; ``seer_trt.serving.openai.server.run`` starts and stops the server, and
``on_ray`` deploys it on a Ray cluster (``seer_trt.serving.ray_serve``).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from seer_trt.cli.common import Parser, add_backend, add_engines, add_verbose, backend_options, require_extra, run_main
from seer_trt.contracts.errors import InputError

PROG = "seer-serve"
SERVE_MODULES = ("fastapi", "uvicorn", "pydantic", "prometheus_client", "httpx")  # what the serve extra brings


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog=PROG, description="Serve an export over HTTP with OpenAI's chat-completions API (JSON or "
                "streamed Server-Sent Events); requests arriving apart share denoising steps (Engine).")  # fmt: skip
    add_engines(ap)
    g = ap.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    g.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0: any free port, printed)")
    g.add_argument("--api-key", help="require Authorization: Bearer KEY on every route but /health (default: "
                   "$SEER_API_KEY; neither: no key)")  # fmt: skip
    g.add_argument("--model-name", help="the model name clients send and /v1/models lists (default: the export "
                   "folder's name)")  # fmt: skip
    g.add_argument("--allow-image-urls", action="store_true",
                   help="fetch http(s) image URLs in messages (within the export's image byte bound and "
                   "--image-url-timeout; the server then reaches any address a client names, so only where that "
                   "is acceptable). Default: refused with 400; data: URLs always work")  # fmt: skip
    g.add_argument(
        "--image-url-timeout",
        type=float,
        default=10.0,
        help="seconds one image URL may take to fetch, redirects included (default: 10)",
    )
    s = ap.add_argument_group("engine")
    s.add_argument("--max-queue", type=int, default=256,
                   help="requests waiting for admission at most; more are answered 429 (default: 256)")  # fmt: skip
    s.add_argument("--max-rows", type=int, help="rows denoised together at most (default: 4 x the largest batch "
                   "bucket)")  # fmt: skip
    s.add_argument("--timeout", type=float, help="each request's deadline in seconds; past it, 504 (default: none)")
    s.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a connection may take to finish a request's headers (from its opening or its last "
                   "answer) before it is closed, so unfinished or trickled headers cannot hold the server "
                   "(default: 10)")  # fmt: skip
    s.add_argument("--max-held-mib", type=int,
                   help="request bodies held at once, all requests together, in MiB; past it 429 with Retry-After. "
                   "Each held body is parsed and its image decoded, so the server's peak memory under the largest "
                   "bodies stays within 5 x this over its idle size (default: 8 of the largest bodies the export "
                   "accepts)")  # fmt: skip
    s.add_argument("--grace", type=float, default=30.0,
                   help="seconds a shutdown (SIGTERM, Ctrl-C) waits for requests in flight; those still running "
                   "then end with an error answer (503, or an error event and [DONE] on a stream) (default: 30)")  # fmt: skip
    s.add_argument("--binding-cache-mib", type=int,
                   help="ONNX Runtime backend: output buffers kept per engine thread for reuse, in MiB, least "
                   "recently used out. Steps that pack requests arriving apart take many shapes, so the process "
                   "grows by up to this much after warm-up (default: the backend's, 512)")  # fmt: skip
    r = ap.add_argument_group('Ray Serve (docs/DESIGN.md "Scaling out"; needs the ray extra)')
    r.add_argument("--ray", metavar="ADDRESS",
                   help="deploy on a Ray cluster instead of serving here: replicas of this server, one engine each, "
                   "behind Ray Serve's proxy on --host:--port. ADDRESS: the head's HOST:PORT (its GCS port, 6379 "
                   "by default), ray://HOST:PORT (its Ray Client server, 10001 by default), auto (the cluster "
                   "this machine runs, or $RAY_ADDRESS) or local (a cluster of its own, started here and stopped "
                   "with seer-serve). Ctrl-C or SIGTERM removes the application (replicas finish what they hold "
                   "within --grace) and leaves a running cluster running")  # fmt: skip
    r.add_argument("--replicas", type=int, default=1, help="with --ray: replicas (default: 1)")
    r.add_argument("--autoscale", metavar="MIN:MAX",
                   help="with --ray: scale between MIN and MAX replicas on ongoing requests per replica (target "
                   "16, the rows a step batches cheaply) instead of --replicas")  # fmt: skip
    r.add_argument(
        "--gpus-per-replica",
        type=float,
        default=0.0,
        help="with --ray: GPUs each replica holds (1 on GPU nodes: one engine per GPU; default: 0)",
    )
    r.add_argument("--cpus-per-replica", type=float, default=1.0, help="with --ray: CPUs each replica holds "
                   "(default: 1)")  # fmt: skip
    add_backend(ap)
    add_verbose(ap)
    return ap


RAY_ONLY = ("replicas", "autoscale", "gpus_per_replica", "cpus_per_replica")
RAY_WORDS = ("auto", "local")  # ray.init's addresses that name no host: find the cluster, or start one here
# ray.init's HOST:PORT, bare (the GCS) or ray:// (the Ray Client server); an IPv6 host in brackets
RAY_ADDRESS = re.compile(r"(?:ray://)?(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9._-]+)):(?P<port>[0-9]+)")


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, build_parser(), work, argv, atomic=False)


def check_flags(args: argparse.Namespace) -> None:
    """The flags on their own, before opening the export."""
    if not 0 <= args.port <= 65535:
        raise InputError(f"--port {args.port} is not a port; pass 0-65535")
    for flag, value in (("--max-queue", args.max_queue), ("--max-rows", args.max_rows)):
        if value is not None and value < 1:
            raise InputError(f"{flag} {value} must be at least 1")
    if args.max_held_mib is not None and args.max_held_mib < 1:
        raise InputError(f"--max-held-mib {args.max_held_mib} must be at least 1")
    backend_options(args)  # --kv-budget-mib
    if args.binding_cache_mib is not None and args.binding_cache_mib < 0:
        raise InputError(f"--binding-cache-mib {args.binding_cache_mib} must be at least 0")
    if not args.image_url_timeout > 0:
        raise InputError(f"--image-url-timeout {args.image_url_timeout} must be a positive number of seconds")
    for flag, value in (("--header-timeout", args.header_timeout), ("--grace", args.grace)):
        if not value > 0:
            raise InputError(f"{flag} {value} must be a positive number of seconds")
    if args.timeout is not None and not args.timeout > 0:
        raise InputError(f"--timeout {args.timeout} must be a positive number of seconds")
    default = build_parser().get_default
    if args.ray is None:
        given = [f"--{n.replace('_', '-')}" for n in RAY_ONLY if getattr(args, n) != default(n)]
        if given:
            raise InputError(f"{', '.join(given)} apply with --ray ADDRESS (a Ray cluster's replicas); without it "
                             f"seer-serve is one engine in this process")  # fmt: skip
        return
    ray_address(args.ray)
    if args.replicas < 1:
        raise InputError(f"--replicas {args.replicas} must be at least 1")
    if args.autoscale is not None:
        autoscale_range(args.autoscale)
        if args.replicas != default("replicas"):
            raise InputError("--replicas and --autoscale are two ways to say how many replicas; pass one")
    for flag, value in (("--gpus-per-replica", args.gpus_per_replica), ("--cpus-per-replica", args.cpus_per_replica)):
        if value < 0:
            raise InputError(f"{flag} {value} must be at least 0")
    if args.binding_cache_mib is not None:
        raise InputError("--binding-cache-mib applies to seer-serve's own engine, not with --ray")
    if args.header_timeout != default("header_timeout"):
        raise InputError("--header-timeout applies to seer-serve's own server; with --ray Ray Serve's proxies hold "
                         "the connections")  # fmt: skip
    if args.port == 0:
        raise InputError("--port 0 (any free port) is not possible with --ray: Serve's proxies listen on the same "
                         "port on every node; pass one")  # fmt: skip
    on_gpu = args.provider in ("cuda", "tensorrt") or args.backend != "onnxruntime"
    if on_gpu and args.gpus_per_replica == 0:
        raise InputError(f"--backend {args.backend} --provider {args.provider} runs on a GPU: pass "
                         f"--gpus-per-replica 1 (one engine per GPU), or Ray puts every replica of a node on its first "
                         f"GPU")  # fmt: skip


def work(args: argparse.Namespace) -> int:
    check_flags(args)
    require_extra(PROG, SERVE_MODULES, "serve")
    from seer_trt.serving.openai.server import Settings, run

    key = args.api_key or os.environ.get("SEER_API_KEY") or None
    if args.ray is not None:
        return on_ray(args, key)
    held = None if args.max_held_mib is None else args.max_held_mib * 2**20
    binding = None if args.binding_cache_mib is None else args.binding_cache_mib * 2**20
    settings = Settings(args.engines, args.host, args.port, key, backend_options(args), args.model_name,
                        args.max_rows, args.max_queue, args.timeout, args.allow_image_urls, args.image_url_timeout,
                        held, args.header_timeout, args.grace, binding)  # fmt: skip
    return run(settings, PROG)


def ray_address(text: str) -> tuple[str, int] | None:
    """--ray's (host, port), or None for ``auto`` and ``local`` (Ray finds the cluster, or starts one here): the
    forms ``ray.init`` takes, checked before Ray sees them (Ray answers the others with a traceback).

    Raises:
        InputError: not one of those forms, or a port outside 1-65535.
    """
    if text in RAY_WORDS:
        return None
    match = RAY_ADDRESS.fullmatch(text)
    port = int(match["port"]) if match else 0
    if not 0 < port < 2**16:
        raise InputError(f"--ray {text} is not a Ray address; pass the head's HOST:PORT (its GCS port, 6379 by "
                         f"default), ray://HOST:PORT (its Ray Client server, 10001 by default), auto (the cluster "
                         f"this machine runs) or local (a cluster started here)")  # fmt: skip
    return match["v6"] or match["host"], port


def autoscale_range(text: str | None) -> tuple[int, int] | None:
    """--autoscale MIN:MAX as (MIN, MAX); None when not given.

    Raises:
        InputError: not MIN:MAX with 1 <= MIN <= MAX.
    """
    if text is None:
        return None
    lo, _, hi = text.partition(":")
    if not (lo.isdigit() and hi.isdigit() and 0 < int(lo) <= int(hi)):
        raise InputError(f"--autoscale {text} is not MIN:MAX replicas with 1 <= MIN <= MAX")
    return int(lo), int(hi)


def ray_application(args: argparse.Namespace, key: str | None, replicas: int | None = None):
    """The Ray Serve application seer-serve's flags describe (``replicas``: another count, the same otherwise: Serve
    then changes the count in place, draining the replicas it stops)."""
    import math

    from seer_trt.serving.ray_serve import application

    autoscale = autoscale_range(args.autoscale) if replicas is None else None

    threads = args.threads or max(1, math.ceil(args.cpus_per_replica))  # 0 would take every core of the node
    pipeline = {**backend_options(args), "threads": threads}
    serving = {"timeout_s": args.timeout, "allow_image_urls": args.allow_image_urls,
               "image_url_timeout_s": args.image_url_timeout,
               "max_held_bytes": None if args.max_held_mib is None else args.max_held_mib * 2**20}  # fmt: skip
    return application(str(args.engines), replicas or args.replicas, autoscale, args.model_name,
                       num_gpus=args.gpus_per_replica, num_cpus=args.cpus_per_replica, api_key=key, grace_s=args.grace,
                       pipeline=pipeline, serving=serving, max_rows=args.max_rows, max_queue=args.max_queue)  # fmt: skip


def on_ray(args: argparse.Namespace, key: str | None) -> int:
    """--ray: deploy seer_trt.serving.ray_serve's application on the cluster at ``args.ray`` and hold it until a
    signal, then remove it (its replicas drain within --grace)."""
    import contextlib
    import signal
    import time
    import warnings

    require_extra(PROG, ("ray",), "ray")
    from seer_trt.contracts.manifest import Manifest
    from seer_trt.contracts.signals import Interrupted

    Manifest.read(args.engines)  # a bad export is one line here, not a replica failing to start on every node
    address = ray_address(args.ray)
    if address is not None:  # Ray's client retries a dead address for minutes: one line now
        import socket

        try:
            socket.create_connection(address, timeout=10).close()
        except OSError as err:
            raise InputError(f"--ray {args.ray}: no Ray cluster answers there ({err.strerror or err}); start one "
                             f"with ray start --head, or pass its address") from None  # fmt: skip
    import ray
    from ray import serve

    from seer_trt.serving.ray_serve import APP

    def stop(signum, frame):
        raise Interrupted(signum)

    try:
        with warnings.catch_warnings():  # the client's timeout is a warning line before its error: the error says it
            warnings.simplefilter("ignore")
            ray.init(address=args.ray, logging_level="ERROR", log_to_driver=args.verbose)
    except (ConnectionError, RuntimeError, ValueError) as err:  # ValueError: a malformed $RAY_ADDRESS under auto
        raise InputError(f"--ray {args.ray}: no Ray cluster answers there ({str(err).splitlines()[0]}); start one "
                         f"with ray start --head, or pass its address") from None  # fmt: skip
    for signum in (signal.SIGTERM, signal.SIGHUP):  # after ray.init, whose core worker installs its own
        signal.signal(signum, stop)
    autoscale = autoscale_range(args.autoscale)
    name = args.model_name or args.engines.resolve().name
    count = f"{autoscale[0]}-{autoscale[1]} replicas" if autoscale else f"{args.replicas} replica(s)"
    if APP in serve.status().applications:  # another seer-serve's: replacing it, then deleting it, would be silent
        raise InputError(f"a Ray Serve application {APP!r} already runs on {args.ray}; stop the seer-serve that "
                         f"deployed it, or remove it with: serve shutdown (or serve.delete({APP!r}))")  # fmt: skip
    deployed = False
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        from ray.serve.context import _get_global_client

        http = _get_global_client().http_config  # Serve keeps the proxies' address of its first start on a cluster
        if (http.host, http.port) != (args.host, args.port):
            raise InputError(f"Serve already runs on {args.ray} with its proxies on {http.host}:{http.port}, which "
                             f"it cannot change; pass --host {http.host} --port {http.port}, or restart Serve "
                             f"(serve shutdown)")  # fmt: skip
        print(f"{PROG}: deploying {count} of {name!r} on Ray ({args.ray}) ...", file=sys.stderr, flush=True)
        deployed = True
        try:
            serve.run(ray_application(args, key), name=APP, route_prefix="/")
        except (RuntimeError, ValueError) as err:  # RayServeException (DEPLOY_FAILED) is a RuntimeError
            raise InputError(f"Ray Serve could not deploy {APP!r}: {str(err).strip().splitlines()[-1][:300]}") from None
        print(f"{PROG}: serving {name!r} from {args.engines} on Ray ({args.ray}), {count}, at "
              f"http://{args.host}:{args.port}/v1 (API key {'required' if key else 'not required'})",
              file=sys.stderr, flush=True)  # fmt: skip
        while True:
            time.sleep(5)
            status = serve.status().applications.get(APP)
            if status is None or status.status in ("DEPLOY_FAILED", "DELETING"):
                state = "removed" if status is None else status.status
                raise InputError(f"the Ray Serve application {APP!r} is {state} on {args.ray}")
    finally:
        try:
            if deployed:
                with contextlib.suppress(Exception):  # the cluster may be gone: the error that brought us here counts
                    serve.delete(APP)
        finally:
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
