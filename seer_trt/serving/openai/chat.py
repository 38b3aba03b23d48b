"""The OpenAI chat-completions schema of ``seer-serve`` (docs/DESIGN.md "Serving and embedding"): a client's body,
as pydantic models, becomes one ``Request``; one ``Result`` becomes the response body.

In:  a ``POST /v1/chat/completions`` body: ``messages`` (an optional system turn, then user and assistant turns
     alternating from the user's first to the user's question; the question's content is text or parts: text, and
     at most one image as a ``data:`` URL or, where the server fetches them, an http(s) URL), the OpenAI settings
     this model has (``max_tokens`` / ``max_completion_tokens``: the answer window, ``temperature`` in [0, 2],
     ``top_p`` in (0, 1], ``seed``, ``stop``, ``stream``, ``stream_options``, ``n`` = 1) and seer-trt's own
     (``seer``, ``early_stop``, ``decoding``, ``remasking``, ``steps``, ``cache``, ``refresh_interval``,
     ``window``): every field of ``seer_trt.contracts.requests``, bounded as it says.
Out: a ``Request`` for the engine; the bodies of ``chat.completion``, of a stream's ``chat.completion.chunk``s
     (``TextStream`` turns answer ids as they become final into text deltas, cut at a stop sequence by the rule of
     ``seer_trt.serving.stops``) and of OpenAI's error object.

A conversation becomes one ``Request``: its last message the prompt, the turns before it its ``history``, which the
runtime's chat template (``seer_trt.runtime.prompt.ChatFormat``) places as text between its control tokens, so an
earlier turn cannot pass for one; turns out of order, a tool message or an image in an earlier turn are refused.
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from seer_trt.contracts.errors import InputError, SeerError
from seer_trt.contracts.requests import OWN_HTTP, limits
from seer_trt.runtime.request import Request, Result
from seer_trt.serving.stops import TextStream, check_stops, ids_holding  # noqa: F401 - chat.TextStream as before

if TYPE_CHECKING:
    from seer_trt.runtime.engine import Limits

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
               429: "rate_limit_error",
               500: "server_error", 503: "service_unavailable", 504: "timeout_error"}  # fmt: skip


class ApiError(SeerError):
    """An HTTP error answer: its status and OpenAI's error fields (``type`` follows the status)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None,
                 retry_after_s: int | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s  # a retriable refusal (429, 503): the Retry-After header

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": ERROR_TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}  # fmt: skip


# --- what a client sends --------------------------------------------------------------------------------------

# strict: a JSON "true" string is not a bool, 1.5 not a count; forbid: a misspelt field is an error, not ignored
STRICT = ConfigDict(extra="forbid", strict=True)


class TextPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str


class ImageUrl(BaseModel):
    model_config = STRICT
    url: str  # data:image/png;base64,..., or an http(s) URL where the server fetches them (--allow-image-urls)
    detail: Literal["auto", "low", "high"] | None = None  # accepted, unused: the export's tiling decides


class ImagePart(BaseModel):
    model_config = STRICT
    type: Literal["image_url"]
    image_url: ImageUrl


Part = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class Message(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Part] | None = None
    name: str | None = None  # accepted, unused


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class ChatRequest(BaseModel):
    model_config = STRICT
    model: str
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, **limits("gen_length"))  # the answer window N (gen_length)
    max_completion_tokens: int | None = Field(None, **limits("gen_length"))  # the same, OpenAI's newer name
    # 0: greedy; > 0 samples (from denoise_logits where the export has it); OpenAI's range
    temperature: float | None = Field(None, **limits("temperature"))
    seed: int | None = Field(None, **limits("seed"))
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1)  # answers per request: 1 only
    user: str | None = None  # accepted, unused
    top_p: float | None = Field(None, **limits("top_p"))  # nucleus sampling at temperature > 0
    stop: str | list[str] | None = None  # up to 4 sequences: the answer ends before the first to end (stops.py)
    # OpenAI fields this model cannot honour: accepted at their neutral value, one clear 400 otherwise (UNSUPPORTED)
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    logit_bias: dict[str, Any] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # seer-trt's own settings (the openai client's extra_body), echoed under "seer" in the response
    seer: bool | None = None  # False: the padded loop over all N positions
    early_stop: bool | None = None  # LLaDA-V's stopping rule at <|eot_id|>
    decoding: str | None = None  # fixed | threshold:TAU | factor:F
    # what ranks positions: low_confidence | random (sampling exports) | Dream's topk_margin | entropy
    remasking: str | None = Field(None, **limits("remasking"))
    steps: int | None = Field(None, **limits("steps"))  # denoising steps over N
    cache: str | None = Field(None, **limits("cache"))  # the prompt K/V cache: none | reuse | forecast
    refresh_interval: int | None = Field(None, **limits("refresh_interval"))  # steps between the cache's refreshes
    window: int | None = Field(None, **limits("window"))  # the oracle: cut to this many positions, no step zero


