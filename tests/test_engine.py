"""The engine: requests that arrive apart share steps and get what ``SeerPipeline.generate`` gives each
alone (seer_trt/runtime/engine.py)."""

from __future__ import annotations

import threading
import time

import pytest

from seer_trt.eval.tasks import make_samples, mixed_requests
from seer_trt.runtime.engine import Cancelled, DeadlineExceeded, Engine, QueueFull
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request

FIELDS = ("text", "token_ids", "window", "kept", "steps", "refreshes", "gen_length", "error")


@pytest.fixture(scope="module")
def pipe(fixture_export) -> SeerPipeline:
    return SeerPipeline.from_manifest(fixture_export[0], threads=1)


def mixed(n: int, seed: int = 3) -> list[Request]:
    return mixed_requests(seed, n)


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
    engine = Engine(pipe, policy=policy)  # not started: the test steps it
    streamed: dict[int, list[int]] = {i: [] for i in range(len(requests))}
    tickets = []
    while len(tickets) < len(requests) or engine.rows or engine.depth:
        for i in range(len(tickets), min(len(tickets) + 2, len(requests))):
            tickets.append(engine.submit(requests[i], on_prefix=lambda ids, i=i: streamed[i].extend(ids)))
        engine.step()
        assert engine.steps < 2000
    got = [t.result(0) for t in tickets]
    engine.close()
    assert all(g.ok for g in got) and differing(alone, got) == []
    assert all(tuple(streamed[i]) == g.token_ids for i, g in enumerate(got))  # the prefixes add up to the answer
    assert max(engine.rows_per_step) > 2  # rows admitted at different steps did share steps


@pytest.mark.slow
def test_requests_arriving_apart_get_their_answers_alone(pipe):
    """Arriving while others denoise, under the measured cost model: which rows share a call, in which shape, now
    depends on timing, and a row batched with others is equal to the row alone only up to float rounding
    (docs/DESIGN.md, the engine), so at most one answer in 16 may differ (measured: see the DESIGN)."""
    requests = mixed(16)
    alone = [pipe.generate([r])[0] for r in requests]
    engine = Engine(pipe).start()
    try:
        streamed: dict[int, list[int]] = {i: [] for i in range(len(requests))}
        tickets = []
        for i, r in enumerate(requests):  # arriving while others denoise
            tickets.append(engine.submit(r, on_prefix=lambda ids, i=i: streamed[i].extend(ids)))
            time.sleep(0.005 * (i % 4))
        got = [t.result(120) for t in tickets]
    finally:
        engine.close()
    assert all(g.ok for g in got) and len(differing(alone, got)) <= 1
    assert all(tuple(streamed[i]) == g.token_ids for i, g in enumerate(got))  # the prefixes add up to the answer
    assert max(engine.rows_per_step) > 1  # rows did share steps
    assert engine.depth == 0 and not engine.rows


@pytest.mark.slow
def test_prefixes_are_final_when_sent(pipe):
    """Every id passed on is the answer's id at that position: nothing sent is ever revised."""
    engine = Engine(pipe).start()
    try:
        request = Request(make_samples(5, 1)[0].question, make_samples(5, 1)[0].image, decoding="fixed", cache="none")
        chunks: list[list[int]] = []
        result = engine.submit(request, on_prefix=chunks.append).result(60)
    finally:
        engine.close()
    assert len(chunks) >= 1 and sum(chunks, []) == list(result.token_ids)


@pytest.mark.slow
def test_sampled_and_cached_requests_step_in_the_engine_with_the_pipelines_answer(pipe):
    requests = [Request("count to 3 .", temperature=0.7, seed=4), Request("count to 3 .", cache="reuse", decoding="fixed", seer=False),
                Request("count to 4 .", temperature=0.9, seed=5, remasking="random", cache="forecast")]  # fmt: skip
    alone = [pipe.generate([r])[0] for r in requests]
    engine = Engine(pipe).start()
    try:
        got = [engine.generate(r, timeout_s=60) for r in requests]
    finally:
        engine.close()
    assert all(g.ok for g in got) and differing(alone, got) == []
    assert got[1].refreshes < got[1].steps  # the cache held the prompt on some steps


