"""``manifest.json``: everything the runtime and the engine builder need to know about an export (docs/DESIGN.md "Graphs and their contract").

In:  an export folder written by ``seer-export`` (graphs, ``tokenizer/``, ``manifest.json``).
Out: ``Manifest``: model dims, vision preprocessing, special ids, tokenizer folder and system prompt, Seer
     calibration, generation defaults, each graph's file / I/O / precision, length buckets, engines per backend
     and what ``seer-build`` built (``EngineBuild``: TensorRT version, device, profiles, ONNX sha256 per plan),
     tool versions, and the parity report the export measured.

Versioned: ``schema_version`` "MAJOR.MINOR". A reader accepts its own major version and any minor (a newer
minor only adds keys, which are ignored); another major is refused with the fix (re-export). Every class is a
frozen dataclass with ``to_dict`` / ``from_dict``; ``Manifest.read`` / ``write`` do the JSON.
1.1 added ``builds`` (absent from 1.0 manifests, read as none). 1.2 added ``checksums`` (sha256 of every file the
graphs read, ``seer_trt.contracts.integrity``), the image limits of ``VisionInfo`` and the ``buckets`` a build planned its
profiles from (``EngineBuild``); absent from older manifests, read as none / the defaults. 2.0: one window graph
(``denoise`` gained ``p_end``; ``step_zero_full`` is gone), ``step_zero`` may return ``probe_score``, every graph
reads one shared weights file (``weights``), and the Seer calibration gained a probe signal and a detector: 1.x
exports are refused. 2.1: the window graphs (``denoise``, ``denoise_logits``) take a prompt K/V cache
(``past_weights``, ``past_key_values.{i}.key/value``) and return ``present.{i}.key/value``
(``seer_trt.contracts.graphs.cache_specs``); a 2.0 export runs with cache "none" only. 2.2: the window graphs
return ``log_confidence`` (the log-probability of ``x0``, fp32 headroom near 1) instead of ``confidence``, and the
generation defaults gained ``decoding`` and the model its fixture's ``task_family``; a 2.1 export's confidence is read as its log, its decoding as "fixed".
2.3: the model records its ``family`` ("llada-v", "lavida-llada", "mmada") and the vision front end its
``encoder`` and ``pool_stride`` (LaViDa pools each tile's features inside the ``vision`` graph; ``tokens_per_tile``
counts them after the pool), and where the image goes (``placement``, ``prefix_ids``, ``suffix_ids``: MMaDA's ids
come from the ``image_tokens`` graph, ahead of the question); absent from older manifests, read as LLaDA-V's.
2.4: the model records its ``logit_shift`` (1: Dream's, position i predicted from hidden state i - 1; a cached step
then computes each row's last prompt position), the vision encoder may be "none" (text only), and the generation
defaults may name Dream's ``schedule`` and its ``topk_margin`` / ``entropy`` remasking; absent: 0, "even".
2.5: the Seer calibration records its end tail (``tail``: the share of the cut-away positions kept after the window as
committed end tokens; ``tail_token``: "eot" or "endoftext"); absent: 0 (the paper's cut), "eot".
2.6: how a request's gen_length reshapes the window (``lengths``, ``WindowRule``) and the shapes the cost model's
calibration times (``cost_calibration``), written once by seer-export and read by both runtimes; absent: the rule
``model.loop_blocks`` and the generation defaults imply (``WindowRule.of``), ``CALIBRATION_SHAPES``. ``loop_blocks``
is still written, for 2.5 readers.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Literal

from seer_trt.contracts.config import CostCalibration, GenerationConfig, SeerConfig, SpecialTokens, WindowRule, is_whole
from seer_trt.contracts.confined import MAX_INDEX_BYTES, MAX_MANIFEST_BYTES, inside, read_bounded
from seer_trt.contracts.errors import ManifestError, SeerError
from seer_trt.contracts.graphs import GraphSpec, TensorSpec
from seer_trt.contracts.profiles import LengthBuckets, Profile

SCHEMA_VERSION = "2.6"
MANIFEST_FILE = "manifest.json"
TOKENIZER_DIR = "tokenizer"  # tokenizer.json + tokenizer_config.json (chat template), relative to the manifest
WEIGHTS_INDEX = "weights.json"  # name -> where in the shared weights file, one line per tensor


def _take(data: Any, cls: type, where: str, lenient: bool) -> dict[str, Any]:
    """The fields of dataclass ``cls`` from ``data``; a missing required key is an error, unknown keys only when
    not ``lenient`` (a manifest of our own minor version or older has no keys we do not know)."""
    if not isinstance(data, dict):
        raise ManifestError(f"{where} is a {type(data).__name__}, expected a JSON object")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    required = [
        n for n, f in fields.items() if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [n for n in required if n not in data]
    if missing:
        raise ManifestError(f"{where} lacks {missing}; the manifest is incomplete, re-export it with seer-export")
    unknown = sorted(set(data) - set(fields))
    if unknown and not lenient:
        raise ManifestError(f"{where} has unknown key(s) {unknown}; expected a subset of {sorted(fields)}")
    return {n: data[n] for n in fields if n in data}


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    name: str  # registry name (--model), e.g. "tiny-llada-v", "llada-v"
    architecture: str  # "llava_llada"
    hidden_size: int  # D
    intermediate_size: int  # SwiGLU width: the units the sparsity statistic averages over
    num_layers: int  # decoder layers
    num_heads: int
    vocab_size: int  # V
    task_family: str | None = None  # a fixture's synthetic task family (seer_trt.eval.tasks); None: the default's
    family: str = "llada-v"  # the model family (seer_export.models.families): "llada-v" | "lavida-llada" | "mmada"
    # a request's gen_length N: None keeps blocks of at most the default's; k splits N into k blocks (MMaDA's N / 4)
    loop_blocks: int | None = None
    # 1: position i's logits (and step zero's statistic) come from hidden state i - 1, the position before it in its
    # row (Dream); a cached step then computes each row's last prompt position with its answer (runtime.kv_cache)
    logit_shift: int = 0

    def __post_init__(self) -> None:
        dims = ("hidden_size", "intermediate_size", "num_layers", "num_heads", "vocab_size")
        bad = {d: getattr(self, d) for d in dims if not is_whole(getattr(self, d)) or getattr(self, d) < 1}
        if bad:
            raise ManifestError(f"model {bad}: expected whole numbers >= 1 (the exported model's dims); re-export "
                                f"with seer-export")  # fmt: skip
        k = self.loop_blocks
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ManifestError(f"model.loop_blocks is {k!r}; expected a whole number >= 1 or null")
        if self.logit_shift not in (0, 1):
            raise ManifestError(f"model.logit_shift {self.logit_shift!r} is not 0 or 1; upgrade seer-trt or re-export")


@dataclasses.dataclass(frozen=True)
class VisionInfo:
    """How the runtime turns an image into ``vision`` graph inputs and splices its features into the prompt."""

    image_size: int  # S: tiles are S x S px
    patch_size: int  # px per patch side
    tokens_per_tile: int  # T features per tile from the vision graph: (S / patch)^2, or fewer after a pool
    image_aspect_ratio: str  # "pad": one tile per image; "anyres" / "anyres_max_N": LLaVA-OneVision tiling
    patch_merge_type: str  # "spatial_unpad" (LLaDA-V) or "flat"
    grid_pinpoints: tuple[tuple[int, int], ...]  # anyres candidate (width, height) px resolutions
    anyres_max_tiles: int | None  # N of anyres_max_N, None otherwise
    newline: str  # "unpad": image_newline after a single tile's features and after each anyres map row; "none"
    # "siglip": the vision graph's tower (SigLIP / SigLIP2); "magvitv2": image_tokens' ids; "none": text only (Dream)
    encoder: str = "siglip"
    pool_stride: int = 1  # 1: no pool; s: each tile's map bilinearly pooled to ceil(side / s) a side, in the graph
    # "inline": the image where <image> stands in the user's message; "before_prompt": prefix_ids, the image,
    # suffix_ids, then the chat-templated question without it (MMaDA's <|mmu|><|soi|> ids <|eoi|>)
    placement: str = "inline"
    prefix_ids: tuple[int, ...] = ()
    suffix_ids: tuple[int, ...] = ()
    pixel_mean: float = 0.5  # pixels: (x / 255 - mean) / std per channel
    pixel_std: float = 0.5
    max_image_pixels: int = 50_000_000  # an image with more (width x height, from its header) is refused undecoded
    max_image_bytes: int = 50 * 2**20  # an encoded image file larger than this is refused unread
    # most pixels an image may decode to (after a JPEG's reduced-scale decode); None: what the tiling can use,
    # ``seer_trt.runtime.image.decoded_pixel_limit``
    max_decoded_pixels: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "grid_pinpoints", tuple(tuple(int(v) for v in p) for p in self.grid_pinpoints))
        if self.newline not in ("none", "unpad"):
            raise ManifestError(f"vision.newline {self.newline!r} is not one of 'none', 'unpad'")
        if self.encoder not in ("siglip", "magvitv2", "none") or self.placement not in ("inline", "before_prompt"):
            raise ManifestError(f"vision encoder {self.encoder!r} / placement {self.placement!r}: expected 'siglip', "
                                f"'magvitv2' or 'none', 'inline' or 'before_prompt'; upgrade seer-trt or re-export")  # fmt: skip
        object.__setattr__(self, "prefix_ids", tuple(int(i) for i in self.prefix_ids))
        object.__setattr__(self, "suffix_ids", tuple(int(i) for i in self.suffix_ids))


@dataclasses.dataclass(frozen=True)
class GraphEntry:
    """One exported graph: its ONNX file and its contract (``seer_trt.contracts.graphs``) in concrete form."""

    spec: GraphSpec  # name, inputs and outputs with concrete dtypes and the dynamic axes by name
    file: str  # ONNX file, relative to the manifest
    precision: str  # "float32" | "float16": the dtype of weights and activations (statistics stay float32)
    opset: int  # ONNX default-domain opset
    external_data: str | None  # weights file next to ``file`` when the graph was saved with external data
    size_bytes: int  # weights, as stored
    # seer-quantize's record when the graph's weights were quantized: scheme ("int8" | "int4" | "trt-int8" |
    # "trt-fp8" | "trt-int4"), runtime ("onnxruntime-cpu" | "tensorrt": what runs its quantized ops), tool, method,
    # calibration (trt-*), check; None: as exported. An optional key: a 2.2 reader that lacks it ignores it.
    quantization: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "file": self.file,
            "precision": self.precision,
            "opset": self.opset,
            "external_data": self.external_data,
            "size_bytes": self.size_bytes,
            "summary": self.spec.summary,
            "inputs": [t.to_dict() for t in self.spec.inputs],
            "outputs": [t.to_dict() for t in self.spec.outputs],
        }
        if self.quantization is not None:
            out["quantization"] = dict(self.quantization)
        return out

    @classmethod
    def from_dict(cls, name: str, data: Any, lenient: bool) -> GraphEntry:
        where = f"manifest graphs.{name}"
        if not isinstance(data, dict):
            raise ManifestError(f"{where} is a {type(data).__name__}, expected a JSON object")
        keys = ("file", "precision", "opset", "external_data", "size_bytes", "inputs", "outputs")
        missing = [k for k in keys if k not in data]
        if missing:
            raise ManifestError(f"{where} lacks {missing}; the manifest is incomplete, re-export it with seer-export")
        try:
            spec = GraphSpec(
                name=name,
                inputs=tuple(TensorSpec.from_dict(t) for t in data["inputs"]),
                outputs=tuple(TensorSpec.from_dict(t) for t in data["outputs"]),
                summary=data.get("summary", ""),
            )
        except (KeyError, TypeError) as err:
            raise ManifestError(f"{where}: malformed inputs/outputs ({err!r}); re-export it with seer-export") from None
        quantization = data.get("quantization")
        if quantization is not None and not (isinstance(quantization, dict) and isinstance(quantization.get("scheme"),
                                                                                             str)):  # fmt: skip
            raise ManifestError(f"{where}: quantization is {quantization!r}, expected an object with a 'scheme'; "
                                f"re-run seer-quantize")  # fmt: skip
        return cls(spec, data["file"], data["precision"], int(data["opset"]), data["external_data"], data["size_bytes"],
                   quantization)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class StoredTensor:
    """Where one tensor lies in the shared weights file."""

    offset: int  # bytes from the file's start
    length: int  # bytes
    dtype: str  # numpy dtype name
    shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class WeightsInfo:
    """The one external-data file every graph of the export reads its tensors from, each tensor stored once."""

    file: str  # relative to the manifest (seer_trt.contracts.graphs.WEIGHTS_FILE)
    index: str  # JSON index beside it: tensor name -> StoredTensor (WEIGHTS_INDEX)
    size_bytes: int  # of the file, alignment padding included
    tensors: int  # tensors in it


def write_weights_index(path: Path, index: dict[str, StoredTensor]) -> None:
    """The index as JSON, one tensor per line: ``{"NAME": [offset, length, "dtype", [shape]], ...}``."""
    rows = [f"  {json.dumps(name)}: {json.dumps([t.offset, t.length, t.dtype, list(t.shape)])}"
            for name, t in index.items()]  # fmt: skip
    path.write_text("{\n" + ",\n".join(rows) + "\n}\n")


def read_weights_index(folder: str | Path, info: WeightsInfo) -> dict[str, StoredTensor]:
    """The shared weights file's index.

    Raises:
        ManifestError: the index is missing or malformed.
    """
    path = inside(folder, info.index, "weights.index")
    try:
        data = json.loads(read_bounded(path, folder, "weights.index", MAX_INDEX_BYTES))
        return {n: StoredTensor(int(o), int(k), str(d), tuple(int(v) for v in s)) for n, (o, k, d, s) in data.items()}
    except FileNotFoundError:
        raise ManifestError(f"{path} (the shared weights' index) is missing; re-export with seer-export") from None
    except (OSError, ValueError, TypeError, AttributeError) as err:
        raise ManifestError(f"{path} is not a weights index ({err}); re-export with seer-export") from None


@dataclasses.dataclass(frozen=True)
class Versions:
    seer_trt: str
    torch: str
    onnx: str
    onnxscript: str
    onnxruntime: str
    opset: int


@dataclasses.dataclass(frozen=True)
class ParityRow:
    """One output of one graph on one input case, exported graph vs PyTorch."""

    graph: str
    output: str
    case: str  # which inputs, e.g. "b3 p12 g9 left-padded", "packed 2 rows"
    kind: str  # "value" | "fraction" | "index" (seer_trt.contracts.graphs.TensorSpec.kind)
    max_abs: float  # max |onnx - torch|; "index": the largest reference-probability gap of a differing choice
    max_rel: float  # max |onnx - torch| / |torch| over elements with |torch| > atol (0 when none)
    agreement: float  # share of elements within tolerance ("index": equal or a near-tie, seer_trt.contracts.graphs)
    atol: float
    rtol: float
    required: float  # agreement required: 1.0 except for "index" outputs
    passed: bool


@dataclasses.dataclass(frozen=True)
class EndToEnd:
    """A full Seer generation through the exported graphs vs the PyTorch reference ``seer_generate``."""

    samples: int  # held-out prompts of the fixture task
    seed: int  # their seed (seer_trt.eval.tasks.make_samples)
    gen_length: int
    steps: int
    detector: str  # the Seer setting used (its label and signal)
    token_agreement: float  # share of equal answer tokens: the reference's positions through its first <|eot_id|>
    window_agreement: float  # share of equal tokens over the whole window, after the answer included
    answer_match: float  # share of rows whose answer (through the first <|eot_id|>) is identical
    kept_agreement: float  # share of rows with the same L*
    required: float  # token agreement required for this precision (seer_trt.contracts.graphs.TOKEN_AGREEMENT)
    passed: bool


@dataclasses.dataclass(frozen=True)
class ParityReport:
    status: Literal["passed", "failed", "skipped"]
    reference: str  # what the graphs were compared with, e.g. "PyTorch float32, ONNX Runtime CPUExecutionProvider"
    rows: tuple[ParityRow, ...] = ()
    end_to_end: EndToEnd | None = None
    note: str = ""  # why it was skipped, or what failed

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reference": self.reference,
            "rows": [dataclasses.asdict(r) for r in self.rows],
            "end_to_end": None if self.end_to_end is None else dataclasses.asdict(self.end_to_end),
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, data: Any, lenient: bool) -> ParityReport:
        kw = _take(data, cls, "manifest parity", lenient)
        kw["rows"] = tuple(ParityRow(**_take(r, ParityRow, "manifest parity row", lenient)) for r in kw.get("rows", ()))
        e2e = kw.get("end_to_end")
        kw["end_to_end"] = None if e2e is None else EndToEnd(**_take(e2e, EndToEnd, "manifest end_to_end", lenient))
        return cls(**kw)


@dataclasses.dataclass(frozen=True)
class EngineFile:
    """One TensorRT plan: one graph's engine holding all its optimization profiles (weights once)."""

    file: str  # the plan, relative to the manifest
    onnx_sha256: str  # of the graph's .onnx file followed by its external data: the ONNX it was built from
    profiles: tuple[Profile, ...]  # in the engine's profile-index order (seer_trt.contracts.profiles)
    size_bytes: int  # of the plan
    seconds: float  # build time

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "profiles": [p.to_dict() for p in self.profiles]}

    @classmethod
    def from_dict(cls, data: Any, where: str, lenient: bool) -> EngineFile:
        kw = _take(data, cls, where, lenient)
        kw["profiles"] = tuple(Profile.from_dict(p) for p in kw["profiles"])
        return cls(**kw)


