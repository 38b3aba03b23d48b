"""``SeerPipeline``: requests in, answers out, through an export's graphs on one backend (docs/DESIGN.md "Layout and
dependency direction", "Seer, exactly").

In:  an export folder (``seer-export``), then ``Request``s: prompt text, optional image, optional overrides.
Out: one ``Result`` per request: text, answer ids, L*, steps, per-stage seconds (or the request's error).

A call plans first, then executes the plan; each stage takes what the one before returned:

    plan:    request ─► prompt (ids) ─► image (tiles + layout) ─► embed (PromptEmbeds) ─► groups by settings
    execute: per group step_zero ─► boundary (L*) ─► schedule ─► its rows; every group's rows in one loop ─►
             denoise (each step: dispatch, layout, kv_cache) ─► detokenize

Requests with the same generation settings share one step-zero pass; then every row, whatever its settings, steps
in the one loop, each step's live rows split into graph calls as the dispatch policy decides. A request whose input is
bad (empty prompt, unreadable image, prompt past the largest bucket) gets its error in its result and the others
complete. The ``cost_model`` policy's step costs are measured once, as a step of their own between planning and
execution (or at open). A pipeline may be called from several threads at once: the backend's sessions are
shared, and each thread has its own bound buffers.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from seer_trt.backends import open_backend
from seer_trt.contracts.backend import Backend
from seer_trt.contracts.config import CostCalibration, GenerationConfig, SeerConfig
from seer_trt.contracts.errors import ConfigError, InputError, ManifestError, SeerError, describe
from seer_trt.contracts.graphs import CACHED_GRAPHS, has_cache
from seer_trt.contracts.manifest import Manifest
from seer_trt.contracts.policies import DEFAULT_CACHE, DEFAULT_POLICY, CacheConfig, check_cache, check_dispatch
from seer_trt.runtime import costs
from seer_trt.runtime.boundary import detect
from seer_trt.runtime.decoding import Decoding, choose
from seer_trt.runtime.denoise import Loop, LoopSettings, LoopStats, Row, make_rows
from seer_trt.runtime.detokenize import MaskAnswerError, answer
from seer_trt.runtime.dispatch import CostModel
from seer_trt.runtime.embed import Embedder, PromptEmbeds
from seer_trt.runtime.image import Image, ImageLimits, prepare_image
from seer_trt.runtime.kv_cache import CallBuffers, KVPool, cache_layout, default_kv_budget
from seer_trt.runtime.prompt import PromptFormat
from seer_trt.runtime.request import GENERATION_FIELDS, Request, Result, check_settings
from seer_trt.runtime.schedule import plan_schedule
from seer_trt.runtime.step_zero import check_seer, step_zero_rows

STAGES = ("preprocess", "step_zero", "boundary", "dispatch", "packing", "denoise", "detokenize")
Mode = str  # "seer": step zero and the boundary rule; "full": the padded loop; "window": cut, no step zero


@dataclasses.dataclass(frozen=True, eq=False)  # holds arrays: compared by identity
class GroupPlan:
    """Requests that run together: one step-zero pass, one dispatch plan, one set of settings."""

    gen: GenerationConfig  # the settings every row shares
    decoding: Decoding  # how they decode, chosen once from ``gen`` (``seer_trt.runtime.decoding.choose``)
    mode: Mode  # "seer" | "full" | "window" (each row cut to its ``windows`` entry: the oracle at the true length)
    early_stop: bool  # LLaDA-V's stopping rule: a row stops once the answer before its first <|eot_id|> is done
    cache: CacheConfig  # the prompt K/V cache policy of the loop
    rows: tuple[int, ...]  # [R] the requests' indices in the call, in order
    prompts: tuple[PromptEmbeds, ...]  # [R] their prompt embeddings
    prepare_s: tuple[float, ...]  # [R] seconds each took to prepare (prompt, image, embed)
    seeds: np.ndarray  # [R] int64 sampling seeds
    top_p: np.ndarray  # [R] float64 nucleus masses of sampling
    windows: np.ndarray  # [R] int64 kept positions of mode "window" (gen_length otherwise)


@dataclasses.dataclass(frozen=True, eq=False)
class Checked:
    """One request's cheap part checked (``SeerPipeline.check``): what a server needs before it queues a request (a
    400 without a queue slot, the prompt's token count for usage), kept so that nothing is tokenized twice."""

    request: Request
    gen: GenerationConfig  # its settings over the export's defaults
    decoding: Decoding  # chosen once from ``gen``
    cache: CacheConfig  # its prompt K/V cache policy
    ids: tuple[int, ...]  # its prompt ids, chat template applied (image placeholders unexpanded)