def test_nothing_waits_behind_a_long_sampled_request(pipe):
    """A sampled request over the whole window, step by step (seer off, fixed, a step per token), admitted with
    short greedy ones: they finish while it still runs, each in no more engine steps than it takes alone."""
    engine = Engine(pipe)  # stepped by hand
    long = engine.submit(Request("count to 9 .", temperature=0.8, seed=1, seer=False, decoding="fixed",
                                 steps=pipe.manifest.generation.gen_length))  # fmt: skip
    short = [engine.submit(Request(f"count to {k} .")) for k in (2, 3, 4)]
    alone = Engine(pipe)
    ticket = alone.submit(Request("count to 4 ."))
    while not ticket.future.done():
        alone.step()
    while not all(t.future.done() for t in short):
        engine.step()
        assert engine.steps <= alone.steps
    assert all(t.result(0).ok for t in short) and not long.future.done()
    while not long.future.done():
        engine.step()
    assert long.result(0).ok and long.result(0).steps == pipe.manifest.generation.gen_length


@pytest.mark.slow
def test_a_bad_request_fails_alone(pipe):
    engine = Engine(pipe).start()
    try:
        bad = engine.submit(Request(""))
        big = engine.submit(Request("count " * 100_000))
        good = engine.submit(Request("count to 3 .", cache="none"))
        assert good.result(60).text.startswith("1 2 3")
        assert bad.result(60).error_kind == "input" and "empty" in bad.result().error
        assert "max_prompt_chars" in big.result(60).error
    finally:
        engine.close()


@pytest.mark.slow
def test_cancel_deadline_and_a_full_queue(pipe):
    engine = Engine(pipe, max_queue=2)  # not started: nothing leaves the queue
    engine.submit(Request("count to 3 ."))
    engine.submit(Request("count to 3 ."))
    with pytest.raises(QueueFull, match="2 requests are waiting"):
        engine.submit(Request("count to 3 ."))
    engine.close()  # what was queued fails, nothing hangs
    engine = Engine(pipe).start()
    try:
        started = threading.Event()
        ticket = engine.submit(Request("count to 9 .", decoding="fixed", cache="none", seer=False),
                                  on_prefix=lambda ids: started.set())  # fmt: skip
        assert started.wait(60)
        ticket.cancel()
        with pytest.raises(Cancelled):
            ticket.result(60)
        late = engine.submit(Request("count to 9 .", decoding="fixed", cache="none", seer=False), timeout_s=0.0)
        with pytest.raises(DeadlineExceeded):
            late.result(60)
        assert engine.generate(Request("count to 3 .", cache="none")).text.startswith("1 2 3")  # the loop goes on
    finally:
        engine.close()
    assert engine.depth == 0 and not engine.rows


@pytest.mark.slow
def test_threads_submitting_at_once(pipe):
    requests = mixed(12, seed=9)
    alone = [pipe.generate([r])[0] for r in requests]
    engine = Engine(pipe).start()
    got: list = [None] * len(requests)
    try:

        def client(i: int) -> None:
            got[i] = engine.generate(requests[i], timeout_s=120)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(requests))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
    finally:
        engine.close()
    assert all(g is not None and g.ok for g in got) and len(differing(alone, got)) <= 1  # timing decides the shapes


def test_a_request_whose_client_left_is_not_prepared_or_run(pipe, monkeypatch):
    """Cancelled while its preparation waits for a preparing thread: never prepared; cancelled while prepared: its
    preparation ends alone and no rows are started for it; either ends Cancelled at once (issue 37: preparation is
    cancelled when its client leaves). The requests beside them are answered."""
    real, calls = pipe.prepare_one, []

    def slow(request):
        calls.append(request.prompt)
        if request.prompt.startswith("count to 9"):
            time.sleep(2.0)
        return real(request)

    real_start, started = pipe.start_group, []

    def start_group(group):
        started.append(len(group.rows))
        return real_start(group)

    monkeypatch.setattr(pipe, "prepare_one", slow)
    monkeypatch.setattr(pipe, "start_group", start_group)
    engine = Engine(pipe, prepare_threads=2).start()
    try:
        busy = [engine.submit(Request("count to 9 .")), engine.submit(Request("count to 9 .  "))]
        waiting = engine.submit(Request("count to 3 ."))  # queued behind the two preparations that hold the pool
        deadline = time.monotonic() + 10
        while waiting.preparation is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert waiting.preparation is not None and not waiting.preparation.running()
        start = time.monotonic()
        waiting.cancel()
        busy[1].cancel()  # its preparation is running: it finishes, then is dropped
        with pytest.raises(Cancelled):
            waiting.result(10)
        assert time.monotonic() - start < 1.0  # not after the 2 s preparations
        with pytest.raises(Cancelled):
            busy[1].result(10)
        assert busy[0].result(30).text.startswith("1 2 3 4 5 6 7 8 9")
        assert "count to 3 ." not in calls  # never prepared
        assert sum(started) == 1  # busy[0]'s row alone: the one cancelled while prepared started none
        deadline = time.monotonic() + 10
        while engine.rows and time.monotonic() < deadline:  # the step retiring the last row ends
            time.sleep(0.01)
        assert engine.rows == [] and not engine.loop.rows
    finally:
        engine.close()


