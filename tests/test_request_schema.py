"""One request schema: every field of ``seer_trt.contracts.requests`` exists, by its name and bounds, on every
surface (Python's ``Request``, the OpenAI body, Triton's inputs, the C ABI's request), and no surface has a
setting the table lacks."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from seer_trt.contracts.requests import BY_NAME, FIELDS, FORMATTED, MESSAGES, limits
from seer_trt.runtime.request import Request

ROOT = Path(__file__).resolve().parents[1]
# The OpenAI body's own plumbing and the OpenAI fields it refuses or ignores: not request settings
OPENAI_ONLY = {"model", "messages", "stream", "stream_options", "n", "user", "max_completion_tokens", "tools",
               "tool_choice", "functions", "function_call", "logprobs", "top_logprobs", "response_format",
               "logit_bias", "presence_penalty", "frequency_penalty"}  # fmt: skip
TRITON_TRANSPORT = {"stream"}  # how the answer comes back (one response or a stream), as HTTP's "stream"
# The C request's members that are not settings: the prompt's ids and the image's tiles and geometry
C_PLUMBING = {"struct_size", "prompt_ids", "prompt_len", "block_length", "num_stop"}


def test_the_table_is_well_formed():
    names = [f.name for f in FIELDS]
    assert len(names) == len(set(names))
    for f in FIELDS:
        assert f.help and f.default and f.triton.startswith("TYPE_"), f
        assert (f.kind in ("int", "float")) or not (limits(f.name).keys() - {"max_length"}), f  # bounds are numbers'
    assert BY_NAME["temperature"].bounds() == ">= 0 and <= 2"
    assert BY_NAME["stop"].bounds() == "at most 4 items"


def test_python_request_has_every_field_but_the_servers_stop():
    attributes = {f.name for f in dataclasses.fields(Request)}
    assert {f.name for f in FIELDS} - attributes == {"stop"}  # stop cuts the answer text: the servers' (stops.py)
    assert attributes - {f.name for f in FIELDS} == {"block_length"}  # the export's, not a request's, setting


def test_http_body_has_every_field_with_the_tables_bounds():
    from seer_trt.serving.openai.chat import ApiError, ChatRequest, parse, stops

    body = ChatRequest.model_fields
    named = {f.http_name for f in FIELDS if f.http != MESSAGES}
    assert named - body.keys() == set(), "a field missing from the OpenAI body"
    assert body.keys() - named - OPENAI_ONLY == set(), "an OpenAI body setting the table lacks"
    for f in FIELDS:
        if f.http == MESSAGES or f.name == "stop":  # stop: a string or a list, counted by chat.stops (below)
            continue
        found = {}
        for meta in body[f.http_name].metadata:
            for key in ("ge", "gt", "le", "lt", "max_length"):
                if getattr(meta, key, None) is not None:
                    found[key] = getattr(meta, key)
        assert found == limits(f.name), f.name
    with pytest.raises(ApiError, match="at most 4"):
        stops(
            parse(
                json.dumps(
                    {"model": "m", "messages": [{"role": "user", "content": "q"}], "stop": list("abcde")}
                ).encode()
            ),
            100,
        )


def test_http_body_carries_every_field_to_the_request():
    """A body setting every field (messages for prompt, image, system and history) gives a Request holding each."""
    import base64

    from seer_trt.runtime.engine import Limits
    from seer_trt.serving.openai.chat import parse, stops, to_request

    image_bytes = b"\x89PNG\r\n\x1a\n" + bytes(16)  # decoded by the pipeline later, carried as bytes here
    url = "data:image/png;base64," + base64.b64encode(image_bytes).decode()
    body = {"model": "m", "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "count to 2 ."},
        {"role": "assistant", "content": "1 2"},
        {"role": "user", "content": [{"type": "text", "text": "how many shapes ?"},
                                     {"type": "image_url", "image_url": {"url": url}}]}],
        "max_tokens": 32, "steps": 16, "seer": False, "decoding": "factor:1", "early_stop": True,
        "remasking": "low_confidence", "temperature": 0.5, "seed": 7, "top_p": 0.9, "stop": ["x", "y"],
        "cache": "reuse", "refresh_interval": 4, "window": 8}  # fmt: skip
    chat = parse(json.dumps(body).encode())
    request = to_request(chat, Limits(1000, len(image_bytes), 100))
    assert stops(chat, 100) == ("x", "y")
    wanted = {"prompt": "how many shapes ?", "image": image_bytes, "system": "be brief",
              "history": (("user", "count to 2 ."), ("assistant", "1 2")), "gen_length": 32, "steps": 16,
              "seer": False, "decoding": "factor:1", "early_stop": True, "remasking": "low_confidence",
              "temperature": 0.5, "seed": 7, "top_p": 0.9, "cache": "reuse", "refresh_interval": 4, "window": 8}  # fmt: skip
    assert set(wanted) == {f.name for f in FIELDS} - {"stop"}
    for name, value in wanted.items():
        assert getattr(request, name) == value, name


def test_triton_inputs_are_the_tables_fields():
    from seer_trt.serving.triton.orchestrator import REQUEST_INPUTS

    inputs = {t.name: t for t in REQUEST_INPUTS if t.name not in TRITON_TRANSPORT}
    assert inputs.keys() == {f.name for f in FIELDS}
    for f in FIELDS:
        assert inputs[f.name].data_type == f.triton, f.name
        assert inputs[f.name].optional == (f.name != "prompt"), f.name


def test_c_request_has_every_field():
    header = (ROOT / "cpp" / "include" / "seer" / "seer_c.h").read_text()
    struct = re.search(r"typedef struct \{([^{}]*)\} seer_request;", header)
    assert struct, "seer_c.h declares no seer_request struct"
    text = re.sub(r"/\*.*?\*/", "", struct.group(1), flags=re.S)
    members = set(re.findall(r"(\w+)\s*(?:,|;)", text))
    wanted = {f.c_name for f in FIELDS}
    assert wanted - members == set(), "a field missing from the C request"
    assert members - wanted - C_PLUMBING == set(), "a C request setting the table lacks"
    assert FORMATTED in members  # system, history and the prompt go into the ids the caller formats
