# ruff: noqa: F811 - ``expected``, a fixture imported from test_triton, is each test's argument
"""seer-triton's default orchestration (docs/DESIGN.md "Serving and embedding"): one decoupled model whose one engine
steps every request, streamed. In-process through a fake ``triton_python_backend_utils`` (the engine's own calls
counted), and served by a real ``tritonserver`` on 127.0.0.1: ``stream_infer`` over gRPC and the ``generate`` /
``generate_stream`` endpoints answer as ``seer-run`` and ``SeerPipeline.generate`` do."""

from __future__ import annotations

import json
import queue
import threading
import time
import types
import urllib.error
import urllib.request

import numpy as np
import pytest
from cli_capture import cli
from test_triton import (
    CASES,
    TIMEOUT_S,
    Case,
    answer,
    configs,
    expected,  # noqa: F401 - a fixture: seer-run's answers to CASES
    inputs,
    io_of,
    wanted,
)

from seer_trt.cli.triton import main as triton_main
from seer_trt.contracts.policies import CacheConfig
from seer_trt.runtime.request import Request
from seer_trt.serving.triton import pbtxt
from seer_trt.serving.triton.local import LocalServer, ServerInstall
from seer_trt.serving.triton.wire import REQUEST_INPUTS

FIELDS = ["prompt", "image", "gen_length", "steps", "seer", "decoding", "early_stop", "remasking", "temperature",
          "seed", "top_p", "stop", "cache", "refresh_interval", "window", "system", "history"]  # fmt: skip
SAMPLED = dict(temperature=0.8, top_p=0.9)


# ---- in-process: the decoupled model over a fake Python backend ------------------------------------------------


class Tensor:
    def __init__(self, name: str, value) -> None:
        self.name, self.value = name, np.asarray(value)

    def as_numpy(self):
        return self.value


class Error:
    INTERNAL, INVALID_ARG = "INTERNAL", "INVALID_ARG"

    def __init__(self, message: str, code: str = "INTERNAL") -> None:
        self.text, self.code = message, code


class Response:
    def __init__(self, output_tensors=(), error=None) -> None:
        self.outputs, self.error = {t.name: t.value for t in output_tensors}, error


class Sender:
    """A request's response sender: what was sent, and a flag for its final response."""

    def __init__(self) -> None:
        self.sent: list[tuple[Response, int]] = []
        self.done = threading.Event()
        self.on_send = None  # called with each response (a test's hook)

    def send(self, response=None, flags: int = 0) -> None:
        self.sent.append((response, flags))
        if self.on_send is not None:
            self.on_send(response)
        if flags & FINAL:
            self.done.set()

    def text(self) -> str:
        return "".join(r.outputs["text"][0, 0].decode() for r, _ in self.sent if r is not None and r.error is None)


FINAL = 1
PB = types.SimpleNamespace(Tensor=Tensor, TritonError=Error, InferenceResponse=Response,
                           TRITONSERVER_RESPONSE_COMPLETE_FINAL=FINAL,
                           get_input_tensor_by_name=lambda request, name: request.tensors.get(name))  # fmt: skip


class FakeRequest:
    def __init__(self, prompt: str | bytes, **fields) -> None:
        values = {"prompt": prompt.encode() if isinstance(prompt, str) else prompt, **fields}
        kinds = {t.name: t.data_type for t in REQUEST_INPUTS}
        dtypes = {"TYPE_STRING": np.object_, "TYPE_INT32": np.int32, "TYPE_INT64": np.int64, "TYPE_FP32": np.float32,
                  "TYPE_BOOL": bool}  # fmt: skip
        self.tensors = {k: Tensor(k, np.array([[v.encode() if isinstance(v, str) else v]], dtype=dtypes[kinds[k]]))
                        for k, v in values.items()}  # fmt: skip
        self.sender = Sender()
        self.cancel = threading.Event()

    def get_response_sender(self) -> Sender:
        return self.sender

    def is_cancelled(self) -> bool:
        return self.cancel.is_set()