def test_a_slow_preparation_delays_no_other_request(pipe, monkeypatch):
    """Requests are prepared (template, tokenizer, image decode, embeddings) beside the engine thread: one whose
    preparation takes 3 s (a large image) holds back neither the steps nor a text request sent after it."""
    real = pipe.prepare_one

    def slow(request):
        if request.prompt == "count to 9 .":
            time.sleep(3.0)
        return real(request)

    monkeypatch.setattr(pipe, "prepare_one", slow)
    engine = Engine(pipe).start()
    try:
        held = engine.submit(Request("count to 9 ."))
        time.sleep(0.1)
        start = time.monotonic()
        quick = engine.generate(Request("count to 3 ."), timeout_s=30)
        assert quick.text.startswith("1 2 3") and time.monotonic() - start < 2.5 and not held.future.done()
        assert held.result(30).text.startswith("1 2 3 4 5 6 7 8 9")
    finally:
        engine.close()


def test_an_export_without_denoise_logits_samples_from_its_top_ids(fixture_export, tmp_path):
    """The default export (no --sampling) answers temperature > 0 from the denoise graph's top ids (TopK): seeded
    answers repeat, differ between seeds somewhere, a nucleus of one id is the greedy answer, and the engine steps
    them beside greedy rows."""
    import json
    import shutil

    folder = tmp_path / "engines"
    shutil.copytree(fixture_export[0], folder, ignore=shutil.ignore_patterns("denoise_logits*", "goldens*"))
    data = json.loads((folder / "manifest.json").read_text())
    del data["graphs"]["denoise_logits"]
    data["checksums"] = {k: v for k, v in data["checksums"].items() if "denoise_logits" not in k}
    (folder / "manifest.json").write_text(json.dumps(data))
    pipe = SeerPipeline.from_manifest(folder, threads=1)
    prompts = [s.question.replace("<image>\n", "") for s in make_samples(4, 6)]  # text only
    greedy = pipe.generate([Request(p, seer=False, decoding="fixed") for p in prompts])
    assert all(g.ok for g in greedy), [g.error for g in greedy]
    sampled = [Request(p, seer=False, decoding="fixed", temperature=1.5, seed=s) for p in prompts for s in (1, 2)]
    first, again = pipe.generate(sampled), pipe.generate(sampled)
    assert all(a.ok for a in first) and [a.token_ids for a in first] == [a.token_ids for a in again]
    assert any(a.token_ids != g.token_ids for a, g in zip(first, [g for g in greedy for _ in (1, 2)], strict=True))
    tight = pipe.generate([Request(p, seer=False, decoding="fixed", temperature=1.5, seed=1, top_p=1e-9)
                           for p in prompts])  # fmt: skip
    assert [a.token_ids for a in tight] == [g.token_ids for g in greedy]
    engine = Engine(pipe)  # stepped by hand
    tickets = [engine.submit(r) for r in sampled[:4]] + [engine.submit(Request(prompts[0]))]
    while not all(t.future.done() for t in tickets):
        engine.step()
    assert [t.result(0).token_ids for t in tickets[:4]] == [a.token_ids for a in first[:4]]


