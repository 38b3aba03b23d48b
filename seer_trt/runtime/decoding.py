"""How a request decodes, chosen once per request and then only used (docs/DESIGN.md "Decoding strategies").

In:  a request's ``GenerationConfig`` and the export's ``Manifest``.
Out: a ``Decoding``: which window graph its steps call, how a step predicts and ranks positions (a ``Decoder``:
     ``Greedy``, ``Sampled`` or ``TopK``), how many positions it commits (a ``Rule``: ``Fixed``, ``Threshold``,
     ``Factor``) and how a fixed rule's counts are laid out over the steps (``Counts``: LLaDA's ``Spread`` per block,
     Dream's ``Timesteps``). Each is an object chosen once; the loop (``seer_trt.runtime.denoise``) only calls them,
     and nothing else in the runtime parses a rule's spelling or branches on a remasking's or a schedule's name.
     ``cpp/src/decoding.cpp`` is its C++ twin.

A step's prediction, per LLaDA-V's ``generate_with_embeds``: every masked position's prediction, ranked by its
log-probability (``low_confidence``), the log of a uniform draw (``random``) or one of Dream's scores
(``topk_margin``, ``entropy``); then the rule commits among the eligible positions:

    fixed        the row's ``transfer[t]`` most confident eligible positions (ties to the earlier position)
    threshold:τ  every eligible position with probability >= τ, at least the most confident (Fast-dLLM)
    factor:f     the n most confident while the n-th has probability >= 1 - f / (n + 1), at least one
                 (the rule of LLaDA-V's Fast-dLLM hook)

Sampled draws come from a counter-based generator (``uniform``) of the row's seed, its own step and the position,
so a row's samples are the same whatever shares its call and whenever it was admitted.

    counts   Spread      LLaDA-V's get_num_transfer_tokens: a block's masks spread evenly over its steps
             Timesteps   Dream's diffusion_generate: int(m (1 - t[i+1] / t[i])) of the m masks still open
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Protocol

import numpy as np

from seer_trt.contracts.config import SCORED, GenerationConfig, parse_decoding
from seer_trt.contracts.graphs import CONFIDENCE, LEGACY_CONFIDENCE, SCORE_OUTPUTS, log_confidence

if TYPE_CHECKING:
    from seer_trt.contracts.manifest import Manifest
    from seer_trt.runtime.layout import Layout

_M1, _M2, _M3 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def uniform(seeds: np.ndarray, step: int | np.ndarray, positions: np.ndarray, width: int) -> np.ndarray:
    """[n, L, width] float64 uniforms in (0, 1), a pure function of (row seed, step, answer position, column);
    ``step`` is one for every row or each row's own [n].

    A counter-based generator (splitmix64's finaliser over the mixed counters), so a row draws the same numbers
    whichever rows share its call and in whatever layout: sampled decoding stays independent of dispatch.
    """
    steps = np.broadcast_to(np.asarray(step, dtype=np.int64), (len(seeds),)).astype(np.uint64)
    with np.errstate(over="ignore"):
        z = (np.asarray(seeds, dtype=np.uint64)[:, None, None] * _M1
             + steps[:, None, None] * _M2
             + positions.astype(np.uint64)[..., None] * _M3
             + np.arange(width, dtype=np.uint64)[None, None])  # fmt: skip
        z ^= z >> np.uint64(30)
        z *= _M2
        z ^= z >> np.uint64(27)
        z *= _M3
        z ^= z >> np.uint64(31)
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


class Decoder(Protocol):
    """Predictions and their log-confidences of one step, in the loop's state shape [n, L_max]; ``step`` is each
    row's own step [n] (rows admitted apart share calls)."""

    graph: str  # the graph it calls

    def reads(self, outputs: frozenset[str]) -> tuple[str, ...]:
        """The outputs of ``graph`` (of those it has, ``outputs``) a step of this decoder fetches to the host."""
        ...

    def __call__(self, out: dict[str, np.ndarray], layout: Layout, step: int | np.ndarray, shape: tuple[int, int],
                 mask_id: int) -> tuple[np.ndarray, np.ndarray]: ...  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Greedy:
    """Temperature 0: the ``denoise`` graph's own argmax, ranked by its log-probability (``low_confidence``) or by
    one of Dream's scores the graph returns (``score``: ``log_margin`` for topk_margin, ``neg_entropy`` for entropy;
    ``seer_trt.contracts.graphs.SCORE_OUTPUTS``)."""

    score: str | None = None
    graph: str = "denoise"

    def reads(self, outputs: frozenset[str]) -> tuple[str, ...]:
        return ("x0", *(n for n in (CONFIDENCE.name, LEGACY_CONFIDENCE) if n in outputs)) if self.score is None \
            else ("x0", self.score)  # fmt: skip

    def __call__(self, out, layout, step, shape, mask_id):
        conf = log_confidence(out) if self.score is None else out[self.score]
        return layout.gather(out["x0"], shape, mask_id), layout.gather(conf, shape, -np.inf)


@dataclasses.dataclass(frozen=True)
class Sampled:
    """Gumbel-max over ``denoise_logits`` in float64 (LLaDA's ``add_gumbel_noise``; argmax at temperature 0), ranked
    by the prediction's log-probability, uniform noise (random remasking) or Dream's margin or negative entropy.
    With ``top_p`` below 1 a row draws only among its nucleus: the most probable ids (at the temperature) whose
    mass reaches ``top_p`` (OpenAI's and Hugging Face's ``top_p``); the confidence stays the full softmax's."""

    temperature: float
    remasking: str  # "low_confidence" | "random"
    seeds: np.ndarray  # [n] one seed per row
    graph: str = "denoise_logits"
    top_p: np.ndarray | None = None  # [n] nucleus mass per row; None: 1 for every row

    def reads(self, outputs: frozenset[str]) -> tuple[str, ...]:
        return ("logits",)

    def __call__(self, out, layout, step, shape, mask_id):
        logits = layout.gather(out["logits"], (*shape, out["logits"].shape[-1]), 0.0).astype(np.float64)
        positions = np.broadcast_to(np.arange(shape[1])[None], shape)
        shifted = logits - logits.max(-1, keepdims=True)  # same argmax, no overflow in exp
        if self.temperature > 0:
            gumbel = (
                -np.log(uniform(self.seeds, 2 * np.asarray(step), positions, logits.shape[-1]))
            ) ** self.temperature
            drawn = np.exp(shifted)
            if self.top_p is not None and (np.asarray(self.top_p) < 1).any():
                drawn = drawn * nucleus(shifted / self.temperature, np.asarray(self.top_p, dtype=np.float64))
            x0 = np.argmax(drawn / gumbel, axis=-1)
        else:
            x0 = np.argmax(logits, axis=-1)
        if self.remasking == "random":
            return x0, np.log(uniform(self.seeds, 2 * np.asarray(step) + 1, positions, 1)[..., 0])
        if self.remasking in SCORED:  # Dream's scores, from the (temperature-scaled) softmax
            scaled = shifted / (self.temperature or 1.0)
            p = np.exp(scaled - scaled.max(-1, keepdims=True))
            return x0, dream_score(p / p.sum(-1, keepdims=True), self.remasking)
        picked = np.take_along_axis(shifted, x0[..., None], -1)[..., 0]
        with np.errstate(divide="ignore"):
            return x0, picked - np.log(np.exp(shifted).sum(-1))  # log softmax of x0, float64


@dataclasses.dataclass(frozen=True)
class TopK:
    """Sampling from the ``denoise`` graph's ``top_logits`` / ``top_ids`` (the most probable ids per position, what an
    export without ``denoise_logits`` returns): Gumbel-max over those ids in float64 at the temperature, within the
    row's ``top_p`` nucleus of them. It differs from LLaDA-V's Gumbel over the whole vocabulary (``Sampled``) by the
    mass outside the top ids, which it never draws, and by its draws (one uniform per kept id, not per vocabulary
    id). The confidence is the full softmax's log-probability of the drawn id (``low_confidence``), from the graph's
    ``log_confidence`` of its argmax, or a uniform draw (``random``)."""

    temperature: float
    remasking: str  # "low_confidence" | "random"
    seeds: np.ndarray  # [n]
    top_p: np.ndarray | None = None  # [n]
    graph: str = "denoise"

    def reads(self, outputs: frozenset[str]) -> tuple[str, ...]:
        return ("top_logits", "top_ids", *(n for n in (CONFIDENCE.name, LEGACY_CONFIDENCE) if n in outputs))

    def __call__(self, out, layout, step, shape, mask_id):
        k = out["top_logits"].shape[-1]
        logits = layout.gather(out["top_logits"], (*shape, k), 0.0).astype(np.float64)  # [n, L, k] descending
        ids = layout.gather(out["top_ids"], (*shape, k), mask_id)
        positions = np.broadcast_to(np.arange(shape[1])[None], shape)
        shifted = logits - logits[..., :1]  # the argmax at 0
        drawn = np.exp(shifted)
        if self.temperature > 0 and self.top_p is not None and (np.asarray(self.top_p) < 1).any():
            drawn = drawn * nucleus(shifted / self.temperature, np.asarray(self.top_p, dtype=np.float64))
        gumbel = (-np.log(uniform(self.seeds, 2 * np.asarray(step), positions, k))) ** self.temperature
        pick = np.argmax(drawn / gumbel, axis=-1)[..., None]  # [n, L, 1]
        x0 = np.take_along_axis(ids, pick, -1)[..., 0]
        if self.remasking == "random":
            return x0, np.log(uniform(self.seeds, 2 * np.asarray(step) + 1, positions, 1)[..., 0])
        best = layout.gather(log_confidence(out), shape, -np.inf).astype(np.float64)  # log p of the argmax
        return x0, best + np.take_along_axis(shifted, pick, -1)[..., 0]


def nucleus(scaled: np.ndarray, top_p: np.ndarray) -> np.ndarray:
    """[n, L, V] bool: per row and position the smallest set of most probable ids under softmax(``scaled``) whose
    mass reaches the row's ``top_p`` [n] (the most probable id always; ties to the lower id)."""
    p = np.exp(scaled - scaled.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    order = np.argsort(-p, axis=-1, kind="stable")
    ranked = np.take_along_axis(p, order, -1)
    before = np.cumsum(ranked, -1) - ranked  # the mass of the ids ranked above each
    keep = np.empty(p.shape, dtype=bool)
    np.put_along_axis(keep, order, before < top_p[:, None, None], -1)
    return keep


def dream_score(p: np.ndarray, remasking: str) -> np.ndarray:
    """[n, L] float64 score of Dream's ``sample_tokens`` from probabilities ``p`` [n, L, V]: top-1 minus top-2
    probability (``topk_margin``), or sum p log(p + 1e-10), the negative entropy (``entropy``)."""
    if remasking == "topk_margin":
        top = np.partition(p, p.shape[-1] - 2, axis=-1)[..., -2:]
        return top[..., 1] - top[..., 0]
    return (p * np.log(p + 1e-10)).sum(-1)


def commit_top_k(confidence: np.ndarray, k: np.ndarray) -> np.ndarray:
    """[n, L] bool: each row's ``k[i]`` most confident positions; ties go to the earlier position."""
    order = np.argsort(-confidence, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(order.shape[1]), order.shape), axis=1)
    return rank < np.asarray(k)[:, None]


def commit_threshold(confidence: np.ndarray, eligible: np.ndarray, tau: float) -> np.ndarray:
    """[n, L] bool: every eligible position whose probability is >= ``tau``, and each row's most confident one."""
    top = commit_top_k(confidence, np.ones(len(confidence), dtype=np.int64))
    return ((confidence >= math.log(tau)) | top) & eligible


def factor_bounds(width: int, factor: float) -> np.ndarray:
    """[width] float64: the log-probability the n-th most confident position needs under ``factor:f``,
    log(1 - f / (n + 1)) for n = 1..width, -inf where that bound is <= 0 and for n = 1 (one always commits)."""
    n = np.arange(1, width + 1, dtype=np.float64)
    bound = 1.0 - factor / (n + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(bound > 0, np.log(np.maximum(bound, 1e-300)), -np.inf)
    out[0] = -np.inf
    return out


def commit_factor(confidence: np.ndarray, eligible: np.ndarray, factor: float) -> np.ndarray:
    """[n, L] bool: per row the n most confident eligible positions, n the longest run from the top whose k-th
    position (k <= n) has probability >= 1 - f / (k + 1); at least one."""
    order = np.argsort(-confidence, axis=1, kind="stable")
    ranked = np.take_along_axis(confidence, order, 1)  # [n, L] descending
    ok = (ranked >= factor_bounds(confidence.shape[1], factor)[None]) & np.take_along_axis(eligible, order, 1)
    count = np.cumprod(ok, axis=1).sum(1)  # [n] the run of passing positions from the top
    return commit_top_k(confidence, np.maximum(count, 1)) & eligible


class Rule:
    """A commit rule, parsed once from its spelling (``Rule.parse``): ``Fixed``, ``Threshold`` or ``Factor``. Each
    commits a step's positions for any rows at once (``commit``), without looking at its name again."""

    name: str  # "fixed" | "threshold" | "factor"
    value: float | None  # τ of threshold, f of factor; None for fixed

    @classmethod
    def parse(cls, text: str) -> Rule:
        """``"fixed"``, ``"threshold:TAU"`` or ``"factor:F"`` (raises ``ConfigError`` on anything else)."""
        return cls.of(*parse_decoding(text))

    @staticmethod
    def of(name: str, value: float | None = None) -> Rule:
        """The rule ``name`` ("fixed", "threshold", "factor") with its value (τ, f; none for fixed)."""
        return RULES[name]() if value is None else RULES[name](value)

    @property
    def fixed(self) -> bool:
        """Whether the step count and blocks come from the schedule (else a row commits as confidence allows and
        moves to its next block once the current one is full)."""
        return False

    def commit(self, confidence: np.ndarray, eligible: np.ndarray, transfer: np.ndarray) -> np.ndarray:
        """[n, L] bool: the positions a step commits; ``confidence`` is -inf where not ``eligible``; ``transfer`` [n]
        is the fixed schedule's count."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Fixed(Rule):
    """The row's ``transfer[t]`` most confident eligible positions (LLaDA-V ``generate_with_embeds``)."""

    name = "fixed"
    value = None

    @property
    def fixed(self) -> bool:
        return True

    def commit(self, confidence, eligible, transfer):
        return commit_top_k(confidence, transfer) & eligible


@dataclasses.dataclass(frozen=True)
class Threshold(Rule):
    """Every eligible position with probability >= τ, and at least the most confident (Fast-dLLM)."""

    value: float  # τ
    name = "threshold"

    def commit(self, confidence, eligible, transfer):
        return commit_threshold(confidence, eligible, self.value)


@dataclasses.dataclass(frozen=True)
class Factor(Rule):
    """The n most confident while the n-th has probability >= 1 - f / (n + 1), at least one (LLaDA-V's Fast-dLLM
    hook)."""

    value: float  # f
    name = "factor"

    def commit(self, confidence, eligible, transfer):
        return commit_factor(confidence, eligible, self.value)


RULES: dict[str, type[Rule]] = {"fixed": Fixed, "threshold": Threshold, "factor": Factor}
FIXED = Fixed()


# --- how a fixed rule's commits are laid out over the steps ------------------------------------------------------


class Counts(Protocol):
    """The tokens a row commits at each of its steps under the fixed rule, and the block each step works in."""

    def plan(self, length: int, steps: int, block_length: int, steps_per_block: int
             ) -> tuple[list[int], list[int], np.ndarray | None]:  # fmt: skip
        """(tokens per step, block end per step, Dream's fractions per step or None) of a row keeping ``length``
        positions over ``steps`` steps."""
        ...


def _spread(count: int, steps: int) -> list[int]:
    """``count`` masks over ``steps`` steps, remainder to the earliest steps (``get_num_transfer_tokens``)."""
    base, rest = divmod(count, steps)
    return [base + 1 if i < rest else base for i in range(steps)]


@dataclasses.dataclass(frozen=True)
class Spread:
    """LLaDA-V's ``generate_with_embeds``: ``steps // num_blocks`` steps per block; a block's masks spread evenly over
    its steps, the remainder to the earliest; a final partial block (after Seer's cut) gets its share, rounded up."""

    def plan(self, length, steps, block_length, steps_per_block):
        transfer: list[int] = []
        block_end: list[int] = []
        for start in range(0, length, block_length):
            size = min(block_length, length - start)
            block_steps = steps_per_block if size == block_length else math.ceil(size * steps_per_block / block_length)
            transfer += _spread(size, block_steps)
            block_end += [start + size] * block_steps
        return transfer, block_end, None


DREAM_EPS = 1e-3  # DreamGenerationConfig's eps


def linspace32(start: float, end: float, count: int) -> np.ndarray:
    """``torch.linspace(start, end, count)`` in float32 as PyTorch's CPU kernel computes it (so Dream's counts match):
    a float32 step, then ``start + step * i`` for the first half and ``end - step * (count - 1 - i)`` for the rest,
    each a fused multiply-add (one rounding; float32 products are exact in float64)."""
    if count == 1:
        return np.array([start], dtype=np.float32)
    first, last = np.float32(start), np.float32(end)
    step = np.float32((last - first) / np.float32(count - 1))
    i = np.arange(count, dtype=np.float64)
    half = count // 2
    low = np.float64(first) + np.float64(step) * i[:half]
    high = np.float64(last) - np.float64(step) * (count - 1 - i[half:])
    return np.concatenate([low, high]).astype(np.float32)


def dream_fractions(steps: int, eps: float = DREAM_EPS) -> np.ndarray:
    """[steps] float32 1 - t[i + 1] / t[i] of Dream's timesteps ``linspace(1, eps, steps + 1)``; inf at the last step
    (its loop commits every mask left there)."""
    t = linspace32(1.0, eps, steps + 1)
    out = (np.float32(1) - t[1:] / t[:-1]).astype(np.float32)
    out[-1] = np.inf
    return out


def dream_transfer(masks: int, steps: int, eps: float = DREAM_EPS) -> list[int]:
    """Tokens Dream's loop commits at each of ``steps`` steps over ``masks`` masked positions (sums to ``masks``),
    when every step commits what it chose (no prediction of the mask id itself)."""
    out, left = [], masks
    for f in dream_fractions(steps, eps):
        k = left if np.isinf(f) else int(np.float32(left) * f)
        out.append(k)
        left -= k
    return out


@dataclasses.dataclass(frozen=True)
class Timesteps:
    """Dream's ``diffusion_generate``: one block; step i commits ``int(m (1 - t[i + 1] / t[i]))`` of the m masks still
    open (``Schedule.count`` reads the fractions), t = ``linspace(1, eps, steps + 1)`` in float32, the last step all
    that are left."""

    eps: float = DREAM_EPS

    def plan(self, length, steps, block_length, steps_per_block):
        return dream_transfer(length, steps, self.eps), [length] * steps, dream_fractions(steps, self.eps)


COUNTS: dict[str, Counts] = {"even": Spread(), "dream": Timesteps()}  # GenerationConfig.schedule -> its counts


@dataclasses.dataclass(frozen=True)
class Decoding:
    """One request's decoding, chosen by ``choose`` when it is prepared and used unchanged by its loop."""

    predictor: type  # Greedy | TopK | Sampled
    rule: Rule  # how many positions a step commits
    temperature: float  # 0: argmax
    remasking: str  # what ranks positions: low_confidence | random | topk_margin | entropy
    score: str | None = None  # the denoise output a greedy step ranks by (Dream's scores); None: the log-probability
    counts: Counts = Spread()  # how the fixed rule's commits are laid out over the steps (the schedule)

    @property
    def graph(self) -> str:
        """The window graph its steps call: the predictor's own ("denoise", or "denoise_logits" for ``Sampled``)."""
        return self.predictor.graph

    @property
    def step_zero_predicts(self) -> bool:
        """Whether a full-depth step-zero pass's greedy prediction is this decoding's step 0 (greedy, ranked by the
        log-probability, as that pass ranks)."""
        return self.predictor is Greedy and self.score is None

    def decoder(self, seeds: np.ndarray, top_p: np.ndarray | None = None) -> Decoder:
        """The loop's ``Decoder`` for rows with these sampling ``seeds`` and nucleus masses ``top_p`` ([n] each)."""
        if self.predictor is Greedy:
            return Greedy(self.score)
        return self.predictor(self.temperature, self.remasking, seeds, top_p=top_p)


def choose(gen: GenerationConfig, manifest: Manifest) -> Decoding:
    """The decoding of a request of ``gen`` on this export: greedy through ``denoise`` (by its log-probability, or by
    a Dream score that graph returns); sampling or random remasking over ``denoise_logits`` (LLaDA-V's Gumbel over
    the whole vocabulary) where exported, else from ``denoise``'s top ids (``TopK``) where it returns them; else
    ``denoise_logits``, which ``Manifest.graph`` then names the re-export for."""
    rule = Rule.parse(gen.decoding)
    common = {"rule": rule, "temperature": gen.temperature, "remasking": gen.remasking,
              "counts": COUNTS[gen.schedule]}  # fmt: skip
    outputs = {t.name for t in manifest.graph("denoise").spec.outputs} if "denoise" in manifest.graphs else set()
    if gen.temperature == 0 and gen.remasking == "low_confidence":
        return Decoding(Greedy, **common)
    score = SCORE_OUTPUTS.get(gen.remasking)
    if gen.temperature == 0 and score in outputs:
        return Decoding(Greedy, score=score, **common)
    if (
        gen.remasking in ("low_confidence", "random")
        and "denoise_logits" not in manifest.graphs
        and "top_ids" in outputs
    ):
        return Decoding(TopK, **common)
    return Decoding(Sampled, **common)
