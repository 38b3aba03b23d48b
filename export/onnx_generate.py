"""Seer generation driven through the exported graphs with ONNX Runtime: the export's end-to-end check (DESIGN §4).

In:  an export folder (graphs + manifest), prompt ids with ``IMAGE_PLACEHOLDER`` slots and single pixel tiles.
Out: ``seer_export.sampler.Generation`` (tokens [B, N], L*, steps), to compare token by token with the
     PyTorch reference ``seer_export.seer.seer_generate``.

    ids ─► embed ─┐
    tile ► vision ┴► splice (features, image_newline) ─► left-pad ─► step zero (early exit, or full depth)
    ─► seer_trt.boundary.detect ─► L* ─► seer_trt.schedule.plan_schedule ─► denoise on max(L*) positions
       (a full-depth step zero's x0 / confidence serve as step 0) ─► top-k commits per step

numpy + onnxruntime only, mirroring ``seer_export.sampler.generate`` (greedy, ``low_confidence``): the window
is physically cut to the longest kept row, rows past their own L* are padding (segment 0). The runtime package
will carry the production loop; this one exists to prove the graphs reproduce the reference.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from seer_export.sampler import Generation
from seer_trt.boundary import detect
from seer_trt.config import GenerationConfig, SeerConfig
from seer_trt.errors import ConfigError
from seer_trt.manifest import Manifest
from seer_trt.preprocess import IMAGE_PLACEHOLDER
from seer_trt.schedule import plan_schedule

PROVIDER = "CPUExecutionProvider"


class OnnxGraphs:
    """ONNX Runtime sessions over an export folder, opened on first use, CPU only."""

    def __init__(self, folder: Path, manifest: Manifest) -> None:
        self.folder = Path(folder)
        self.manifest = manifest
        self.float = np.dtype(manifest.precision)  # dtype of float inputs: embeddings, pixels
        self._sessions: dict = {}

    def session(self, name: str):
        import onnxruntime as ort

        if name not in self._sessions:
            entry = self.manifest.graph(name)
            options = ort.SessionOptions()
            options.log_severity_level = 3
            sess = ort.InferenceSession(str(self.folder / entry.file), options, providers=[PROVIDER])
            if sess.get_providers()[0] != PROVIDER:  # onnxruntime-gpu may list providers it does not use (§11)
                raise ConfigError(f"{name}: ONNX Runtime runs on {sess.get_providers()}, expected {PROVIDER}")
            self._sessions[name] = sess
        return self._sessions[name]

    def run(self, name: str, **feeds: np.ndarray) -> dict[str, np.ndarray]:
        """Outputs of graph ``name`` by output name."""
        sess = self.session(name)
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(names, feeds), strict=True))

    def release(self) -> None:
        self._sessions.clear()


def window_layout(prefix_valid: np.ndarray, kept: np.ndarray, gen_length: int) -> tuple[np.ndarray, np.ndarray]:
    """``segment_ids`` [B, P + G] int32 and ``position_ids`` [B, P + G] int64 (``llada_v.window_layout``)."""
    gen_valid = np.arange(gen_length)[None] < np.asarray(kept)[:, None]  # [B, G]
    valid = np.concatenate([prefix_valid, gen_valid], axis=1)
    return valid.astype(np.int32), np.maximum(np.cumsum(valid, axis=1) - 1, 0).astype(np.int64)


def left_pad(prompts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """[P_i, D] prompts -> zero left-padded embeds [B, P, D] and validity [B, P] (``llada_v.left_pad_prompts``)."""
    longest = max(p.shape[0] for p in prompts)
    embeds = np.zeros((len(prompts), longest, prompts[0].shape[1]), dtype=prompts[0].dtype)
    valid = np.zeros((len(prompts), longest), dtype=bool)
    for b, p in enumerate(prompts):  # once per request, not in the step loop
        embeds[b, longest - p.shape[0] :] = p
        valid[b, longest - p.shape[0] :] = True
    return embeds, valid


def prompt_embeds(graphs: OnnxGraphs, ids: list[int], tiles: np.ndarray | None) -> np.ndarray:
    """[P, D] embeddings of one prompt: text through ``embed``, each placeholder through ``vision``.

    Single tiles, as ``LLaDAV.image_features`` takes them (``seer_export.fixture.TaskEncoder`` does): a tile's
    features, then ``image_newline`` under "unpad" merging. Anyres tiling is the runtime's job.
    """
    newline = graphs.manifest.vision.newline == "unpad"
    n_images = sum(1 for i in ids if i == IMAGE_PLACEHOLDER)
    if n_images != (0 if tiles is None else len(tiles)):
        raise ConfigError(f"prompt has {n_images} image placeholder(s) but {0 if tiles is None else len(tiles)} tiles")
    images: list[np.ndarray] = []
    if n_images:
        out = graphs.run("vision", pixel_values=tiles.astype(graphs.float))
        for feats in out["image_features"]:  # [T, D]
            images.append(np.concatenate([feats, out["image_newline"][None]]) if newline else feats)
    parts, text = [], []
    for i in [*ids, None]:
        if (i is None or i == IMAGE_PLACEHOLDER) and text:
            parts.append(graphs.run("embed", input_ids=np.array([text], dtype=np.int64))["embeds"][0])
            text = []
        if i == IMAGE_PLACEHOLDER:
            parts.append(images.pop(0))
        elif i is not None:
            text.append(i)
    return np.concatenate(parts)


def commit_top_k(confidence: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Boolean [B, N]: each row's ``k[b]`` most confident positions; ties go to the earlier position."""
    order = np.argsort(-confidence, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(order.shape[1])[None].repeat(order.shape[0], 0), axis=1)
    return rank < np.asarray(k)[:, None]


