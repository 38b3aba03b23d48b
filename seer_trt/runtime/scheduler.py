"""Step-level continuous batching: requests that arrive apart share denoising steps (docs/DESIGN.md "Serving").

In:  ``Request``s submitted at any time from any thread (``StepScheduler.submit``), each with an optional callback
     for its final prefix and a deadline; a ``SeerPipeline`` (its backend, buckets and cost model).
Out: per request a ``Ticket``: the ``Result`` ``SeerPipeline.generate`` gives it alone (same tokens, L*, steps),
     and, as they become final, the answer ids of its committed prefix.

One engine thread loops over step boundaries:

    admit: queued requests ─► prepare (prompt, image, embed) ─► step zero, batched ─► L* ─► a row each
    step:  live rows ─► plan_dispatch (cost model) ─► one graph call per group ─► each row commits by its own
           rule, schedule and step count ─► newly final prefix to its callback ─► finished rows retire

A row's state is its own (tokens, step count, block, stop), so it computes in a shared call what it computes
alone (``seer_trt.runtime.layout``: attention stays inside a row's segment), and the rows of a step may differ in
settings, length and progress. Greedy decoding with the exact loop (``cache none``) runs here; a request that
asks for sampling or a prompt K/V cache is answered by ``SeerPipeline.generate`` alone, between steps.
"""

from __future__ import annotations

import dataclasses
import itertools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from seer_trt.contracts.config import GenerationConfig
from seer_trt.contracts.errors import ConfigError, InputError, SeerError, describe
from seer_trt.contracts.graphs import step_outputs
from seer_trt.contracts.policies import EXACT
from seer_trt.runtime.boundary import detect
from seer_trt.runtime.denoise import Greedy, commit, current_block_end
from seer_trt.runtime.detokenize import detokenize
from seer_trt.runtime.dispatch import plan_dispatch
from seer_trt.runtime.request import Request, Result
from seer_trt.runtime.schedule import Schedule, plan_schedule
from seer_trt.runtime.step_zero import step_zero_rows

_SERIALS = itertools.count()
Prefix = Callable[[list[int]], None]  # called from the engine thread with the ids newly final, in order


class QueueFull(SeerError):
    """The scheduler's queue holds as many requests as it may: try again later (HTTP 429)."""


class Cancelled(SeerError):
    """The request was cancelled (its client went away) before it finished."""


class DeadlineExceeded(SeerError):
    """The request ran past its deadline."""


@dataclasses.dataclass(eq=False)
class Ticket:
    """A submitted request: its future ``Result`` and a way to cancel it."""

    request: Request
    on_prefix: Prefix | None
    deadline: float | None  # time.monotonic() past which it fails
    future: Future = dataclasses.field(default_factory=Future)
    cancelled: threading.Event = dataclasses.field(default_factory=threading.Event)
    submitted: float = dataclasses.field(default_factory=time.monotonic)

    def result(self, timeout: float | None = None) -> Result:
        return self.future.result(timeout)

    def cancel(self) -> None:
        """Stop the request at the next step boundary (a client that disconnected)."""
        self.cancelled.set()


@dataclasses.dataclass(eq=False)
class Row:
    """One request's denoising state, as ``denoise`` keeps it for a row of a group."""

    ticket: Ticket
    gen: GenerationConfig
    embeds: np.ndarray  # [P, D] prompt embeddings
    kept: int  # L*
    schedule: Schedule  # this row's alone
    x: np.ndarray  # [kept] int64 state, mask_id where not committed
    step0: tuple[np.ndarray, np.ndarray] | None  # step 0's (x0, log-confidence) from a full-depth step zero
    stop_id: int | None
    t: int = 0  # steps taken
    used: int = 0  # steps in which it had a position to commit
    calls: int = 0  # of those, graph calls (all computed the prompt: the exact loop)
    stop: int = 0  # first committed stop_id (kept: none)
    sent: int = 0  # answer ids passed to on_prefix so far
    prepare_s: float = 0.0
    tail: int = 0  # Seer's end tail: committed end tokens after the window (SeerPipeline.tails)
    serial: int = dataclasses.field(default_factory=lambda: next(_SERIALS))  # unique for the process's life

    def open_positions(self, mask_id: int) -> np.ndarray:
        positions = np.arange(self.kept)
        return (self.x == mask_id) & (positions < self.stop)

    @property
    def cap(self) -> int:
        return int(self.schedule.steps[0] if self.gen.rule[0] == "fixed" else self.kept)