@dataclasses.dataclass(frozen=True)
class EngineBuild:
    """What ``seer-build`` built with one TensorRT flavour. Plans run only under the same TensorRT version on the
    same kind of GPU, so the runtime compares these with its own before loading any plan."""

    builder: str  # "tensorrt" (data-centre and any CUDA GPU) | "tensorrt-rtx" (RTX GPUs; builds without one)
    version: str  # the builder library's version
    device: str  # the GPU built on, e.g. "NVIDIA H200"; "" when built without one (TensorRT-RTX ahead of time)
    compute_capability: str  # e.g. "9.0"; "" when built without a GPU
    timing_cache: str | None  # the timing cache used and updated (absolute, or relative to the manifest)
    built_at: str  # UTC, ISO 8601
    engines: dict[str, EngineFile]  # graph -> its plan
    buckets: LengthBuckets | None = None  # the sizes the profiles were planned from (None: built before 1.2)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "engines": {g: e.to_dict() for g, e in self.engines.items()},
                "buckets": None if self.buckets is None else self.buckets.to_dict()}  # fmt: skip

    @classmethod
    def from_dict(cls, name: str, data: Any, lenient: bool) -> EngineBuild:
        where = f"manifest builds.{name}"
        kw = _take(data, cls, where, lenient)
        if not isinstance(kw["engines"], dict):
            raise ManifestError(f"{where}.engines is a {type(kw['engines']).__name__}, expected a JSON object")
        kw["engines"] = {g: EngineFile.from_dict(e, f"{where}.engines.{g}", lenient) for g, e in kw["engines"].items()}
        if kw.get("buckets") is not None:
            kw["buckets"] = LengthBuckets.from_dict(_take(kw["buckets"], LengthBuckets, f"{where}.buckets", lenient))
        return cls(**kw)