def test_a_checked_request_is_submitted_as_checked(pipe):
    """``Engine.check`` returns a request's settings, decoding and prompt ids; submitted, they are prepared as they
    are (no second tokenizing) and the ticket reports the prompt's token count; a bad request is refused at the
    check, before any queue slot."""
    from seer_trt.contracts.errors import InputError

    engine = Engine(pipe)  # stepped by hand
    checked = engine.check(Request("count to 3 .", decoding="fixed", early_stop=True))
    assert checked.gen.decoding == "fixed" and checked.decoding.rule.fixed and len(checked.ids) > 3
    calls, real = [], pipe.prompts.ids
    pipe.prompts.ids = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        ticket = engine.submit(checked)
        while not ticket.future.done():
            engine.step()
    finally:
        del pipe.prompts.ids
    assert calls == [] and ticket.prompt_tokens == len(checked.ids)
    assert ticket.result().text == pipe.generate([checked.request])[0].text
    with pytest.raises(InputError, match="decoding"):
        engine.check(Request("count to 3 .", decoding="sometimes"))
    assert engine.depth == 0
    engine.close()


def test_an_engine_run_by_hand_calls_every_graph_on_the_callers_thread(pipe, monkeypatch):
    """``prepare_threads=0`` and ``run_until``: how Triton's orchestrator runs the engine inside ``execute``, the
    only thread its BLS graph calls may come from. Every graph call (embeddings, step zero, the loop) is made on the
    caller's thread, and the answers are the engine's (equal to each request alone, up to float rounding); a step that
    fails answers its rows with an internal failure naming the cause, and the engine then answers the next call."""
    requests = mixed(6, seed=5)
    alone = [pipe.generate([r])[0] for r in requests]
    threads: set[str] = set()
    run = pipe.backend.run
    monkeypatch.setattr(
        pipe.backend, "run", lambda *a, **k: threads.add(threading.current_thread().name) or run(*a, **k)
    )
    engine = Engine(pipe, max_queue=0, prepare_threads=0)
    tickets = [engine.submit(r) for r in requests]
    engine.run_until(tickets)
    got = [t.result(0) for t in tickets]
    assert threads == {threading.current_thread().name} and engine._pool is None
    assert all(g.ok for g in got) and len(differing(alone, got)) <= 1, differing(alone, got)

    def broken(graph, *a, **k):
        if graph == "denoise":
            raise RuntimeError("the denoise component is gone")
        return run(graph, *a, **k)

    monkeypatch.setattr(pipe.backend, "run", broken)
    failing = [engine.submit(Request("count to 5 .", seer=False, cache="none")) for _ in range(2)]
    engine.run_until(failing)
    for t in failing:
        assert (t.result(0).error, t.result(0).error_kind) == (
            "RuntimeError: the denoise component is gone",
            "internal",
        )
    monkeypatch.setattr(pipe.backend, "run", run)
    results = pipe.results
    monkeypatch.setattr(pipe, "results", lambda *a: (_ for _ in ()).throw(UnicodeError("the tokenizer broke")))
    unread = engine.submit(Request("count to 4 .", cache="none"))
    engine.run_until([unread])  # an answer that cannot be read out fails alone, and run_until returns
    assert (unread.result(0).error, unread.result(0).error_kind) == ("UnicodeError: the tokenizer broke", "internal")
    monkeypatch.setattr(pipe, "results", results)
    again = engine.submit(Request("count to 3 .", cache="none"))
    engine.run_until([again])
    assert again.result(0).text.startswith("1 2 3")
    started = Engine(pipe).start()
    try:
        with pytest.raises(RuntimeError, match="steps an engine by hand"):
            started.run_until([])
    finally:
        started.close()


@pytest.mark.slow
def test_rows_admitted_at_different_steps_share_each_steps_calls(pipe):
    """Rows, not cohorts, step together: two requests join at every step boundary (the exact loop, every row at
    another step of its own), and each engine step makes at most two window-graph calls (the rows computing their
    prompt, the rows reading it) whose rows are every live row; the answers are each request's alone."""
    requests = [Request(q, seer=False, decoding="fixed", gen_length=16, steps=16)
                for q in ("count to 3 .", "count to 5 .", "repeat cat 2 times .", "count to 7 .", "list the colours .",
                          "count to 2 .", "repeat dog 3 times .", "count to 4 .")]  # fmt: skip
    alone = [pipe.generate([r])[0] for r in requests]
    engine = Engine(pipe, policy="naive_pad")  # stepped by hand: one call per class of rows
    calls: list[tuple[int, int]] = []  # (engine step, rows of a window-graph call)
    tickets = []
    while len(tickets) < len(requests) or engine.rows:
        for r in requests[len(tickets) : len(tickets) + 2]:
            tickets.append(engine.submit(r))
        live = 0 if engine.loop is None else len(engine.loop.live())
        if engine.loop is not None:
            engine.loop.on_call = lambda call: calls.append((engine.steps, call.rows))
        engine.step()
        joined = len(engine.loop.live()) if live == 0 else None
        assert engine.steps < 500 and (joined is None or joined >= 0)
    got = [t.result(0) for t in tickets]
    engine.close()
    assert all(g.ok for g in got) and differing(alone, got) == []
    per_step: dict[int, list[int]] = {}
    for step, rows in calls:
        per_step.setdefault(step, []).append(rows)
    assert max(len(c) for c in per_step.values()) <= 2  # one call for refreshing rows, one for the rest
    assert max(sum(c) for c in per_step.values()) > 2  # rows admitted at different steps shared calls
    assert engine.calls_per_step and max(engine.calls_per_step) <= 2