class StepScheduler:
    """One engine loop over a pipeline: ``submit`` from any thread, ``start`` / ``close`` around it."""

    def __init__(self, pipe, max_rows: int | None = None, max_queue: int = 256, policy: str | None = None) -> None:
        """
        Args:
            pipe: a ``SeerPipeline``; its cost model is measured at ``start`` when its policy needs one.
            max_rows: rows denoised together at most (default: the largest batch bucket x 4).
            max_queue: requests waiting for admission at most; ``submit`` raises ``QueueFull`` past it.
            policy: the dispatch policy of each step (default: the pipeline's).
        """
        self.pipe = pipe
        self.max_rows = max_rows or 4 * pipe.buckets.batch[-1]
        self.policy = policy or pipe.policy
        self.queue: queue.Queue[Ticket] = queue.Queue(max_queue)
        self.rows: list[Row] = []
        self.steps = 0  # engine steps run
        self.rows_per_step: list[int] = []  # live rows of each step (a bounded window for metrics)
        self._layouts: dict[tuple, object] = {}  # the last step's layouts, by (rows, path, shape)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the client side ------------------------------------------------------------------------------------

    def submit(self, request: Request, on_prefix: Prefix | None = None, timeout_s: float | None = None) -> Ticket:
        """Queue ``request``; its ticket's future gets the ``Result`` (or ``Cancelled`` / ``DeadlineExceeded``).

        Raises:
            QueueFull: ``max_queue`` requests are waiting already.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        ticket = Ticket(request, on_prefix, deadline)
        try:
            self.queue.put_nowait(ticket)
        except queue.Full:
            raise QueueFull(f"{self.queue.maxsize} requests are waiting; retry later") from None
        self._wake.set()
        return ticket

    def generate(self, request: Request, timeout_s: float | None = None) -> Result:
        return self.submit(request, timeout_s=timeout_s).result()

    @property
    def depth(self) -> int:
        """Requests waiting for admission."""
        return self.queue.qsize()

    @property
    def running(self) -> bool:
        """The engine loop is up and not stopping (what a health check reports)."""
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def start(self) -> StepScheduler:
        if self.policy == "cost_model" and self.pipe.cost is None:
            self.pipe.calibrate_costs()
        self._thread = threading.Thread(target=self._loop, name="seer-step-scheduler", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Stop the loop; requests still queued or running fail with ``Cancelled``."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        for row in self.rows:
            _fail(row.ticket, Cancelled("the server is shutting down"))
        self.rows = []
        while not self.queue.empty():
            _fail(self.queue.get_nowait(), Cancelled("the server is shutting down"))

    # --- the engine -----------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self.rows and self.queue.empty():
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            try:
                self.step()
            except Exception as err:  # noqa: BLE001 - a failed step fails its rows, never the loop
                for row in self.rows:
                    _fail(row.ticket, SeerError(f"the step failed ({type(err).__name__}: {describe(err)})"))
                self.rows = []

    def step(self) -> None:
        """One step boundary: admit, run one step of every live row, retire the finished ones."""
        self._admit()
        mask_id = self.pipe.manifest.special_tokens.mask_id
        now = time.monotonic()
        for row in list(self.rows):
            if row.ticket.cancelled.is_set():
                self._retire(row, Cancelled("cancelled"))
            elif row.ticket.deadline is not None and now > row.ticket.deadline:
                self._retire(row, DeadlineExceeded("the request ran past its deadline"))
        live = [r for r in self.rows if r.open_positions(mask_id).any() and r.t < r.cap]
        for row in [r for r in self.rows if r not in live]:
            self._retire(row)
        if not live:
            return
        predictions: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        calling = [r for r in live if not (r.t == 0 and r.step0 is not None)]
        for r in live:
            if r.t == 0 and r.step0 is not None:
                predictions[id(r)] = r.step0
        if calling:
            predictions.update(self._call(calling, mask_id))
        for r in live:
            self._commit(r, *predictions[id(r)], mask_id)
        self.steps += 1
        self.rows_per_step = [*self.rows_per_step[-999:], len(live)]
        for row in [r for r in self.rows if not (r.open_positions(mask_id).any() and r.t < r.cap)]:
            self._retire(row)

    def _admit(self) -> None:
        """Queued requests become rows, up to ``max_rows``: prepared, then step zero batched per settings."""
        fresh: list[tuple[Ticket, GenerationConfig, object, float]] = []
        while len(self.rows) + len(fresh) < self.max_rows:
            try:
                ticket = self.queue.get_nowait()
            except queue.Empty:
                break
            if ticket.cancelled.is_set():
                _fail(ticket, Cancelled("cancelled"))
                continue
            if ticket.deadline is not None and time.monotonic() > ticket.deadline:
                _fail(ticket, DeadlineExceeded("the request waited past its deadline"))
                continue
            start = time.perf_counter()
            try:
                gen, prompt = self.pipe.prepare(ticket.request)
                cache = self.pipe.cache_for(ticket.request)
            except (InputError, ConfigError) as err:  # the request's own input or settings
                ticket.future.set_result(Result.failed(str(err), "input"))
                continue
            except SeerError as err:
                ticket.future.set_result(Result.failed(str(err), "internal"))
                continue
            except Exception as err:  # noqa: BLE001 - this request's input, and only its
                ticket.future.set_result(Result.failed(f"{type(err).__name__}: {describe(err)}", "internal"))
                continue
            if not _steppable(self.pipe, gen, cache):
                self._alone(ticket)
                continue
            fresh.append((ticket, gen, prompt, time.perf_counter() - start))
        batches: dict[tuple[GenerationConfig, bool], list] = {}  # one step-zero pass per window and detector use
        for item in fresh:
            batches.setdefault((item[1], item[0].request.seer and item[0].request.window is None), []).append(item)
        for (gen, seer), members in batches.items():
            self._start_rows(gen, seer, members)

    def _start_rows(self, gen: GenerationConfig, seer: bool, members: list) -> None:
        special = self.pipe.manifest.special_tokens
        embeds = [prompt.embeds for _, _, prompt, _ in members]
        n = gen.gen_length
        step0 = None
        if seer:
            zero = step_zero_rows(self.pipe.backend, embeds, n, self.pipe.seer, self.pipe.buckets.batch[-1])
            kept = detect(zero.profile, self.pipe.seer)
            if zero.x0 is not None and gen.remasking == "low_confidence":  # its confidence is the log-probability
                step0 = (zero.x0, zero.confidence)
        else:
            kept = np.array([t.request.window or n for t, *_ in members], dtype=np.int64)
        tails = self.pipe.tails(kept, n, [len(e) for e in embeds])
        for i, (ticket, _, prompt, prep) in enumerate(members):
            k = int(kept[i])
            row0 = None if step0 is None else (step0[0][i, :k].astype(np.int64), step0[1][i, :k])
            self.rows.append(Row(ticket, gen, prompt.embeds, k, plan_schedule(gen, np.array([k])),
                                 np.full(k, special.mask_id, dtype=np.int64), row0,
                                 special.eot_id if ticket.request.early_stop else None, stop=k,
                                 prepare_s=prep, tail=int(tails[i])))  # fmt: skip

    def _alone(self, ticket: Ticket) -> None:
        """A request the step loop does not run (sampling, a prompt cache): the pipeline answers it alone."""
        try:
            result = self.pipe.generate([ticket.request])[0]
        except Exception as err:  # noqa: BLE001 - its failure, and only its
            result = Result.failed(f"{type(err).__name__}: {describe(err)}", "internal")
        if result.ok and ticket.on_prefix is not None:
            ticket.on_prefix(list(result.token_ids))
        ticket.future.set_result(result)

    def _call(self, rows: list[Row], mask_id: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """One step's graph calls over ``rows``, grouped as the dispatch policy plans them."""
        pipe = self.pipe
        kept = np.array([r.kept for r in rows], dtype=np.int64)
        left = np.array([r.cap - r.t for r in rows], dtype=np.int64)
        plan = plan_dispatch([len(r.embeds) + r.tail for r in rows], kept, left, pipe.buckets, self.policy,
                             pipe.tau_pad, pipe.short, pipe.cost, pipe.backend.max_shape("denoise"))  # fmt: skip
        out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        layouts = {}
        for group in plan.groups:
            members = [rows[i] for i in group.rows]
            k = kept[list(group.rows)]
            key = (tuple(r.serial for r in members), group.path, group.prompt_len, group.gen_len)
            layout = self._layouts.get(key)
            if layout is None:  # a new membership; the same rows in the same shape reuse the last step's
                tails = np.array([r.tail for r in members], dtype=np.int64)
                layout = pipe.layout(group.path, [r.embeds for r in members], k, group.prompt_len, group.gen_len,
                                     tails)  # fmt: skip
            layouts[key] = layout
            width = int(k.max())
            x = np.full((len(members), width), mask_id, dtype=np.int64)
            for j, r in enumerate(members):
                x[j, : r.kept] = r.x
            feeds = {"prefix_embeds": layout.prefix_embeds, "gen_ids": layout.gen_ids(x, mask_id),
                     "segment_ids": layout.segment_ids, "position_ids": layout.position_ids}  # fmt: skip
            past, _ = _exact_feeds(pipe, layout)
            result = pipe.backend.run("denoise", {**feeds, **past}, step_outputs(pipe.backend.spec("denoise")))
            x0, conf = Greedy()(result, layout, 0, (len(members), width), mask_id)
            scored = {}  # Dream's scores, for the rows that rank by one (the graph returns them all)
            for j, r in enumerate(members):
                score = pipe.in_graph_score(r.gen)
                if score is not None and score not in scored:
                    scored[score] = Greedy(score)(result, layout, 0, (len(members), width), mask_id)[1]
                out[id(r)] = (x0[j, : r.kept], (conf if score is None else scored[score])[j, : r.kept])
                r.calls += 1
        self._layouts = layouts
        return out

    def _commit(self, r: Row, x0: np.ndarray, conf: np.ndarray, mask_id: int) -> None:
        """What ``denoise`` does for one row at its step ``r.t``."""
        positions = np.arange(r.kept)
        open_ = r.open_positions(mask_id)
        r.used += 1
        fixed = r.gen.rule[0] == "fixed"
        block = r.kept if r.gen.block_length is None else r.gen.block_length
        block_end = int(r.schedule.block_end[0, r.t] if fixed else current_block_end(open_[None], np.array([r.kept]),
                                                                                     block)[0])  # fmt: skip
        eligible = open_ & (positions < block_end)
        scores = np.where(eligible, conf.astype(np.float64), -np.inf)
        transfer = r.schedule.count(r.t, np.array([int(open_.sum())]))
        chosen = commit(r.gen.rule, scores[None], eligible[None], transfer)[0]
        r.x = np.where(chosen, x0, r.x)
        if r.stop_id is not None:
            r.stop = int(np.where(r.x == r.stop_id, positions, r.kept).min())
        r.t += 1
        self._emit(r, mask_id)

    def _emit(self, r: Row, mask_id: int) -> None:
        """Pass on the answer ids that became final: those before the first position still masked."""
        if r.ticket.on_prefix is None:
            return
        masked = np.flatnonzero(r.x == mask_id)
        final = r.kept if len(masked) == 0 else int(masked[0])
        eot = self.pipe.manifest.special_tokens.eot_id
        ids = r.x[:final].tolist()
        done = eot in ids
        ids = ids[: ids.index(eot)] if done else ids
        if len(ids) > r.sent:
            try:
                r.ticket.on_prefix(ids[r.sent :])
            except Exception:  # noqa: BLE001 - a broken callback ends its own request, never the step
                r.ticket.cancel()
            r.sent = len(ids)

    def _retire(self, r: Row, error: SeerError | None = None) -> None:
        self.rows.remove(r)
        if error is not None:
            _fail(r.ticket, error)
            return
        special = self.pipe.manifest.special_tokens
        n = r.gen.gen_length
        tokens = np.full((1, n), special.mask_id, dtype=np.int64)
        tokens[0, : r.kept] = r.x
        ((ids, text),) = detokenize(tokens, np.array([r.kept]), self.pipe.prompts.tokenizer, special.eot_id)
        seconds = {"preprocess": r.prepare_s, "queued_and_denoised": time.monotonic() - r.ticket.submitted}
        r.ticket.future.set_result(Result(text, tuple(ids), tuple(r.x.tolist()), r.kept, r.used, n, seconds,
                                          refreshes=r.calls))  # fmt: skip


def _steppable(pipe, gen: GenerationConfig, cache) -> bool:
    """Whether the step loop runs this request: greedy (ranked by the log-probability, or by a Dream score the
    denoise graph returns), the exact loop (no prompt cache)."""
    return pipe.decoder_graph(gen) == "denoise" and gen.temperature == 0 and cache.mode == "none"


def _exact_feeds(pipe, layout) -> tuple[dict, bool]:
    """The cache inputs of an exact step (every step computes the prompt), for a window graph that takes them."""
    from seer_trt.runtime.kv_cache import GroupCache

    kv = GroupCache(EXACT, pipe.backend.spec("denoise"), layout)
    return kv.plan(0, False)


def _fail(ticket: Ticket, error: SeerError) -> None:
    if not ticket.future.done():
        ticket.future.set_exception(error)