UNION_TAGS = {"str", "int", "float", "bool", "none", "TextPart", "ImagePart"}


def _param(loc: tuple) -> str | None:
    """``messages[0].content[1].image_url.url`` from pydantic's error location, without the tags it adds for a
    union's members ("str", "list[...]") and a tagged union's tag (the part's ``type``, after its index)."""
    out: list[str] = []
    tagged = False
    for i, p in enumerate(map(str, loc)):
        if "tagged-union" in p:
            tagged = True
        elif tagged and i and str(loc[i - 1]).isdigit():
            tagged = False  # the discriminator's value, not a field
        elif not (p in UNION_TAGS or "[" in p or p.startswith("function-")):
            out.append(f"[{p}]" if p.isdigit() else f".{p}")
    return "".join(out).lstrip(".") or None


def parse(body: bytes) -> ChatRequest:
    """The request body, validated.

    Raises:
        ApiError: 400, not JSON or a field of the wrong type, missing or unknown (``param`` names it).
    """
    try:
        return ChatRequest.model_validate_json(body)
    except ValidationError as err:
        first = max(err.errors(include_url=False), key=lambda e: len(e["loc"]))  # the deepest: the most specific
        param = _param(first["loc"])
        if first["type"] == "json_invalid":
            raise ApiError(f"the body is not JSON ({first['msg']}); send a JSON object", 400) from None
        if first["type"] == "extra_forbidden":
            raise ApiError(f"unknown field {param}; this server takes {sorted(ChatRequest.model_fields)} (seer-trt's "
                           f"own: {', '.join(OWN_HTTP)})", 400, param) from None  # fmt: skip
        found = first.get("input")  # the value refused, when it is one short value (not a message or a list)
        got = f" (got {found!r:.40})" if isinstance(found, bool | int | float | str) else ""
        raise ApiError(f"{param or 'the body'}: {first['msg']}{got}", 400, param) from None


DATA_URL = re.compile(r"data:(image/[\w.+-]+)(?:;[\w=.+-]+)*;base64,(.*)", re.S)


def is_remote(url: str) -> bool:
    return url[:8].lower().startswith(("http://", "https://"))  # a scheme is case-insensitive (RFC 3986)


def image_bytes(url: str, param: str, max_bytes: int, fetched: Mapping[str, bytes] | None) -> bytes:
    """The encoded image of a ``data:image/...;base64,`` URL, its size bounded before decoding, or of an http(s)
    URL the server fetched (``fetched``; None: the server does not fetch).

    Raises:
        ApiError: 400, an http(s) URL the server does not fetch, a data URL that is not a base64 image, or one
            past ``max_bytes``.
    """
    if is_remote(url):
        if fetched is None:
            raise ApiError("this server does not fetch image URLs (start it with --allow-image-urls); send the "
                           "image inline as a data:image/png;base64,... URL", 400, param)  # fmt: skip
        return fetched[url]
    match = DATA_URL.fullmatch(url)
    if match is None:
        raise ApiError(f"the image URL starts {url[:32]!r}; expected data:image/<type>;base64,<data>", 400, param)
    data = match.group(2)
    size = len(data) // 4 * 3 - len(data[-2:]) + len(data[-2:].rstrip("="))  # base64's padding is not data
    if size > max_bytes:
        raise ApiError(f"the image is {size} bytes, more than the {max_bytes} accepted; send a smaller file", 400,
                       param)  # fmt: skip
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError("the image's data is not valid base64", 400, param) from None


