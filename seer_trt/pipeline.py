"""``SeerPipeline``: requests in, answers out, through an export's graphs on one backend (docs/DESIGN.md §2, §4).

In:  an export folder (``seer-export``), then ``Request``s: prompt text, optional image, optional overrides.
Out: one ``Result`` per request: text, answer ids, L*, steps, per-stage seconds (or the request's error).

    preprocess (embed.py) ─► step zero (step_zero.py) ─► boundary (boundary.py) ─► schedule (schedule.py)
    ─► dispatch (dispatch.py) ─► denoise (denoise.py, per group, in its layout.py layout) ─► detokenize

Requests with the same generation settings are batched: one step-zero pass for all of them, then their
windows, cut to each row's L*, are grouped and run as the dispatch policy decides. A request whose input is
bad (empty prompt, unreadable image, prompt past the largest bucket) gets its error in its result and the others
complete. A pipeline may be called from several threads at once: the backend's sessions are shared, and each
thread has its own bound buffers.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from seer_trt.backend import Backend, open_backend
from seer_trt.boundary import detect
from seer_trt.config import GenerationConfig, SeerConfig
from seer_trt.denoise import Greedy, Sampled, denoise
from seer_trt.dispatch import DEFAULT_POLICY, CostModel, DispatchPlan, plan_dispatch
from seer_trt.embed import Image, ImageLimits, PromptEmbeds, PromptEncoder
from seer_trt.errors import ConfigError, InputError, SeerError, describe
from seer_trt.graphs import has_cache
from seer_trt.kv_cache import CACHE_MODES, DEFAULT_CACHE, CacheConfig
from seer_trt.layout import left_pad, packed_layout, padded_layout
from seer_trt.manifest import Manifest
from seer_trt.schedule import Schedule, plan_schedule, select_rows
from seer_trt.step_zero import StepZeroOut, run_step_zero

STAGES = ("preprocess", "step_zero", "boundary", "dispatch", "packing", "denoise", "detokenize")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


def check_text(name: str, value: Any) -> None:
    """``value`` is a str that UTF-8 can encode.

    Raises:
        InputError: not a str, or a lone surrogate in it (invalid UTF-8 decoded with surrogateescape, as argv is,
            or a broken ``\\ud800`` escape in JSON); the message shows it escaped.
    """
    if not isinstance(value, str):
        raise InputError(f"{name} is a {type(value).__name__}; expected text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InputError(f"{name} is not valid Unicode text: {value[err.start : err.end]!r} at character {err.start} "
                         f"is a lone surrogate (invalid UTF-8 or a broken \\u escape); send UTF-8 text") from None  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Request:
    """One question; ``None`` overrides take the export's generation defaults."""

    prompt: str  # user message; "<image>" marks where the image goes (prepended when absent)
    image: Image | None = None  # path, encoded bytes or [H, W, 3] uint8 RGB
    gen_length: int | None = None  # answer window N
    steps: int | None = None  # denoising steps over N (Seer rescales them to the kept window)
    block_length: int | None = None
    temperature: float | None = None  # 0: greedy; > 0: Gumbel sampling from denoise_logits
    remasking: str | None = None  # "low_confidence" | "random"
    seer: bool = True  # False: the padded baseline, every step over all N positions
    early_stop: bool = False  # LLaDA-V's stopping_criteria=['<|eot_id|>']: stop once the answer before it is done
    cache: str | CacheConfig | None = None  # prompt K/V cache: "none" | "reuse" | "forecast" or a whole policy
    refresh_interval: int | None = None  # steps between prompt computations under a cache; None: the pipeline's
    window: int | None = None  # cut the window to this many positions without step zero (the oracle: true length)
    seed: int = 0  # sampling noise of this request (temperature > 0 or random remasking)
    system: str | None = None  # system message instead of the export's ("" for none); text, like the prompt

    def __post_init__(self) -> None:
        """Every field's type, so a malformed request fails alone with one line (``InputError``)."""
        check_text("prompt", self.prompt)
        if self.system is not None:
            check_text("system", self.system)
        if self.image is not None and not isinstance(self.image, str | Path | bytes | bytearray | np.ndarray):
            raise InputError(f"image is a {type(self.image).__name__}; expected a file path, encoded bytes or an "
                             f"[H, W, 3] uint8 array")  # fmt: skip
        for name in ("gen_length", "steps", "block_length", "window", "refresh_interval"):
            value = getattr(self, name)
            if value is not None and not _is_int(value):
                raise InputError(f"{name} is {value!r}; expected a whole number")
        if not _is_int(self.seed) or not 0 <= self.seed < 2**63:
            raise InputError(f"seed is {self.seed!r}; expected a whole number in [0, 2**63)")
        t = self.temperature
        if t is not None and (isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t)):
            raise InputError(f"temperature is {t!r}; expected a finite number >= 0 (0: greedy)")
        if self.remasking is not None and not isinstance(self.remasking, str):
            raise InputError(f"remasking is {self.remasking!r}; expected 'low_confidence' or 'random'")
        if self.cache is not None and not isinstance(self.cache, CacheConfig) and self.cache not in CACHE_MODES:
            raise InputError(f"cache is {self.cache!r}; expected one of {list(CACHE_MODES)} or a CacheConfig")
        for name in ("seer", "early_stop"):
            if not isinstance(getattr(self, name), bool | np.bool_):
                raise InputError(f"{name} is {getattr(self, name)!r}; expected true or false")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Request:
        """A request from a JSON object (JSONL input): ``prompt`` required, ``image`` a file path."""
        if not isinstance(data, Mapping) or not isinstance(data.get("prompt"), str):
            raise InputError(f"a request must be a JSON object with a 'prompt' string, got {ascii(data)[:80]}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise InputError(f"unknown request key(s) {unknown}; expected a subset of {sorted(fields)}")
        return cls(**dict(data))


@dataclasses.dataclass(frozen=True)
class Result:
    text: str  # the answer, special tokens dropped
    token_ids: tuple[int, ...]  # answer ids before the first <|eot_id|>
    window: tuple[int, ...]  # every kept position's id, <|eot_id|> and what follows included
    kept: int  # L*: answer positions denoised (N without Seer)
    steps: int  # denoising steps used (forward passes over this row's window)
    gen_length: int  # N
    seconds: dict[str, float]  # per stage (STAGES); batched stages count the whole batch's time
    error: str | None = None  # why this request failed; the fields above are empty then
    refreshes: int = 0  # denoising steps that computed the prompt (all of them under cache "none")

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "token_ids": list(self.token_ids), "window": list(self.window)}

    @classmethod
    def failed(cls, error: str) -> Result:
        return cls("", (), (), 0, 0, 0, {}, error)


