"""The orchestrator's contract with Triton clients: its inputs and outputs, a request read into ``Request``s, answers
written back (docs/DESIGN.md "Serving and embedding").

In:  one Triton request (``triton_python_backend_utils``'s): REQUEST_INPUTS by name, each [rows, 1].
Out: per row a ``Request`` (``read_request``), its stop sequences and whether it streams (``read_reply``); then the
     answer's tensors (``write_outputs``) or an error response (INVALID_ARG for a client's error, INTERNAL else).

Every input is named as the ``Request`` field (and seer-serve's body field) it sets, and mapped as seer-serve maps it:
the same bounds, the same ``InputError`` messages (``Request.__post_init__``; stop sequences through
``seer_trt.serving.stops.check_stops``). A row's prompt and image are measured in bytes before anything decodes
them (``ByteLimits``), so an oversized one costs the server no more than receiving it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from seer_trt.contracts.errors import InputError
from seer_trt.serving.stops import check_stops
from seer_trt.serving.triton.pbtxt import TensorConfig

# The orchestrator's contract with clients; every tensor has a leading batch axis (rows), not listed in dims.
# Numbers at 0 and empty text take the export's default, as an absent input does.
REQUEST_INPUTS = (
    TensorConfig("prompt", "TYPE_STRING", (1,)),  # UTF-8 question; "<image>" marks where the image goes
    TensorConfig("image", "TYPE_STRING", (1,), optional=True),  # encoded PNG/JPEG bytes; empty: no image
    TensorConfig("gen_length", "TYPE_INT32", (1,), optional=True),  # answer window N; 0: the export's default
    TensorConfig("steps", "TYPE_INT32", (1,), optional=True),  # denoising steps over N; 0: the default
    TensorConfig("seer", "TYPE_BOOL", (1,), optional=True),  # False: the padded baseline; default True
    TensorConfig("decoding", "TYPE_STRING", (1,), optional=True),  # fixed | threshold:TAU | factor:F; empty: default
    TensorConfig("early_stop", "TYPE_BOOL", (1,), optional=True),  # LLaDA-V's stop at <|eot_id|>; default False
    # low_confidence | Dream's topk_margin | entropy (random: sampling exports); empty: the export's default
    TensorConfig("remasking", "TYPE_STRING", (1,), optional=True),
    TensorConfig("temperature", "TYPE_FP32", (1,), optional=True),  # 0: greedy; absent: the export's default
    TensorConfig("seed", "TYPE_INT64", (1,), optional=True),  # sampling noise, [0, 2**63); default 0
    TensorConfig("top_p", "TYPE_FP32", (1,), optional=True),  # nucleus mass in (0, 1]; default 1
    # JSON: a string or a list of at most 4 strings; the text ends before the first to end (seer_trt.serving.stops)
    TensorConfig("stop", "TYPE_STRING", (1,), optional=True),
    TensorConfig("cache", "TYPE_STRING", (1,), optional=True),  # prompt K/V cache: none | reuse | forecast
    TensorConfig("refresh_interval", "TYPE_INT32", (1,), optional=True),  # steps between refreshes; 0: default
    TensorConfig("window", "TYPE_INT32", (1,), optional=True),  # the oracle window without step zero; 0: none
    TensorConfig("system", "TYPE_STRING", (1,), optional=True),  # system message; absent: the export's
    TensorConfig("history", "TYPE_STRING", (1,), optional=True),  # JSON [[role, text], ...], oldest first
    # the decoupled model: True sends each newly final text as a response of its own (one row per request)
    TensorConfig("stream", "TYPE_BOOL", (1,), optional=True),
)
RESPONSE_OUTPUTS = (
    TensorConfig("text", "TYPE_STRING", (1,)),  # the answer (streamed: the text new since the last response)
    TensorConfig("token_ids", "TYPE_INT64", (-1,)),  # answer ids before <|eot_id|> (or the stop); padded with -1
    TensorConfig("kept", "TYPE_INT32", (1,)),  # L*: answer positions denoised (N without Seer)
    TensorConfig("denoise_steps", "TYPE_INT32", (1,)),  # denoising steps used
)
PAD_ID = -1  # fills token_ids rows shorter than the request's longest
UTF8_MAX_BYTES = 4  # the most bytes UTF-8 spends on one character (RFC 3629)
MAX_JSON_BYTES = 1 << 20  # a stop or history input's JSON (history's text is bounded again as the prompt's)


@dataclasses.dataclass(frozen=True)
class ByteLimits:
    """What one row may send, checked on its raw bytes before they are decoded (``read_request``)."""

    prompt_chars: int  # characters of message text the pipeline accepts (PromptFormat.max_chars)
    image_bytes: int  # an encoded image file's bytes (the pipeline's image limit: the manifest's max_image_bytes)
    stop_chars: int | None = None  # a stop sequence's characters (Limits.max_answer_chars); None: not bounded

    @property
    def prompt_bytes(self) -> int:
        """UTF-8 bytes of the longest prompt that can hold ``prompt_chars`` characters."""
        return UTF8_MAX_BYTES * self.prompt_chars

    @classmethod
    def of(cls, pipeline: Any, stop_chars: int | None = None) -> ByteLimits:
        """The limits of a ``SeerPipeline``."""
        return cls(pipeline.prompts.max_chars, pipeline.image_limits.bytes, stop_chars)


@dataclasses.dataclass(frozen=True)
class Reply:
    """How one Triton request is answered, beside its rows' ``Request``s."""

    stops: tuple[tuple[str, ...], ...]  # per row: its stop sequences
    stream: bool  # one response per newly final text, then the last (one row only)