@dataclasses.dataclass(frozen=True, eq=False)
class Prepared:
    """One request ready to run (``SeerPipeline.prepare_one``): its settings, prompt embeddings and cache policy."""

    request: Request
    gen: GenerationConfig
    decoding: Decoding  # chosen once from ``gen``
    prompt: PromptEmbeds
    cache: CacheConfig
    mode: Mode
    seconds: float  # to prepare it


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """What one call runs, decided before any denoising: like vLLM's scheduler output, plain data."""

    size: int  # requests in the call: one Result each, in order
    groups: tuple[GroupPlan, ...]  # requests grouped by settings, in the order of each group's first request
    failed: dict[int, tuple[str, str]]  # request index -> why it could not be prepared (it fails alone), and the
    # error's kind: "input" (the request's own input: a client error) or "internal"
    policy: str  # dispatch policy of every group
    needs_costs: bool  # cost_model with several rows (of any groups: they share calls): the step costs come first


@dataclasses.dataclass(frozen=True)
class BatchOutput:
    results: tuple[Result, ...]  # one per request, in order
    stats: LoopStats  # how its rows stepped: steps, graph calls, rows per call
    # (reuse, forecast or None) relative K/V error a cache's drift gate measured at each refresh it checked
    kv_errors: tuple[tuple[float, float | None], ...] = ()


@dataclasses.dataclass(eq=False)
class GroupRun:
    """A group started (``SeerPipeline.start_group``): its rows, each ready for the loop, and the stages' seconds."""

    group: GroupPlan
    rows: list[Row]  # [R] in the group's order
    clock: dict[str, float]  # seconds per stage


