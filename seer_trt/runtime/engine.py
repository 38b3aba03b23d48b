"""The engine: requests that arrive apart step side by side through the one loop (docs/DESIGN.md "Serving and embedding").

In:  ``Request``s submitted at any time from any thread (``Engine.submit``), each with an optional callback for its
     final prefix and a deadline; a ``SeerPipeline`` (its backend, buckets, cost model and defaults).
Out: per request a ``Ticket``: the ``Result`` ``SeerPipeline.generate`` gives it when admitted with the same
     requests, and, as they become final, the answer ids of its committed prefix.

Servers (seer-serve's HTTP app, its Ray replicas) reach the engine through ``EngineClient`` only, as vLLM's API
server reaches its engine: ``check`` a request (settings, decoding, cache policy, prompt ids: a 400 before any
queue slot), ``submit`` it (the prompt tokenized once: the checked ids go on to preparation), read the limits, the
tokenizer's ``decode`` and the health; never the pipeline's insides.

One engine thread loops over step boundaries:

    admit: queued requests ─► prepared off the engine thread (SeerPipeline.prepare_one: template, tokenizer,
           image decode, embeddings; a pool of its own) ─► grouped by settings ─► start_group (step zero batched,
           L*, schedule) ─► ``Row``s ─► a slot of the K/V pool each (they wait, in order, until theirs fits)
           ─► the one ``Loop``
    step:  Loop.step over every live row (its graph calls formed from all of them, whenever they were admitted)
           ─► newly final prefixes to their callbacks ─► finished rows retire, their slots back to the pool

Every setting steps here, as in ``generate``, because it is ``generate``'s own loop (``seer_trt.runtime.denoise``):
greedy and sampled, every decoding rule and remasking, early stop, Seer, padded and oracle windows, and the prompt
K/V cache with each row's refresh schedule. A request never runs outside a step, so a long or sampled one delays
the others by its steps' time, not by its whole answer. Rows share graph calls whatever step each is at and
whenever each was admitted: a step's calls are formed from all its live rows (those that compute their prompt in
one, those that read it in another, split as the dispatch policy prices them).

A graph call that fails fails the rows it held, not the step's others (they take the step again at the next
boundary: a row's state changes only once its step succeeds). Each of its rows runs once more from the start in
calls of its own when the call held others, so only the request that brought the failure fails (the retry policy
of every server: ``Engine._retry_or_fail``); a row that streamed part of its answer fails instead.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from typing import Protocol

import numpy as np

from seer_trt.contracts.errors import InputError, SeerError, describe
from seer_trt.runtime.denoise import Loop, Row, failed_rows
from seer_trt.runtime.pipeline import Checked, GroupRun, SeerPipeline
from seer_trt.runtime.prompt import longest_token
from seer_trt.runtime.request import Request, Result

Prefix = Callable[[list[int]], None]  # called from the engine thread with the ids newly final, in order


class QueueFull(SeerError):
    """The engine's queue holds as many requests as it may: try again later (HTTP 429)."""


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
    checked: Checked | None = None  # its settings and prompt ids, when the client checked it first (``Engine.check``)
    future: Future = dataclasses.field(default_factory=Future)
    cancelled: threading.Event = dataclasses.field(default_factory=threading.Event)
    submitted: float = dataclasses.field(default_factory=time.monotonic)
    preparation: Future | None = None  # its prepare_one in the engine's pool, once admitted
    alone: bool = False  # retried in graph calls of its own after a shared call failed (``Engine._retry_or_fail``)
    streamed: bool = False  # on_prefix has been handed part of its answer

    def result(self, timeout: float | None = None) -> Result:
        return self.future.result(timeout)

    @property
    def prompt_tokens(self) -> int | None:
        """The prompt's ids (chat template included, image placeholders unexpanded), when it was checked first."""
        return None if self.checked is None else len(self.checked.ids)

    def cancel(self) -> None:
        """Stop the request at the next step boundary (a client that disconnected); a preparation not yet started
        (template, tokenizer, image decode) is not started at all."""
        self.cancelled.set()
        preparation = self.preparation
        if preparation is not None:
            preparation.cancel()  # False once it runs: then it is dropped when it ends


@dataclasses.dataclass(eq=False)
class Admitted:
    """A ticket's row in the loop, and what its Result is read from."""

    ticket: Ticket
    run: GroupRun  # its group as started (step zero, L*, the stages' seconds)
    index: int  # its row in the group
    prepare_s: float
    sent: int = 0  # answer ids passed to on_prefix so far

    @property
    def row(self) -> Row:
        return self.run.rows[self.index]


