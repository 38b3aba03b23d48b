"""What a caller hands the pipeline and what it gets back: ``Request`` (one question, its overrides, checked on
construction so a malformed one fails alone with one line) and ``Result`` (its answer, or why it failed).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from seer_trt.contracts.config import REMASKINGS, GenerationConfig, parse_decoding
from seer_trt.contracts.errors import ConfigError, InputError
from seer_trt.contracts.policies import CACHE_MODES, CacheConfig
from seer_trt.runtime.image import Image


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


def check_text(name: str, value: Any) -> None:
    """``value`` is a str that UTF-8 can encode.

    Raises:
        InputError: not a str, or a lone surrogate in it (invalid UTF-8 decoded with surrogateescape, as argv is,
            or a broken ``\\ud800`` escape in JSON); the message shows it escaped.
    """
    if not isinstance(value, str):
        raise InputError(f"{name} is a {type(value).__name__}; expected text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InputError(f"{name} is not valid Unicode text: {value[err.start : err.end]!r} at character {err.start} "
                         f"is a lone surrogate (invalid UTF-8 or a broken \\u escape); send UTF-8 text") from None  # fmt: skip


GENERATION_FIELDS = ("gen_length", "steps", "block_length", "temperature", "remasking", "decoding")  # the export's


def check_settings(gen_length: Any = None, steps: Any = None, block_length: Any = None, temperature: Any = None,
                   remasking: Any = None, decoding: Any = None) -> None:  # fmt: skip
    """The types of generation overrides (None: the export's default), so a bad one fails with one line.

    Raises:
        InputError: a count that is not a whole number, a temperature that is not a number in [0, 2] (OpenAI's
            range: ``GenerationConfig.MAX_TEMPERATURE``), a remasking that is not text, a decoding rule that is not
            fixed, threshold:TAU or factor:F.
    """
    for name, value in (("gen_length", gen_length), ("steps", steps), ("block_length", block_length)):
        if value is not None and not _is_int(value):
            raise InputError(f"{name} is {value!r}; expected a whole number")
    t, most = temperature, GenerationConfig.MAX_TEMPERATURE
    if t is not None and (isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0 <= t <= most):
        raise InputError(f"temperature is {t!r}; expected a number in [0, {most:g}] (0: greedy; OpenAI's range)")
    if remasking is not None and not isinstance(remasking, str):
        raise InputError(f"remasking is {remasking!r}; expected one of {list(REMASKINGS)}")
    if decoding is not None:
        try:
            parse_decoding(decoding)
        except ConfigError as err:
            raise InputError(str(err)) from None


def check_history(history: Any) -> tuple[tuple[str, str], ...]:
    """Earlier turns as a tuple of (role, text): user and assistant alternating from a user turn, so the turn
    being answered (the prompt, a user's) follows an assistant's. Pairs or {"role", "content"} objects (JSON).

    Raises:
        InputError: naming the first turn that is not one, or breaks the alternation.
    """
    if isinstance(history, str | bytes) or not isinstance(history, Sequence):
        raise InputError(f"history is a {type(history).__name__}; expected a list of (role, text) turns")
    out = []
    for i, turn in enumerate(history):
        if isinstance(turn, Mapping) and set(turn) == {"role", "content"}:
            turn = (turn["role"], turn["content"])
        if isinstance(turn, str | bytes) or not isinstance(turn, Sequence) or len(turn) != 2:
            raise InputError(f"history[{i}] is {ascii(turn)[:60]}; expected a (role, text) pair")
        role, text = turn
        expected = ("user", "assistant")[i % 2]
        if role != expected:
            raise InputError(f"history[{i}] is a {ascii(role)[:20]} turn; expected {expected!r} (turns alternate "
                             f"user, assistant, ..., and the prompt is the user's next turn)")  # fmt: skip
        check_text(f"history[{i}]", text)
        out.append((role, text))
    if len(out) % 2:
        raise InputError("history ends with a user turn; the prompt is the user's next turn, after an assistant's")
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Request:
    """One question; ``None`` overrides take the export's generation defaults."""

    prompt: str  # user message; "<image>" marks where the image goes (prepended when absent)
    image: Image | None = None  # path, encoded bytes or [H, W, 3] uint8 RGB
    gen_length: int | None = None  # answer window N
    steps: int | None = None  # denoising steps over N (Seer rescales them to the kept window)
    block_length: int | None = None
    temperature: float | None = None  # 0: greedy; > 0: Gumbel sampling from denoise_logits
    remasking: str | None = None  # "low_confidence" | "random"
    decoding: str | None = (
        None  # commit rule: "fixed" | "threshold:TAU" | "factor:F" (docs/DESIGN.md "Decoding strategies")
    )
    seer: bool = True  # False: the padded baseline, every step over all N positions
    early_stop: bool = False  # LLaDA-V's stopping_criteria=['<|eot_id|>']: stop once the answer before it is done
    cache: str | CacheConfig | None = None  # prompt K/V cache: "none" | "reuse" | "forecast" or a whole policy
    refresh_interval: int | None = None  # steps between prompt computations under a cache; None: the pipeline's
    window: int | None = None  # cut the window to this many positions without step zero (the oracle: true length)
    seed: int = 0  # sampling noise of this request (temperature > 0 or random remasking)
    top_p: float = 1.0  # nucleus sampling (temperature > 0): draw from the smallest set of ids holding this mass
    system: str | None = None  # system message instead of the export's ("" for none); text, like the prompt
    history: tuple[tuple[str, str], ...] = ()  # earlier turns, oldest first: ("user" | "assistant", text), text only

    def __post_init__(self) -> None:
        """Every field's type, so a malformed request fails alone with one line (``InputError``)."""
        check_text("prompt", self.prompt)
        if self.system is not None:
            check_text("system", self.system)
        object.__setattr__(self, "history", check_history(self.history))
        if self.image is not None and not isinstance(self.image, str | Path | bytes | bytearray | np.ndarray):
            raise InputError(f"image is a {type(self.image).__name__}; expected a file path, encoded bytes or an "
                             f"[H, W, 3] uint8 array")  # fmt: skip
        check_settings(**{k: getattr(self, k) for k in GENERATION_FIELDS})
        for name in ("window", "refresh_interval"):
            value = getattr(self, name)
            if value is not None and not _is_int(value):
                raise InputError(f"{name} is {value!r}; expected a whole number")
        if not _is_int(self.seed) or not 0 <= self.seed < 2**63:
            raise InputError(f"seed is {self.seed!r}; expected a whole number in [0, 2**63)")
        t = self.top_p
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0 < t <= 1:
            raise InputError(f"top_p is {t!r}; expected a number in (0, 1] (1: the whole vocabulary)")
        if self.cache is not None and not isinstance(self.cache, CacheConfig) and self.cache not in CACHE_MODES:
            raise InputError(f"cache is {self.cache!r}; expected one of {list(CACHE_MODES)} or a CacheConfig")
        for name in ("seer", "early_stop"):
            if not isinstance(getattr(self, name), bool | np.bool_):
                raise InputError(f"{name} is {getattr(self, name)!r}; expected true or false")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Request:
        """A request from a JSON object (JSONL input): ``prompt`` required, ``image`` a file path."""
        if not isinstance(data, Mapping) or not isinstance(data.get("prompt"), str):
            raise InputError(f"a request must be a JSON object with a 'prompt' string, got {ascii(data)[:80]}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise InputError(f"unknown request key(s) {unknown}; expected a subset of {sorted(fields)}")
        return cls(**dict(data))


@dataclasses.dataclass(frozen=True)
class Result:
    text: str  # the answer, special tokens dropped
    token_ids: tuple[int, ...]  # answer ids before the first <|eot_id|>
    window: tuple[int, ...]  # every kept position's id, <|eot_id|> and what follows included
    kept: int  # L*: answer positions denoised (N without Seer)
    steps: int  # denoising steps used (forward passes over this row's window)
    gen_length: int  # N
    seconds: dict[str, float]  # per stage (STAGES); batched stages count the whole batch's time
    error: str | None = None  # why this request failed; the fields above are empty then
    refreshes: int = 0  # denoising steps that computed the prompt (all of them under cache "none")
    error_kind: str | None = None  # "input": the request itself was bad (a client error); "internal": it was not

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "token_ids": list(self.token_ids), "window": list(self.window)}

    @classmethod
    def failed(cls, error: str, kind: str = "input") -> Result:
        """A request that failed: ``kind`` "input" when its own input was bad, "internal" otherwise."""
        return cls("", (), (), 0, 0, 0, {}, error, error_kind=kind)