@dataclasses.dataclass(frozen=True)
class BatchOutput:
    results: tuple[Result, ...]  # one per request, in order
    plans: tuple[DispatchPlan, ...]  # one per group of requests sharing generation settings
    # (reuse, forecast or None) relative K/V error a cache's drift gate measured at each refresh it checked
    kv_errors: tuple[tuple[float, float | None], ...] = ()


class SeerPipeline:
    """The Seer pipeline over one export and one backend."""

    def __init__(self, folder: str | Path, manifest: Manifest, backend: Backend, policy: str = DEFAULT_POLICY,
                 tau_pad: float = 0.2, short: int = 4, image_limits: ImageLimits | None = None,
                 seer: SeerConfig | None = None, cache: CacheConfig = DEFAULT_CACHE) -> None:  # fmt: skip
        """
        Args:
            image_limits: what an image may cost before it is decoded; None: the manifest's.
            cache: the prompt K/V cache policy of requests that do not choose one (docs/DESIGN.md §10).
            seer: a detector other than the export's calibration (``manifest.seer``): the end-token signal at full
                depth (every export's ``denoise`` returns ``p_end``), or other detector settings of the signal the
                ``step_zero`` graph was exported for.

        Raises:
            ConfigError: ``seer`` reads a signal the export's ``step_zero`` graph does not compute; a cache policy
                other than none on an export whose window graph takes no cache.
        """
        self.folder = Path(folder)
        self.manifest = manifest
        self.seer = manifest.seer if seer is None else check_seer(seer, manifest)
        self.backend = backend
        self.encoder = PromptEncoder(folder, manifest, backend, image_limits)
        self.policy = policy
        self.cache = check_cache(cache, manifest)
        self.tau_pad = tau_pad
        self.short = short
        self.cost: CostModel | None = None  # measured on the first batch of several rows that needs it
        self._cost_lock = threading.Lock()
        # the shapes calls are padded to: the built profiles' buckets on TensorRT, the manifest's otherwise
        self.buckets = backend.buckets() or manifest.buckets
        plan_dispatch([], [], [], self.buckets, policy, tau_pad, short, CostModel(0, 0, 0))  # validates

    @classmethod
    def from_manifest(cls, folder: str | Path, backend: str = "onnxruntime", provider: str = "cpu",
                      threads: int = 0, verify: bool = False, cuda_graphs: bool = False, share_weights: bool = True,
                      **options: Any) -> SeerPipeline:  # fmt: skip
        """Open an export folder.

        Args:
            backend: "onnxruntime", "tensorrt" or "tensorrt-rtx".
            provider: ONNX Runtime's provider ("cpu", "cuda", "tensorrt").
            threads: ONNX Runtime intra-op threads (0: its default).
            verify: check every graph file against the sha256 the export recorded before opening it.
            cuda_graphs: TensorRT: replay CUDA graphs for calls at a static bucket shape.
            share_weights: ONNX Runtime CPU: every session reads one memory map of the shared weights file
                (``seer_trt.backend.OrtBackend``).
            options: ``SeerPipeline`` options (policy, tau_pad, short, image_limits, seer, cache).

        Raises:
            ManifestError: no manifest, a corrupt one, an unsupported schema, a graph file missing or (``verify``)
                not the exported one.
            ConfigError: an unknown backend or provider, or a provider ONNX Runtime does not offer.
        """
        manifest = Manifest.read(folder)
        if verify:
            from seer_trt.integrity import verify as verify_files

            verify_files(folder, manifest)
        opened = open_backend(folder, manifest, backend, provider, threads, cuda_graphs=cuda_graphs,
                              share_weights=share_weights)  # fmt: skip
        return cls(folder, manifest, opened, **options)

    def generation(self, request: Request) -> GenerationConfig:
        """The request's settings: its overrides over the export's defaults."""
        base = self.manifest.generation
        changes = {k: getattr(request, k) for k in ("gen_length", "steps", "block_length", "temperature", "remasking")
                   if getattr(request, k) is not None}  # fmt: skip
        if "gen_length" in changes:  # a new window keeps the default's shape: one block, one step per token
            n = changes["gen_length"]
            changes.setdefault("block_length", n if base.block_length == base.gen_length else base.block_length)
            changes.setdefault("steps", max(1, n * base.steps // base.gen_length))
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

    def prepare(self, request: Request) -> tuple[GenerationConfig, PromptEmbeds]:
        """Settings and prompt embeddings of one request.

        Raises:
            InputError: bad settings, empty prompt, unreadable image, prompt past the largest bucket.
        """
        if not isinstance(request, Request):
            raise InputError(f"expected a Request or a prompt string, got {type(request).__name__}")
        gen = self.generation(request)
        if request.window is not None and not 1 <= request.window <= gen.gen_length:
            raise InputError(f"window {request.window} must lie in [1, gen_length {gen.gen_length}]")
        if gen.temperature > 0 or gen.remasking != "low_confidence":
            self.manifest.graph("denoise_logits")  # raises with the re-export command when absent
        prompt = self.encoder.encode(request.prompt, request.image, request.system)
        largest = self.buckets.prompt[-1]
        if len(prompt.embeds) > largest:
            raise InputError(
                f"the prompt takes {len(prompt.embeds)} embeddings (text and image features), more than the largest "
                f"prompt bucket {largest}; shorten it or re-export with larger buckets"
            )
        return gen, prompt

    def generate(self, requests: Request | str | Sequence[Request | str], policy: str | None = None) -> list[Result]:
        """Answer ``requests`` (a prompt string is a Request with defaults); one Result each, in order."""
        return list(self.generate_batch(requests, policy).results)

    def generate_batch(self, requests: Request | str | Sequence[Request | str],
                       policy: str | None = None) -> BatchOutput:  # fmt: skip
        """``generate``, also returning the dispatch plans (one per group of requests with equal settings)."""
        if isinstance(requests, Request | str):
            requests = [requests]
        requests = list(requests)
        results: list[Result | None] = [None] * len(requests)
        ready: dict[tuple, list[tuple[int, PromptEmbeds, float]]] = {}
        for i, request in enumerate(requests):
            start = time.perf_counter()
            try:
                requests[i] = request = Request(request) if isinstance(request, str) else request
                gen, prompt = self.prepare(request)
                cache = self.cache_for(request)
            except SeerError as err:
                results[i] = Result.failed(str(err))
                continue
            except Exception as err:  # noqa: BLE001 - whatever this one request's input set off, it fails alone
                results[i] = Result.failed(f"this request could not be prepared ({type(err).__name__}: "
                                           f"{describe(err)}); the others are unaffected")  # fmt: skip
                continue
            mode = "window" if request.window is not None else "seer" if request.seer else "full"
            key = (gen, mode, request.early_stop, cache)
            ready.setdefault(key, []).append((i, prompt, time.perf_counter() - start))
        plans, errors = [], []
        for (gen, mode, early_stop, cache), rows in ready.items():
            seeds = np.array([requests[i].seed for i, _, _ in rows], dtype=np.int64)
            windows = np.array([requests[i].window or gen.gen_length for i, _, _ in rows], dtype=np.int64)
            out, plan, gated = self._run(gen, mode, [p for _, p, _ in rows], seeds, windows, policy or self.policy,
                                         early_stop, cache)  # fmt: skip
            plans.append(plan)
            errors += gated
            for (i, _, prep), result in zip(rows, out, strict=True):
                results[i] = dataclasses.replace(result, seconds={"preprocess": prep, **result.seconds})
        return BatchOutput(tuple(results), tuple(plans), tuple(errors))

    def _run(self, gen: GenerationConfig, mode: str, prompts: list[PromptEmbeds], seeds: np.ndarray,
             windows: np.ndarray, policy: str, early_stop: bool = False,
             cache: CacheConfig = DEFAULT_CACHE) -> tuple[list[Result], DispatchPlan, list]:  # fmt: skip
        """Step zero, boundary, dispatch, denoising and detokenizing of rows sharing ``gen``.

        ``mode``: "seer" (step zero and the boundary rule), "full" (the padded baseline) or "window" (each row
        cut to its ``windows`` entry, no step zero: the oracle when that is the true length). ``early_stop``:
        every row stops once the answer before its first ``<|eot_id|>`` is complete. ``cache``: the prompt K/V
        cache policy of the denoising loop. Also returns the K/V errors its drift gate measured.
        """
        special = self.manifest.special_tokens
        seer = self.seer
        n = gen.gen_length
        embeds = [p.embeds for p in prompts]
        clock = {s: 0.0 for s in STAGES[1:]}
        greedy = gen.temperature == 0 and gen.remasking == "low_confidence"
        kept = windows.copy() if mode == "window" else np.full(len(prompts), n, dtype=np.int64)
        step0 = None
        if mode == "seer":
            t0 = time.perf_counter()
            zero = self._step_zero(embeds, n)
            t1 = time.perf_counter()
            kept = detect(zero.profile, seer)
            clock["step_zero"], clock["boundary"] = t1 - t0, time.perf_counter() - t1
            if greedy and zero.x0 is not None:
                step0 = (zero.x0, zero.confidence)
        if policy == "cost_model" and self.cost is None and len(prompts) > 1:
            with self._cost_lock:
                if self.cost is None:
                    self.calibrate_costs()
        t0 = time.perf_counter()
        schedule = plan_schedule(gen, kept)
        plan = plan_dispatch([len(e) for e in embeds], kept, schedule.steps, self.buckets, policy,
                             self.tau_pad, self.short, self.cost, self.backend.max_shape("denoise"))  # fmt: skip
        clock["dispatch"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        tokens = np.full((len(prompts), n), special.mask_id, dtype=np.int64)
        used = np.zeros(len(prompts), dtype=np.int64)  # steps each row took part in
        refreshes = np.zeros(len(prompts), dtype=np.int64)  # of those, the ones that computed the row's prompt
        errors = []
        for group in plan.groups:
            rows = np.array(group.rows)
            members = [embeds[r] for r in rows]
            t1 = time.perf_counter()
            layout = (packed_layout(members, kept[rows]) if group.path == "packed"
                      else padded_layout(members, kept[rows], group.prompt_len, group.gen_len))  # fmt: skip
            clock["packing"] += time.perf_counter() - t1
            decoder = Greedy() if greedy else Sampled(gen.temperature, gen.remasking, seeds[rows])
            group_step0 = None if step0 is None else (step0[0][rows], step0[1][rows])
            out = denoise(self.backend, layout, select_rows(schedule, rows), decoder, special.mask_id, group_step0,
                          special.eot_id if early_stop else None, cache)  # fmt: skip
            tokens[rows, : out.tokens.shape[1]] = out.tokens
            used[rows] = out.steps
            refreshes[rows] = out.refreshes
            errors += out.kv_errors
        clock["denoise"] = time.perf_counter() - t0 - clock["packing"]
        t0 = time.perf_counter()
        answers = [answer_ids(row[:k], special.eot_id) for row, k in zip(tokens, kept, strict=True)]
        texts = [self.encoder.tokenizer.decode(a, skip_special_tokens=True) for a in answers]
        clock["detokenize"] = time.perf_counter() - t0
        results = [Result(text, tuple(a), tuple(row[:k].tolist()), int(k), int(s), n, dict(clock), refreshes=int(r))
                   for text, a, row, k, s, r in zip(texts, answers, tokens, kept, used, refreshes, strict=True)]  # fmt: skip
        return results, plan, errors

    def _step_zero(self, embeds: list[np.ndarray], n: int) -> StepZeroOut:
        """Step zero for every row, in calls of at most the largest batch bucket."""
        size = self.buckets.batch[-1]
        parts = []
        for start in range(0, len(embeds), size):
            prefix, valid = left_pad(embeds[start : start + size])
            parts.append(run_step_zero(self.backend, prefix, valid, n, self.seer))
        join = lambda xs: None if xs[0] is None else np.concatenate(xs)  # noqa: E731
        return StepZeroOut(*(join([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(StepZeroOut)))

    # (rows, prompt, answer) of the timed calls: single rows from short to long prompts, small and full batches of
    # short rows, and one long sequence like a packed group, so the fit sees launch, per-slot and attention costs.
    CALIBRATION_SHAPES = ((1, 16, 4), (1, 32, 16), (1, 128, 32), (1, 384, 64), (1, 640, 128), (4, 32, 8),
                          (4, 128, 32), (8, 32, 8), (16, 32, 16), (16, 64, 32))  # fmt: skip

    def calibrate_costs(self, shapes: Sequence[tuple[int, int, int]] = CALIBRATION_SHAPES,
                        repeats: int = 5) -> CostModel:  # fmt: skip
        """Time one denoising step (the loop's host work and the graph call) at ``shapes``, fit ``CostModel``
        and use it for the ``cost_model`` policy. About two seconds on a 2-core CPU with the fixture.

        Args:
            shapes: (rows, prompt length, answer length) of the timed calls.
            repeats: timed steps per shape after one warm-up; the fastest is the shape's time (other load on the
                machine only ever adds time, so the minimum is the least disturbed estimate).
        """
        dim = self.manifest.model.hidden_size
        mask = self.manifest.special_tokens.mask_id
        limits = self.backend.max_shape("denoise") or {}
        fitting = []  # each shape within the buckets and the backend's largest shape (engine profiles)
        for b, p, g in shapes:
            b, p, g = min(b, self.buckets.batch[-1]), min(p, self.buckets.prompt[-1]), min(g, self.buckets.answer[-1])
            p = max(1, min(p, limits.get("prompt", p), limits.get("seq", p + g) - g))
            fitting.append((b, p, g))
        sizes, seconds = [], []
        for b, p, g in dict.fromkeys(fitting):
            prompts = [np.zeros((p, dim), dtype=self.manifest.precision)] * b
            kept = np.full(b, g, dtype=np.int64)
            layout = padded_layout(prompts, kept, p, g)
            one_step = Schedule(kept, np.ones(b, np.int64), np.zeros((b, 1), np.int64), np.full((b, 1), g))
            times = []
            for _ in range(repeats + 1):  # the first binds buffers and warms the session
                start = time.perf_counter()
                denoise(self.backend, layout, one_step, Greedy(), mask)
                times.append(time.perf_counter() - start)
            sizes.append((b, p + g))
            seconds.append(min(times[1:]))
        self.cost = CostModel.fit(sizes, seconds)
        return self.cost

    def close(self) -> None:
        self.backend.close()


def check_seer(seer: SeerConfig, manifest: Manifest) -> SeerConfig:
    """``seer`` if the export can run it: the end-token signal always (``denoise`` returns ``p_end``); an MLP
    statistic or a probe only as the export's ``step_zero`` graph computes it (the layer, statistic and probe
    are baked into the graph; the detector's settings are not).

    Raises:
        ConfigError: the signal differs from what the export's step_zero graph computes.
    """
    if seer.full_depth:
        return seer
    baked = manifest.seer
    fields = ["probe_layer", "statistic", "tau_abs"]
    if seer.signal == "probe":
        fields += ["signal", "probe_weights", "probe_bias"]
    differ = [f for f in fields if getattr(seer, f) != getattr(baked, f)]
    if "step_zero" not in manifest.graphs or differ:
        computes = f"the {baked.statistic} statistic at layer {baked.probe_layer}"
        computes += " and its probe" if baked.signal == "probe" else ""
        raise ConfigError(
            f"this export's step_zero graph computes {computes}; the detector {seer.name} differs in "
            f"{differ or ['graphs: no step_zero']}: use the end-token signal (any export), or re-export with that "
            f"calibration"
        )
    return seer


def check_cache(cache: CacheConfig, manifest: Manifest) -> CacheConfig:
    """``cache`` if the export's window graph can run it (any export runs "none").

    Raises:
        ConfigError: a cache policy other than none, and a window graph exported without the cache (schema 2.0).
    """
    if not isinstance(cache, CacheConfig):
        raise ConfigError(f"cache is a {type(cache).__name__}; expected a seer_trt.kv_cache.CacheConfig")
    if cache.mode != "none" and "denoise" in manifest.graphs and not has_cache(manifest.graph("denoise").spec):
        raise ConfigError(f"cache {cache.mode!r}: this export's denoise graph takes no prompt K/V cache (exported "
                          f"before schema 2.1); re-export with seer-export, or use cache none")  # fmt: skip
    return cache


def answer_ids(row: np.ndarray, eot_id: int) -> list[int]:
    """A kept window's answer: ids before its first ``<|eot_id|>`` (the whole window when there is none)."""
    ids = row.tolist()
    return ids[: ids.index(eot_id)] if eot_id in ids else ids