def message(err: BaseException) -> str:
    """A client's one-line error: our own errors as they are, anything else named by type, no object reprs (as the
    engine words a failure: ``seer_trt.runtime.engine.why``)."""
    from seer_trt.runtime.engine import why

    return why(err)


def error_kind(err: BaseException) -> str:
    """``Result.error_kind`` of a failure: "input" when the request's own input was bad, "internal" otherwise."""
    return "input" if isinstance(err, InputError) else "internal"


def error_response(pb: Any, text: str, kind: str | None) -> Any:
    """An error response: INVALID_ARG for a client's error (``kind`` "input"), INTERNAL (the default) otherwise.

    A Python backend older than error codes (its ``TritonError`` has no ``INVALID_ARG``) answers INTERNAL for both.
    """
    code = getattr(pb.TritonError, "INVALID_ARG" if kind == "input" else "INTERNAL", None)
    error = pb.TritonError(text) if code is None else pb.TritonError(text, code)
    return pb.InferenceResponse(error=error)


class Columns:
    """One Triton request's inputs, one value per row."""

    def __init__(self, pb: Any, request: Any) -> None:
        self.pb, self.request = pb, request
        prompt = pb.get_input_tensor_by_name(request, "prompt")
        if prompt is None:  # the Python backend does not enforce required inputs of a batched model
            raise InputError(
                "the request has no 'prompt' input; send the question as a BYTES tensor 'prompt' [rows, 1]"
            )
        self.prompts = prompt.as_numpy().reshape(-1)
        self.rows = len(self.prompts)

    def __call__(self, name: str) -> np.ndarray | None:
        tensor = self.pb.get_input_tensor_by_name(self.request, name)
        if tensor is None:
            return None
        values = tensor.as_numpy().reshape(-1)
        if len(values) != self.rows:
            raise InputError(f"input {name!r} has {len(values)} rows, 'prompt' has {self.rows}; send one value per row")
        return values


def text_of(name: str, value: Any, example: str) -> str:
    """A BYTES input's UTF-8 text."""
    if not isinstance(value, bytes):
        raise InputError(f"{name} is a {type(value).__name__}; send it as BYTES, e.g. {example}")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{name} is not UTF-8 ({err.reason} at byte {err.start}); send UTF-8 text") from None


def json_of(name: str, value: Any, example: str) -> Any:
    """A BYTES input's JSON value."""
    if isinstance(value, bytes) and len(value) > MAX_JSON_BYTES:
        raise InputError(f"{name} is {len(value)} bytes, more than the {MAX_JSON_BYTES} accepted; send less")
    text = text_of(name, value, example)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{name} is not JSON ({err.msg} at character {err.pos}); send e.g. {example}") from None


def number(value: Any) -> float:
    """An FP32 input as the decimal its client wrote (0.8, not 0.800000011920929): seeded sampling then draws what
    ``SeerPipeline.generate`` draws at 0.8."""
    return float(np.format_float_positional(np.float32(value), unique=True, trim="0"))