@pytest.fixture(scope="module")
def model(fixture_export):
    from seer_trt.runtime.pipeline import SeerPipeline
    from seer_trt.serving.triton.decoupled import Model

    model = Model.__new__(Model)  # what Model.__init__ builds inside the server, without the server
    model.serve(PB, SeerPipeline.from_manifest(fixture_export[0], cache=CacheConfig("none")))
    warm = FakeRequest("count to 3 .")
    model.execute([warm])  # the engine's loop is made at its first admission
    assert warm.sender.done.wait(TIMEOUT_S) and warm.sender.sent[-1][0].error is None
    yield model
    model.finalize()


def test_the_contract_names_every_request_field():
    assert [t.name for t in REQUEST_INPUTS] == [*FIELDS, "stream"]  # Request's names, and seer-serve's stream


def test_a_stream_concatenates_to_the_whole_answer_and_ends_final(model, fixture_export):
    from seer_trt.runtime.pipeline import SeerPipeline

    requests = [FakeRequest("count to 12 .", stream=True), FakeRequest("count to 12 ."),
                FakeRequest("repeat cat 3 times .", stream=True, seer=False, gen_length=32, decoding="fixed")]  # fmt: skip
    model.execute(requests)
    for r in requests:
        assert r.sender.done.wait(TIMEOUT_S)
    pipe = SeerPipeline.from_manifest(fixture_export[0], cache=CacheConfig("none"))
    want = pipe.generate([Request("count to 12 ."), Request("count to 12 ."),
                          Request("repeat cat 3 times .", seer=False, gen_length=32, decoding="fixed")])  # fmt: skip
    pipe.close()
    for r, w in zip(requests, want, strict=True):
        *streamed, (last, flags) = r.sender.sent
        assert flags == FINAL and all(f == 0 for _, f in streamed) and last.error is None
        assert r.sender.text() == w.text and list(last.outputs["token_ids"][0]) == list(w.token_ids)
        assert int(last.outputs["kept"][0, 0]) == w.kept and int(last.outputs["denoise_steps"][0, 0]) == w.steps
        assert all(set(resp.outputs) == {"text"} for resp, _ in streamed)
    assert len(requests[1].sender.sent) == 1  # not streamed: the whole answer in one response
    assert len(requests[2].sender.sent) > 2  # the fixed loop over 32 positions: its prefix grows over many steps


def test_requests_of_separate_calls_share_the_engines_steps(model):
    """Each request arrives in an execute call of its own; the one engine steps their rows together: its steps hold
    rows of several calls (its window-graph calls as the dispatch policy forms them from those rows: on a CPU the
    cost model measured here may give each row a call of its own)."""
    before = model.engine.steps
    rows: list[int] = []
    model.engine.loop.on_call = lambda record: rows.append(record.rows)
    requests = [FakeRequest(f"repeat dog {n} times .", stream=True, seer=False, gen_length=32, decoding="fixed")
                for n in (3, 4, 5, 6)]  # fmt: skip
    for r in requests:
        model.execute([r])
    for r in requests:
        assert r.sender.done.wait(TIMEOUT_S) and r.sender.sent[-1][0].error is None
    model.engine.loop.on_call = None
    steps = model.engine.steps - before
    live = model.engine.rows_per_step[-steps:]
    print(f"{steps} engine steps, live rows per step {live}; rows per window-graph call {rows}")
    assert max(live) >= 2 and steps < 4 * 32  # alone, the four fixed loops over 32 positions take 128 steps
    assert sum(rows) == sum(live)  # every live row of every step in one of its calls


def test_a_cancelled_request_leaves_at_the_next_step(model):
    """Cancelled after its first streamed text: at most one more step runs it (the watcher polls every 5 ms, the row
    leaves at the next step boundary), and its final response is an error."""
    request = FakeRequest("repeat cat 9 times .", stream=True, seer=False, gen_length=64, decoding="fixed")
    at_cancel: list[int] = []

    def first(response) -> None:
        if not at_cancel:
            at_cancel.append(model.engine.steps)
            request.cancel.set()
            time.sleep(0.05)  # the engine thread, held here, lets the watcher see the cancellation first

    request.sender.on_send = first
    model.execute([request])
    assert request.sender.done.wait(TIMEOUT_S)
    last, flags = request.sender.sent[-1]
    assert flags == FINAL and last.error is not None and last.error.text == "cancelled"
    streamed = [r for r, f in request.sender.sent if f == 0]
    print(f"cancelled at step {at_cancel[0]}: {len(streamed)} streamed responses, engine at step {model.engine.steps}")
    assert len(streamed) <= 2 and model.engine.steps - at_cancel[0] <= 1


