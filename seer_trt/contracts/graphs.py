"""The exported graphs' contract: names, dtypes and axes of every input and output (docs/DESIGN.md "Graphs and their contract").

In:  the model's dims (hidden size, vocab, layers, vision tile geometry) and the export precision.
Out: one ``GraphSpec`` per graph and the parity tolerance table (the length buckets engines are built for are
     ``seer_trt.contracts.profiles.LengthBuckets``). The exporter, the manifest, the engine builder and the runtime all read these; nothing
     else spells a graph's I/O.

Axes are symbolic names or fixed sizes. Dynamic axes: ``batch``, ``prompt`` (prompt embeddings computed in this
call), ``answer`` (the answer window), ``past`` (cached prompt positions), ``history`` (cached K/V snapshots),
``seq`` (= past + prompt + answer), ``tiles`` (image tiles), ``tokens`` (ids to embed). Model axes (``hidden``,
``vocab``, ``layers``, ``kv_heads``, ``head_dim``, ``image_size``, ``tile_tokens``) are fixed per model and
resolved by ``graph_specs``. ``float`` marks a tensor in the graph's precision (float32 or float16); statistics,
probabilities and logits are float32 in every precision.

    prompt ids ──► embed ──┐
    pixel tiles ► vision ──┴► (runtime splices image features + newline) ► prefix_embeds [B, P, D]
    prefix_embeds, gen_ids, segment_ids, position_ids ─► step_zero      ─► sparsity (, probe_score) [B, G]
      (+ past_weights, past_key_values.{i}.key/value) ─► denoise        ─► x0, log_confidence, p_end [B, G]
                                                                            (+ present.{i}.key/value)
                                                       ─► denoise_logits ─► logits (only with --sampling)

``step_zero`` is the early exit (embeddings + layers 0..k); ``denoise`` is the one full-depth window graph: every
denoising step, and step zero itself when the calibration reads the end-token probability. Every graph of an
export reads its weights from one shared file (``WEIGHTS_FILE``), each tensor stored once.

The window graphs carry an optional prompt K/V cache (docs/DESIGN.md "Graphs and their contract", "Prompt K/V cache"), ONNX Runtime GenAI's
``past_key_values`` convention with a short history in front: per layer i, ``past_key_values.{i}.key`` /
``.value`` [history, B, kv_heads, past, head_dim] (keys after RoPE) and ``past_weights`` [history]; the graph
attends to ``sum_m past_weights[m] * past[m]`` (reuse: one snapshot, weight 1; a forecast: its extrapolation
weights) without forming that sum, and returns ``present.{i}.key`` / ``.value`` [B, kv_heads, prompt, head_dim],
the K/V of the prompt positions it computed. ``past`` may be 0 (no cache: exactly the uncached graph) and
``prompt`` may be 0 (a cached step: only the answer positions are computed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from seer_trt.contracts.errors import ConfigError

Axis = str | int


Kind = Literal["value", "fraction", "index"]


FLOAT = "float"  # the graph's precision, resolved by ``graph_specs``


PRECISIONS = {"fp32": "float32", "fp16": "float16"}  # --dtype value -> numpy / manifest dtype name


DTYPES = ("float32", "float16", "int64", "int32")


DYNAMIC_AXES = ("batch", "prompt", "answer", "past", "history", "seq", "tiles", "tokens")


MODEL_AXES = ("hidden", "vocab", "layers", "kv_heads", "head_dim", "image_size", "tile_tokens")


WEIGHTS_FILE = "weights.data"  # the one external-data file every graph of an export reads its tensors from


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input or output of a graph."""

    name: str  # the ONNX input/output name
    dtype: str  # "float32" | "float16" | "int64" | "int32", or FLOAT before ``resolve``
    shape: tuple[Axis, ...]  # a symbolic axis name (DYNAMIC_AXES, MODEL_AXES) or a fixed size per axis
    kind: Kind = "value"  # how parity compares it: "value" (close), "fraction" (a mean of 0/1), "index" (equal)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))
        if self.dtype not in DTYPES + (FLOAT,):
            raise ConfigError(f"tensor {self.name!r}: dtype {self.dtype!r} is not one of {DTYPES}")
        unknown = [a for a in self.shape if isinstance(a, str) and a not in DYNAMIC_AXES + MODEL_AXES]
        if unknown:
            raise ConfigError(f"tensor {self.name!r}: unknown axis name(s) {unknown}; expected {DYNAMIC_AXES}")

    @property
    def dynamic_axes(self) -> dict[int, str]:
        """Axis index -> name, for the axes whose size varies per call."""
        return {i: a for i, a in enumerate(self.shape) if isinstance(a, str) and a in DYNAMIC_AXES}

    def resolve(self, precision: str, dims: Mapping[str, int]) -> TensorSpec:
        """The concrete spec: FLOAT becomes ``precision``, model axes become their sizes."""
        shape = tuple(dims[a] if isinstance(a, str) and a in MODEL_AXES else a for a in self.shape)
        return dataclasses.replace(self, dtype=precision if self.dtype == FLOAT else self.dtype, shape=shape)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "kind": self.kind}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorSpec:
        return cls(name=data["name"], dtype=data["dtype"], shape=tuple(data["shape"]), kind=data.get("kind", "value"))