@dataclasses.dataclass(frozen=True)
class Manifest:
    schema_version: str  # "MAJOR.MINOR"; SCHEMA_VERSION when written by this version
    model: ModelInfo
    vision: VisionInfo
    special_tokens: SpecialTokens  # ids of the model's tokenizer; the graphs bake mask / suppressed ids from these
    tokenizer: str  # folder relative to the manifest: tokenizer.json + tokenizer_config.json (chat template)
    system_prompt: str | None  # default system message of the chat format, None for none
    seer: SeerConfig  # the calibration the step-zero graphs were exported for (statistic, probe layer)
    generation: GenerationConfig  # defaults: gen_length, steps, block_length, temperature, remasking
    precision: str  # "float32" | "float16"
    graphs: dict[str, GraphEntry]  # graph name -> entry, in export order
    buckets: LengthBuckets
    versions: Versions
    parity: ParityReport
    weights: WeightsInfo | None = None  # the shared weights file (None: every graph holds its weights inline)
    engines: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)  # backend -> graph -> file
    builds: dict[str, EngineBuild] = dataclasses.field(default_factory=dict)  # builder -> what seer-build built
    checksums: dict[str, str] = dataclasses.field(default_factory=dict)  # file the graphs read -> its sha256
    # how a request's gen_length reshapes the window; None: what model.loop_blocks and the defaults imply
    lengths: WindowRule | None = None
    cost_calibration: CostCalibration = CostCalibration()  # what the cost_model policy times

    def __post_init__(self) -> None:
        if self.lengths is None:
            object.__setattr__(self, "lengths", WindowRule.of(self.generation, self.model.loop_blocks))
        self.check_bounds()

    def check_bounds(self) -> None:
        """What the manifest says of its ids and layers lies inside its own model (docs/DESIGN.md "Bounds and output
        folders"): every special id and image marker id a row of the vocabulary, the Seer probe layer one of the
        model's layers. The C++ runtime refuses the same (cpp/src/manifest.cpp).

        Raises:
            ManifestError: naming the value, the range it must lie in, and the fix.
        """
        vocab, layers = self.model.vocab_size, self.model.num_layers
        outside = {k: v for k, v in self.special_tokens.to_dict().items() if v >= vocab}
        if outside:
            raise ManifestError(f"special_tokens {outside} lie outside the vocabulary [0, {vocab}) (model.vocab_size); "
                                f"the tokenizer and the graphs come from different models: re-export with "
                                f"seer-export")  # fmt: skip
        markers = [i for i in (*self.vision.prefix_ids, *self.vision.suffix_ids) if not 0 <= i < vocab]
        if markers:
            raise ManifestError(f"vision image marker ids {markers} (prefix_ids, suffix_ids) lie outside the vocabulary "
                                f"[0, {vocab}) (model.vocab_size); re-export with seer-export")  # fmt: skip
        if not self.seer.probe_layer < layers:
            raise ManifestError(f"seer.probe_layer {self.seer.probe_layer} is not a layer of the model: expected 0 <= "
                                f"probe_layer < {layers} (model.num_layers); re-calibrate with seer-calibrate "
                                f"--write, or re-export with seer-export")  # fmt: skip

    def graph(self, name: str) -> GraphEntry:
        """The entry of graph ``name``.

        Raises:
            ManifestError: the export does not hold that graph.
        """
        if name not in self.graphs:
            how = "seer-export --sampling" if name == "denoise_logits" else f"seer-export --graphs ... {name}"
            raise ManifestError(
                f"this export has no {name!r} graph (it has {sorted(self.graphs)}); re-export with {how}"
            )
        return self.graphs[name]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "model": dataclasses.asdict(self.model),
            "vision": {
                **dataclasses.asdict(self.vision),
                "grid_pinpoints": [list(p) for p in self.vision.grid_pinpoints],
            },
            "special_tokens": self.special_tokens.to_dict(),
            "tokenizer": self.tokenizer,
            "system_prompt": self.system_prompt,
            "seer": self.seer.to_dict(),
            "generation": self.generation.to_dict(),
            "precision": self.precision,
            "graphs": {name: g.to_dict() for name, g in self.graphs.items()},
            "buckets": self.buckets.to_dict(),
            "versions": dataclasses.asdict(self.versions),
            "parity": self.parity.to_dict(),
            "weights": None if self.weights is None else dataclasses.asdict(self.weights),
            "engines": {k: dict(v) for k, v in self.engines.items()},
            "builds": {k: b.to_dict() for k, b in self.builds.items()},
            "checksums": dict(self.checksums),
            "lengths": self.lengths.to_dict(),
            "cost_calibration": self.cost_calibration.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = MANIFEST_FILE) -> Manifest:
        """Parse a manifest, refusing a schema major version other than this reader's.

        Raises:
            ManifestError: another major version, a missing key or a malformed value; the message names it.
        """
        if not isinstance(data, dict):
            raise ManifestError(f"{where} holds a {type(data).__name__}, expected a JSON object")
        lenient = _check_version(data.get("schema_version"), where)
        kw = _take(data, cls, where, lenient)
        try:
            kw["model"] = ModelInfo(**_take(kw["model"], ModelInfo, "manifest model", lenient))
            kw["vision"] = VisionInfo(**_take(kw["vision"], VisionInfo, "manifest vision", lenient))
            kw["special_tokens"] = SpecialTokens(
                **_take(kw["special_tokens"], SpecialTokens, "manifest special_tokens", lenient)
            )
            kw["seer"] = SeerConfig.from_dict(_take(kw["seer"], SeerConfig, "manifest seer", lenient))
            kw["generation"] = GenerationConfig.from_dict(
                _take(kw["generation"], GenerationConfig, "manifest generation", lenient)
            )
            if not isinstance(kw["graphs"], dict):
                raise ManifestError(f"{where}: graphs is a {type(kw['graphs']).__name__}, expected a JSON object")
            kw["graphs"] = {n: GraphEntry.from_dict(n, g, lenient) for n, g in kw["graphs"].items()}
            kw["buckets"] = LengthBuckets.from_dict(_take(kw["buckets"], LengthBuckets, "manifest buckets", lenient))
            kw["versions"] = Versions(**_take(kw["versions"], Versions, "manifest versions", lenient))
            kw["parity"] = ParityReport.from_dict(kw["parity"], lenient)
            if kw.get("weights") is not None:
                kw["weights"] = WeightsInfo(**_take(kw["weights"], WeightsInfo, "manifest weights", lenient))
            kw["engines"] = {str(k): dict(v) for k, v in kw.get("engines", {}).items()}
            kw["builds"] = {str(k): EngineBuild.from_dict(k, v, lenient) for k, v in kw.get("builds", {}).items()}
            sums = kw.get("checksums", {})
            if not isinstance(sums, dict) or not all(isinstance(v, str) for v in sums.values()):
                raise ManifestError(
                    f"{where}: checksums is not an object of file -> sha256; re-export with seer-export"
                )
            kw["checksums"] = {str(k): v for k, v in sums.items()}
            if kw.get("lengths") is not None:  # absent before 2.6: __post_init__ derives it
                kw["lengths"] = WindowRule.from_dict(_take(kw["lengths"], WindowRule, "manifest lengths", lenient))
            if kw.get("cost_calibration") is None:  # absent before 2.6 (or null): the default shapes
                kw.pop("cost_calibration", None)
            else:
                kw["cost_calibration"] = CostCalibration.from_dict(
                    _take(kw["cost_calibration"], CostCalibration, "manifest cost_calibration", lenient)
                )
            return cls(**kw)
        except ManifestError as err:
            raise ManifestError(err if str(err).startswith(where) else f"{where}: {err}") from None
        except SeerError as err:  # a config value out of range: name the file
            raise ManifestError(f"{where}: {err}") from None
        except (TypeError, ValueError, AttributeError) as err:
            raise ManifestError(f"{where}: malformed value ({err}); re-export it with seer-export") from None

    @classmethod
    def read(cls, folder: str | Path) -> Manifest:
        """Read ``folder/manifest.json``.

        Raises:
            ManifestError: no manifest, unreadable JSON, an unsupported schema version, or malformed content.
        """
        path = Path(folder) / MANIFEST_FILE
        if not path.exists():
            found = "it does not exist" if not Path(folder).is_dir() else f"it holds no {MANIFEST_FILE}"
            raise ManifestError(
                f"{folder} is not an export folder ({found}); create one with `seer-export --out {folder}`"
            )
        try:
            data = json.loads(read_bounded(inside(folder, MANIFEST_FILE, "manifest"), folder, "the manifest",
                                           MAX_MANIFEST_BYTES))  # fmt: skip
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ManifestError(f"{path} is not readable JSON ({err}); re-export with seer-export") from None
        manifest = cls.from_dict(data, str(path))
        manifest.check_paths(folder)
        return manifest

    def paths(self) -> list[tuple[str, str]]:
        """(entry, path) of every file or folder the manifest names, relative to its folder."""
        out = [("tokenizer", self.tokenizer)]
        for name, g in self.graphs.items():
            out.append((f"graphs.{name}.file", g.file))
            if g.external_data is not None:
                out.append((f"graphs.{name}.external_data", g.external_data))
        if self.weights is not None:
            out += [("weights.file", self.weights.file), ("weights.index", self.weights.index)]
        out += [(f"engines.{b}.{g}", f.get("file") if isinstance(f, dict) else f)  # a plan: a name or {file, profiles}
                for b, files in self.engines.items() for g, f in files.items()]  # fmt: skip
        out += [(f"builds.{b}.engines.{g}.file", e.file) for b, build in self.builds.items()
                for g, e in build.engines.items()]  # fmt: skip
        out += [(f"checksums.{f}", f) for f in self.checksums]
        return out

    def check_paths(self, folder: str | Path) -> None:
        """Every path the manifest names lies inside ``folder`` (``seer_trt.contracts.confined.inside``).

        Raises:
            ManifestError: naming the first entry that does not.
        """
        for entry, name in self.paths():
            inside(folder, name, entry)

    def write(self, folder: str | Path) -> Path:
        """Write ``folder/manifest.json``; returns its path."""
        path = Path(folder) / MANIFEST_FILE
        text = json.dumps(self.to_dict(), indent=2)
        text = _FLAT_LIST.sub(lambda m: "[" + ", ".join(v.strip() for v in m.group(1).split(",\n")) + "]", text)
        path.write_text(text + "\n")
        return path


# An innermost JSON list (shapes, pinpoint pairs) on one line, so the manifest stays readable.
_FLAT_LIST = re.compile(r"\[\n\s+([^\[\]{}]+?)\n\s+\]")


def _check_version(found: Any, where: str) -> bool:
    """Accept our major version; returns True for a newer minor (whose extra keys are then ignored)."""
    major, minor = (int(v) for v in SCHEMA_VERSION.split("."))
    try:
        f_major, f_minor = (int(v) for v in str(found).split("."))
    except ValueError:
        raise ManifestError(
            f"{where}: schema_version {found!r} is not 'MAJOR.MINOR' (expected {SCHEMA_VERSION}); re-export with "
            f"seer-export"
        ) from None
    if f_major != major:
        fix = "upgrade seer-trt, or re-export" if f_major > major else "re-export it"
        raise ManifestError(
            f"{where}: schema_version {found} is not supported (this seer-trt reads {major}.x, "
            f"expected {SCHEMA_VERSION}); {fix} with this version's seer-export"
        )
    return f_minor > minor