def test_every_field_maps_as_seer_serve_maps_it(model, fixture_export):
    """Sampled with seeds, a stop sequence, system and history: the answers SeerPipeline.generate gives, the text cut
    before the stop; bad values refused with Request's own messages (INVALID_ARG)."""
    from seer_trt.runtime.pipeline import SeerPipeline
    from seer_trt.serving.stops import cut_at_stop

    fields = [dict(temperature=0.8, top_p=0.9, seed=s) for s in (1, 2, 3)]
    fields += [dict(system="You count.", history=json.dumps([["user", "count to 2 ."], ["assistant", "1 2"]])),
               dict(cache="reuse", refresh_interval=2), dict(window=8, seer=False)]  # fmt: skip
    requests = [FakeRequest("count to 12 .", stream=True, stop=json.dumps(["7"]), **f) for f in fields]
    model.execute(requests)
    for r in requests:
        assert r.sender.done.wait(TIMEOUT_S) and r.sender.sent[-1][0].error is None, r.sender.sent[-1][0].error.text
    asked = [{**f, "history": tuple(map(tuple, json.loads(f["history"])))} if "history" in f else f for f in fields]
    pipe = SeerPipeline.from_manifest(fixture_export[0], cache=CacheConfig("none"))
    want = pipe.generate([Request("count to 12 .", **f) for f in asked])
    pipe.close()
    for r, w in zip(requests, want, strict=True):
        assert w.ok and r.sender.text() == cut_at_stop(w.text, ["7"])[0]
    bad = [FakeRequest("count .", temperature=3.0), FakeRequest("count .", top_p=0.0), FakeRequest("count .", seed=-1),
           FakeRequest("count .", stop=json.dumps(["a", "b", "c", "d", "e"])), FakeRequest("count .", stop="[1"),
           FakeRequest("count .", history=json.dumps([["assistant", "hi"]])), FakeRequest("count .", cache="always")]  # fmt: skip
    model.execute(bad)
    words = ["temperature is 3.0", "top_p is 0.0", "seed is -1", "stop has 5 sequences; send at most 4",
             "stop is not JSON", "history[0] is a 'assistant' turn", "cache is 'always'"]  # fmt: skip
    for r, w in zip(bad, words, strict=True):
        (response, flags), = r.sender.sent  # fmt: skip
        assert flags == FINAL and response.error.code == "INVALID_ARG" and w in response.error.text, response.error.text


def test_an_internal_failure_answers_internal(model, monkeypatch):
    """A graph call that fails (the backend, not the request): the request's final response is an INTERNAL error
    naming it, and the next request is answered."""
    backend = model.pipeline.backend
    run = backend.run

    def broken(graph, *args, **kwargs):
        if graph == "denoise":
            raise RuntimeError("the denoise session is gone")
        return run(graph, *args, **kwargs)

    monkeypatch.setattr(backend, "run", broken)
    request = FakeRequest("repeat cat 3 times .", seer=False, gen_length=32, decoding="fixed")
    model.execute([request])
    assert request.sender.done.wait(TIMEOUT_S)
    ((response, flags),) = request.sender.sent
    assert flags == FINAL and response.error.code == "INTERNAL"
    assert response.error.text == "RuntimeError: the denoise session is gone"
    monkeypatch.setattr(backend, "run", run)
    again = FakeRequest("count to 3 .")
    model.execute([again])
    assert again.sender.done.wait(TIMEOUT_S) and again.sender.sent[-1][0].error is None