@dataclasses.dataclass(frozen=True)
class StepZero:
    profile: np.ndarray  # [B, N] the signal the calibration names
    step0: tuple[np.ndarray, np.ndarray] | None  # x0 [B, N], confidence [B, N] of a full-depth pass, else None


def step_zero(graphs: OnnxGraphs, prefix: np.ndarray, valid: np.ndarray, n: int, seer: SeerConfig) -> StepZero:
    """Run the step-zero graph the calibration needs over an all-mask window of ``n`` positions."""
    batch = prefix.shape[0]
    segment_ids, position_ids = window_layout(valid, np.full(batch, n), n)
    feeds = dict(
        prefix_embeds=prefix,
        gen_ids=np.full((batch, n), graphs.manifest.special_tokens.mask_id, dtype=np.int64),
        segment_ids=segment_ids,
        position_ids=position_ids,
    )
    if not seer.needs_full_depth(graphs.manifest.model.num_layers):
        return StepZero(graphs.run("step_zero", **feeds)["sparsity"], None)
    out = graphs.run("step_zero_full", **feeds)
    profile = out["p_end"] if seer.signal == "end_token_prob" else out["sparsity_layers"][:, seer.probe_layer]
    return StepZero(profile, (out["x0"], out["confidence"]))


def seer_generate(
    graphs: OnnxGraphs, prefix: np.ndarray, valid: np.ndarray, gen: GenerationConfig, seer: SeerConfig
) -> Generation:
    """Seer through the graphs: step zero, boundary, one-shot truncation, greedy denoising on the kept window.

    Args:
        graphs: sessions over the export.
        prefix: [B, P, D] left-padded prompt embeddings in the graphs' precision.
        valid: [B, P] bool, False on left padding.
        gen: generation settings; greedy with ``low_confidence`` remasking only.
        seer: the calibration the step-zero graphs were exported for.
    """
    if gen.temperature > 0 or gen.remasking != "low_confidence":
        raise ConfigError("the ONNX check runs greedy low_confidence decoding; set temperature 0")
    mask_id = graphs.manifest.special_tokens.mask_id
    batch, n = prefix.shape[0], gen.gen_length
    zero = step_zero(graphs, prefix, valid, n, seer)
    kept = detect(zero.profile, seer)  # [B] L*
    schedule = plan_schedule(gen, kept, batch)
    g = int(kept.max())  # the cut window: rows shorter than g are padded past their own L*
    segment_ids, position_ids = window_layout(valid, kept, g)
    positions = np.arange(g)[None]  # [1, g]
    x = np.full((batch, g), mask_id, dtype=np.int64)  # [B, g]
    for t in range(schedule.num_steps):
        masked = x == mask_id
        if t == 0 and zero.step0 is not None:  # a full-depth step zero already predicted step 0 (§4)
            x0, conf = (a[:, :g] for a in zero.step0)
        else:
            out = graphs.run("denoise", prefix_embeds=prefix, gen_ids=x, segment_ids=segment_ids,
                             position_ids=position_ids)  # fmt: skip
            x0, conf = out["x0"], out["confidence"]
        eligible = masked & (positions < schedule.block_end[:, t, None])
        conf = np.where(eligible, conf.astype(np.float64), -np.inf)
        commit = commit_top_k(conf, schedule.transfer[:, t]) & eligible
        x = np.where(commit, x0, x)
    tokens = np.full((batch, n), mask_id, dtype=np.int64)
    tokens[:, :g] = x
    return Generation(tokens=tokens, kept=schedule.kept, steps=schedule.steps)
