"""Optimization profiles: the size ranges each TensorRT engine accepts, planned from the length buckets (DESIGN "Engines and profiles").

In:  the graphs' specs (``seer_trt.contracts.graphs``), the manifest's ``LengthBuckets`` (or ``--profiles`` overrides),
     the vision tiles of one image, and which axes get one profile per bucket (``split``, default the answer).
Out: ``ProfilePlan``: per graph its engine's ``Profile``s, each a min/opt/max ``Range`` per dynamic axis. The
     builder adds them in this order, the manifest records them, the TensorRT backend opens one execution context
     per profile and picks the nearest covering one per call (``select_profile``), the Triton generator reads the
     same records: one source of truth.

Seer changes the answer window per group of rows, so by default every answer bucket B_i gets its own profile
covering (B_{i-1}, B_i] with opt = B_i (static calls are padded up to B_i, the shape TensorRT should tune for);
batch and prompt span 1 .. their largest bucket with opt at the middle bucket. ``seq`` is not planned: it is
past + prompt + answer in every graph (``segment_ids`` [B, C + P + G]), so its range is the sum of theirs, which is
also what TensorRT's shape checks demand of min, opt and max.

    buckets answer (16, 32, 64)  ->  profile 0: answer 1..16 opt 16 | 1: 17..32 opt 32 | 2: 33..64 opt 64

A window graph with the prompt K/V cache (``past`` and ``history`` axes, docs/DESIGN.md "Prompt K/V cache") is called in two
shapes, so each of its answer ranges gets two profiles: one that computes the prompt (prompt 1..P, past 0, one
snapshot: every step of the exact loop and the cache's refreshes) and one cached step (prompt 0, past 1..P, 1 ..
MAX_SNAPSHOTS snapshots). A zero-length axis is an empty tensor, which TensorRT accepts when the profile's range
includes 0.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from seer_trt.contracts.errors import ConfigError

PLANNED_AXES = ("batch", "prompt", "answer", "past", "history", "tiles", "tokens")  # dynamic axes with ranges
MAX_SNAPSHOTS = 3  # cached K/V snapshots a cached step may take (seer_trt.runtime.kv_cache: forecast order 2)
SPLIT_AXES = ("batch", "prompt", "answer")  # axes that can get one profile per bucket
DEFAULT_SPLIT = ("answer",)


@dataclasses.dataclass(frozen=True)
class Range:
    """The sizes one dynamic axis takes under a profile."""

    min: int  # smallest size accepted (0: the tensor may be empty)
    opt: int  # the size TensorRT tunes its kernels for
    max: int  # largest size accepted

    def __post_init__(self) -> None:
        if not 0 <= self.min <= self.opt <= self.max:
            raise ConfigError(f"profile range min {self.min} / opt {self.opt} / max {self.max}: expected "
                              f"0 <= min <= opt <= max")  # fmt: skip

    def __add__(self, other: Range) -> Range:
        return Range(self.min + other.min, self.opt + other.opt, self.max + other.max)

    def covers(self, size: int) -> bool:
        return self.min <= size <= self.max


@dataclasses.dataclass(frozen=True)
class Profile:
    """One optimization profile of one engine: a ``Range`` per planned dynamic axis of the graph."""

    ranges: tuple[tuple[str, Range], ...]  # (axis, range) in PLANNED_AXES order; ``seq`` is prompt + answer

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranges", tuple((a, r) for a, r in self.ranges))
        unknown = [a for a, _ in self.ranges if a not in PLANNED_AXES]
        if unknown:
            raise ConfigError(f"profile axes {unknown} are not planned axes; expected some of {PLANNED_AXES}")

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.ranges)

    def range(self, axis: str) -> Range:
        """The range of ``axis``; ``seq`` is derived as (past +) prompt + answer."""
        if axis == "seq":
            seq = self.range("prompt") + self.range("answer")
            return seq + self.range("past") if "past" in self.axes else seq
        for a, r in self.ranges:
            if a == axis:
                return r
        raise ConfigError(f"this profile has no {axis!r} axis; it plans {list(self.axes)}")

    def covers(self, sizes: Mapping[str, int]) -> bool:
        """True when every planned axis's size in ``sizes`` lies inside its range."""
        return all(r.covers(sizes[a]) for a, r in self.ranges if a in sizes)

    def distance(self, sizes: Mapping[str, int]) -> float:
        """How far a call's sizes lie from the shape TensorRT tuned for: sum of |log2(size / opt)| (an empty axis
        counts as size 1/2)."""
        return sum(abs(math.log2((sizes[a] or 0.5) / (r.opt or 0.5))) for a, r in self.ranges if a in sizes)

    def shapes(self, inputs: Sequence[tuple[str, tuple[str | int, ...]]]) -> dict[str, tuple[tuple[int, ...], ...]]:
        """(min, opt, max) shape per input, for ``IOptimizationProfile.set_shape``.

        Args:
            inputs: (name, shape) per graph input, axes symbolic (dynamic) or fixed sizes (a ``GraphSpec``'s).
        """
        out = {}
        for name, shape in inputs:
            ranges = [self.range(a) if isinstance(a, str) else Range(a, a, a) for a in shape]
            out[name] = tuple(tuple(getattr(r, k) for r in ranges) for k in ("min", "opt", "max"))
        return out

    def label(self) -> str:
        """One line, e.g. ``batch 1..16 (opt 4), prompt 1..512 (opt 128), answer 17..32 (opt 32)``."""
        return ", ".join(f"{a} {r.min}..{r.max} (opt {r.opt})" for a, r in self.ranges)

    def to_dict(self) -> dict[str, list[int]]:
        return {a: [r.min, r.opt, r.max] for a, r in self.ranges}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        if not isinstance(data, Mapping):
            raise ConfigError(f"a profile is a {type(data).__name__}, expected {{axis: [min, opt, max]}}")
        try:
            return cls(tuple((str(a), Range(*(int(v) for v in r))) for a, r in data.items()))
        except TypeError:
            raise ConfigError(f"malformed profile {dict(data)}; expected {{axis: [min, opt, max]}}") from None