@pytest.mark.slow
def test_requests_wait_for_their_k_v_slot_and_one_that_can_never_fit_fails_alone(fixture_export):
    """Admission by memory: a K/V pool that holds two rows' prompt K/V admits two at a time, the others wait in
    order and are answered as slots come back; a request larger than the whole budget fails alone, in one line."""
    probe = SeerPipeline.from_manifest(fixture_export[0], threads=1)
    requests = [Request(f"count to {k} .", cache="reuse") for k in (3, 5, 7, 4, 9)]  # prompts of one length
    alone = [probe.generate([r])[0] for r in requests]
    pool = probe.kv_pool()
    (length,) = {len(probe.prompts.ids(r.prompt, False)) for r in requests}
    two = 2 * pool.slot_bytes(length, 1)  # two rows' snapshots, exactly
    pipe = SeerPipeline.from_manifest(fixture_export[0], threads=1, kv_budget=two)
    engine = Engine(pipe, policy="naive_pad")
    held = []  # slots held at each graph call (between a step's admission and its retirements)
    run = pipe.backend.run
    pipe.backend.run = lambda *a, **k: held.append(engine.kv["slots"]) or run(*a, **k)
    tickets = [engine.submit(r) for r in requests]
    while engine.rows or engine.depth:
        engine.step()
    got = [t.result(0) for t in tickets]
    assert all(g.ok for g in got) and differing(alone, got) == []
    assert max(held) == 2 and engine.kv["slots"] == 0 and engine.kv["bytes"] <= two
    tiny = Engine(SeerPipeline.from_manifest(fixture_export[0], threads=1, kv_budget=16), policy="naive_pad")
    big, small = tiny.submit(Request("count to 3 .", cache="reuse")), tiny.submit(Request("count to 3 .", cache="none"))
    while tiny.rows or tiny.depth:
        tiny.step()
    assert not big.result(0).ok and "K/V pool's budget is 16 bytes" in big.result(0).error
    assert "\n" not in big.result(0).error and small.result(0).text.startswith("1 2 3")
    tiny.close()
    engine.close()


@pytest.mark.slow
@pytest.mark.parametrize("retry", [True, False])
def test_a_failed_shared_call_fails_only_the_request_that_brought_it(pipe, monkeypatch, retry):
    """The retry policy of every server: a denoise call fails whenever it holds the one long prompt (a component that
    cannot take its shape). Sharing calls with it, the short requests fail with it once, run again alone and get
    their answers alone; the long one fails again alone, with the call's error. Without the retry all three fail."""
    limit = len(pipe.prompts.ids("count to 3 .", False))
    run = pipe.backend.run

    def failing(graph, feeds, *rest):
        if graph == "denoise" and feeds["prefix_embeds"].shape[1] > 2 * limit:
            raise RuntimeError("CUDA out of memory")
        return run(graph, feeds, *rest)

    requests = [Request("count to 3 ."), Request("count to 3 . " * 12), Request("count to 4 .")]
    alone = [pipe.generate([r])[0] for r in (requests[0], requests[2])]
    monkeypatch.setattr(pipe.backend, "run", failing)
    engine = Engine(pipe, policy="naive_pad", retry_alone=retry)  # stepped by hand: the three share each call
    tickets = [engine.submit(r) for r in requests]
    engine.run_until(tickets)
    got = [t.result(0) for t in tickets]
    engine.close()
    assert "CUDA out of memory" in got[1].error and got[1].error_kind == "internal"
    if retry:
        assert engine.retried == 3 and differing(alone, [got[0], got[2]]) == []
    else:
        assert engine.retried == 0 and not got[0].ok and not got[2].ok
