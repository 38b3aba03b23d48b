"""The step scheduler: requests that arrive apart share steps and get what ``SeerPipeline.generate`` gives each
alone (seer_trt/runtime/scheduler.py)."""

from __future__ import annotations

import threading
import time

import pytest

from seer_trt.eval.tasks import make_samples
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request
from seer_trt.runtime.scheduler import Cancelled, DeadlineExceeded, QueueFull, StepScheduler

FIELDS = ("text", "token_ids", "window", "kept", "steps", "refreshes", "gen_length", "error")


@pytest.fixture(scope="module")
def pipe(fixture_export) -> SeerPipeline:
    return SeerPipeline.from_manifest(fixture_export[0], threads=1)


def _prompt(i: int, sample) -> tuple[str, object]:
    """Every sixth request text only: its question without the image placeholder."""
    return (sample.question, sample.image) if i % 6 else (sample.question.replace("<image>\n", ""), None)


def mixed(n: int, seed: int = 3) -> list[Request]:
    """Every kind of row the loop runs: each decoding rule, early stop, the padded baseline, an oracle window,
    with and without images."""
    out = []
    for i, s in enumerate(make_samples(seed, n)):
        out.append(Request(*_prompt(i, s), decoding=["fixed", "threshold:0.9", "factor:1",
                           None][i % 4], early_stop=i % 3 == 0, seer=i % 5 != 4, window=5 if i == 7 else None,
                           cache="none"))  # fmt: skip
    return out


def same(a, b) -> bool:
    return all(getattr(a, f) == getattr(b, f) for f in FIELDS)


def differing(alone, got) -> list[int]:
    return [i for i, (a, g) in enumerate(zip(alone, got, strict=True)) if not same(a, g)]


@pytest.mark.slow
@pytest.mark.parametrize(("policy", "tail"), [("static", None), ("packed", None), ("packed", 1.0)])
def test_requests_admitted_between_steps_get_their_answers_alone(pipe, fixture_export, policy, tail):
    """The loop stepped by hand, two requests joining at each step boundary, under a fixed dispatch policy: the
    call shapes are then the same on every run, and every answer is exactly the answer alone (also with Seer's end
    tail, ahead of each cut row's prompt)."""
    if tail is not None:
        pipe = SeerPipeline.from_manifest(fixture_export[0], threads=1, seer=pipe.seer.replace(tail=tail))
    requests = mixed(16)
    alone = [pipe.generate([r])[0] for r in requests]
    scheduler = StepScheduler(pipe, policy=policy)  # not started: the test steps it
    streamed: dict[int, list[int]] = {i: [] for i in range(len(requests))}
    tickets = []
    while len(tickets) < len(requests) or scheduler.rows or scheduler.depth:
        for i in range(len(tickets), min(len(tickets) + 2, len(requests))):
            tickets.append(scheduler.submit(requests[i], on_prefix=lambda ids, i=i: streamed[i].extend(ids)))
        scheduler.step()
        assert scheduler.steps < 2000
    got = [t.result(0) for t in tickets]
    scheduler.close()
    assert all(g.ok for g in got) and differing(alone, got) == []
    assert all(tuple(streamed[i]) == g.token_ids for i, g in enumerate(got))  # the prefixes add up to the answer
    assert max(scheduler.rows_per_step) > 2  # rows admitted at different steps did share steps


@pytest.mark.slow
def test_requests_arriving_apart_get_their_answers_alone(pipe):
    """Arriving while others denoise, under the measured cost model: which rows share a call, in which shape, now
    depends on timing, and a row batched with others is equal to the row alone only up to float rounding
    (docs/DESIGN.md, the step scheduler), so at most one answer in 16 may differ (measured: see the DESIGN)."""
    requests = mixed(16)
    alone = [pipe.generate([r])[0] for r in requests]
    scheduler = StepScheduler(pipe).start()
    try:
        streamed: dict[int, list[int]] = {i: [] for i in range(len(requests))}
        tickets = []
        for i, r in enumerate(requests):  # arriving while others denoise
            tickets.append(scheduler.submit(r, on_prefix=lambda ids, i=i: streamed[i].extend(ids)))
            time.sleep(0.005 * (i % 4))
        got = [t.result(120) for t in tickets]
    finally:
        scheduler.close()
    assert all(g.ok for g in got) and len(differing(alone, got)) <= 1
    assert all(tuple(streamed[i]) == g.token_ids for i, g in enumerate(got))  # the prefixes add up to the answer
    assert max(scheduler.rows_per_step) > 1  # rows did share steps
    assert scheduler.depth == 0 and not scheduler.rows