# ---- the real server ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine_repo(fixture_export, tmp_path_factory):
    repo = tmp_path_factory.mktemp("triton-engine") / "repo"
    rc, out, err = cli(triton_main, ["--engines", str(fixture_export[0]), "--out", str(repo), "--flavour", "cpu",
                                     "--cache", "none"])  # fmt: skip  # seer-run's answers below are cache none's
    assert rc == 0, err
    assert out.splitlines() == ["seer: python"]  # one model: no component models
    return repo


@pytest.mark.slow
def test_the_engine_repository_is_one_decoupled_model(engine_repo):
    (config,) = configs(engine_repo).values()
    assert config.model_transaction_policy.decoupled and [g.count for g in config.instance_group] == [1]
    assert [t[0] for t in io_of(config, "input")] == [*FIELDS, "stream"]
    assert pbtxt.parameters(config)["seer_role"] == "decoupled" and pbtxt.parameters(config)["backend"] == "onnxruntime"
    assert (engine_repo / "seer" / "1" / "export" / "denoise.onnx").is_file()


@pytest.fixture(scope="module")
def engine_server(engine_repo, triton_install):
    with LocalServer(engine_repo, ServerInstall.find(triton_install.home), start_timeout=600) as running:
        yield running


def stream(url: str, tensors_of, cases, cancel_after: int | None = None) -> list[list]:
    """Each case's responses over one gRPC stream (``stream_infer``): [(text, outputs or None, error)] per case."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)), stream_timeout=TIMEOUT_S)
    out = []
    try:
        for case in cases:
            client.async_stream_infer("seer", tensors_of(grpcclient, case))
            responses = []
            while True:
                result, error = got.get(timeout=TIMEOUT_S)
                if error is not None:
                    responses.append((None, None, error))
                    break
                final = result.get_response().parameters["triton_final_response"].bool_param
                responses.append((result.as_numpy("text")[0, 0].decode(), answer(result) if final else None, None))
                if final or (cancel_after is not None and len(responses) >= cancel_after):
                    break
            out.append(responses)
    finally:
        client.stop_stream(cancel_requests=cancel_after is not None)
        client.close()
    return out


def streamed(module, case: Case) -> list:
    flag = module.InferInput("stream", [1, 1], "BOOL")
    flag.set_data_from_numpy(np.array([[True]]))
    return [*inputs(module, case), flag]


@pytest.mark.serving
def test_stream_infer_answers_as_seer_run_does(engine_server, expected):
    for case, want, responses in zip(CASES, expected, stream(engine_server.grpc_url, streamed, CASES), strict=True):
        *parts, (text, whole, error) = responses
        assert error is None and whole is not None and all(w is None for _, w, _ in parts)
        assert "".join(t for t, _, _ in parts) + text == want["text"], case.prompt  # the deltas add up to the answer
        assert whole == {**wanted(want), "text": text}, case.prompt
    # not streamed: one response, the whole answer
    for case, want, responses in zip(CASES, expected, stream(engine_server.grpc_url, inputs, CASES), strict=True):
        assert [answer for _, answer, _ in responses] == [wanted(want)], case.prompt


def generate(url: str, endpoint: str, body: dict) -> tuple[int, list[dict]]:
    request = urllib.request.Request(f"http://{url}/v2/models/seer/{endpoint}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            text = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as err:
        return err.code, [json.loads(err.read().decode())]
    if endpoint == "generate":
        return status, [json.loads(text)]
    return status, [json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")]


@pytest.mark.serving
def test_the_generate_endpoints_answer_and_stream(engine_server, expected):
    texts = [(c, w) for c, w in zip(CASES, expected, strict=True) if c.image is None]
    for case, want in texts:
        body = {"prompt": case.prompt, "seer": case.seer, "early_stop": case.early_stop,
                **({"gen_length": case.gen_length} if case.gen_length else {}),
                **({"decoding": case.decoding} if case.decoding else {})}  # fmt: skip
        status, (whole,) = generate(engine_server.http_url, "generate", body)
        assert status == 200 and whole["text"] == want["text"] and whole["token_ids"] == want["token_ids"]
        status, events = generate(engine_server.http_url, "generate_stream", {**body, "stream": True})
        assert status == 200 and "".join(e["text"] for e in events) == want["text"], case.prompt
        assert events[-1]["token_ids"] == want["token_ids"] and events[-1]["kept"] == want["kept"]
    status, (error,) = generate(engine_server.http_url, "generate", {"prompt": " "})
    assert status == 400 and "the prompt is empty" in error["error"]
    status, (error,) = generate(engine_server.http_url, "generate", {"prompt": "count .", "stop": "[1"})
    assert status == 400 and "stop is not JSON" in error["error"]


@pytest.mark.serving
def test_sampled_requests_with_seeds_answer_as_the_pipeline_does(engine_server, fixture_export):
    from seer_trt.runtime.pipeline import SeerPipeline

    prompts = [c.prompt for c in CASES if c.image is None] + ["count to 7 .", "repeat cat 4 times ."]

    def sampled(module, case):
        tensors = inputs(module, Case(case[0]))
        for name, dtype, value in (("temperature", "FP32", np.float32(0.8)), ("top_p", "FP32", np.float32(0.9)),
                                   ("seed", "INT64", np.int64(case[1]))):  # fmt: skip
            t = module.InferInput(name, [1, 1], dtype)
            t.set_data_from_numpy(np.array([[value]]))
            tensors.append(t)
        return tensors

    asked = [(p, seed) for seed, p in enumerate(prompts)]
    got = [r[-1][1] for r in stream(engine_server.grpc_url, sampled, asked)]
    pipe = SeerPipeline.from_manifest(fixture_export[0], cache=CacheConfig("none"))
    want = pipe.generate([Request(p, seed=s, **SAMPLED) for p, s in asked])
    pipe.close()
    assert got == [{"text": w.text, "token_ids": list(w.token_ids), "kept": w.kept, "steps": w.steps} for w in want]
    assert len({w.text for w in want}) > 1


@pytest.mark.serving
def test_a_cancelled_stream_ends_and_the_server_goes_on(engine_server, expected):
    long = Case("repeat cat 9 times .", gen_length=64, seer=False, decoding="fixed")
    (responses,) = stream(engine_server.grpc_url, streamed, [long], cancel_after=1)
    assert len(responses) == 1 and responses[0][2] is None and responses[0][1] is None  # cut off mid-answer
    assert stream(engine_server.grpc_url, inputs, CASES[:1])[0][-1][1] == wanted(expected[0])


@pytest.mark.serving
def test_malformed_requests_get_errors_over_the_stream(engine_server, expected):
    bad = [Case(""), Case("count to 3 .", image=b"not a png"), Case("count to 3 .", gen_length=100000)]
    words = ["the prompt is empty", "not a readable image", "exceeds the largest answer bucket"]
    for responses, w in zip(stream(engine_server.grpc_url, inputs, bad), words, strict=True):
        ((_, _, error),) = responses
        assert w in error.message(), error.message()
    assert stream(engine_server.grpc_url, inputs, CASES[:1])[0][-1][1] == wanted(expected[0])


@pytest.mark.serving
def test_readme_client_snippet_runs_against_the_server(engine_server):
    """The README's Python streaming client, verbatim, pointed at this server through TRITON_GRPC."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    serving = readme[readme.index("## Serving on Triton") :]
    code = re.search(r"```python\n(.*?)```", serving, re.S).group(1)
    env = {**os.environ, "TRITON_GRPC": engine_server.grpc_url}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == re.search(r"It prints `([^`]+)`", serving).group(1)  # answer, L*, steps


@pytest.mark.serving
def test_concurrent_streams_are_all_answered(engine_server, expected):
    """16 clients, a stream each, 3 requests a stream (48 in all, bounded by TIMEOUT_S each): every answer is seer-run's
    and the server lives on (asking a request whether it was cancelled after its final response crashed it once)."""
    picks = [[(k * 3 + j) % len(CASES) for j in range(3)] for k in range(16)]
    found: dict[int, list] = {}

    def client(k: int) -> None:
        found[k] = stream(engine_server.grpc_url, inputs, [CASES[i] for i in picks[k]])

    threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    assert sorted(found) == list(range(16)) and engine_server.process.poll() is None
    for k, responses in found.items():
        assert [r[-1][1] for r in responses] == [wanted(expected[i]) for i in picks[k]]