@dataclasses.dataclass(frozen=True)
class Limits:
    """What a request may hold, for a server to bound its bodies before it parses them."""

    max_prompt_chars: int  # the prompt's and system message's characters together
    max_image_bytes: int  # one encoded image
    # an answer's characters at most: the largest answer bucket x (the vocabulary's longest token + a separator a
    # decoder may write between two ids, as WordLevel's does); a stop sequence longer than this could never match
    max_answer_chars: int


class EngineClient(Protocol):
    """What a server uses of an engine (``Engine`` is one): the seam between serving and the runtime."""

    limits: Limits
    eot_id: int  # <|eot_id|>: an answer that reached it inside its window finished with "stop"
    capacity: int  # requests it holds at most, queued and denoising
    running: bool  # its loop is up and not stopping: the health check
    depth: int  # requests waiting for admission
    rows: list  # the tickets admitted and not yet retired
    steps: int  # engine steps run
    rows_per_step: list[int]  # live rows of the latest steps
    calls_per_step: list[int]  # window-graph calls of the latest steps
    kv: dict[str, int]  # the K/V pool: slots, bytes held, budget, requests waiting for a slot

    def check(self, request: Request) -> Checked: ...  # raises InputError: a 400, no queue slot taken

    def submit(self, request: Request | Checked, on_prefix: Prefix | None = None,
               timeout_s: float | None = None) -> Ticket: ...  # fmt: skip

    def decode(self, ids: list[int]) -> str: ...  # answer ids -> text, special tokens dropped (as Result.text)