@pytest.mark.slow
def test_prefixes_are_final_when_sent(pipe):
    """Every id passed on is the answer's id at that position: nothing sent is ever revised."""
    scheduler = StepScheduler(pipe).start()
    try:
        request = Request(make_samples(5, 1)[0].question, make_samples(5, 1)[0].image, decoding="fixed", cache="none")
        chunks: list[list[int]] = []
        result = scheduler.submit(request, on_prefix=chunks.append).result(60)
    finally:
        scheduler.close()
    assert len(chunks) >= 1 and sum(chunks, []) == list(result.token_ids)


@pytest.mark.slow
def test_sampling_and_cached_requests_are_answered_alone_with_the_pipelines_answer(pipe):
    requests = [Request("count to 3 .", temperature=0.7, seed=4), Request("count to 3 .", cache="reuse")]
    alone = [pipe.generate([r])[0] for r in requests]
    scheduler = StepScheduler(pipe).start()
    try:
        got = [scheduler.generate(r, timeout_s=60) for r in requests]
    finally:
        scheduler.close()
    assert differing(alone, got) == []  # answered by generate alone: the very same calls


@pytest.mark.slow
def test_a_bad_request_fails_alone(pipe):
    scheduler = StepScheduler(pipe).start()
    try:
        bad = scheduler.submit(Request(""))
        big = scheduler.submit(Request("count " * 100_000))
        good = scheduler.submit(Request("count to 3 .", cache="none"))
        assert good.result(60).text.startswith("1 2 3")
        assert bad.result(60).error_kind == "input" and "empty" in bad.result().error
        assert "max_prompt_chars" in big.result(60).error
    finally:
        scheduler.close()


@pytest.mark.slow
def test_cancel_deadline_and_a_full_queue(pipe):
    scheduler = StepScheduler(pipe, max_queue=2)  # not started: nothing leaves the queue
    scheduler.submit(Request("count to 3 ."))
    scheduler.submit(Request("count to 3 ."))
    with pytest.raises(QueueFull, match="2 requests are waiting"):
        scheduler.submit(Request("count to 3 ."))
    scheduler.close()  # what was queued fails, nothing hangs
    scheduler = StepScheduler(pipe).start()
    try:
        started = threading.Event()
        ticket = scheduler.submit(Request("count to 9 .", decoding="fixed", cache="none", seer=False),
                                  on_prefix=lambda ids: started.set())  # fmt: skip
        assert started.wait(60)
        ticket.cancel()
        with pytest.raises(Cancelled):
            ticket.result(60)
        late = scheduler.submit(Request("count to 9 .", decoding="fixed", cache="none", seer=False), timeout_s=0.0)
        with pytest.raises(DeadlineExceeded):
            late.result(60)
        assert scheduler.generate(Request("count to 3 .", cache="none")).text.startswith("1 2 3")  # the loop goes on
    finally:
        scheduler.close()
    assert scheduler.depth == 0 and not scheduler.rows


@pytest.mark.slow
def test_threads_submitting_at_once(pipe):
    requests = mixed(12, seed=9)
    alone = [pipe.generate([r])[0] for r in requests]
    scheduler = StepScheduler(pipe).start()
    got: list = [None] * len(requests)
    try:

        def client(i: int) -> None:
            got[i] = scheduler.generate(requests[i], timeout_s=120)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(requests))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
    finally:
        scheduler.close()
    assert all(g is not None and g.ok for g in got) and len(differing(alone, got)) <= 1  # timing decides the shapes