@dataclasses.dataclass(frozen=True)
class GraphSpec:
    """One exported graph: its name (also the ONNX file stem), inputs and outputs, in order."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    summary: str  # one line for listings and --help

    def input(self, name: str) -> TensorSpec:
        return next(t for t in self.inputs if t.name == name)

    def output(self, name: str) -> TensorSpec:
        return next(t for t in self.outputs if t.name == name)

    def resolve(self, precision: str, dims: Mapping[str, int]) -> GraphSpec:
        return dataclasses.replace(
            self,
            inputs=tuple(t.resolve(precision, dims) for t in self.inputs),
            outputs=tuple(t.resolve(precision, dims) for t in self.outputs),
        )


# The four inputs every transformer graph takes (docs/DESIGN.md "Graphs and their contract"): one contract for padded, left-padded and packed.
WINDOW_INPUTS = (
    TensorSpec("prefix_embeds", FLOAT, ("batch", "prompt", "hidden")),  # prompt + spliced image features
    TensorSpec("gen_ids", "int64", ("batch", "answer")),  # answer window, masks included
    TensorSpec("segment_ids", "int32", ("batch", "seq")),  # 0 = padding; attend only within equal ids
    TensorSpec("position_ids", "int64", ("batch", "seq")),  # restart per packed segment
)


X0 = TensorSpec("x0", "int64", ("batch", "answer"), kind="index")  # greedy prediction, suppression applied


CONFIDENCE = TensorSpec("log_confidence", "float32", ("batch", "answer"))  # log-probability of x0 (suppressed)
LEGACY_CONFIDENCE = "confidence"  # a 2.1 export's output: the probability itself (its log is what the loop ranks)


def log_confidence(out: Mapping[str, Any]) -> Any:
    """The window graph's log-probability of ``x0`` from its outputs: ``log_confidence``, or the log of a 2.1
    export's ``confidence`` (whose fp32 ties near 1 stay ties)."""
    if CONFIDENCE.name in out:
        return out[CONFIDENCE.name]
    import numpy as np

    with np.errstate(divide="ignore"):
        return np.log(out[LEGACY_CONFIDENCE])


P_END = TensorSpec("p_end", "float32", ("batch", "answer"))  # p(<|eot_id|>) + p(<|endoftext|>), unsuppressed
# Dream's scores of the (suppressed) distribution, in a family whose loop ranks by one (graph_specs(scores=True)):
# log(p1 - p2), monotone in topk_margin's score with fp32's relative resolution near 1; sum p log(p + 1e-10)
LOG_MARGIN = TensorSpec("log_margin", "float32", ("batch", "answer"))
NEG_ENTROPY = TensorSpec("neg_entropy", "float32", ("batch", "answer"))
SCORE_OUTPUTS = {"topk_margin": LOG_MARGIN.name, "entropy": NEG_ENTROPY.name}  # remasking -> the output it ranks by


PROBE_SCORE = TensorSpec("probe_score", "float32", ("batch", "answer"))  # sigmoid(w . x / rms(x) + b) after layer k


GRAPHS: dict[str, GraphSpec] = {
    g.name: g
    for g in (
        GraphSpec(
            "embed",
            (TensorSpec("input_ids", "int64", ("batch", "tokens")),),
            (TensorSpec("embeds", FLOAT, ("batch", "tokens", "hidden")),),
            "token ids -> embeddings (the runtime holds no weights)",
        ),
        GraphSpec(
            "vision",
            (TensorSpec("pixel_values", FLOAT, ("tiles", 3, "image_size", "image_size")),),
            (
                TensorSpec("image_features", FLOAT, ("tiles", "tile_tokens", "hidden")),  # after the projector
                TensorSpec("image_newline", FLOAT, ("hidden",)),  # spliced by the runtime (manifest: vision)
            ),
            "pixel tiles -> projected image features, and the image_newline embedding",
        ),
        GraphSpec(
            "image_tokens",
            (TensorSpec("pixel_values", FLOAT, ("tiles", 3, "image_size", "image_size")),),
            (TensorSpec("image_ids", "int64", ("tiles", "tile_tokens"), kind="index"),),
            "pixels -> an image tokenizer's codes as vocabulary ids (MMaDA's MAGVIT-v2), embedded by embed",
        ),
        GraphSpec(
            "step_zero",
            WINDOW_INPUTS,
            (TensorSpec("sparsity", "float32", ("batch", "answer"), kind="fraction"), PROBE_SCORE),
            "early exit: layers 0..k only -> the MLP statistic at layer k (and the probe's score where calibrated)",
        ),
        GraphSpec(
            "denoise",
            WINDOW_INPUTS,
            (X0, CONFIDENCE, P_END, LOG_MARGIN, NEG_ENTROPY),
            "one full-depth step: greedy x0, its log-probability, the end-token probability (step zero's fallback)",
        ),
        GraphSpec(
            "denoise_logits",
            WINDOW_INPUTS,
            (TensorSpec("logits", "float32", ("batch", "answer", "vocab")),),
            "one denoising step: suppressed logits, for sampling with temperature > 0 (seer-export --sampling)",
        ),
    )
}