@dataclasses.dataclass(frozen=True)
class ProfilePlan:
    """Every engine's profiles, and what they were planned from."""

    buckets: LengthBuckets  # the sizes planned from: the manifest's, or ``--profiles`` overrides
    split: tuple[str, ...]  # axes with one profile per bucket; the others span all their buckets in one range
    max_tiles: int  # vision tiles of one image (1 for "pad", base tile + the largest anyres grid otherwise): opt
    graphs: dict[str, tuple[Profile, ...]]  # graph -> its engine's profiles, in profile-index order

    def profiles(self, graph: str) -> tuple[Profile, ...]:
        if graph not in self.graphs:
            raise ConfigError(f"no profiles planned for graph {graph!r}; planned: {sorted(self.graphs)}")
        return self.graphs[graph]

    def describe(self) -> str:
        """The plan as text: one line per profile, under its graph."""
        lines = [f"profiles from buckets {self.buckets.to_dict()}, one per bucket of {list(self.split)}, "
                 f"{self.max_tiles} tile(s) per image"]  # fmt: skip
        for graph, profiles in self.graphs.items():
            lines.append(f"{graph}: {len(profiles)} profile(s)")
            lines += [f"  [{i}] {p.label()}" for i, p in enumerate(profiles)]
        return "\n".join(lines)


