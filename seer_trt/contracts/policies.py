"""Policies a user chooses per pipeline or request: the prompt K/V cache (docs/DESIGN.md "Prompt K/V cache") and
the dispatch of truncated rows (docs/DESIGN.md "Seer, exactly", hybrid execution), with their defaults.

Configuration only: the stages that carry them out are ``seer_trt.runtime.kv_cache`` and
``seer_trt.runtime.dispatch``. CLIs read defaults and choices here without importing a stage.

    cache none      every step computes the prompt (zero-length cache): the exact loop
          reuse     refresh at step 0, every R steps and at every block boundary; in between feed the last snapshot
          forecast  the same refreshes; in between feed the ResilPhase extrapolation of the last snapshots
    dispatch        cost_model (default), hybrid (the paper's rule), naive_pad, static, packed, per_request
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from typing import Any, Literal

from seer_trt.contracts.errors import ConfigError
from seer_trt.contracts.graphs import has_cache
from seer_trt.contracts.manifest import Manifest

CacheMode = Literal["none", "reuse", "forecast"]
CACHE_MODES = ("none", "reuse", "forecast")
ORDERS = (1, 2)  # forecast orders: 2 or 3 snapshots kept


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    """A prompt K/V cache policy (docs/DESIGN.md "Prompt K/V cache"); round-trips through JSON like the other configs."""

    mode: CacheMode = "none"  # none | reuse | forecast
    refresh: int = 8  # R: steps from one exact prompt computation to the next (also one at every block boundary)
    order: int = 1  # forecast: order of the Lagrange extrapolation (snapshots kept: order + 1)
    alpha: float = 0.55  # forecast: steepness of the tanh phase map
    drift: float | None = None  # gate: relative K/V error at a refresh past which the next one comes at R // 2

    def __post_init__(self) -> None:
        if self.mode not in CACHE_MODES:
            raise ConfigError(f"cache policy {self.mode!r} is not one of {CACHE_MODES}; pass --cache none, reuse or "
                              f"forecast")  # fmt: skip
        if isinstance(self.refresh, bool) or not isinstance(self.refresh, numbers.Integral) or self.refresh < 1:
            raise ConfigError(f"refresh interval {self.refresh!r} (--refresh-interval, a request's refresh_interval): "
                              f"expected a whole number of steps >= 1 (1: every step computes the prompt)")  # fmt: skip
        if self.order not in ORDERS:
            raise ConfigError(f"forecast order {self.order!r} is not one of {ORDERS}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, numbers.Real) or not 0 < self.alpha < 10:
            raise ConfigError(f"phase map alpha {self.alpha!r}: expected a number in (0, 10) (ResilPhase: 0.55)")
        if self.drift is not None and (isinstance(self.drift, bool) or not isinstance(self.drift, numbers.Real)
                                       or not self.drift > 0):  # fmt: skip
            raise ConfigError(f"drift gate {self.drift!r}: expected a relative error > 0, or none (no gate)")

    @property
    def snapshots(self) -> int:
        """Snapshots kept: the graph's ``history`` axis on cached steps."""
        return self.order + 1 if self.mode == "forecast" else 1

    @property
    def label(self) -> str:
        """How tables name it: "none", "reuse R=4", "forecast R=4 (order 1, gate 0.05)"."""
        if self.mode == "none":
            return "none"
        extra = [f"order {self.order}"] if self.mode == "forecast" else []
        extra += [f"gate {self.drift:g}"] if self.drift is not None else []
        return f"{self.mode} R={self.refresh}" + (f" ({', '.join(extra)})" if extra else "")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CacheConfig:
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ConfigError(
                f"cache: unknown key(s) {unknown}; expected a subset of {[f.name for f in dataclasses.fields(cls)]}"
            )
        return cls(**data)


EXACT = CacheConfig()  # "none": the exact loop


# The pipeline's default, chosen by measurement (docs/DESIGN.md "Prompt K/V cache"): the fewest refreshes whose exact match stays
# within 1 point of the exact loop on 500 held-out fixture prompts at N = 64 and 128 (reuse R = 8: -0.6 points;
# the forecast was never better than reuse at equal refreshes, and keeps twice the memory).
DEFAULT_CACHE = CacheConfig("reuse", 8)


# Dispatch policies of truncated rows (seer_trt.runtime.dispatch); cost_model is timed on the backend first.
POLICIES = ("cost_model", "hybrid", "naive_pad", "static", "packed", "per_request")
DEFAULT_POLICY = "cost_model"


def check_cache(cache: CacheConfig, manifest: Manifest) -> CacheConfig:
    """``cache`` if the export's window graph can run it (any export runs "none").

    Raises:
        ConfigError: a cache policy other than none, and a window graph exported without the cache (schema 2.0).
    """
    if not isinstance(cache, CacheConfig):
        raise ConfigError(f"cache is a {type(cache).__name__}; expected a seer_trt.contracts.policies.CacheConfig")
    if cache.mode != "none" and "denoise" in manifest.graphs and not has_cache(manifest.graph("denoise").spec):
        raise ConfigError(f"cache {cache.mode!r}: this export's denoise graph takes no prompt K/V cache (exported "
                          f"before schema 2.1); re-export with seer-export, or use cache none")  # fmt: skip
    return cache


def check_dispatch(policy: str, tau_pad: float = 0.2, short: int = 4) -> None:
    """The dispatch settings, checked once (the pipeline at open, ``plan_dispatch`` per plan).

    Raises:
        ConfigError: an unknown policy, ``tau_pad`` outside [0, 1], or a negative ``short``.
    """
    if policy not in POLICIES:
        raise ConfigError(f"unknown dispatch policy {policy!r}; choose from {POLICIES}")
    if not 0.0 <= tau_pad <= 1.0:
        raise ConfigError(f"tau_pad must lie in [0, 1], got {tau_pad}")
    if short < 0:
        raise ConfigError(f"short must be >= 0 (0: no group of short rows), got {short}")