def text_of(content: str | list | None, param: str, images: list[bytes] | None, decode_image) -> str:
    """A message's text, its parts joined by newlines; image parts go to ``images`` (None: none allowed)."""
    if content is None:
        raise ApiError("the message has no content", 400, param)
    if isinstance(content, str):
        return content
    texts = []
    for i, part in enumerate(content):
        if isinstance(part, TextPart):
            texts.append(part.text)
        elif images is None:
            raise ApiError("only the last user message may hold an image", 400, f"{param}[{i}]")
        elif images:
            raise ApiError("a request may hold one image; this model reads one picture per prompt", 400,
                           f"{param}[{i}]")  # fmt: skip
        else:
            images.append(decode_image(part.image_url.url, f"{param}[{i}].image_url.url"))
    return "\n".join(texts)


def remote_images(chat: ChatRequest) -> list[tuple[str, str]]:
    """(url, param) of every http(s) image URL of the body, for a server that fetches them before ``to_request``."""
    out = []
    for m, message in enumerate(chat.messages):
        for i, part in enumerate(message.content if isinstance(message.content, list) else []):
            if isinstance(part, ImagePart) and is_remote(part.image_url.url):
                out.append((part.image_url.url, f"messages[{m}].content[{i}].image_url.url"))
    return out


# field -> (is it at its neutral value, why it is refused otherwise)
UNSUPPORTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "tools": (lambda v: not v, "this model does not call tools; send the conversation without tools"),
    "tool_choice": (lambda v: v in (None, "none"), "this model does not call tools"),
    "functions": (lambda v: not v, "this model does not call functions"),
    "function_call": (lambda v: v in (None, "none"), "this model does not call functions"),
    "logprobs": (lambda v: not v, "log-probabilities of the answer are not returned: a diffusion model commits "
                                  "tokens out of order, with no per-token sampling distribution to report"),
    "top_logprobs": (lambda v: v is None, "log-probabilities of the answer are not returned"),
    "response_format": (lambda v: v is None or v.get("type") == "text",
                        "structured output (json_object, json_schema) is not supported; send type text or none"),
    "logit_bias": (lambda v: not v, "logit_bias is not supported"),
    "presence_penalty": (lambda v: not v, "penalties are not supported; send 0 or none"),
    "frequency_penalty": (lambda v: not v, "penalties are not supported; send 0 or none"),
}  # fmt: skip


def stops(chat: ChatRequest, max_chars: int) -> tuple[str, ...]:
    """The body's stop sequences, each at most ``max_chars`` characters (``Limits.max_answer_chars``: a longer one
    could never end an answer, and matching costs grow with its length).

    Raises:
        ApiError: 400, more than four, an empty one, or one past ``max_chars`` (``stops.check_stops``).
    """
    seqs = () if chat.stop is None else (chat.stop,) if isinstance(chat.stop, str) else tuple(chat.stop)
    try:
        return check_stops(seqs, max_chars)
    except InputError as err:
        raise ApiError(str(err), 400, "stop") from None


