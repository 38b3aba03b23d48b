"""The request's fields, once: what a caller may set on one request, whatever surface it comes through.

Every surface is built from this table or checked against it (``tests/test_request_schema.py``), so a field cannot
exist on one and not another:

    Python   seer_trt.runtime.request.Request      an attribute named ``name`` (``stop``: the servers' text cut)
    HTTP     seer_trt.serving.openai.chat           ``ChatRequest``'s field ``http`` (or a message: ``messages``)
    Triton   seer_trt.serving.triton.orchestrator   the input ``name`` of type ``triton`` ([rows, 1])
    C        cpp/include/seer/seer_c.h              ``seer_request``'s member ``c`` (or the ids the caller formats)

Bounds are the checks the runtime makes (``Request.__post_init__``, ``GenerationConfig``, the servers' stop check);
the table states them so a surface can refuse a value before decoding anything and so its help says the same.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from seer_trt.contracts.config import GenerationConfig

Kind = Literal["text", "bytes", "int", "float", "bool", "texts", "turns"]
MESSAGES = "messages"  # an OpenAI body carries the field in its messages, not as a field of its own
FORMATTED = "prompt_ids"  # the C ABI takes chat-formatted ids: the caller formats the field into them


@dataclasses.dataclass(frozen=True)
class RequestField:
    """One request field: its name on every surface, its type, what an absent value means and what is accepted."""

    name: str  # Request's attribute, Triton's input, the C member unless ``c`` says otherwise
    kind: Kind  # texts: a list of strings; turns: earlier (role, text) pairs, oldest first
    default: str  # what leaving it out means, in words
    help: str
    triton: str  # the Triton input's data type
    http: str | None = None  # ChatRequest's field; None: ``name``; MESSAGES: carried by the messages
    c: str | None = None  # seer_request's member; None: ``name``; FORMATTED: in prompt_ids
    ge: float | None = None  # inclusive lower bound (numbers)
    gt: float | None = None  # exclusive lower bound
    le: float | None = None  # inclusive upper bound
    lt: float | None = None  # exclusive upper bound
    max_length: int | None = None  # the most characters (text) or items (texts)
    choices: tuple[str, ...] = ()  # the accepted values of a text field; empty: any the runtime parses

    @property
    def http_name(self) -> str:
        return self.name if self.http is None else self.http

    @property
    def c_name(self) -> str:
        return self.name if self.c is None else self.c

    def bounds(self) -> str:
        """The accepted values in words, for help texts."""
        parts = [f">= {self.ge:g}" if self.ge is not None else "", f"> {self.gt:g}" if self.gt is not None else "",
                 f"<= {self.le:g}" if self.le is not None else "", f"< {self.lt:g}" if self.lt is not None else ""]  # fmt: skip
        words = " and ".join(p for p in parts if p)
        if self.choices:
            words = " | ".join(self.choices)
        if self.max_length is not None:
            unit = "items" if self.kind == "texts" else "characters"
            words = f"{words}, " if words else ""
            words += f"at most {self.max_length} {unit}"
        return words or "any"


MAX_TEMPERATURE = GenerationConfig.MAX_TEMPERATURE  # OpenAI's range
MAX_STOPS = 4  # OpenAI's bound on stop sequences
MAX_SEED = 2**63  # a seed is a non-negative int64

FIELDS: tuple[RequestField, ...] = (
    RequestField(
        "prompt",
        "text",
        "required",
        "the user's message; '<image>' marks where the image goes",
        "TYPE_STRING",
        http=MESSAGES,
        c=FORMATTED,
    ),  # fmt: skip
    RequestField(
        "image",
        "bytes",
        "no image",
        "an encoded PNG or JPEG file (HTTP: an image_url part, a data: URL "
        "or a fetched URL; C: the preprocessed tiles and their geometry, a seer_image)",
        "TYPE_STRING",
        http=MESSAGES,
    ),  # fmt: skip
    RequestField(
        "system",
        "text",
        "the export's system message",
        "a system message instead of the export's ('' for none)",
        "TYPE_STRING",
        http=MESSAGES,
        c=FORMATTED,
    ),  # fmt: skip
    RequestField(
        "history",
        "turns",
        "none",
        "earlier turns, oldest first, as (role, text) with role user or "
        "assistant (Triton: a JSON list of [role, text] pairs)",
        "TYPE_STRING",
        http=MESSAGES,
        c=FORMATTED,
    ),  # fmt: skip
    RequestField(
        "gen_length", "int", "the export's", "the answer window N, in tokens", "TYPE_INT32", http="max_tokens", ge=1
    ),  # fmt: skip
    RequestField(
        "steps",
        "int",
        "the export's",
        "denoising steps over N (Seer rescales them to the kept window)",
        "TYPE_INT32",
        ge=1,
    ),  # fmt: skip
    RequestField("seer", "bool", "true", "false: the padded baseline, every step over all N positions", "TYPE_BOOL"),
    RequestField(
        "decoding",
        "text",
        "the export's",
        "how many positions a step commits: fixed | threshold:TAU | factor:F",
        "TYPE_STRING",
    ),  # fmt: skip
    RequestField(
        "early_stop", "bool", "false", "LLaDA-V's stop once the answer before <|eot_id|> is done", "TYPE_BOOL"
    ),  # fmt: skip
    RequestField(
        "remasking",
        "text",
        "the export's",
        "which positions a step commits: low_confidence, random "
        "(sampling exports), a Dream export's topk_margin or entropy",
        "TYPE_STRING",
        max_length=32,
    ),  # fmt: skip
    RequestField(
        "temperature",
        "float",
        "the export's (0: greedy)",
        "sampling temperature; 0 is greedy",
        "TYPE_FP32",
        ge=0,
        le=MAX_TEMPERATURE,
    ),  # fmt: skip
    RequestField(
        "seed",
        "int",
        "0",
        "the request's sampling noise: equal seeds give equal answers",
        "TYPE_INT64",
        ge=0,
        lt=MAX_SEED,
    ),  # fmt: skip
    RequestField(
        "top_p",
        "float",
        "1 (the whole vocabulary)",
        "nucleus sampling at temperature > 0: draw from the smallest set of ids holding this mass",
        "TYPE_FP32",
        gt=0,
        le=1,
    ),  # fmt: skip
    RequestField(
        "stop",
        "texts",
        "none",
        "the answer ends before the first of these sequences to end (each at most what the largest window can hold)",
        "TYPE_STRING",
        max_length=MAX_STOPS,
    ),  # fmt: skip
    RequestField(
        "cache",
        "text",
        "the server's",
        "the prompt K/V cache",
        "TYPE_STRING",
        max_length=16,
        choices=("none", "reuse", "forecast"),
    ),  # fmt: skip
    RequestField(
        "refresh_interval",
        "int",
        "the server's",
        "steps between the cache's computations of the prompt",
        "TYPE_INT32",
        ge=1,
    ),  # fmt: skip
    RequestField(
        "window",
        "int",
        "none: step zero decides",
        "cut the window to this many positions without step zero (the oracle: the true answer length)",
        "TYPE_INT32",
        ge=1,
    ),  # fmt: skip
)
BY_NAME = {f.name: f for f in FIELDS}
OWN_HTTP = tuple(f.name for f in FIELDS if f.http is None and f.name not in ("temperature", "seed", "top_p", "stop"))
"""seer-trt's own body fields (the openai client's extra_body); the rest are OpenAI's names."""


def limits(name: str) -> dict[str, float | int]:
    """A field's bounds as keyword arguments (pydantic's ``Field``'s names), the ones it has."""
    f = BY_NAME[name]
    found = {"ge": f.ge, "gt": f.gt, "le": f.le, "lt": f.lt, "max_length": f.max_length}
    return {k: v for k, v in found.items() if v is not None}