class SeerPipeline:
    """The Seer pipeline over one export and one backend."""

    def __init__(self, folder: str | Path, manifest: Manifest, backend: Backend, policy: str = DEFAULT_POLICY,
                 tau_pad: float = 0.2, short: int = 4, image_limits: ImageLimits | None = None,
                 seer: SeerConfig | None = None, cache: CacheConfig = DEFAULT_CACHE,
                 cost: CostModel | None = None, max_prompt_chars: int | None = None,
                 kv_budget: int | None = None) -> None:  # fmt: skip
        """
        Args:
            image_limits: what an image may cost before it is decoded; None: the manifest's.
            cache: the prompt K/V cache policy of requests that do not choose one (docs/DESIGN.md "Prompt K/V cache").
            seer: a detector other than the export's calibration (``manifest.seer``): the end-token signal at full
                depth (every export's ``denoise`` returns ``p_end``), or other detector settings of the signal the
                ``step_zero`` graph was exported for.
            cost: the ``cost_model`` policy's step costs, measured before (``calibrate_costs``); None: measured
                when a call first needs them.
            max_prompt_chars: the most characters of message text a request may send, checked before templating
                and tokenizing; None: what the largest prompt bucket can hold (``prompt_char_limit``).
            kv_budget: bytes the prompt K/V pool may hold in the backend's memory (the rows' snapshots and the
                loops' call buffers): a request is admitted when its slot fits; None: ``default_kv_budget``.

        Raises:
            ConfigError: ``seer`` reads a signal the export's ``step_zero`` graph does not compute; a cache policy
                other than none on an export whose window graph takes no cache; bad dispatch settings.
        """
        check_dispatch(policy, tau_pad, short)
        self.folder = Path(folder)
        self.manifest = manifest
        self.seer = manifest.seer if seer is None else check_seer(seer, manifest)
        self.backend = backend
        # the shapes calls are padded to: the built profiles' buckets on TensorRT, the manifest's otherwise
        self.buckets = backend.buckets() or manifest.buckets
        self.prompts = PromptFormat(folder, manifest, self.buckets.prompt[-1], max_prompt_chars)
        v = manifest.vision
        self.image_limits = image_limits or ImageLimits.of(v)
        self.embedder = Embedder(manifest, backend)
        self.policy = policy
        self.cache = check_cache(cache, manifest)
        self.tau_pad = tau_pad
        self.short = short
        self.cost = cost
        self._cost_lock = threading.Lock()
        self._local = threading.local()  # per thread: the call buffers its generate calls reuse
        self._tail_embed: np.ndarray | None = None
        spec = next((backend.spec(g) for g in CACHED_GRAPHS if g in manifest.graphs), None)
        self._pool = None  # the rows' prompt K/V slots in the backend's memory (an export before 2.1 has no cache)
        if spec is not None and cache_layout(spec) is not None:
            budget = kv_budget if kv_budget is not None else default_kv_budget(backend.memory)
            self._pool = KVPool(backend.memory, spec, budget)

    @classmethod
    def from_manifest(cls, folder: str | Path, backend: str = "onnxruntime", provider: str = "cpu",
                      threads: int = 0, verify: bool = False, cuda_graphs: bool = False, share_weights: bool = True,
                      calibrate: bool = False, **options: Any) -> SeerPipeline:  # fmt: skip
        """Open an export folder.

        Args:
            backend: "onnxruntime", "tensorrt" or "tensorrt-rtx".
            provider: ONNX Runtime's provider ("cpu", "cuda", "tensorrt").
            threads: ONNX Runtime intra-op threads (0: its default).
            verify: check every graph file against the sha256 the export recorded before opening it.
            cuda_graphs: TensorRT: replay CUDA graphs for calls at a static bucket shape.
            share_weights: ONNX Runtime CPU: every session reads one memory map of the shared weights file
                (``seer_trt.backends.onnxruntime.OrtBackend``).
            calibrate: measure the ``cost_model`` policy's step costs now (about 2 s on a 2-core CPU with the
                fixture) rather than before the first call that needs them.
            options: ``SeerPipeline`` options (policy, tau_pad, short, image_limits, seer, cache, cost).

        Raises:
            ManifestError: no manifest, a corrupt one, an unsupported schema, a graph file missing or (``verify``)
                not the exported one.
            ConfigError: an unknown backend or provider, or a provider ONNX Runtime does not offer.
        """
        manifest = Manifest.read(folder)
        if verify:
            from seer_trt.contracts.integrity import verify as verify_files

            verify_files(folder, manifest)
        opened = open_backend(folder, manifest, backend, provider, threads, cuda_graphs=cuda_graphs,
                              share_weights=share_weights)  # fmt: skip
        pipe = cls(folder, manifest, opened, **options)
        if calibrate:
            pipe.calibrate_costs()
        return pipe

    # --- settings -------------------------------------------------------------------------------------------

    def settings(self, **overrides: Any) -> GenerationConfig:
        """The export's generation defaults with ``overrides`` (``GENERATION_FIELDS``; None keeps a default).

        Raises:
            InputError: a bad value, steps past gen_length, or a window past the largest answer bucket.
        """
        base = self.manifest.generation
        changes = {k: v for k, v in overrides.items() if v is not None}
        unknown = sorted(set(changes) - set(GENERATION_FIELDS))
        if unknown:
            raise InputError(f"unknown generation setting(s) {unknown}; expected {list(GENERATION_FIELDS)}")
        check_settings(**changes)
        if "gen_length" in changes:  # a new window: the export's rule (manifest "lengths") shapes its blocks, steps
            n = changes["gen_length"]
            try:
                block, steps = self.manifest.lengths.shape(n, base, changes.get("block_length"))
            except ValueError as err:
                raise InputError(str(err)) from None
            changes.setdefault("block_length", block)
            changes.setdefault("steps", steps)
        try:
            gen = dataclasses.replace(base, **changes)
        except (ValueError, TypeError) as err:
            raise InputError(f"request settings: {err}") from None
        if gen.steps > gen.gen_length:  # the schedule allows it (upstream does), but those steps would commit nothing
            raise InputError(f"steps {gen.steps} exceeds gen_length {gen.gen_length}: a step commits at least one "
                             f"token, so the steps past {gen.gen_length} would only repeat the model for nothing; pass "
                             f"steps <= gen_length")  # fmt: skip
        largest = self.buckets.answer[-1]
        if gen.gen_length > largest:
            raise InputError(f"gen_length {gen.gen_length} exceeds the largest answer bucket {largest}; ask for "
                             f"<= {largest} or re-export with larger buckets")  # fmt: skip
        return gen

    def generation(self, request: Request) -> GenerationConfig:
        """The request's settings: its overrides over the export's defaults."""
        return self.settings(**{k: getattr(request, k) for k in GENERATION_FIELDS})

    def cache_for(self, request: Request) -> CacheConfig:
        """The request's cache policy: its ``cache`` (a policy, or a mode over the pipeline's policy) and
        ``refresh_interval`` over the pipeline's.

        Raises:
            InputError: a bad interval, or a cache on an export without one.
        """
        base = request.cache if isinstance(request.cache, CacheConfig) else self.cache
        mode = None if isinstance(request.cache, CacheConfig) else request.cache
        changes = {k: v for k, v in (("mode", mode), ("refresh", request.refresh_interval)) if v is not None}
        try:
            return check_cache(dataclasses.replace(base, **changes), self.manifest)
        except ConfigError as err:
            raise InputError(str(err)) from None

    # --- plan -----------------------------------------------------------------------------------------------

    def encode(self, prompt: str, image: Image | None = None, system: str | None = None,
               history: Sequence[tuple[str, str]] = ()) -> PromptEmbeds:  # fmt: skip
        """A request's prompt embeddings: prompt ids, then the image's tiles, then both through the graphs.

        Raises:
            InputError: an empty prompt, misplaced ``<image>`` placeholders, or an unreadable or too large image.
        """
        ids = self.prompts.ids(prompt, image is not None, system, history)
        prepared = None if image is None else prepare_image(image, self.manifest.vision, self.image_limits)
        return self.embedder.embed(ids, prepared)

    def check(self, request: Request) -> Checked:
        """What is cheap to check of one request, no image decoded and no graph run: its settings, decoding, cache
        policy and prompt ids (``Checked``, which ``prepare`` and the engine take as they are).

        Raises:
            InputError: bad settings, a rule this export cannot run, an empty or too long prompt, misplaced
                ``<image>`` placeholders.
        """
        if not isinstance(request, Request):
            raise InputError(f"expected a Request or a prompt string, got {type(request).__name__}")
        gen = self.generation(request)
        if request.window is not None and not 1 <= request.window <= gen.gen_length:
            raise InputError(f"window {request.window} must lie in [1, gen_length {gen.gen_length}]")
        decoding = choose(gen, self.manifest)
        if decoding.graph not in self.manifest.graphs:
            try:
                self.manifest.graph(decoding.graph)  # raises with the re-export command when absent
            except ManifestError as err:  # what this request asks of an export that cannot do it
                raise InputError(str(err)) from None
        cache = self.cache_for(request)
        ids = self.prompts.ids(request.prompt, request.image is not None, request.system, request.history)
        return Checked(request, gen, decoding, cache, tuple(ids))

    def prepare(self, request: Request | Checked) -> tuple[Checked, PromptEmbeds]:
        """A request checked (``check``, unless it was) and its prompt embeddings: the image decoded and tiled, the
        prompt ids and image features through the graphs.

        Raises:
            InputError: what ``check`` raises, an unreadable or too large image, a prompt past the largest bucket.
        """
        checked = request if isinstance(request, Checked) else self.check(request)
        image = checked.request.image
        prepared = None if image is None else prepare_image(image, self.manifest.vision, self.image_limits)
        prompt = self.embedder.embed(list(checked.ids), prepared)
        largest = self.buckets.prompt[-1]
        if len(prompt.embeds) > largest:
            raise InputError(
                f"the prompt takes {len(prompt.embeds)} embeddings (text and image features), more than the largest "
                f"prompt bucket {largest}; shorten it or re-export with larger buckets"
            )
        return checked, prompt

    def plan(self, requests: Sequence[Request | str], policy: str | None = None) -> Plan:
        """Prepare every request and group them by settings; a request that cannot be prepared fails alone."""
        return self.group([self.prepare_one(r) for r in requests], policy)

    def prepare_one(self, request: Request | Checked | str) -> Prepared | tuple[str, str]:
        """One request prepared (settings, prompt, image, embeddings, cache policy), or (why it failed, the error's
        kind: "input" or "internal"); a ``Checked`` one is not checked again. Safe to call from any thread (the engine
        prepares off its own)."""
        start = time.perf_counter()
        try:
            request = Request(request) if isinstance(request, str) else request
            checked, prompt = self.prepare(request)
        except (InputError, ConfigError) as err:  # the request's own input or settings
            return str(err), "input"
        except SeerError as err:  # a graph or component failed while preparing it (embed, vision)
            return str(err), "internal"
        except Exception as err:  # noqa: BLE001 - whatever this one request's input set off, it fails alone
            return (f"this request could not be prepared ({type(err).__name__}: {describe(err)}); the others are "
                    f"unaffected", "internal")  # fmt: skip
        request = checked.request
        mode = "window" if request.window is not None else "seer" if request.seer else "full"
        return Prepared(request, checked.gen, checked.decoding, prompt, checked.cache, mode,
                        time.perf_counter() - start)  # fmt: skip

    def group(self, items: Sequence[Prepared | tuple[str, str]], policy: str | None = None) -> Plan:
        """The plan of prepared requests (``prepare_one``'s, in the call's order): grouped by settings, the failed
        ones apart."""
        policy = policy or self.policy
        check_dispatch(policy, self.tau_pad, self.short)
        failed = {i: item for i, item in enumerate(items) if not isinstance(item, Prepared)}
        ready: dict[tuple, list[tuple[int, Prepared]]] = {}
        for i, item in enumerate(items):
            if isinstance(item, Prepared):
                ready.setdefault((item.gen, item.mode, item.request.early_stop, item.cache), []).append((i, item))
        groups = tuple(
            GroupPlan(gen, members[0][1].decoding, mode, early_stop, cache, rows=tuple(i for i, _ in members),
                      prompts=tuple(p.prompt for _, p in members), prepare_s=tuple(p.seconds for _, p in members),
                      seeds=np.array([p.request.seed for _, p in members], dtype=np.int64),
                      top_p=np.array([p.request.top_p for _, p in members], dtype=np.float64),
                      windows=np.array([p.request.window or gen.gen_length for _, p in members], dtype=np.int64))
            for (gen, mode, early_stop, cache), members in ready.items()
        )  # fmt: skip
        needs_costs = policy == "cost_model" and sum(len(g.rows) for g in groups) > 1  # rows of any groups share calls
        return Plan(len(items), groups, failed, policy, needs_costs)

    def calibrate_costs(self, plan: CostCalibration | None = None) -> CostModel:
        """Measure the backend's step costs for the ``cost_model`` policy (``seer_trt.runtime.costs``) at ``plan``'s
        shapes (None: the manifest's ``cost_calibration``)."""
        self.cost = costs.calibrate(self.backend, self.manifest, self.buckets, plan)
        return self.cost

    # --- execute --------------------------------------------------------------------------------------------

    def generate(self, requests: Request | str | Sequence[Request | str], policy: str | None = None) -> list[Result]:
        """Answer ``requests`` (a prompt string is a Request with defaults); one Result each, in order."""
        return list(self.generate_batch(requests, policy).results)

    def generate_batch(self, requests: Request | str | Sequence[Request | str],
                       policy: str | None = None) -> BatchOutput:  # fmt: skip
        """``generate``, also returning the dispatch plans (one per group of requests with equal settings)."""
        requests = [requests] if isinstance(requests, Request | str) else list(requests)
        return self.execute(self.plan(requests, policy))

    def execute(self, plan: Plan) -> BatchOutput:
        """Run ``plan``: the cost model's calibration first when it needs one and none was measured, then every
        group started and its rows stepped in one loop to the end: the engine's path with every row arriving at
        once. Rows whose prompt K/V does not fit the pool yet wait for others to finish."""
        if plan.needs_costs and self.cost is None:
            with self._cost_lock:
                if self.cost is None:
                    self.calibrate_costs()
        results: list[Result | None] = [None] * plan.size
        for i, (error, kind) in plan.failed.items():
            results[i] = Result.failed(error, kind)
        runs = [self.start_group(group) for group in plan.groups]  # step zero, L*, schedule, the rows
        waiting = [row for run in runs for row in run.rows]
        loop = self.loop(plan.policy)
        t0 = time.perf_counter()
        try:
            while waiting or loop.rows:
                waiting = waiting[loop.add(waiting) :]  # in order, as their K/V slots fit the pool
                if waiting and not loop.rows:  # nothing will give a slot back: the head can never fit
                    waiting[0].error = self.too_large(waiting[0])
                    waiting = waiting[1:]
                loop.step()
                loop.retire()
        finally:
            loop.close()
        denoise_s, stats = time.perf_counter() - t0, loop.stats()
        errors = []
        for run in runs:
            run.clock["denoise"] = denoise_s
            errors += [e for r in run.rows for e in r.cache.errors]
            for i, prep, result in zip(run.group.rows, run.group.prepare_s, self.results(run), strict=True):
                results[i] = dataclasses.replace(result, seconds={"preprocess": prep, **result.seconds}) \
                    if result.ok else result  # fmt: skip
        return BatchOutput(tuple(results), stats, tuple(errors))

    def loop(self, policy: str | None = None, shared: bool = True) -> Loop:
        """A loop over this pipeline's backend (``generate`` makes one per call; the engine one for its life).

        Args:
            shared: use this thread's call buffers, kept across calls (``generate``: a call allocates none); False:
                buffers of the loop's own (the engine's loop, which lives as long as it does).
        """
        special = self.manifest.special_tokens
        settings = LoopSettings(self.backend, special.mask_id, self.buckets, policy or self.policy, self.tau_pad,
                                self.short, self.cost, self.kv_pool(), self.manifest.model.logit_shift)  # fmt: skip
        buffers = None
        if shared and self._pool is not None:
            buffers = self._local.__dict__.get("buffers")
            if buffers is None:
                buffers = self._local.buffers = CallBuffers(self._pool, self.buckets.batch[-1])
        return Loop(settings, buffers)

    def kv_pool(self) -> KVPool | None:
        """The rows' prompt K/V slots in the backend's memory (None when no window graph takes a cache)."""
        return self._pool

    def too_large(self, row: Row) -> str:
        """Why ``row`` can never be admitted: its prompt K/V is larger than what the pool's budget leaves."""
        pool = self.kv_pool()
        need = pool.slot_bytes(len(row.prefix), row.cache.config.snapshots)
        return (f"this request's prompt K/V takes {need} bytes ({len(row.prefix)} positions x "
                f"{row.cache.config.snapshots} snapshot(s)) and the K/V pool's budget is {pool.budget} bytes, "
                f"{pool.used} of them held; raise the budget (--kv-budget-mib) or send cache none")  # fmt: skip

    def start_group(self, group: GroupPlan) -> GroupRun:
        """A group's rows ready for the loop: step zero batched, boundary (L*), schedule, each row's prefix (its end
        tail ahead of its prompt), settings and cache policy; no slot reserved yet (``reserve``)."""
        gen, special, n = group.gen, self.manifest.special_tokens, group.gen.gen_length
        embeds = [p.embeds for p in group.prompts]
        rows_n = len(embeds)
        clock = {s: 0.0 for s in STAGES[1:]}
        decoding = group.decoding
        kept = group.windows.copy() if group.mode == "window" else np.full(rows_n, n, dtype=np.int64)
        step0 = None
        if group.mode == "seer":
            t0 = time.perf_counter()
            zero = step_zero_rows(self.backend, embeds, n, self.seer, self.buckets.batch[-1])
            t1 = time.perf_counter()
            kept = detect(zero.profile, self.seer)
            clock["step_zero"], clock["boundary"] = t1 - t0, time.perf_counter() - t1
            if decoding.step_zero_predicts and zero.x0 is not None:
                step0 = (zero.x0, zero.confidence)
        t0 = time.perf_counter()
        schedule = plan_schedule(gen, kept, decoding.counts)
        tails = self.tails(kept, n, [len(e) for e in embeds])
        rows = make_rows(embeds, schedule, decoding, special.mask_id, has_cache(self.backend.spec(decoding.graph)),
                         special.eot_id if group.early_stop else None, group.cache, gen.block_length, group.seeds,
                         group.top_p, step0, tails, self.tail_embed() if tails.any() else None)  # fmt: skip
        clock["dispatch"] = time.perf_counter() - t0
        return GroupRun(group, rows, clock)

    def results(self, run: GroupRun, rows: np.ndarray | None = None) -> list[Result]:
        """The Results of a started group's ``rows`` (indices into the group; all by default) as they stand now."""
        special, n = self.manifest.special_tokens, run.group.gen.gen_length
        picked = run.rows if rows is None else [run.rows[int(i)] for i in rows]
        t0 = time.perf_counter()
        out = []
        for row in picked:
            if row.error is not None:
                out.append(Result.failed(row.error, "input"))
                continue
            try:
                ids, text = answer(row.x, row.kept, self.prompts.tokenizer, special.eot_id, special.mask_id)
            except MaskAnswerError as err:  # a broken export's "answer": this request fails alone
                out.append(Result.failed(str(err), "internal"))
                continue
            out.append(Result(text, tuple(ids), tuple(row.x.tolist()), row.kept, row.used, n, dict(run.clock),
                              refreshes=row.refreshes))  # fmt: skip
        run.clock["detokenize"] = time.perf_counter() - t0
        return out

    def tails(self, kept: np.ndarray, gen_length: int, prompt_lengths: list[int]) -> np.ndarray:
        """[R] end-tail positions of a group's rows (docs/DESIGN.md "Seer, exactly"): ``seer.tail`` of each cut row's
        cut-away positions (none for a row kept whole: the padded loop), and no more than the largest prompt bucket
        leaves room for."""
        if not self.seer.tail:
            return np.zeros(len(kept), dtype=np.int64)
        room = self.buckets.prompt[-1] - np.asarray(prompt_lengths, dtype=np.int64)
        return np.clip(self.seer.tails(kept, gen_length), 0, np.maximum(room, 0))

    def tail_embed(self) -> np.ndarray:
        """[D] the embedding of the token the end tail holds (``seer.tail_token``), embedded once."""
        if self._tail_embed is None:
            self._tail_embed = self.embedder.embed([self.seer.tail_id(self.manifest.special_tokens)]).embeds[0]
        return self._tail_embed

    def close(self) -> None:
        self.backend.close()