def to_request(chat: ChatRequest, limits: Limits, fetched: Mapping[str, bytes] | None = None) -> Request:
    """The ``Request`` of a chat body: its last message the user's prompt, the turns before it its ``history``, a
    system message its ``system``; its stop sequences checked against ``limits`` (``stops``).

    Raises:
        ApiError: 400, n other than 1, a stop sequence refused, conflicting window sizes, turns out of order, a
            bad image.
        InputError: a field ``Request`` refuses (a lone surrogate in the text, a malformed decoding rule).
    """
    if chat.n != 1:
        raise ApiError(f"n is {chat.n}; this server answers one choice per request (n = 1)", 400, "n")
    for name, (neutral, why) in UNSUPPORTED.items():
        if not neutral(getattr(chat, name)):
            raise ApiError(f"{name}: {why}", 400, name)
    stops(chat, limits.max_answer_chars)
    windows = {w for w in (chat.max_tokens, chat.max_completion_tokens) if w is not None}
    if len(windows) > 1:
        raise ApiError(f"max_tokens {chat.max_tokens} and max_completion_tokens {chat.max_completion_tokens} differ; "
                       f"send one of them", 400, "max_completion_tokens")  # fmt: skip

    def decode(url: str, param: str) -> bytes:
        return image_bytes(url, param, limits.max_image_bytes, fetched)

    systems = [i for i, m in enumerate(chat.messages) if m.role in ("system", "developer")]
    turns = [i for i, m in enumerate(chat.messages) if m.role not in ("system", "developer")]
    if len(systems) > 1:
        raise ApiError("send at most one system message", 400, f"messages[{systems[1]}]")
    if not turns or chat.messages[turns[-1]].role != "user":
        raise ApiError("the last message must be the user's question", 400, f"messages[{len(chat.messages) - 1}]")
    if systems and systems[0] > turns[0]:
        raise ApiError("the system message must come before the conversation's turns", 400, f"messages[{systems[0]}]")
    for k, i in enumerate(turns):  # the last is the user's (above), so alternating from a user's is all
        expected = ("user", "assistant")[k % 2]
        if chat.messages[i].role != expected:
            raise ApiError(f"messages[{i}] has the role {chat.messages[i].role!r} where this model's chat format "
                           f"needs {expected!r}: turns alternate user, assistant, ..., from the user's first to the "
                           f"question (tool messages are not supported)", 400, f"messages[{i}]")  # fmt: skip
    system = None
    if systems:
        system = text_of(chat.messages[systems[0]].content, f"messages[{systems[0]}].content", None, decode)
    history = tuple((chat.messages[i].role, text_of(chat.messages[i].content, f"messages[{i}].content", None, decode))
                    for i in turns[:-1])  # fmt: skip
    images: list[bytes] = []
    prompt = text_of(chat.messages[turns[-1]].content, f"messages[{turns[-1]}].content", images, decode)
    options = {"gen_length": chat.max_completion_tokens or chat.max_tokens, "steps": chat.steps,
               "temperature": chat.temperature, "decoding": chat.decoding, "remasking": chat.remasking, "seer": chat.seer,
               "early_stop": chat.early_stop, "seed": chat.seed, "cache": chat.cache,
               "refresh_interval": chat.refresh_interval, "top_p": chat.top_p, "window": chat.window}  # fmt: skip
    return Request(prompt, image=images[0] if images else None, system=system, history=history,
                   **{k: v for k, v in options.items() if v is not None})  # fmt: skip


# --- what it gets back ----------------------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int  # prompt ids of the chat-formatted prompt (an image counts as one placeholder id)
    completion_tokens: int  # answer ids returned: Result.token_ids, up to the cut when a stop sequence ended it
    total_tokens: int


class SeerInfo(BaseModel):
    seer: bool  # whether Seer cut the window at step zero
    early_stop: bool
    decoding: str  # the commit rule used
    steps: int  # denoising steps over the whole window N (the setting)
    gen_length: int  # N
    kept: int  # L*: answer positions denoised
    denoise_steps: int  # denoising steps used
    cache: str  # the prompt K/V cache policy it ran under: none | reuse | forecast
    refreshes: int  # of its steps, the graph calls that computed its prompt


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    seer: SeerInfo


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    seer: SeerInfo | None = None  # on the chunk that carries the finish_reason


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "seer-trt"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def finish_reason(result: Result, eot_id: int) -> Literal["stop", "length"]:
    """ "stop" when the answer ended with <|eot_id|> inside the window, "length" when the window ran out first."""
    return "stop" if eot_id in result.window else "length"


def seer_info(request: Request, gen, cache: str, result: Result) -> SeerInfo:
    """seer-trt's settings of ``request`` as run (``gen``: its ``GenerationConfig``; ``cache``: its cache policy's
    mode), with L*, the steps used and the prompt's refreshes."""
    return SeerInfo(seer=bool(request.seer), early_stop=bool(request.early_stop), decoding=gen.decoding,
                    steps=gen.steps, gen_length=gen.gen_length, kept=result.kept, denoise_steps=result.steps,
                    cache=cache, refreshes=result.refreshes)  # fmt: skip


def usage(prompt_tokens: int, result: Result, text: str, decode: Callable[[list[int]], str]) -> Usage:
    """The tokens of a request whose answer returned ``text``: the whole ``Result.text``, or less when a stop
    sequence cut it, which then counts only the ids that text holds (``ids_holding``)."""
    n = len(result.token_ids) if text == result.text else ids_holding(result.token_ids, text, decode)
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=n, total_tokens=prompt_tokens + n)


def now() -> int:
    return int(time.time())
