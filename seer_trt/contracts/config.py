"""Configuration shared by the exporter and the runtime: special tokens, generation defaults, Seer calibration.

Each is a frozen dataclass validated on construction and round-tripped through JSON (``to_dict`` /
``from_dict``), so a model's ``config.json`` and later the manifest carry them verbatim. Nothing here holds a
token id as a literal: ids are resolved from the model's tokenizer by token string.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from pathlib import Path
from typing import Any, Literal

import numpy as np

from seer_trt.contracts.errors import ConfigError
from seer_trt.contracts.profiles import MAX_BUCKET

Signal = Literal["mlp_sparsity", "probe", "end_token_prob"]
Statistic = Literal["abs_below", "gate_negative"]
Direction = Literal["up", "down"]
Detector = Literal["jump", "threshold"]
TailToken = Literal["eot", "endoftext"]

SIGNALS = ("mlp_sparsity", "probe", "end_token_prob")
STATISTICS = ("abs_below", "gate_negative")
DIRECTIONS = ("up", "down")
DETECTORS = ("jump", "threshold")
TAIL_TOKENS = ("eot", "endoftext")
DECODINGS = ("fixed", "threshold", "factor")  # commit rules of the loop (docs/DESIGN.md "Decoding strategies")
# what a new export defaults to (measured: docs/results.md "Decoding strategies"); a manifest without one ran "fixed"
DEFAULT_DECODING = "factor:1"
REMASKINGS = ("low_confidence", "random", "topk_margin", "entropy")
SCORED = ("topk_margin", "entropy")  # Dream's scores: they rank positions, but are no log-probability to threshold
SCHEDULES = ("even", "dream")
PROBE_EPS = 1e-6  # the probe reads the residual stream RMS-normalised (no weight): x / sqrt(mean(x^2) + eps)


def _from_dict(cls, data: dict[str, Any], where: str):
    """Build dataclass ``cls`` from ``data``, naming unknown keys instead of ignoring them."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; expected a subset of {sorted(names)}")
    return cls(**data)


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    """Token strings LLaDA-V gives a meaning to, and their ids in one tokenizer.

    The strings are the model family's (LLaDA-V SFT layout: answer, ``<|eot_id|>``, then ``<|endoftext|>``
    padding); the ids are whatever the tokenizer maps them to, so the fixture and the real model differ.
    """

    mask_id: int  # <|mdm_mask|>: every answer position at step zero
    endoftext_id: int  # <|endoftext|>: padding after the answer
    startoftext_id: int  # <|startoftext|>: BOS
    eot_id: int  # <|eot_id|>: end of the answer, the position Seer looks for
    start_header_id: int  # <|start_header_id|>
    end_header_id: int  # <|end_header_id|>

    STRINGS = {
        "mask_id": "<|mdm_mask|>",
        "endoftext_id": "<|endoftext|>",
        "startoftext_id": "<|startoftext|>",
        "eot_id": "<|eot_id|>",
        "start_header_id": "<|start_header_id|>",
        "end_header_id": "<|end_header_id|>",
    }

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.to_dict().items() if not is_whole(v) or v < 0}
        if bad:
            raise ConfigError(f"special_tokens {bad}: expected token ids, whole numbers >= 0 (the ids the export's "
                              f"tokenizer gives its special tokens); re-export with seer-export")  # fmt: skip

    @property
    def suppressed_ids(self) -> tuple[int, ...]:
        """Ids whose logits are -inf at masked positions (LLaDA-V ``generate_with_embeds``)."""
        return (self.endoftext_id, self.startoftext_id, self.start_header_id, self.end_header_id)

    @classmethod
    def from_tokenizer(cls, tokenizer_json: str | Path, strings: dict[str, str] | None = None) -> SpecialTokens:
        """Resolve every id from a ``tokenizer.json`` (the light ``tokenizers`` package, no transformers).

        ``strings``: the token string of each field when the model family names others than LLaDA's ``STRINGS``
        (Dream's ChatML: ``<|mask|>``, ``<|im_end|>``, ...; ``seer_export.models.families.Family.special_strings``).
        """
        from tokenizers import Tokenizer

        strings = {**cls.STRINGS, **(strings or {})}
        tok = Tokenizer.from_file(str(tokenizer_json))
        ids: dict[str, int] = {}
        for field, text in strings.items():
            idx = tok.token_to_id(text)
            if idx is None:
                raise ConfigError(
                    f"tokenizer {tokenizer_json} has no token {text!r}; a LLaDA-V tokenizer must define all of "
                    f"{sorted(set(strings.values()))}"
                )
            ids[field] = idx
        return cls(**ids)

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpecialTokens:
        return _from_dict(cls, data, "special_tokens")


