"""seer-serve (docs/DESIGN.md "Serving and embedding"): OpenAI's chat-completions API over the engine, served
by uvicorn on 127.0.0.1 in this process (and once as the ``seer-serve`` command). The real ``openai`` client gets
what ``SeerPipeline.generate`` gives the same request alone, whole and streamed; every error path answers its
status with OpenAI's error body; a bounded load of concurrent, streamed and abandoned requests leaves nothing
behind."""

from __future__ import annotations

import base64
import collections
import contextlib
import io
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx  # the serve and dev extras, which the README's test command installs: never skipped
import openai
import pytest
import uvicorn
from PIL import Image

from seer_trt.eval.tasks import make_samples
from seer_trt.runtime.engine import Cancelled, Engine
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request
from seer_trt.serving.openai.chat import ApiError, TextStream
from seer_trt.serving.openai.http import create_app
from seer_trt.serving.openai.server import config as server_config
from seer_trt.serving.openai.server import listen

pytestmark = pytest.mark.serving

KEY = "test-key"
MODEL = "tiny"
LOAD_CLIENTS = 16
LOAD_REQUESTS = 360  # over LOAD_CLIENTS threads: a third streamed, a tenth of those abandoned after the first chunk
LOAD_WARM_UP = 120  # requests before RSS is read: the binding cache and ONNX Runtime's arenas settle
RSS_GROWTH = 96 * 2**20  # at most, after warm-up (measured: about 20 MiB)
REQUEST_TIMEOUT_S = 300  # per request on a busy 2-core machine


def png(image) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


SAMPLES = make_samples(11, 12)
IMAGES = [s for s in SAMPLES if s.image is not None][:4]
TEXTS = ["count to 7 .", "repeat cat 3 times .", "count to 3 .", "count from 2 to 6 ."]


@contextlib.contextmanager
def serving(engine: Engine, header_timeout_s: float = 10.0, **options) -> Iterator[str]:
    """uvicorn as seer-serve configures it (seer_trt.serving.openai.server) on a free 127.0.0.1 port in a background
    thread, serving ``create_app(engine, MODEL, ...)``."""
    app = create_app(engine, MODEL, **options)
    sock = listen("127.0.0.1", 0)  # seer-serve's own listening socket
    server = uvicorn.Server(server_config(app, header_timeout_s, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.fixture(scope="module")
def pipe(fixture_export):
    folder, _, _ = fixture_export
    pipe = SeerPipeline.from_manifest(folder, threads=1)
    # the backend keeps an IOBinding per call shape, up to 512 MiB of outputs per thread by default; packed steps
    # come in many shapes, so the load test's RSS would grow into that bound: keep it small to see a leak
    pipe.backend.cache_bytes = 16 * 2**20
    return pipe


@pytest.fixture(scope="module")
def engine(pipe):
    sched = Engine(pipe, max_queue=256).start()
    yield sched
    sched.close()


@pytest.fixture(scope="module")
def url(engine):
    with serving(engine, api_key=KEY) as base:
        yield base


@pytest.fixture
def http(url):
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=REQUEST_TIMEOUT_S) as c:
        yield c


def alone(pipe, prompt: str, image: bytes | None = None, **settings) -> str:
    """What the pipeline answers the request alone, with the settings the server runs by default."""
    result = pipe.generate([Request(prompt, image=image, **settings)])[0]
    assert result.ok, result.error
    return result.text


def user(text: str, image: bytes | None = None) -> list[dict]:
    if image is None:
        return [{"role": "user", "content": text}]
    return [{"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": data_url(image)}}]}]  # fmt: skip


# --- the openai client ----------------------------------------------------------------------------------------