class Engine:
    """One engine loop over a pipeline: ``submit`` from any thread, ``start`` / ``close`` around it."""

    def __init__(self, pipe: SeerPipeline, max_rows: int | None = None, max_queue: int = 256, policy: str | None = None,
                 prepare_threads: int = 2, retry_alone: bool = True) -> None:  # fmt: skip
        """
        Args:
            pipe: a ``SeerPipeline``; its cost model is measured at ``start`` when its policy needs one.
            max_rows: rows denoised together at most (default: the largest batch bucket x 4).
            max_queue: requests waiting for admission at most; ``submit`` raises ``QueueFull`` past it.
            policy: how each step's rows are split into graph calls (default: the pipeline's).
            prepare_threads: threads that prepare requests (template, tokenizer, image decode, embeddings) beside
                the engine thread, so a large image delays no step; 0: each is prepared on the stepping thread when
                it is admitted (a host whose graph calls must stay on one thread: Triton's BLS, ``run_until``).
            retry_alone: a request whose shared graph call failed runs once more in calls of its own
                (``_retry_or_fail``), so only the request that brings a failure fails; False: it fails at once.
        """
        self.pipe = pipe
        self.max_rows = max_rows or 4 * pipe.buckets.batch[-1]
        self.policy = policy or pipe.policy
        self.queue: queue.Queue[Ticket] = queue.Queue(max_queue)
        self.loop: Loop | None = None  # made at the first admission, once the cost model is measured
        self.admitted: dict[int, Admitted] = {}  # row key -> its ticket, in the loop
        self.waiting: list[Admitted] = []  # started, waiting for their K/V slot, in order
        self._pool = ThreadPoolExecutor(prepare_threads, thread_name_prefix="seer-prepare") if prepare_threads else None
        self._preparing: list[tuple[Ticket, Future]] = []  # in submission order
        self.steps = 0  # engine steps run
        self.retry_alone = retry_alone
        self.retried = 0  # requests run again alone after a shared call failed
        self.rows_per_step: list[int] = []  # live rows of each step (a bounded window for metrics)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the client side ------------------------------------------------------------------------------------

    def check(self, request: Request) -> Checked:
        """``request``'s settings, decoding, cache policy and prompt ids (``SeerPipeline.check``), to ``submit`` as
        they are: call it off the event loop (it tokenizes).

        Raises:
            InputError: what the request asks is refused (a client error).
        """
        return self.pipe.check(request)

    def submit(self, request: Request | Checked, on_prefix: Prefix | None = None,
               timeout_s: float | None = None) -> Ticket:  # fmt: skip
        """Queue ``request`` (checked by ``check`` or not); its ticket's future gets the ``Result`` (or
        ``Cancelled`` / ``DeadlineExceeded``).

        Raises:
            QueueFull: ``max_queue`` requests are waiting already.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        checked = request if isinstance(request, Checked) else None
        ticket = Ticket(request if checked is None else checked.request, on_prefix, deadline, checked)
        try:
            self.queue.put_nowait(ticket)
        except queue.Full:
            raise QueueFull(f"{self.queue.maxsize} requests are waiting; retry later") from None
        self._wake.set()
        return ticket

    def generate(self, request: Request, timeout_s: float | None = None) -> Result:
        return self.submit(request, timeout_s=timeout_s).result()

    def run_until(self, tickets: Sequence[Ticket]) -> None:
        """Step an engine that was never started, on the caller's thread, until every one of ``tickets`` is
        answered (a host that owns the thread its graphs are called on: Triton's orchestrator in ``execute``)."""
        if self._thread is not None:
            raise RuntimeError("run_until steps an engine by hand; this one runs its own loop (start)")
        while not all(t.future.done() for t in tickets):
            self._guarded_step()
            if not self.admitted and not self.waiting and not self._preparing and self.queue.empty():
                for t in tickets:  # nothing left that could answer them
                    _answer(t, Result.failed("the engine holds this request no longer (a bug: please report it)",
                                             "internal"))  # fmt: skip

    @property
    def limits(self) -> Limits:
        answer_chars = self.pipe.buckets.answer[-1] * (longest_token(self.pipe.prompts.tokenizer) + 1)
        return Limits(self.pipe.prompts.max_chars, self.pipe.image_limits.bytes, answer_chars)

    @property
    def eot_id(self) -> int:
        return self.pipe.manifest.special_tokens.eot_id

    @property
    def capacity(self) -> int:
        """Requests held at most: the queue's and the rows'."""
        return self.queue.maxsize + self.max_rows

    def decode(self, ids: list[int]) -> str:
        return self.pipe.prompts.tokenizer.decode(ids, skip_special_tokens=True)

    @property
    def depth(self) -> int:
        """Requests waiting for admission."""
        return self.queue.qsize()

    @property
    def rows(self) -> list[Ticket]:
        """The tickets of the rows admitted and not yet retired (those being prepared or waiting for their K/V slot
        included)."""
        return [*(a.ticket for a in self.admitted.values()), *(a.ticket for a in self.waiting),
                *(t for t, _ in self._preparing)]  # fmt: skip

    @property
    def kv(self) -> dict[str, int]:
        """The K/V pool now: slots held, their bytes, the budget, the call buffers' bytes, requests waiting for a
        slot; zeros without a pool."""
        pool = self.pipe.kv_pool()
        if pool is None:
            return {"slots": 0, "bytes": 0, "budget": 0, "buffer_bytes": 0, "waiting": len(self.waiting)}
        return {"slots": pool.slots, "bytes": pool.used, "budget": pool.budget, "buffer_bytes": pool.buffer_bytes,
                "waiting": len(self.waiting)}  # fmt: skip

    @property
    def calls_per_step(self) -> list[int]:
        """Window-graph calls of each of the latest steps."""
        return [] if self.loop is None else list(self.loop.step_calls)

    @property
    def running(self) -> bool:
        """The engine loop is up and not stopping (what a health check reports)."""
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def start(self) -> Engine:
        if self.policy == "cost_model" and self.pipe.cost is None:
            self.pipe.calibrate_costs()
        self._thread = threading.Thread(target=self._loop, name="seer-engine", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Stop the loop; requests still queued or running fail with ``Cancelled``."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        for ticket in self.rows:
            _fail(ticket, Cancelled("the server is shutting down"))
        self.admitted, self.waiting, self._preparing = {}, [], []
        if self.loop is not None:
            self.loop.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        while not self.queue.empty():
            _fail(self.queue.get_nowait(), Cancelled("the server is shutting down"))

    # --- the engine -----------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            ready = any(f.done() for _, f in self._preparing)
            if not self.admitted and not ready and (self.queue.empty() or self._room() <= 0):
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            self._guarded_step()

    def _guarded_step(self) -> None:
        try:
            self.step()
        except Exception as err:  # noqa: BLE001 - a failed step fails its rows, never the loop
            held = failed_rows(err)  # the rows of the call that failed (None: not known, every row of the step)
            failed = [k for k in self.admitted if held is None or k in held]
            for key in failed:  # retried alone or failed (a 500); the step's other rows take it again at the next
                admitted = self.admitted.pop(key)  # boundary (a row's state changes only once its step succeeds);
                if self.loop is not None:  # those still being prepared or waiting for a slot were in no step
                    self.loop.remove(admitted.row)
                self._retry_or_fail(admitted.ticket, err, len(held) > 1 if held is not None else len(failed) > 1)

    def step(self) -> None:
        """One step boundary: admit, one step of every live row, retire the finished ones."""
        self._admit()
        now = time.monotonic()
        for admitted in list(self.admitted.values()):
            ticket, row = admitted.ticket, admitted.row
            if ticket.cancelled.is_set():
                self._retire(admitted, Cancelled("cancelled"))
            elif ticket.deadline is not None and now > ticket.deadline:
                self._retire(admitted, DeadlineExceeded("the request ran past its deadline"))
            else:
                continue
            row.dropped = True
        if self.loop is None:
            return
        live = len(self.loop.live())
        if live and self.loop.step():
            self.steps += 1
            self.rows_per_step = [*self.rows_per_step[-999:], live]
        for admitted in list(self.admitted.values()):
            self._emit(admitted)
        for row in self.loop.retire():
            admitted = self.admitted.get(row.key)
            if admitted is not None:
                self._retire(admitted)

    def _room(self) -> int:
        return self.max_rows - len(self.rows)

    def _admit(self) -> None:
        """Queued requests go to the preparing pool, up to ``max_rows`` rows in all; those prepared are grouped by
        settings as ``generate`` plans a call and started (step zero batched, L*), then join the loop in order as
        their K/V slots fit the pool. An engine stepped by hand (never started) waits for its preparations, so each
        step admits what was queued."""
        room = self._room()  # counted once: each ticket taken below joins the preparing list
        while room > 0:
            try:
                ticket = self.queue.get_nowait()
            except queue.Empty:
                break
            if ticket.cancelled.is_set():
                _fail(ticket, Cancelled("cancelled"))
            elif ticket.deadline is not None and time.monotonic() > ticket.deadline:
                _fail(ticket, DeadlineExceeded("the request waited past its deadline"))
            else:
                future = self._prepare(ticket.checked or ticket.request)
                future.add_done_callback(lambda _: self._wake.set())
                ticket.preparation = future
                if ticket.cancelled.is_set():  # cancelled between the check above and now
                    future.cancel()
                self._preparing.append((ticket, future))
                room -= 1
        if self._thread is None and self._preparing:
            wait_all([f for _, f in self._preparing])
        self._start_prepared()
        self._seat()

    def _start_prepared(self) -> None:
        """The prepared requests grouped and started (step zero, L*): their rows wait for a K/V slot."""
        done = [(t, f) for t, f in self._preparing if f.done()]
        if not done:
            return
        self._preparing = [(t, f) for t, f in self._preparing if not f.done()]
        for ticket, _ in done:  # its client left while it was prepared: no rows for it
            if ticket.cancelled.is_set():
                _fail(ticket, Cancelled("cancelled"))
        done = [(t, f) for t, f in done if not t.cancelled.is_set()]
        if not done:
            return
        self._start([(t, f) for t, f in done if not t.alone])
        for alone in (d for d in done if d[0].alone):  # retried alone: a step zero and graph calls of its own
            self._start([alone])

    def _start(self, done: list[tuple[Ticket, Future]]) -> None:
        if not done:
            return
        tickets = [t for t, _ in done]
        try:  # these tickets have left _preparing: whatever fails here must answer them, or their clients wait forever
            plan = self.pipe.group([f.result() for _, f in done], self.policy)
            alone = tickets[0].alone  # a retry: one row in calls of its own, which need no costs
            shared = not alone and (
                plan.needs_costs or (self.loop is not None and bool(self.loop.rows)) or bool(self.waiting)
            )
            if self.policy == "cost_model" and shared and self.pipe.cost is None:  # stepped by hand, never started:
                self.pipe.calibrate_costs()  # measured when rows first share a step (one row alone needs no costs)
        except Exception as err:  # noqa: BLE001 - these requests' failure (the costs' calibration included): each
            for ticket in tickets:  # retried alone when they were several, as a failed call's rows are
                self._retry_or_fail(ticket, err, len(tickets) > 1)
            return
        for i, (error, kind) in plan.failed.items():
            _answer(tickets[i], Result.failed(error, kind))
        for group in plan.groups:
            members = [tickets[i] for i in group.rows]
            try:
                run = self.pipe.start_group(group)
            except Exception as err:  # noqa: BLE001 - these requests' failure, and only theirs
                for ticket in members:
                    self._retry_or_fail(ticket, err, len(members) > 1)
                continue
            for row in run.rows:
                row.alone = members[0].alone
            self.waiting += [Admitted(t, run, i, group.prepare_s[i]) for i, t in enumerate(members)]

    def _retry_or_fail(self, ticket: Ticket, err: BaseException, shared: bool) -> None:
        """The retry policy, one for every server: a request whose graph call failed for a reason not its own input
        runs again, from the start and in calls of its own, when that call held other rows (one of them may have
        brought the shape or the values that failed it) and it has not retried yet and has streamed nothing (its
        retry could differ from what the client already has); otherwise it fails with the call's error."""
        if shared and self.retry_alone and not ticket.alone and not ticket.streamed and not ticket.cancelled.is_set():
            ticket.alone = True
            self.retried += 1
            future = self._prepare(ticket.checked or ticket.request)
            future.add_done_callback(lambda _: self._wake.set())
            ticket.preparation = future
            self._preparing.append((ticket, future))
            return
        _answer(ticket, Result.failed(why(err), "input" if isinstance(err, InputError) else "internal"))

    def _seat(self) -> None:
        """Started rows join the loop, in order, while their K/V slots fit the pool (admission by memory); a row
        that could never fit (larger than the budget leaves when nothing else is held) fails alone."""
        if self.loop is None:
            self.loop = self.pipe.loop(self.policy, shared=False)
        seated = 0
        for admitted in self.waiting:
            if admitted.ticket.cancelled.is_set():
                seated += 1
                _fail(admitted.ticket, Cancelled("cancelled"))
                continue
            if not self.loop.add([admitted.row]):
                break
            seated += 1
            self.admitted[admitted.row.key] = admitted
        self.waiting = self.waiting[seated:]
        if self.waiting and not self.loop.rows:  # nothing holds a slot that could be freed
            head = self.waiting.pop(0)
            _answer(head.ticket, Result.failed(self.pipe.too_large(head.row), "input"))

    def _prepare(self, request: Request | Checked) -> Future:
        """``prepare_one`` in the pool, or here and now without one (``prepare_threads=0``)."""
        if self._pool is not None:
            return self._pool.submit(self.pipe.prepare_one, request)
        done: Future = Future()
        try:
            done.set_result(self.pipe.prepare_one(request))
        except Exception as err:  # noqa: BLE001 - handed on as the pool's future would
            done.set_exception(err)
        return done

    def _emit(self, admitted: Admitted) -> None:
        """Pass on the answer ids that became final: those before the first position still masked."""
        ticket = admitted.ticket
        if ticket.on_prefix is None:
            return
        special = self.pipe.manifest.special_tokens
        x = admitted.row.x
        masked = np.flatnonzero(x == special.mask_id)
        ids = x[: len(x) if len(masked) == 0 else int(masked[0])].tolist()
        ids = ids[: ids.index(special.eot_id)] if special.eot_id in ids else ids
        if len(ids) > admitted.sent:
            try:
                ticket.on_prefix(ids[admitted.sent :])
            except Exception:  # noqa: BLE001 - a broken callback ends its own request, never the step
                ticket.cancel()
            admitted.sent = len(ids)
            ticket.streamed = True

    def _retire(self, admitted: Admitted, error: SeerError | None = None) -> None:
        """Take the row out of the loop (its slot back to the pool) and answer its ticket."""
        row, ticket = admitted.row, admitted.ticket
        self.admitted.pop(row.key, None)
        if self.loop is not None:
            self.loop.remove(row)
        if error is not None:
            _fail(ticket, error)
            return
        try:
            (result,) = self.pipe.results(admitted.run, np.array([admitted.index]))
        except Exception as err:  # noqa: BLE001 - its answer could not be read out (detokenize): it fails alone
            _answer(ticket, Result.failed(why(err), "internal"))
            return
        seconds = {"preprocess": admitted.prepare_s, "queued_and_denoised": time.monotonic() - ticket.submitted}
        _answer(ticket, dataclasses.replace(result, seconds=seconds))


def why(err: BaseException) -> str:
    """A failure in one line for its client: our own errors as they are (they name the graph or input), anything
    else named by its type; no object reprs."""
    return describe(err) if isinstance(err, SeerError) else f"{type(err).__name__}: {describe(err)}"


def _answer(ticket: Ticket, result: Result) -> None:
    if not ticket.future.done():
        ticket.future.set_result(result)


def _fail(ticket: Ticket, error: SeerError) -> None:
    if not ticket.future.done():
        ticket.future.set_exception(error)