def _ranges(sizes: Sequence[int], split: bool) -> list[Range]:
    """One range per bucket (``split``), or one range 1 .. largest with opt at the middle bucket."""
    if split:
        return [Range(lo + 1, hi, hi) for lo, hi in zip((0, *sizes[:-1]), sizes, strict=True)]
    return [Range(1, sizes[(len(sizes) - 1) // 2], sizes[-1])]


def plan_profiles(
    inputs: Mapping[str, Sequence[tuple[str, tuple[str | int, ...]]]],
    buckets: LengthBuckets,
    max_tiles: int = 1,
    split: Sequence[str] = DEFAULT_SPLIT,
    logit_shift: int = 0,
) -> ProfilePlan:
    """Plan the profiles of each graph's engine.

    Args:
        inputs: graph -> (input name, shape) per input, as in its ``GraphSpec`` (``[(t.name, t.shape) ...]``).
        buckets: batch, prompt and answer sizes; text spans (``tokens``) are at most a prompt.
        max_tiles: vision tiles of one image (``tiles_per_image``).
        split: axes that get one profile per bucket (cross product when several); at most SPLIT_AXES.
        logit_shift: the manifest's ``model.logit_shift``: 1 (Dream) gives a cached step's call a prompt of the rows'
            last prompt positions (one column padded, one per row packed; ``seer_trt.runtime.kv_cache``), not 0.

    Raises:
        ConfigError: an unknown split axis, or a graph with a dynamic axis no bucket plans.
    """
    split = tuple(dict.fromkeys(split))
    bad = [a for a in split if a not in SPLIT_AXES]
    if bad:
        raise ConfigError(f"cannot split profiles on {bad}; choose from {SPLIT_AXES}")
    if max_tiles < 1:
        raise ConfigError(f"max_tiles must be >= 1, got {max_tiles}")
    sources = {"batch": buckets.batch, "prompt": buckets.prompt, "answer": buckets.answer, "tokens": buckets.prompt}
    graphs = {}
    for graph, tensors in inputs.items():
        axes = {a for _, shape in tensors for a in shape if isinstance(a, str) and a != "seq"}
        unknown = sorted(axes - set(PLANNED_AXES))
        if unknown:
            raise ConfigError(f"graph {graph!r} has dynamic axes {unknown} that no bucket plans ({PLANNED_AXES})")
        cached = "past" in axes
        options = []
        for axis in (a for a in PLANNED_AXES if a in axes):
            if axis == "tiles":  # one image's tiles, or one tile each of up to a batch of images
                options.append([((axis, Range(1, max_tiles, max(max_tiles, buckets.batch[-1]))),)])
            elif axis == "prompt" and cached:  # the two call shapes of a cached window graph (see above)
                prompts = _ranges(buckets.prompt, "prompt" in split)
                # a cached step: no prompt, or (shifted logits) each row's last prompt position, the rest cached
                live = Range(1, 1, buckets.prompt[-1]) if logit_shift else Range(0, 0, 0)
                options.append([((axis, r), ("past", Range(0, 0, 0)), ("history", Range(1, 1, 1))) for r in prompts]
                               + [((axis, live), ("past", Range(0 if logit_shift else max(1, r.min), r.opt, r.max)),
                                   ("history", Range(1, 1, MAX_SNAPSHOTS))) for r in prompts])  # fmt: skip
            elif axis not in ("past", "history"):
                options.append([((axis, r),) for r in _ranges(sources[axis], axis in split)])
        order = {a: i for i, a in enumerate(PLANNED_AXES)}
        graphs[graph] = tuple(Profile(tuple(sorted((p for part in combo for p in part), key=lambda p: order[p[0]])))
                              for combo in itertools.product(*options))  # fmt: skip
    return ProfilePlan(buckets, split, max_tiles, graphs)


def select_profile(profiles: Sequence[Profile], sizes: Mapping[str, int], graph: str = "") -> int:
    """Index of the nearest profile covering ``sizes``: the covering one closest to its opt shape, first on a tie.

    Raises:
        ConfigError: no profile covers the call; the message names the largest sizes the engine accepts.
    """
    best, best_distance = -1, math.inf
    for i, profile in enumerate(profiles):
        if profile.covers(sizes):
            d = profile.distance(sizes)
            if d < best_distance:
                best, best_distance = i, d
    if best < 0:
        wanted = {a: s for a, s in sizes.items() if a in PLANNED_AXES}
        raise ConfigError(
            f"graph {graph!r}: no engine profile covers sizes {wanted}; the engine accepts up to "
            f"{max_sizes(profiles)}; rebuild with larger sizes, e.g. seer-build --profiles answer=...,N"
        )
    return best


def max_sizes(profiles: Sequence[Profile]) -> dict[str, int]:
    """The largest size per dynamic axis over ``profiles`` (``seq`` included when planned)."""
    out: dict[str, int] = {}
    for p in profiles:
        axes = (*p.axes, "seq") if {"prompt", "answer"} <= set(p.axes) else p.axes
        for axis in axes:
            out[axis] = max(out.get(axis, 0), p.range(axis).max)
    return out


def tiles_per_image(image_aspect_ratio: str, image_size: int, grid_pinpoints: Sequence[Sequence[int]]) -> int:
    """Vision tiles of one image: 1 for "pad"; anyres: the base tile plus the largest pinpoint grid."""
    if not image_aspect_ratio.startswith("anyres") or not grid_pinpoints:
        return 1
    return 1 + max((w // image_size) * (h // image_size) for w, h in grid_pinpoints)


def parse_overrides(items: Sequence[str], buckets: LengthBuckets) -> tuple[LengthBuckets, tuple[str, ...]]:
    """``--profiles`` items over the manifest's buckets: ``AXIS=SIZES`` (batch, prompt, answer; comma-separated
    increasing sizes) replaces that axis's buckets, ``split=AXES`` chooses the axes with one profile per bucket.

    Raises:
        ConfigError: an item that is not KEY=VALUE, an unknown key, or sizes that are not increasing integers.
    """
    sizes = buckets.to_dict()
    split = DEFAULT_SPLIT
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not value.strip():
            raise ConfigError(f"--profiles {item!r}: expected AXIS=SIZES (e.g. answer=16,64,256) or split=AXES")
        parts = [v.strip() for v in value.split(",") if v.strip()]
        if key == "split":
            split = tuple(parts)
            bad = [a for a in split if a not in SPLIT_AXES]
            if bad:
                raise ConfigError(f"--profiles split={value}: {bad} cannot be split; choose from {SPLIT_AXES}")
        elif key in sizes:
            try:
                sizes[key] = [int(v) for v in parts]
            except ValueError:
                raise ConfigError(f"--profiles {item!r}: sizes must be integers, e.g. {key}=16,64,256") from None
        else:
            raise ConfigError(f"--profiles {item!r}: unknown key {key!r}; expected one of {(*sizes, 'split')}")
    return LengthBuckets.from_dict(sizes), split


MAX_BUCKETS = 64  # sizes per axis
MAX_BUCKET = {"batch": 4096, "prompt": 2**20, "answer": 2**16}  # what one call of any model here could hold


@dataclasses.dataclass(frozen=True)
class LengthBuckets:
    """The lengths engines are built for (docs/DESIGN.md "Engines and profiles"): each profile covers one bucket, runtime rounds up."""

    batch: tuple[int, ...] = (1, 2, 4, 8, 16)  # rows per call
    prompt: tuple[int, ...] = (64, 128, 256, 512, 1024)  # prompt embeddings P, images included
    answer: tuple[int, ...] = (16, 32, 64, 128, 256)  # answer window G (after Seer truncation: L* rounded up)

    def __post_init__(self) -> None:
        for name in ("batch", "prompt", "answer"):
            values = tuple(int(v) for v in getattr(self, name))
            if not values or list(values) != sorted(set(values)) or values[0] < 1:
                raise ConfigError(f"buckets.{name} must be increasing positive sizes, got {list(values)[:8]}")
            if len(values) > MAX_BUCKETS or values[-1] > MAX_BUCKET[name]:
                raise ConfigError(f"buckets.{name} {list(values)[:8]}: at most {MAX_BUCKETS} sizes of at most "
                                  f"{MAX_BUCKET[name]} (what a call can hold: anything past it would be allocated "
                                  f"before it fails)")  # fmt: skip
            object.__setattr__(self, name, values)

    @classmethod
    def for_model(cls, gen_length: int, longest_image: int, text_budget: int = 256) -> LengthBuckets:
        """Powers of two covering the model's answer window (at least 16..256) and one image plus text."""
        return cls(prompt=_powers(64, longest_image + text_budget), answer=_powers(16, max(256, gen_length)))

    def to_dict(self) -> dict[str, list[int]]:
        return {k: list(v) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LengthBuckets:
        return cls(**{k: tuple(v) for k, v in data.items()})


def _powers(start: int, cover: int) -> tuple[int, ...]:
    """start, 2 * start, ... up to the first power >= cover."""
    out = [start]
    while out[-1] < cover:
        out.append(out[-1] * 2)
    return tuple(out)