def read_request(pb: Any, request: Any, limits: ByteLimits | None = None) -> list:
    """The pipeline ``Request``s of one Triton request, one per row.

    Args:
        limits: the most bytes a row's prompt and image may hold, checked before they are decoded; None: none.

    Raises:
        InputError: text that is not UTF-8, a prompt or image past ``limits``, rows that disagree in number, JSON
            that does not parse, or a setting ``Request`` refuses (its own message, the row named first).
    """
    from seer_trt.runtime.request import Request

    column = Columns(pb, request)
    rows = column.rows
    values = {n: column(n) for n in (t.name for t in REQUEST_INPUTS[1:])}
    out = []
    for i, prompt in enumerate(column.prompts.tolist()):
        where = f"row {i}: " if rows > 1 else ""

        def get(name: str, i: int = i) -> Any:
            v = values[name]
            return None if v is None else v[i]

        try:
            if not isinstance(prompt, bytes):
                raise InputError(f"prompt is a {type(prompt).__name__}; send the question as BYTES (UTF-8 text)")
            if limits is not None and len(prompt) > limits.prompt_bytes:
                raise InputError(f"prompt is {len(prompt)} bytes, more than the {limits.prompt_bytes} accepted "
                                 f"({UTF8_MAX_BYTES} per character of the {limits.prompt_chars} max_prompt_chars); "
                                 f"shorten it")  # fmt: skip
            text = text_of("prompt", prompt, "b'count to 3 .'")
            image = get("image")
            if image is not None and not isinstance(image, bytes):
                raise InputError(f"image is a {type(image).__name__}; send the encoded PNG/JPEG file as BYTES")
            if image is not None and limits is not None and len(image) > limits.image_bytes:
                raise InputError(f"image is {len(image)} bytes, more than the {limits.image_bytes} accepted "
                                 f"(max_image_bytes); send a smaller file")  # fmt: skip
            options: dict[str, Any] = {}
            for name in ("gen_length", "steps", "refresh_interval", "window"):  # 0: the default
                if get(name):
                    options[name] = int(get(name))
            for name, example in (("decoding", "b'factor:1'"), ("remasking", "b'entropy'"), ("cache", "b'reuse'")):
                if get(name) is not None and (value := text_of(name, get(name), example)):  # empty: the default
                    options[name] = value[:32]
            if get("temperature") is not None:
                options["temperature"] = number(get("temperature"))
            if get("top_p") is not None:
                options["top_p"] = number(get("top_p"))
            if get("seed") is not None:
                options["seed"] = int(get("seed"))
            for name in ("seer", "early_stop"):
                if get(name) is not None:
                    options[name] = bool(get(name))
            if get("system") is not None:
                options["system"] = text_of("system", get("system"), "b'You are terse.'")
            if get("history") is not None:
                history = json_of("history", get("history"), '[["user", "hi"], ["assistant", "hello"]]')
                options["history"] = history  # Request checks it: [role, text] pairs, alternating from the user's
            out.append(Request(text, image=image or None, **options))  # an empty image: none
        except InputError as err:
            raise InputError(f"{where}{err}") from None
    return out


def read_reply(pb: Any, request: Any, limits: ByteLimits | None = None) -> Reply:
    """How one Triton request wants its answer: each row's stop sequences (JSON: a string or a list of at most four,
    each at most ``limits.stop_chars`` characters), and whether it streams.

    Raises:
        InputError: a stop input that is not such JSON or that ``check_stops`` refuses; streaming several rows.
    """
    column = Columns(pb, request)
    stops, stream = column("stop"), column("stream")
    found = []
    for i in range(column.rows):
        where = f"row {i}: " if column.rows > 1 else ""
        seqs: Any = () if stops is None or stops[i] == b"" else json_of("stop", stops[i], '["\\n", "."]')
        seqs = (seqs,) if isinstance(seqs, str) else seqs
        try:
            if not isinstance(seqs, list | tuple):
                raise InputError(f"stop is {json.dumps(seqs)[:40]}; send a JSON string or list of strings")
            max_chars = limits.stop_chars if limits is not None and limits.stop_chars is not None else 1 << 30
            found.append(check_stops(seqs, max_chars))
        except InputError as err:
            raise InputError(f"{where}{err}") from None
    streamed = stream is not None and bool(stream.any())
    if streamed and column.rows > 1:
        raise InputError(f"stream is set on a request of {column.rows} rows; stream one row per request")
    return Reply(tuple(found), streamed)


def write_outputs(pb: Any, answers: list, texts: list[str] | None = None) -> list:
    """RESPONSE_OUTPUTS tensors of one request's answers (rows in order); ``texts``: each row's text when it is not
    the answer's own (cut at a stop sequence, or only what a stream has not sent)."""
    texts = [a.text for a in answers] if texts is None else texts
    width = max(len(a.token_ids) for a in answers)
    ids = np.full((len(answers), width), PAD_ID, dtype=np.int64)
    for i, a in enumerate(answers):
        ids[i, : len(a.token_ids)] = a.token_ids
    return [
        pb.Tensor("text", np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)),
        pb.Tensor("token_ids", ids),
        pb.Tensor("kept", np.array([[a.kept] for a in answers], dtype=np.int32)),
        pb.Tensor("denoise_steps", np.array([[a.steps] for a in answers], dtype=np.int32)),
    ]


def text_response(pb: Any, text: str) -> Any:
    """A streamed response: the text new since the last one."""
    return pb.InferenceResponse([pb.Tensor("text", np.array([[text.encode("utf-8")]], dtype=np.object_))])