GRAPH_NAMES = tuple(GRAPHS)


CACHED_GRAPHS = ("denoise", "denoise_logits")  # the window graphs: they take and return prompt K/V


PAST_WEIGHTS = TensorSpec("past_weights", "float32", ("history",))  # weight of each cached snapshot


def past_names(layer: int) -> tuple[str, str]:
    """The cached key and value inputs of decoder layer ``layer`` (ONNX Runtime GenAI's names)."""
    return f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"


def present_names(layer: int) -> tuple[str, str]:
    """The key and value outputs of decoder layer ``layer``: the prompt positions this call computed."""
    return f"present.{layer}.key", f"present.{layer}.value"


def step_outputs(spec: GraphSpec) -> tuple[str, ...]:
    """The outputs a step that refreshes no cache reads: all but the prompt's K/V (``present.*``)."""
    return tuple(t.name for t in spec.outputs if not t.name.startswith("present."))


def cache_specs(layers: int) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The cache inputs (``past_weights``, then key and value per layer) and outputs (key and value per layer)."""
    past = ("history", "batch", "kv_heads", "past", "head_dim")
    present = ("batch", "kv_heads", "prompt", "head_dim")
    inputs = [PAST_WEIGHTS] + [TensorSpec(n, FLOAT, past) for i in range(layers) for n in past_names(i)]
    outputs = [TensorSpec(n, FLOAT, present) for i in range(layers) for n in present_names(i)]
    return tuple(inputs), tuple(outputs)


def has_cache(spec: GraphSpec) -> bool:
    """True when the graph takes cached prompt K/V (exports of manifest schema 2.1 on)."""
    return any(t.name == PAST_WEIGHTS.name for t in spec.inputs)


SERVING_GRAPHS = ("embed", "vision", "step_zero", "denoise")  # what seer-export writes by default
IMAGE_GRAPHS = {"siglip": "vision", "magvitv2": "image_tokens"}  # a front end's graph (manifest vision.encoder)
# graphs exported in fp32 whatever the export's precision: image_tokens' codes are sign bits of the encoder's output,
# which fp16 rounding flips near zero (MMaDA runs its tokenizer in fp32)
FP32_GRAPHS = ("image_tokens",)


def graph_precision(name: str, precision: str) -> str:
    """The precision graph ``name`` is exported in, in an export of ``precision``."""
    return "float32" if name in FP32_GRAPHS else precision


def image_graph(encoder: str) -> str | None:
    """The graph that turns an image into what its placeholder becomes: features (``vision``) or ids; None for a
    text-only model (encoder "none")."""
    return IMAGE_GRAPHS.get(encoder)


def for_front_end(names: tuple[str, ...], encoder: str) -> tuple[str, ...]:
    """``names`` with the image graph of ``encoder`` for either front end's (``--graphs vision`` means the model's);
    a text-only model (``encoder`` "none", Dream) has none."""
    if encoder == "none":
        return tuple(n for n in names if n not in IMAGE_GRAPHS.values())
    return tuple(dict.fromkeys(image_graph(encoder) if n in IMAGE_GRAPHS.values() else n for n in names))


SAMPLING_GRAPHS = ("denoise_logits",)  # added by seer-export --sampling (temperature > 0, random remasking)


TOP_K = 64  # the most probable ids per position the window graph returns for host-side sampling


def top_k(vocab: int) -> int:
    """How many ids ``top_logits`` / ``top_ids`` hold: ``TOP_K``, at most half the vocabulary (so the suppressed
    ids, -inf at masked positions, never fill them)."""
    return max(1, min(TOP_K, vocab // 2))


def graph_specs(dims: Mapping[str, int], precision: str, names: tuple[str, ...] = SERVING_GRAPHS,
                probe: bool = False, cache: bool = True, scores: bool = False,
                top: bool = True) -> dict[str, GraphSpec]:  # fmt: skip
    """Concrete specs of the graphs ``names`` for a model with ``dims`` exported in ``precision``.

    Args:
        dims: a size for every name in MODEL_AXES.
        precision: "float32" or "float16".
        names: which graphs, in export order.
        probe: the calibration is a probe: ``step_zero`` also returns ``probe_score``.
        cache: the window graphs (CACHED_GRAPHS) take and return prompt K/V (``cache_specs``).
        scores: ``denoise`` also returns Dream's scores (``log_margin``, ``neg_entropy``): the family's loop ranks
            positions by one (``seer_export.models.families.ranks_by_score``).
        top: ``denoise`` also returns the ``top_k`` most probable ids per position and their (suppressed) logits,
            ``top_logits`` [batch, answer, k] float32 and ``top_ids`` int64, what the runtime samples from at
            temperature > 0 on an export without ``denoise_logits``.
    """
    missing = [a for a in MODEL_AXES if a not in dims]
    if missing:
        raise ConfigError(f"model dims lack {missing}; expected sizes for {MODEL_AXES}")
    if precision not in PRECISIONS.values():
        raise ConfigError(f"precision {precision!r} is not one of {tuple(PRECISIONS.values())}")
    unknown = [n for n in names if n not in GRAPHS]
    if unknown:
        raise ConfigError(f"unknown graph(s) {unknown}; choose from {GRAPH_NAMES}")
    specs = {n: GRAPHS[n] for n in names}
    if cache:
        extra_in, extra_out = cache_specs(dims["layers"])
        for n in CACHED_GRAPHS:
            if n in specs:
                g = specs[n]
                specs[n] = dataclasses.replace(g, inputs=g.inputs + extra_in, outputs=g.outputs + extra_out)
    specs = {n: g.resolve(graph_precision(n, precision), dims) for n, g in specs.items()}
    if "denoise" in specs and not scores:
        window = specs["denoise"]
        dropped = set(SCORE_OUTPUTS.values())
        specs["denoise"] = dataclasses.replace(
            window, outputs=tuple(t for t in window.outputs if t.name not in dropped)
        )
    if "denoise" in specs and top:
        window, k = specs["denoise"], top_k(dims["vocab"])
        head = tuple(t for t in window.outputs if not t.name.startswith("present."))
        tail = tuple(t for t in window.outputs if t.name.startswith("present."))
        sampled = (TensorSpec("top_logits", "float32", ("batch", "answer", k)),
                   TensorSpec("top_ids", "int64", ("batch", "answer", k), kind="index"))  # fmt: skip
        specs["denoise"] = dataclasses.replace(window, outputs=head + sampled + tail)
    if "step_zero" in specs and not probe:
        zero = specs["step_zero"]
        specs["step_zero"] = dataclasses.replace(
            zero, outputs=tuple(t for t in zero.outputs if t.name != "probe_score")
        )
    return specs


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """How close an exported output must be to PyTorch, per element.

    "value": |a - b| <= atol + rtol * max(|b|, rms of b's last axis): rounding error follows the size of the
    vector an element belongs to. "fraction": |a - b| <= atol. "index": equal, or a near-tie in the reference
    (the reference probability of a's choice within atol of b's). ``agreement``: share of elements that must pass.
    """

    atol: float
    rtol: float
    agreement: float = 1.0


# One table for every parity check: export (ONNX Runtime vs PyTorch) and later engines against the goldens.
# fp16 graphs are compared with the fp32 PyTorch reference, so their rows hold the fp16 rounding of the whole
# graph. A "fraction" (share of hidden units under a threshold) moves in steps of 1 / intermediate_size when a
# unit near the threshold flips, hence its own atol.
TOLERANCES: dict[tuple[str, Kind], Tolerance] = {
    ("float32", "value"): Tolerance(atol=1e-4, rtol=1e-3),
    ("float32", "fraction"): Tolerance(atol=5e-3, rtol=0.0),
    ("float32", "index"): Tolerance(atol=1e-4, rtol=0.0),
    ("float16", "value"): Tolerance(atol=5e-2, rtol=5e-2),
    ("float16", "fraction"): Tolerance(atol=5e-2, rtol=0.0),
    ("float16", "index"): Tolerance(atol=2e-2, rtol=0.0),
}


# End-to-end Seer generation through the graphs vs the PyTorch reference: share of equal answer tokens (the
# reference's positions through its first <|eot_id|>; guesses past the end flip under fp16 without changing any
# answer, and the whole-window figure is reported next to it).
TOKEN_AGREEMENT = {"float32": 1.0, "float16": 0.99}


def tolerance(precision: str, kind: Kind) -> Tolerance:
    """The row of TOLERANCES for an output of ``kind`` in a ``precision`` graph."""
    if (precision, kind) not in TOLERANCES:
        raise ConfigError(f"no tolerance for {kind!r} outputs of {precision!r} graphs; known: {sorted(TOLERANCES)}")
    return TOLERANCES[(precision, kind)]