def test_openai_client_image_whole_and_streamed_equal_the_pipeline(url, pipe):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=REQUEST_TIMEOUT_S)
    sample = IMAGES[0]
    image = png(sample.image)
    expected = alone(pipe, sample.question, image)
    whole = client.chat.completions.create(model=MODEL, messages=user(sample.question, image))
    assert whole.choices[0].message.content == expected and whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.completion_tokens > 0 and whole.usage.prompt_tokens > 0
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    assert {"seer", "early_stop", "decoding", "steps", "kept", "denoise_steps"} <= set(whole.seer)
    stream = client.chat.completions.create(model=MODEL, messages=user(sample.question, image), stream=True,
                                            stream_options={"include_usage": True})  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_streamed_text_arrives_in_pieces_and_matches_seer_settings(url, pipe):
    """The exact loop (decoding fixed) commits a few ids per step: the text comes in several chunks, equal to the
    pipeline's, and the response echoes seer-trt's settings with L* and the steps used."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=REQUEST_TIMEOUT_S)
    extra = {"decoding": "fixed", "early_stop": True}
    expected = pipe.generate([Request("count to 7 .", **extra)])[0]
    stream = client.chat.completions.create(model=MODEL, messages=user("count to 7 ."), stream=True, extra_body=extra)
    chunks = list(stream)
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == expected.text and len(pieces) > 1, pieces
    last = chunks[-1]
    assert last.choices[0].finish_reason == "stop"
    assert last.seer["kept"] == expected.kept and last.seer["denoise_steps"] == expected.steps
    assert last.seer["decoding"] == "fixed" and last.seer["early_stop"] is True
    whole = client.chat.completions.create(model=MODEL, messages=user("count to 7 ."), extra_body=extra,
                                           max_tokens=32, seed=3)  # fmt: skip
    assert whole.choices[0].message.content == alone(pipe, "count to 7 .", gen_length=32, **extra)
    assert whole.seer["gen_length"] == 32


def test_sampling_top_p_stop_and_the_cache_as_openai_clients_send_them(url, pipe):
    """temperature, seed and top_p reach the engine (the pipeline's answer with the same seed); stop ends the answer
    before the sequence, whole and streamed alike; the response names the cache policy it ran under."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=REQUEST_TIMEOUT_S)
    sampled = client.chat.completions.create(model=MODEL, messages=user("count to 7 ."), temperature=0.8, seed=11,
                                             top_p=0.9)  # fmt: skip
    assert sampled.choices[0].message.content == alone(pipe, "count to 7 .", temperature=0.8, seed=11, top_p=0.9)
    assert sampled.seer["cache"] == pipe.cache.mode and sampled.seer["refreshes"] >= 1
    uncached = client.chat.completions.create(model=MODEL, messages=user("count to 7 ."), extra_body={
        "cache": "none", "decoding": "fixed"})  # fmt: skip
    assert uncached.seer["cache"] == "none" and uncached.seer["refreshes"] == uncached.seer["denoise_steps"]
    whole = client.chat.completions.create(model=MODEL, messages=user("count to 7 ."), stop=[" 5", "x"])
    full = alone(pipe, "count to 7 .")
    assert " 5" in full and whole.choices[0].message.content == full[: full.index(" 5")]
    assert whole.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(model=MODEL, messages=user("count to 7 ."), stop=" 5", stream=True,
                                            extra_body={"decoding": "fixed"})  # fmt: skip
    chunks = [c for c in stream if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == full[: full.index(" 5")]
    assert chunks[-1].choices[0].finish_reason == "stop"
    neutral = client.chat.completions.create(
        model=MODEL,
        messages=user("count to 7 ."),
        logprobs=False,
        presence_penalty=0,
        frequency_penalty=0,
        tools=None,
        response_format={"type": "text"},
    )  # what SDKs send by default
    assert neutral.choices[0].message.content == full


STOPS = [  # (what, stop sequences, the answer "1 2 3 4 5 6 7" cut by them)
    ("one arriving across pushes", [" 4 5"], "1 2 3"),
    ("partial matches that turn out not to match", ["3 5", " 6 8"], "1 2 3 4 5 6 7"),
    ("several: the one that ends first cuts", ["4 5 6", "5"], "1 2 3 4 "),
    ("two ending at the same character: the longer", ["7", "6 7"], "1 2 3 4 5 "),
]  # fmt: skip


@pytest.mark.parametrize(("what", "stop", "expected"), STOPS, ids=[s[0] for s in STOPS])
def test_streamed_and_whole_answers_are_cut_alike_and_count_what_they_return(http, pipe, what, stop, expected):
    """The exact loop streams "1 2 3 4 5 6 7" in several chunks: whole and streamed, the stop sequences cut it at the
    same character, and usage counts the answer ids of the text returned (3 for "1 2 3"), not those past the cut."""
    body = chat_body(messages=user("count to 7 ."), decoding="fixed", stop=stop)
    assert alone(pipe, "count to 7 .", decoding="fixed") == "1 2 3 4 5 6 7"
    whole = http.post("/v1/chat/completions", json=body)
    assert whole.status_code == 200, whole.text
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/chat/completions", json=streamed) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    pieces = [e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]]
    answer = whole.json()["choices"][0]
    assert answer["message"]["content"] == "".join(pieces) == expected
    assert [e["choices"][0].get("finish_reason") for e in events if e["choices"]][-1] == answer["finish_reason"]
    assert answer["finish_reason"] == "stop"  # the stop sequence, or the answer's <|eot_id|> inside the window
    used = whole.json()["usage"]["completion_tokens"]
    assert events[-1]["usage"]["completion_tokens"] == used
    tokens = pipe.prompts.tokenizer.encode(expected.strip(), add_special_tokens=False).ids
    assert used == len(tokens) + expected.endswith(" "), (used, tokens)  # a trailing space comes with the next id


def test_a_stop_longer_than_an_answer_can_hold_is_one_400(http, engine):
    """Each stop sequence at most max_answer_chars (the largest answer bucket x the longest token and a separator):
    four of that length are taken, one character more is refused before any work, naming the limit."""
    limit = engine.limits.max_answer_chars
    assert limit == engine.pipe.buckets.answer[-1] * (max(map(len, engine.pipe.prompts.tokenizer.get_vocab())) + 1)
    longest = [("1 2 3 4 5 6 7 8 9 " * limit)[:limit], "1" * limit, "7 " * (limit // 2), "x" * limit]
    r = http.post("/v1/chat/completions", json=chat_body(messages=user("count to 7 ."), stop=longest))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "1 2 3 4 5 6 7", r.text
    r = http.post("/v1/chat/completions", json=chat_body(stop=["a", "b" * (limit + 1)]))
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop", r.text
    assert f"a sequence of {limit + 1} characters, more than the {limit} accepted" in r.json()["error"]["message"]


def test_a_conversation_is_answered_after_its_earlier_turns(http, pipe):
    turns = [{"role": "system", "content": "you count ."}, *user("count to 2 ."), {"role": "assistant", "content": "1 2"},
             *user("count to 3 .")]  # fmt: skip
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": turns})
    assert r.status_code == 200, r.text
    history = (("user", "count to 2 ."), ("assistant", "1 2"))
    expected = pipe.generate([Request("count to 3 .", system="you count .", history=history)])[0]
    assert r.json()["choices"][0]["message"]["content"] == expected.text
    alone_ids = pipe.prompts.ids("count to 3 .", False, "you count .")
    assert r.json()["usage"]["prompt_tokens"] == len(pipe.prompts.ids("count to 3 .", False, "you count .", history))
    assert r.json()["usage"]["prompt_tokens"] > len(alone_ids)  # the earlier turns are in the prompt


def test_system_message_goes_to_the_template(http, pipe):
    body = {"model": MODEL, "messages": [{"role": "system", "content": "you count ."}, *user("count to 3 .")]}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    expected = pipe.generate([Request("count to 3 .", system="you count .")])[0]
    assert r.json()["choices"][0]["message"]["content"] == expected.text


# --- plain HTTP: every error path ---------------------------------------------------------------------------


def chat_body(**fields) -> dict:
    return {"model": MODEL, "messages": user("count to 3 ."), **fields}


ERRORS = [  # (what, body or raw bytes, status, param)
    ("tools", chat_body(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools"),
    ("log-probabilities", chat_body(logprobs=True), 400, "logprobs"),
    ("structured output", chat_body(response_format={"type": "json_object"}), 400, "response_format"),
    ("a penalty", chat_body(presence_penalty=0.5), 400, "presence_penalty"),
    ("five stop sequences", chat_body(stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    ("an empty stop sequence", chat_body(stop=""), 400, "stop"),
    ("top_p of 0", chat_body(top_p=0), 400, "top_p"),
    ("top_p past 1", chat_body(top_p=1.5), 400, "top_p"),
    ("a temperature past 2", chat_body(temperature=2.5), 400, "temperature"),
    ("a temperature of 10^6", chat_body(temperature=1e6), 400, "temperature"),
    ("a negative temperature", chat_body(temperature=-0.5), 400, "temperature"),
    ("not JSON", b"{not json", 400, None),
    ("no messages", {"model": MODEL}, 400, "messages"),
    ("empty messages", chat_body(messages=[]), 400, "messages"),
    ("a string temperature", chat_body(temperature="hot"), 400, "temperature"),
    ("a negative max_tokens", chat_body(max_tokens=0), 400, "max_tokens"),
    ("a fractional seed", chat_body(seed=1.5), 400, "seed"),
    ("an unknown field", chat_body(top_k=3), 400, "top_k"),
    ("an unknown role", chat_body(messages=[{"role": "robot", "content": "hi"}]), 400, "messages[0].role"),
    ("n = 2", chat_body(n=2), 400, "n"),
    ("max_tokens and max_completion_tokens differ", chat_body(max_tokens=8, max_completion_tokens=16), 400,
     "max_completion_tokens"),
    ("two user turns in a row", chat_body(messages=[*user("count to 3 ."), *user("again")]), 400, "messages[1]"),
    ("a conversation opened by the assistant",
     chat_body(messages=[{"role": "assistant", "content": "hi"}, *user("count to 3 .")]), 400, "messages[0]"),
    ("a tool message", chat_body(messages=[*user("a"), {"role": "tool", "content": "b"}, *user("c")]), 400,
     "messages[1]"),
    ("an image in an earlier turn", chat_body(messages=[*user("how many shapes ?", png(IMAGES[0].image)),
                                                        {"role": "assistant", "content": "2"}, *user("why ?")]), 400,
     "messages[0].content[1]"),
    ("the last message is not the user's", chat_body(messages=[{"role": "system", "content": "hi"}]), 400,
     "messages[0]"),
    ("two system messages", chat_body(messages=[{"role": "system", "content": "a"},
                                                {"role": "system", "content": "b"}, *user("hi")]), 400, "messages[1]"),
    ("an http image URL", chat_body(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x.png"}}]}]), 400,
     "messages[0].content[0].image_url.url"),
    ("two images", chat_body(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(png(IMAGES[0].image))}},
        {"type": "image_url", "image_url": {"url": data_url(png(IMAGES[1].image))}}]}]), 400,
     "messages[0].content[1]"),
    ("bad base64", chat_body(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@@"}}]}]), 400,
     "messages[0].content[0].image_url.url"),
    ("a data URL that is not an image", chat_body(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGk="}}]}]), 400,
     "messages[0].content[0].image_url.url"),
    ("an unknown content part", chat_body(messages=[{"role": "user", "content": [{"type": "video"}]}]), 400,
     "messages[0].content[0]"),
    ("a number as image URL", chat_body(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": 5}}]}]), 400, "messages[0].content[0].image_url.url"),
    ("an image in the system message", chat_body(messages=[{"role": "system", "content": [
        {"type": "image_url", "image_url": {"url": data_url(png(IMAGES[0].image))}}]}, *user("hi")]), 400,
     "messages[0].content[0]"),
    ("an empty prompt", chat_body(messages=user("   ")), 400, None),
    ("a lone surrogate", b'{"model": "tiny", "messages": [{"role": "user", "content": "a\\ud800b"}]}', 400, None),
    ("a window past the largest bucket", chat_body(max_tokens=10**6), 400, None),
    ("steps past the window", chat_body(max_tokens=8, steps=64), 400, None),
    ("a malformed decoding rule", chat_body(decoding="greedy"), 400, None),
    ("an unknown model", chat_body(model="gpt-4"), 404, "model"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "body", "status", "param"), ERRORS, ids=[e[0] for e in ERRORS])
def test_bad_requests_answer_their_status_and_an_openai_error_body(http, what, body, status, param):
    raw = body if isinstance(body, bytes) else None
    r = http.post("/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"}) if raw else (
        http.post("/v1/chat/completions", json=body))  # fmt: skip
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["message"] and "Traceback" not in r.text
    assert error["type"] == {400: "invalid_request_error", 404: "not_found_error"}[status]


@contextlib.contextmanager
def image_host(image: bytes, limit: int, hits: list[str] | None = None) -> Iterator[str]:
    """A loopback HTTP server for image URLs: /ok.png, /missing, /declared-big (a Content-Length past ``limit``),
    /streamed-big (chunked, no length, past ``limit``), /slow (nothing for 5 s), /moved (a redirect to /ok.png)."""
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            if hits is not None:
                hits.append(self.path)
            if self.path == "/ok.png":
                self._send(200, image, {"Content-Type": "image/png", "Content-Length": str(len(image))})
            elif self.path == "/moved":
                self._send(302, b"", {"Location": "/ok.png", "Content-Length": "0"})
            elif self.path == "/declared-big":
                self._send(200, b"", {"Content-Type": "image/png", "Content-Length": str(limit + 1)}, body=False)
            elif self.path == "/streamed-big":
                self._send(200, b"", {"Content-Type": "image/png", "Transfer-Encoding": "chunked"}, body=False)
                chunk = b"\0" * 65536
                with contextlib.suppress(OSError):
                    for _ in range(limit // len(chunk) + 2):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            elif self.path == "/slow":
                time.sleep(5)
            else:
                self._send(404, b"no", {"Content-Length": "2"})

        def _send(self, status: int, data: bytes, headers: dict, body: bool = True) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if body:
                self.wfile.write(data)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_image_urls_are_fetched_only_when_allowed_within_size_and_time(engine, pipe):
    image = png(IMAGES[0].image)
    limit = pipe.image_limits.bytes
    question = IMAGES[0].question.replace("<image>\n", "")

    def body(url: str) -> dict:
        return {"model": MODEL, "messages": [{"role": "user", "content": [
            {"type": "text", "text": question}, {"type": "image_url", "image_url": {"url": url}}]}]}  # fmt: skip

    with image_host(image, limit) as host, serving(engine, allow_image_urls=True, image_url_timeout_s=1.0) as base:
        with httpx.Client(base_url=base, timeout=REQUEST_TIMEOUT_S) as c:
            for path in ("/ok.png", "/moved"):
                r = c.post("/v1/chat/completions", json=body(host + path))
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["message"]["content"] == alone(pipe, question, image)
            for path, words in [("/missing", "answered HTTP 404"), ("/declared-big", f"more than the {limit}"),
                                ("/streamed-big", f"more than the {limit} bytes"), ("/slow", "within 1 s")]:  # fmt: skip
                start = time.monotonic()
                r = c.post("/v1/chat/completions", json=body(host + path))
                error = r.json()["error"]
                assert r.status_code == 400 and words in error["message"], (path, r.text)
                assert error["param"] == "messages[0].content[1].image_url.url"
                assert time.monotonic() - start < 4  # the slow host is given up on at the timeout
    with serving(engine) as base:  # the default: never fetched
        r = httpx.post(f"{base}/v1/chat/completions", json=body("http://127.0.0.1:9/x.png"), timeout=30)
        assert r.status_code == 400 and "--allow-image-urls" in r.json()["error"]["message"]


def test_image_urls_are_fetched_only_for_a_request_that_is_otherwise_valid(engine, pipe):
    """20 image URLs in one body (issue 37: 800 MB downloaded before the refusal), URLs in a message that will be
    refused, n = 2: each a 400 with nothing fetched; a valid request fetches its one URL once, upper-case scheme too."""
    image = png(IMAGES[0].image)
    hits: list[str] = []
    with image_host(image, pipe.image_limits.bytes, hits) as host, serving(engine, allow_image_urls=True) as base:
        part = {"type": "image_url", "image_url": {"url": host + "/ok.png"}}
        text = {"type": "text", "text": "how many shapes ?"}
        refused = [
            {"model": MODEL, "messages": [{"role": "user", "content": [text, *[part] * 20]}]},
            {"model": MODEL, "messages": [{"role": "user", "content": [text, part]}, {"role": "assistant",
             "content": "2"}, {"role": "user", "content": "and now ?"}]},
            {"model": MODEL, "messages": [{"role": "user", "content": [text, part]}], "n": 2},
        ]  # fmt: skip
        with httpx.Client(base_url=base, timeout=REQUEST_TIMEOUT_S) as c:
            for body in refused:
                r = c.post("/v1/chat/completions", json=body)
                assert r.status_code == 400, r.text
            assert hits == []
            upper = {"type": "image_url", "image_url": {"url": host.replace("http://", "HTTP://") + "/ok.png"}}
            r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user",
                                                                                    "content": [text, upper]}]})  # fmt: skip
            assert r.status_code == 200 and hits == ["/ok.png"], r.text


def test_a_data_image_of_exactly_the_bound_is_taken(engine):
    from seer_trt.serving.openai.chat import image_bytes

    for n in (10, 11, 12):  # padding of 2, 1 and 0 characters
        url = "data:image/png;base64," + base64.b64encode(b"x" * n).decode()
        assert image_bytes(url, "p", n, None) == b"x" * n
        with pytest.raises(ApiError, match=f"is {n} bytes, more than the {n - 1} accepted"):
            image_bytes(url, "p", n - 1, None)


@pytest.mark.parametrize("stream", [False, True])
def test_an_unreadable_image_fails_in_the_engine_as_a_client_error(http, stream):
    """The engine finds it (its Result's error_kind "input"): 400, streamed or not, before any chunk."""
    body = chat_body(messages=user("how many shapes ?", b"not a png"), stream=stream)
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and "image" in r.json()["error"]["message"], r.text


def test_auth_routes_and_methods(url, http):
    body = chat_body()
    assert httpx.post(f"{url}/v1/chat/completions", json=body).status_code == 401
    wrong = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{url}/v1/models").status_code == 401
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}  # no key needed
    assert http.get("/v1/nothing").status_code == 404 and http.get("/v1/nothing").json()["error"]["type"]
    assert http.get("/v1/chat/completions").status_code == 405
    models = http.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [MODEL]
    assert http.get(f"/v1/models/{MODEL}").json()["id"] == MODEL
    assert http.get("/v1/models/other").status_code == 404


def test_body_bound_is_checked_before_parsing(engine):
    with serving(engine, max_body_bytes=4096) as base, httpx.Client(base_url=base, timeout=60) as c:
        big = chat_body(messages=user("count to 3 . " * 1000))
        r = c.post("/v1/chat/completions", json=big)  # by its Content-Length
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text

        def chunks():  # no Content-Length: counted as it arrives
            yield b'{"model": "tiny", "messages": [{"role": "user", "content": "'
            for _ in range(100):
                yield b"x" * 1024

        r = c.post("/v1/chat/completions", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and "more than" in r.json()["error"]["message"], r.text
        assert c.post("/v1/chat/completions", json=chat_body()).status_code == 200  # a small one passes


def test_queue_full_not_ready_deadline_and_internal_errors(pipe, monkeypatch):
    idle = Engine(pipe)  # never started: not ready
    with serving(idle) as base:
        assert httpx.get(f"{base}/health").status_code == 503
        r = httpx.post(f"{base}/v1/chat/completions", json=chat_body())
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
    sched = Engine(pipe, max_queue=1).start()
    gate = threading.Event()
    real_step = sched.step
    sched.step = lambda: gate.wait(0.05) and real_step()  # the engine holds the queue until the gate opens
    try:
        with serving(sched) as base, ThreadPoolExecutor(1) as pool:
            first = pool.submit(httpx.post, f"{base}/v1/chat/completions", json=chat_body(), timeout=120)
            deadline = time.monotonic() + 30
            while sched.depth == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            r = httpx.post(f"{base}/v1/chat/completions", json=chat_body())
            assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error", r.text
            gate.set()
            assert first.result().status_code == 200
    finally:
        gate.set()
        sched.close()
    sched = Engine(pipe).start()
    try:
        with serving(sched, timeout_s=1e-6) as base:
            r = httpx.post(f"{base}/v1/chat/completions", json=chat_body(), timeout=120)
            assert r.status_code == 504 and r.json()["error"]["code"] == "timeout", r.text
        with serving(sched) as base:
            monkeypatch.setattr(pipe, "prepare", lambda request: 1 / 0)
            r = httpx.post(f"{base}/v1/chat/completions", json=chat_body(), timeout=120)
            assert r.status_code == 500 and r.json()["error"]["type"] == "server_error", r.text
            assert "Traceback" not in r.text
    finally:
        sched.close()


def test_a_client_gone_mid_stream_cancels_its_ticket(pipe):
    sched = Engine(pipe).start()
    tickets, real_submit, real_step = [], sched.submit, sched.step

    def submit(*args, **kwargs):
        tickets.append(real_submit(*args, **kwargs))
        return tickets[-1]

    def slow_step():  # 0.2 s a step: the answer takes seconds, the disconnect lands mid-way
        time.sleep(0.2)
        real_step()

    sched.submit, sched.step = submit, slow_step
    try:
        with serving(sched) as base, httpx.Client(base_url=base, timeout=120) as c:
            body = chat_body(messages=user("count to 7 ."), stream=True, decoding="fixed")
            with c.stream("POST", "/v1/chat/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                        break  # the first text: hang up
            deadline = time.monotonic() + 30
            while not tickets[0].future.done() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert isinstance(tickets[0].future.exception(), Cancelled)
            assert sched.rows == [] and sched.depth == 0
    finally:
        sched.close()


def test_text_stream_holds_back_what_is_not_final_text():
    pieces = {(1,): "a", (1, 2): "a\ufffd", (1, 2, 3): "ab", (1, 2, 3, 4): "ab c"}
    stream = TextStream(lambda ids: pieces[tuple(ids)])
    assert [stream.push([1]), stream.push([2]), stream.push([3]), stream.push([4])] == ["a", "", "b", " c"]
    assert stream.finish("ab c!") == "!" and stream.sent == "ab c!"


def test_metrics(http):
    assert http.post("/v1/chat/completions", json=chat_body()).status_code == 200
    text = http.get("/metrics").text
    for name in ("seer_http_requests_total", "seer_http_errors_total", "seer_queue_depth", "seer_live_rows",
                 "seer_rows_per_step_bucket", "seer_denoise_steps_bucket", "seer_kept_positions_bucket",
                 "seer_http_request_seconds_bucket"):  # fmt: skip
        assert name in text, name
    assert re.search(r'seer_http_requests_total\{route="/v1/chat/completions",status="200"\} [1-9]', text)


# --- load -----------------------------------------------------------------------------------------------------


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_load_concurrent_streamed_and_abandoned_requests(url, engine, pipe):
    cases = [(t, None) for t in TEXTS] + [(s.question, png(s.image)) for s in IMAGES]
    expected = {i: alone(pipe, p, img) for i, (p, img) in enumerate(cases)}
    fixed = {i: alone(pipe, p, img, decoding="fixed", early_stop=True) for i, (p, img) in enumerate(cases)}
    rng = random.Random(0)
    plan = [(rng.randrange(len(cases)), rng.random() < 1 / 3, rng.random() < 0.1) for _ in range(LOAD_REQUESTS)]
    headers = {"Authorization": f"Bearer {KEY}"}

    def one(job) -> str:
        case, stream, abandon = job
        prompt, image = cases[case]
        extra = {"decoding": "fixed", "early_stop": True} if stream else {}
        body = {"model": MODEL, "messages": user(prompt, image), "stream": stream, **extra}
        with httpx.Client(base_url=url, headers=headers, timeout=REQUEST_TIMEOUT_S) as c:
            if not stream:
                r = c.post("/v1/chat/completions", json=body)
                if r.status_code == 429:
                    return "refused"
                assert r.status_code == 200, r.text
                return "answered" if r.json()["choices"][0]["message"]["content"] == expected[case] else "differing"
            with c.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code == 429:
                    return "refused"
                assert r.status_code == 200
                text = ""
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    assert "error" not in chunk, chunk
                    if chunk["choices"]:
                        text += chunk["choices"][0]["delta"].get("content") or ""
                        if abandon and text:
                            return "abandoned"  # closes the connection mid-stream
                return "answered" if text == fixed[case] else "differing"

    with ThreadPoolExecutor(LOAD_CLIENTS) as pool:
        outcomes = list(pool.map(one, plan[:LOAD_WARM_UP]))
        warm = rss_bytes()
        outcomes += list(pool.map(one, plan[LOAD_WARM_UP:]))
    assert len(outcomes) == LOAD_REQUESTS and set(outcomes) <= {"answered", "differing", "refused", "abandoned"}
    assert outcomes.count("answered") >= LOAD_REQUESTS // 2, outcomes
    # an answer equal to the pipeline's alone up to float rounding (docs/DESIGN.md, seer-serve): at most 1 % differ
    assert outcomes.count("differing") <= LOAD_REQUESTS // 100, collections.Counter(outcomes)
    deadline = time.monotonic() + 30
    while (engine.depth or engine.rows) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.depth == 0 and engine.rows == []
    assert max(engine.rows_per_step) > 1  # requests that arrived apart shared steps
    grown = rss_bytes() - warm
    print(f"load: {dict(collections.Counter(outcomes))}, rows per step up to {max(engine.rows_per_step)}, RSS "
          f"{warm / 2**20:.0f} MiB after warm-up, {grown / 2**20:+.1f} MiB at the end")  # fmt: skip
    assert grown < RSS_GROWTH, f"RSS grew {grown / 2**20:.0f} MiB after warm-up"


# --- the command ----------------------------------------------------------------------------------------------


def healthy(proc: subprocess.Popen, after: str = "") -> str:
    """The base URL a seer-serve child prints on stderr (its line, past whatever the libraries print on start-up;
    ``after``: what must follow ``/v1 ``), once ``/health`` answers 200 there."""
    for _ in range(50):
        line = proc.stderr.readline()
        match = re.search(r"on (http://127\.0\.0\.1:\d+)/v1 ?" + after, line)
        if match or not line:
            break
    assert match, line
    base = match.group(1)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                return base
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "seer-serve did not become healthy"
        time.sleep(0.1)


def test_seer_serve_command_serves_and_stops_on_sigterm(fixture_export):
    folder, _, _ = fixture_export
    env = {**os.environ, "SEER_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-m", "seer_trt.cli.serve", "--engines", str(folder), "--port", "0",
                             "--threads", "1", "--binding-cache-mib", "16"], stderr=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip
    try:
        base = healthy(proc, r"\(API key required\)")
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0, timeout=REQUEST_TIMEOUT_S)
        assert [m.id for m in client.models.list()] == [folder.name]
        answer = client.chat.completions.create(model=folder.name, messages=user("count to 7 ."))
        assert answer.choices[0].message.content == "1 2 3 4 5 6 7"
        taken = subprocess.run([sys.executable, "-m", "seer_trt.cli.serve", "--engines", str(folder), "--port",
                                base.rsplit(":", 1)[1]], capture_output=True, text=True, timeout=120)  # fmt: skip
        assert taken.returncode == 2 and len(taken.stderr.strip().splitlines()) == 1, taken.stderr
        assert "cannot listen on" in taken.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 128 + signal.SIGTERM
        assert proc.stderr.read().strip().splitlines()[-1] == "seer-serve: interrupted (SIGTERM)"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_shutdown_past_its_grace_ends_each_request_with_an_answer(fixture_export):
    """SIGTERM with long requests running and --grace 1: whole requests end as answers or OpenAI's error body (503),
    a stream with an error event and [DONE] (issue 37: plain-text 500s and cut streams); no traceback in the log."""
    folder, _, _ = fixture_export
    proc = subprocess.Popen([sys.executable, "-m", "seer_trt.cli.serve", "--engines", str(folder), "--port", "0",
                             "--threads", "1", "--grace", "1"], stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        base = healthy(proc)
        long = {"model": folder.name, "messages": user("count to 9 ."), "seer": False, "decoding": "fixed",
                "cache": "none", "max_tokens": 256, "steps": 256}  # fmt: skip
        whole: list = [None] * 6
        streamed: list[str] = []

        def ask(i: int) -> None:
            whole[i] = httpx.post(f"{base}/v1/chat/completions", json=long, timeout=60)

        def stream() -> None:
            with httpx.stream("POST", f"{base}/v1/chat/completions", json={**long, "stream": True}, timeout=60) as r:
                streamed.extend(r.iter_lines())

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)] + [threading.Thread(target=stream)]
        for t in threads:
            t.start()
        time.sleep(0.5)  # every request in, the first ones denoising
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert proc.wait(60) == 128 + signal.SIGTERM
        log = proc.stderr.read()
        assert "Traceback" not in log, log[-3000:]
        for r in whole:
            assert r.status_code in (200, 503), r.text
            assert "choices" in r.json() if r.status_code == 200 else r.json()["error"]["code"] == "cancelled"
        assert any(r.status_code == 503 for r in whole)  # the grace was spent
        events = [line for line in streamed if line]
        if events and events[0].startswith("{"):  # ended before its first final id: its status, 503, as JSON
            assert json.loads(events[0])["error"]["code"] == "cancelled", events
        else:  # a stream: finished, or an error event, then [DONE]
            assert events and events[-1] == "data: [DONE]", events[-3:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.parametrize(("flags", "words"), [
    (["--port", "70000"], "--port 70000 is not a port"),
    (["--max-queue", "0"], "--max-queue 0 must be at least 1"),
    (["--max-rows", "0"], "--max-rows 0 must be at least 1"),
    (["--timeout", "0"], "--timeout 0.0 must be a positive number"),
    (["--image-url-timeout", "-1"], "--image-url-timeout -1.0 must be a positive number"),
    (["--binding-cache-mib", "-1"], "--binding-cache-mib -1 must be at least 0"),
    (["--max-held-mib", "0"], "--max-held-mib 0 must be at least 1"),
    (["--kv-budget-mib", "0"], "--kv-budget-mib 0 must be at least 1 (MiB)"),
    (["--replicas", "2"], "--replicas apply with --ray ADDRESS"),
    (["--autoscale", "1:2", "--gpus-per-replica", "1"], "--autoscale, --gpus-per-replica apply with --ray ADDRESS"),
    (["--ray", "auto", "--autoscale", "3:1"], "--autoscale 3:1 is not MIN:MAX replicas with 1 <= MIN <= MAX"),
    (["--ray", "auto", "--replicas", "2", "--autoscale", "1:2"], "--replicas and --autoscale are two ways"),
    (["--ray", "auto", "--replicas", "0"], "--replicas 0 must be at least 1"),
    (["--ray", "auto", "--binding-cache-mib", "8"], "--binding-cache-mib applies to seer-serve's own engine"),
    (["--ray", "auto", "--header-timeout", "5"], "--header-timeout applies to seer-serve's own server"),
    (["--ray", "auto", "--port", "0"], "--port 0 (any free port) is not possible with --ray"),
    (["--ray", "auto", "--provider", "cuda"], "runs on a GPU: pass --gpus-per-replica 1"),
    *((["--ray", bad], f"--ray {bad} is not a Ray address; pass the head's HOST:PORT")
      for bad in ("garbage", "127.0.0.1:", ":6379", "ray://127.0.0.1", "http://127.0.0.1:8265", "127.0.0.1:70000",
                  "127.0.0.1:0", "::1:6379", "ray://", "")),
])  # fmt: skip
def test_bad_flags_are_one_line_before_anything_opens(tmp_path, flags, words):
    r = subprocess.run([sys.executable, "-m", "seer_trt.cli.serve", "--engines", str(tmp_path / "none"), *flags],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr


@pytest.mark.parametrize("form", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}", "[::1]:{port}"])
def test_seer_serve_ray_without_a_cluster_there_is_one_line_at_once(fixture_export, form):
    """--ray at an address nothing listens on, in each form that names one: exit 2 and one line naming it, not Ray's
    client retrying for minutes (the cluster itself: tests/test_ray.py)."""
    import socket

    family, host = (socket.AF_INET6, "::1") if form.startswith("[") else (socket.AF_INET, "127.0.0.1")
    try:
        with socket.socket(family) as s:  # a port nothing listens on
            s.bind((host, 0))
            port = s.getsockname()[1]
    except OSError:
        pytest.skip("no IPv6 loopback here")
    address = form.format(port=port)
    r = subprocess.run([sys.executable, "-m", "seer_trt.cli.serve", "--engines", str(fixture_export[0]), "--ray",
                        address], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"--ray {address}: no Ray cluster answers there (Connection refused)" in r.stderr


def test_connections_to_seer_serves_socket_send_without_delay():
    """asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP; without it a response's body waits for
    the client's delayed ACK of its headers (measured: 44 ms for GET /health on loopback, 1.6 ms with it)."""
    import asyncio

    async def check() -> int:
        got: asyncio.Future = asyncio.get_running_loop().create_future()

        def accepted(reader, writer) -> None:
            sock = writer.get_extra_info("socket")
            got.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(accepted, sock=listen("127.0.0.1", 0))
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        value = await asyncio.wait_for(got, 10)
        writer.close()
        server.close()
        return value

    assert asyncio.run(check()) == 1


# --- seer-bench --workload serving ----------------------------------------------------------------------------


def test_the_serving_bench_reports_every_way_the_headline_and_the_overhead(fixture_export):
    from seer_export.bench import serving

    settings = serving.Settings(concurrency=(1, 4), requests=6, rounds=2, overhead_requests=4, long_requests=4)
    report = serving.bench(fixture_export[0], settings, 0, lambda _: None, "test")
    for level in report["levels"].values():
        for key in serving.WAYS:
            rps = level[key]["requests_per_s"]
            assert rps["min"] <= rps["value"] <= rps["max"] and rps["rounds"] == 2
            assert 0 < level[key]["p50_s"] <= level[key]["p99_s"]
        assert all(level[f"default_over_{k}"]["rounds"] == 2 for k in serving.WAYS[1:])
    assert report["answers"] == 2 * 2 * 6 and sum(report["differing"].values()) <= 2  # float rounding at a border
    h = report["headline"]
    assert set(h) == {"serving_over_cache_none_4", "serving_over_generate_batch_4", "overhead_1", "rows_per_call_4",
                      "kv_host_bytes_per_step_4", "projected_h200_over_at_once_4"}  # fmt: skip
    assert h["serving_over_cache_none_4"] == report["levels"]["4"]["default_over_cache_none"]
    assert report["overhead_1"] == report["overhead"]["relative"]  # the headline at the top level too
    for count in report["counted"].values():  # the calls counted by the backend and projected
        served, at_once = count["served"], count["at_once"]
        assert served["steps"] > 0 and served["window_calls"] > 0 and served["rows_per_call"] >= 1
        assert served["kv_host_bytes_per_step"] == 0 == served["host_bytes"]["to_host"]["kv"]  # K/V stays put
        assert count["at_once_over_served"] == at_once["projected_h200_s"] / served["projected_h200_s"] > 0
    assert h["rows_per_call_4"] == report["counted"]["4"]["served"]["rows_per_call"]
    short, long = report["overhead"], report["overhead_long"]
    for o in (short, long):
        assert o["fixed_cost_s"] == pytest.approx(o["http_median_s"] - o["direct_median_s"])
        assert o["relative"] == pytest.approx(o["http_median_s"] / o["direct_median_s"] - 1)
    assert long["direct_median_s"] > 3 * short["direct_median_s"]  # a step per position of 64
    assert "server overhead, padded fixed-rule requests at 64 positions" in serving.table(report)


# --- connections and bodies cannot hold the server (issue 37) ---------------------------------------------------


def test_unfinished_headers_cannot_hold_the_server(engine, pipe):
    """400 connections that never finish their headers (issue 37: 340 made every answer a 503): /health and a normal
    request answer before the deadline beside them, and each is closed once the header deadline passes."""
    import socket

    with serving(engine, header_timeout_s=3.0) as base:
        port = int(base.rsplit(":", 1)[1])
        held = []
        for _ in range(400):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # never finished
            held.append(s)
        opened = time.monotonic()
        with httpx.Client(base_url=base, timeout=10) as c:
            start = time.monotonic()
            assert c.get("/health").status_code == 200 and c.head("/health").status_code == 200
            r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": user("count to 3 .")})
            assert r.status_code == 200 and time.monotonic() - start < 2.5, r.text  # before the 3 s deadline
        for s in held:  # closed by the server at the deadline: the read sees the end
            s.settimeout(max(0.1, opened + 6.0 - time.monotonic()))
            assert s.recv(1) == b""
            s.close()


def test_requests_in_flight_and_slow_bodies_are_bounded(engine):
    """Past ``max_requests`` in flight a request is a 503 with Retry-After and OpenAI's error body; a body that does
    not arrive in ``body_timeout_s`` is a 408; a long unknown model name is not echoed whole."""
    import socket

    with serving(engine, max_requests=1, body_timeout_s=1.0) as base:
        port = int(base.rsplit(":", 1)[1])
        slow = socket.create_connection(("127.0.0.1", port))
        slow.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )  # its body never finishes: it holds the one slot
        time.sleep(0.2)
        with httpx.Client(base_url=base, timeout=10) as c:
            busy = c.post("/v1/chat/completions", json={"model": MODEL, "messages": user("count to 3 .")})
            assert busy.status_code == 503 and busy.headers["retry-after"] == "1", busy.text
            assert busy.json()["error"]["code"] == "overloaded" and c.get("/health").status_code == 200
            slow.settimeout(5)
            answer = b""
            while b"}}" not in answer:  # the headers, then the JSON body
                chunk = slow.recv(4096)
                assert chunk, answer
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 1 s" in answer
            slow.close()
            r = c.post("/v1/chat/completions", json={"model": "m" * 1_000_000, "messages": user("count to 3 .")})
            assert r.status_code == 404 and len(r.text) < 400 and "(1000000 characters)" in r.text


def test_the_heap_is_trimmed_once_a_large_body_is_answered_and_none_is_held(engine, monkeypatch):
    """malloc_trim (seer_trt.serving.openai.middleware.trim_heap) runs after a body of 1 MiB or more is answered with no other
    body held, and not after a small one; a body that the held-bytes budget could never hold is 413, not a 429 to
    retry forever."""
    from seer_trt.serving.openai import middleware

    calls = []
    monkeypatch.setattr(middleware, "trim_heap", lambda: calls.append(time.monotonic()))
    small = {"model": MODEL, "messages": user("count to 3 .")}
    large = json.dumps(small).encode() + b" " * (middleware.TRIM_AFTER_BYTES + 10)  # JSON allows the spaces
    headers = {"content-type": "application/json"}
    with serving(engine) as base, httpx.Client(base_url=base, timeout=60) as c:
        assert c.post("/v1/chat/completions", json=small).status_code == 200
        time.sleep(0.3)
        assert calls == []
        assert c.post("/v1/chat/completions", content=large, headers=headers).status_code == 200
        deadline = time.monotonic() + 5
        while not calls and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(calls) == 1
    with serving(engine, max_held_bytes=2**20) as base, httpx.Client(base_url=base, timeout=60) as c:
        r = c.post("/v1/chat/completions", content=large, headers=headers)
        assert r.status_code == 413 and "more than the 1048576 bytes this server holds" in r.text, r.text


def test_bodies_in_flight_are_bounded_together(engine):
    """Request bodies held at once count against one byte budget (issue 37: 16 bodies of 70 MB peaked at 2.36 GB):
    past it a request is a 503 with Retry-After, and the budget comes back when the holder leaves."""
    import socket

    with serving(engine, max_held_bytes=1000) as base:
        port = int(base.rsplit(":", 1)[1])
        slow = socket.create_connection(("127.0.0.1", port))
        slow.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 900\r\n\r\n" + b" " * 800
        )  # 800 bytes held, 100 never sent
        time.sleep(0.3)
        body = {"model": MODEL, "messages": user("count to 3 ." + " " * 300)}
        with httpx.Client(base_url=base, timeout=30) as c:
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 429 and r.headers["retry-after"] == "1" and "bytes of requests" in r.text
            slow.close()
            time.sleep(0.3)
            assert c.post("/v1/chat/completions", json=body).status_code == 200  # given back


def test_a_chat_completion_tokenizes_its_prompt_once(engine, monkeypatch):
    """The HTTP route checks a request through ``EngineClient.check`` and submits the checked ids (issue 36: the
    prompt was tokenized twice, before queueing and again in preparation): one ``PromptFormat.ids`` call per
    completion, and the usage's prompt tokens are those ids."""
    prompts = engine.pipe.prompts
    calls, real = [], prompts.ids
    monkeypatch.setattr(prompts, "ids", lambda *a, **k: calls.append(real(*a, **k)) or calls[-1])
    with serving(engine) as base, httpx.Client(base_url=base, timeout=REQUEST_TIMEOUT_S) as c:
        r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": user("count to 3 .")})
    assert r.status_code == 200, r.text
    assert len(calls) == 1
    assert r.json()["usage"]["prompt_tokens"] == len(calls[0])