def is_whole(value: Any) -> bool:
    """A whole number as JSON writes one: an int, not a bool (``True`` is an int to Python), not ``1.0``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _shown(value: Any, width: int = 40) -> str:
    """``repr(value)``, cut to about ``width`` characters for an error message."""
    text = repr(value) if not isinstance(value, str | bytes) or len(value) <= width else repr(value[:width]) + "..."
    return text if len(text) <= width + 10 else text[:width] + "..."


def parse_decoding(text: Any) -> tuple[str, float | None]:
    """``"fixed"``, ``"threshold:TAU"`` (0 < TAU <= 1) or ``"factor:F"`` (F > 0) as (strategy, parameter).

    Raises:
        ConfigError: anything else, with the accepted forms.
    """
    forms = "'fixed', 'threshold:TAU' (0 < TAU <= 1, e.g. threshold:0.9) or 'factor:F' (F > 0, e.g. factor:1)"
    if not isinstance(text, str):
        raise ConfigError(f"decoding is {_shown(text)}; expected {forms}")
    if len(text) > 64:  # no rule is longer; and an error must not echo a client's megabytes
        raise ConfigError(f"decoding {_shown(text)} ({len(text)} characters) is not one of {forms}")
    name, sep, raw = text.strip().partition(":")
    if name == "fixed" and not sep:
        return "fixed", None
    if name not in DECODINGS[1:] or not sep:
        raise ConfigError(f"decoding {text!r} is not one of {forms}")
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"decoding {text!r}: {raw!r} is not a number; expected {forms}") from None
    if not math.isfinite(value) or value <= 0 or (name == "threshold" and value > 1):
        raise ConfigError(f"decoding {text!r}: the parameter is out of range; expected {forms}")
    return name, value


def canonical_decoding(text: Any) -> str:
    """The one spelling of a decoding (``"factor:1.0"`` -> ``"factor:1"``), so equal rules group together."""
    name, value = parse_decoding(text)
    return name if value is None else f"{name}:{value:g}"


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """Sampler settings with LLaDA-V's defaults (``generate_with_embeds``: 128 / 128 / 128, greedy)."""

    gen_length: int = 128  # N answer positions, all masks at step zero
    steps: int = 128  # denoising steps over the whole window
    block_length: int = 128  # semi-autoregressive block; == gen_length means one block
    temperature: float = 0.0  # 0: greedy argmax; > 0: Gumbel-max in float64
    # the confidence that ranks positions: the prediction's probability (low_confidence; Dream's maskgit_plus),
    # uniform noise (random), top-1 minus top-2 probability (topk_margin) or the negative entropy (entropy): Dream's
    remasking: Literal["low_confidence", "random", "topk_margin", "entropy"] = "low_confidence"
    # commit rule: "fixed" (k tokens per step from steps), "threshold:TAU" or "factor:F" (as many as confidence allows)
    decoding: str = "fixed"
    # how the fixed rule spreads a window's masks over its steps: "even" (LLaDA's get_num_transfer_tokens, per block)
    # or "dream" (Dream's diffusion_generate: int(masks left * (1 - s / t)) over timesteps linspace(1, 1e-3), one block)
    schedule: Literal["even", "dream"] = "even"

    # OpenAI's range of temperature, [0, 2] (not a field: unannotated); far past it the sampler's Gumbel noise raised
    # to the temperature overflows float64 (10^6: argmax over inf)
    MAX_TEMPERATURE = 2.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "decoding", canonical_decoding(self.decoding))
        for name in ("gen_length", "steps", "block_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ConfigError(f"{name} must be a whole number >= 1, got {value!r}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0 <= t <= self.MAX_TEMPERATURE:
            raise ConfigError(f"temperature must be a number in [0, {self.MAX_TEMPERATURE:g}] (0: greedy; OpenAI's "
                              f"range), got {t!r}; pass one in it")  # fmt: skip

        if self.gen_length % self.block_length:
            raise ConfigError(
                f"gen_length {self.gen_length} is not a multiple of block_length {self.block_length}; "
                "choose a block_length that divides gen_length"
            )
        blocks = self.gen_length // self.block_length
        if self.steps % blocks:
            raise ConfigError(
                f"steps {self.steps} is not a multiple of the number of blocks {blocks} "
                f"(gen_length {self.gen_length} / block_length {self.block_length}); choose steps divisible by it"
            )
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if self.remasking not in REMASKINGS:
            raise ConfigError(f"remasking must be one of {list(REMASKINGS)}, got {self.remasking!r}")
        if self.remasking in SCORED and self.decoding != "fixed":
            raise ConfigError(f"remasking {self.remasking!r} ranks positions by a score that is not a probability; "
                              f"it runs with decoding 'fixed' (Dream's loop), not {self.decoding!r}; pass remasking "
                              f"'low_confidence' for a rule that commits by probability")  # fmt: skip
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule must be one of {list(SCHEDULES)}, got {self.schedule!r}")
        if self.schedule == "dream" and self.block_length != self.gen_length:
            raise ConfigError(f"the dream schedule runs one block over the whole window (diffusion_generate); "
                              f"block_length {self.block_length} differs from gen_length {self.gen_length}")  # fmt: skip

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def rule(self) -> tuple[str, float | None]:
        """(strategy, its parameter): ("fixed", None), ("threshold", tau) or ("factor", f)."""
        return parse_decoding(self.decoding)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationConfig:
        return _from_dict(cls, data, "generation")


BLOCK_RULES = ("whole", "cap", "split")


@dataclasses.dataclass(frozen=True)
class WindowRule:
    """How a request's ``gen_length`` N reshapes the export's window: written by seer-export from the model family,
    applied by both runtimes (docs/DESIGN.md "Model families"). ``blocks``: "whole" (one block of N: LLaDA-V),
    "cap" (blocks of min(``size``, N): LaViDa's 128) or "split" (``count`` blocks of N / count: MMaDA's 4). The steps
    keep the defaults' steps per token (N x steps / gen_length, at least one)."""

    blocks: Literal["whole", "cap", "split"]
    size: int | None = None  # cap: the largest block
    count: int | None = None  # split: the number of blocks

    def __post_init__(self) -> None:
        want = {"whole": (), "cap": ("size",), "split": ("count",)}.get(self.blocks)
        if want is None:
            raise ConfigError(f"window rule blocks {self.blocks!r} is not one of {list(BLOCK_RULES)}")
        for name in ("size", "count"):
            value = getattr(self, name)
            if (value is None) == (name in want):
                raise ConfigError(f"window rule {self.blocks!r} " + (f"needs {name}" if value is None else
                                  f"takes no {name}") + f", got {self.to_dict()}")  # fmt: skip
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
                raise ConfigError(f"window rule {name} must be a whole number >= 1, got {value!r}")

    @classmethod
    def of(cls, gen: GenerationConfig, loop_blocks: int | None) -> WindowRule:
        """The rule of a family that splits N into ``loop_blocks`` blocks (None: it keeps the defaults' shape, one
        block or blocks of at most the default's); also how a manifest before schema 2.6 is read."""
        if loop_blocks:
            return cls("split", count=loop_blocks)
        return cls("whole") if gen.block_length == gen.gen_length else cls("cap", size=gen.block_length)

    def shape(self, n: int, base: GenerationConfig, block: int | None = None) -> tuple[int, int]:
        """(block_length, steps) of a window of ``n`` positions; ``block``: the request's own block length, which
        the rule then does not choose.

        Raises:
            ValueError: a split rule whose count does not divide ``n`` (the caller words it for its user).
        """
        if block is None and self.blocks == "split" and n % self.count:
            raise ValueError(f"gen_length {n}: this model's loop splits the window into {self.count} blocks; ask for "
                             f"a multiple of {self.count}, or pass block_length")  # fmt: skip
        if block is None:
            block = n // self.count if self.blocks == "split" else min(self.size, n) if self.blocks == "cap" else n
        return block, max(1, n * base.steps // base.gen_length)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WindowRule:
        return _from_dict(cls, data, "window rule")


# (rows, prompt, answer) of the calls the cost model's calibration times: single rows from short to long prompts,
# small and full batches of short rows, and one long sequence like a packed group, so the fit sees launch, per-slot
# and attention costs. seer-export writes them into the manifest (``CostCalibration``); both runtimes read them there.
CALIBRATION_SHAPES = ((1, 16, 4), (1, 32, 16), (1, 128, 32), (1, 384, 64), (1, 640, 128), (4, 32, 8),
                      (4, 128, 32), (8, 32, 8), (16, 32, 16), (16, 64, 32))  # fmt: skip
# What a manifest's calibration may ask for, checked when it is read (docs/DESIGN.md "Bounds and output folders"): the
# calibration times at most MAX_CALIBRATION_SHAPES x (MAX_CALIBRATION_REPEATS + 1) steps, none of them past the
# export's largest buckets (each shape is clipped to them before it is timed), so opening an export takes seconds.
MAX_CALIBRATION_SHAPES = 32
MAX_CALIBRATION_REPEATS = 20


@dataclasses.dataclass(frozen=True)
class CostCalibration:
    """The ``cost_model`` dispatch policy's calibration (``seer_trt.runtime.costs``): the (rows, prompt, answer)
    shapes it times, each clipped to the buckets, and the timed steps per shape after one warm-up (the fastest
    counts)."""

    shapes: tuple[tuple[int, int, int], ...] = CALIBRATION_SHAPES
    repeats: int = 5

    def __post_init__(self) -> None:
        try:
            shapes = tuple(tuple(s) for s in self.shapes)
        except TypeError:
            shapes = ()
        whole = all(is_whole(v) for s in shapes for v in s)
        if not shapes or not whole or any(len(s) != 3 or min(s) < 1 for s in shapes):
            raise ConfigError(f"calibration shapes must be one or more [rows, prompt, answer] of whole numbers "
                              f">= 1, got {_shown(self.shapes, 80)}")  # fmt: skip
        ceiling = (MAX_BUCKET["batch"], MAX_BUCKET["prompt"], MAX_BUCKET["answer"])
        past = [list(s) for s in shapes if any(v > top for v, top in zip(s, ceiling, strict=True))]
        if len(shapes) > MAX_CALIBRATION_SHAPES or past:
            found = f"{past[0]} is past the buckets' ceilings" if past else f"{len(shapes)} are given"
            raise ConfigError(f"calibration shapes: {found}; expected at most {MAX_CALIBRATION_SHAPES} [rows, prompt, "
                              f"answer] of at most {list(ceiling)} (each is clipped to the export's buckets); "
                              f"re-export with seer-export")  # fmt: skip
        r = self.repeats
        if not is_whole(r) or not 1 <= r <= MAX_CALIBRATION_REPEATS:
            raise ConfigError(f"calibration repeats must be a whole number in [1, {MAX_CALIBRATION_REPEATS}] (the "
                              f"timed steps per shape), got {_shown(r)}; re-export with seer-export")  # fmt: skip
        object.__setattr__(self, "shapes", tuple(tuple(int(v) for v in s) for s in shapes))

    def to_dict(self) -> dict[str, Any]:
        return {"shapes": [list(s) for s in self.shapes], "repeats": self.repeats}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostCalibration:
        return _from_dict(cls, data, "cost calibration")


@dataclasses.dataclass(frozen=True)
class SeerConfig:
    """Which step-zero signal predicts the answer end, and the detector that turns it into L* (docs/DESIGN.md "Seer, exactly").

    The defaults are the paper's rule for LLaDA-8B-class models: fraction of ``|h| < 1e-3`` in the SwiGLU
    intermediate (the input of ``down_proj``) at layer 3, jump upwards, ``tau_jump`` 0.03, ``gamma`` 0.6,
    window 3, one token of margin after the predicted ``<|eot_id|>``.

    Signals: ``mlp_sparsity`` (an MLP statistic of layer k), ``probe`` (a linear probe on the RMS-normalised
    residual stream after layer k: ``sigmoid(w . x / rms(x) + b)``, the probability that a position is at or
    past the end), both computed by the early-exit ``step_zero`` graph (layers 0..k only); ``end_token_prob``
    (p(<|eot_id|>) + p(<|endoftext|>) from a full-depth pass, which then serves as denoising step 0).
    Detectors: ``jump`` (the paper's SNR rule: tau_jump, gamma, window, direction) or ``threshold`` (the
    smallest position from which every score exceeds ``threshold``); default: jump for mlp_sparsity,
    threshold otherwise.
    """

    signal: Signal = "mlp_sparsity"
    statistic: Statistic = "abs_below"  # abs_below: mean(|h| < tau_abs); gate_negative: mean(gate(x) < 0)
    probe_layer: int = 3  # 0-based decoder layer: its MLP (mlp_sparsity) or the residual stream after it (probe)
    tau_abs: float = 1e-3  # threshold of the abs_below statistic
    direction: Direction = "up"  # the profile jumps up (paper) or down at the answer end
    tau_jump: float = 0.03  # minimum jump over the previous position
    gamma: float = 0.6  # maximum window spread, as a fraction of the jump
    window: int = 3  # positions that must all sit past the jump
    margin: int = 1  # tokens kept after the predicted <|eot_id|>
    detector: Detector | None = None  # None: "jump" for mlp_sparsity, "threshold" for probe / end_token_prob
    threshold: float = 0.5  # threshold detector: cut where every later score exceeds this (a probability)
    probe_weights: tuple[float, ...] = ()  # probe: one weight per hidden unit, on the RMS-normalised residual
    probe_bias: float = 0.0  # probe: added to the dot product before the sigmoid
    label: str = "paper"  # how tables name this setting ("paper" only for the paper-exact rule)
    # the end tail (docs/DESIGN.md "Seer, exactly"): the share of the cut-away positions N - L* that stay in the
    # window as already-committed end tokens, attended by every step and never denoised (0: none, the paper's cut;
    # 1: the whole window stays context, what the uncut loop shows once its padding is committed)
    tail: float = 0.0
    tail_token: TailToken = "eot"  # what the tail holds: "eot" (<|eot_id|>) or "endoftext" (loops that pad with it)

    def __post_init__(self) -> None:
        if self.signal not in SIGNALS:
            raise ConfigError(f"seer.signal must be one of {SIGNALS}, got {self.signal!r}")
        if self.statistic not in STATISTICS:
            raise ConfigError(f"seer.statistic must be one of {STATISTICS}, got {self.statistic!r}")
        if self.direction not in DIRECTIONS:
            raise ConfigError(f"seer.direction must be one of {DIRECTIONS}, got {self.direction!r}")
        if self.detector is None:
            object.__setattr__(self, "detector", "jump" if self.signal == "mlp_sparsity" else "threshold")
        if self.detector not in DETECTORS:
            raise ConfigError(f"seer.detector must be one of {DETECTORS}, got {self.detector!r}")
        if not is_whole(self.probe_layer) or self.probe_layer < 0:
            raise ConfigError(f"seer.probe_layer must be a whole number >= 0, got {_shown(self.probe_layer)}; "
                              f"re-calibrate with seer-calibrate --write")  # fmt: skip
        if self.window < 1:
            raise ConfigError(f"seer.window must be >= 1, got {self.window}")
        if self.margin < 0:
            raise ConfigError(f"seer.margin must be >= 0, got {self.margin}")
        if not self.tau_jump > 0 or not self.gamma >= 0:
            raise ConfigError(f"seer.tau_jump must be > 0 and seer.gamma >= 0, got {self.tau_jump}, {self.gamma}")
        if not 0.0 < self.threshold < 1.0:
            raise ConfigError(f"seer.threshold must be in (0, 1), got {self.threshold}")
        if isinstance(self.tail, bool) or not isinstance(self.tail, numbers.Real) or not 0.0 <= self.tail <= 1.0:
            raise ConfigError(f"seer.tail must be a share in [0, 1] of the cut-away positions, got {self.tail!r}")
        object.__setattr__(self, "tail", float(self.tail))
        if self.tail_token not in TAIL_TOKENS:
            raise ConfigError(f"seer.tail_token must be one of {TAIL_TOKENS}, got {self.tail_token!r}")
        try:
            weights = tuple(float(w) for w in self.probe_weights)
            object.__setattr__(self, "probe_bias", float(self.probe_bias))
        except (TypeError, ValueError):
            raise ConfigError("seer.probe_weights must be a list of numbers and seer.probe_bias a number") from None
        if not all(math.isfinite(w) for w in (*weights, self.probe_bias)):
            raise ConfigError("seer.probe_weights and seer.probe_bias hold a NaN or an infinity; expected finite "
                              "numbers: re-calibrate with seer-calibrate --write")  # fmt: skip
        object.__setattr__(self, "probe_weights", weights)
        if self.signal == "probe" and not weights:
            raise ConfigError(
                "seer.signal 'probe' needs seer.probe_weights (one per hidden unit); calibrate them with "
                "seer-calibrate --write, or choose another signal"
            )

    @property
    def full_depth(self) -> bool:
        """True when the signal needs every layer and the head (end_token_prob): that pass serves as step 0."""
        return self.signal == "end_token_prob"

    def layers_computed(self, num_layers: int) -> int:
        """Decoder layers the step-zero pass runs: k + 1 for an early exit, all of them at full depth."""
        return num_layers if self.full_depth else self.probe_layer + 1

    @property
    def name(self) -> str:
        """What tables call this detector: "paper rule at layer 3", "probe at layer 2", "end-token at full depth"."""
        if self.signal == "end_token_prob":
            return "end-token at full depth"
        if self.signal == "probe":
            return f"probe at layer {self.probe_layer}"
        rule = "paper rule" if self.statistic == "abs_below" else "gate-sign rule"
        return f"{rule} at layer {self.probe_layer}"

    def describe(self) -> str:
        """``name`` with the detector's parameters, e.g. "probe at layer 2 (p > 0.5, margin 1)"."""
        if self.detector == "threshold":
            rule = f"p > {self.threshold:g}"
        else:
            rule = f"jump {self.direction}, tau_jump {self.tau_jump:g}, gamma {self.gamma:g}, window {self.window}"
        stat = ""
        if self.signal == "mlp_sparsity":
            stat = f"|h| < {self.tau_abs:g}, " if self.statistic == "abs_below" else "gate < 0, "
        tail = f", end tail {self.tail:g}" if self.tail else ""
        return f"{self.name} ({stat}{rule}, margin {self.margin}{tail})"

    def tails(self, kept: np.ndarray, gen_length: int) -> np.ndarray:
        """[B] int64 end-tail positions of rows kept to ``kept`` of ``gen_length``: ceil(tail * (N - L*))."""
        cut = gen_length - np.asarray(kept, dtype=np.int64)
        return np.ceil(self.tail * cut).astype(np.int64) if self.tail else np.zeros_like(cut)

    def tail_id(self, special: SpecialTokens) -> int:
        """The token id the end tail holds."""
        return special.eot_id if self.tail_token == "eot" else special.endoftext_id

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["probe_weights"] = list(self.probe_weights)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SeerConfig:
        return _from_dict(cls, data, "seer")

    def replace(self, **changes: Any) -> SeerConfig:
        return dataclasses.replace(self, **changes)


MAX_CONFIG_BYTES = 4 * 2**20  # a model's config.json: a few KB (LLaDA-V's 6 KB); past this it is not one


def read_json(path: str | Path, limit: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """Read a JSON object of at most ``limit`` bytes, turning a missing, corrupt or oversized file into one
    ConfigError line (before reading it: a config.json is read before anything is bounded by it)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > limit:
            raise ConfigError(f"{path} is {size} bytes, more than the {limit} a model's configuration may be; "
                              f"regenerate or restore it")  # fmt: skip
        with open(path, encoding="utf-8") as f:
            data = json.loads(f.read(limit + 1))
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path} is not readable JSON ({err}); regenerate or restore it") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds a {type(data).__name__}, expected a JSON object")
    return data
