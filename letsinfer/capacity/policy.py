"""A model's scaling policy: how many placement groups it keeps, and when it
loads and unloads. Today's behaviour (one group, always loaded) is the default.

``min_groups`` 0 means on demand: the model loads at its first request and
unloads after ``idle_s`` without one. ``min_groups`` of 1 or more pins that
many groups: they are never unloaded nor evicted. Between ``min_groups`` and
``max_groups`` the main adds a group while the model's requests in flight per
group stay above ``target_inflight`` and removes one after a calm
``scale_down_s``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Any

MAX_GROUPS = 64
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


class PolicyError(ValueError):
    """A policy an operator asked for that cannot be: the message says why."""


def parse_duration(text: str, what: str) -> float:
    """``30s``, ``5m``, ``1h``, ``2d`` or plain seconds."""
    found = _DURATION.match(text)
    if found is None:
        raise PolicyError(f"{what}: {text!r} is not a duration (say 30s, 5m, 1h or 2d)")
    seconds = float(found.group(1)) * _UNITS[found.group(2) or "s"]
    if seconds > 30 * 86400:
        raise PolicyError(f"{what}: {text!r} is longer than 30 days")
    return seconds


def duration_text(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True)
class ScalingPolicy:
    min_groups: int = 1
    max_groups: int = 1
    idle_s: float = 300.0  # on demand: unloaded after this long without a request
    # Never unloaded nor evicted sooner after a load (the no-thrash rule):
    # shorter than the gateway's queue wait (30 s), so a request for a model
    # that is out can wait for its turn.
    min_resident_s: float = 10.0
    target_inflight: float = 4.0  # requests in flight per group before adding one
    scale_down_s: float = 120.0  # calm this long before a group is removed

    def __post_init__(self) -> None:
        if not 0 <= self.min_groups <= MAX_GROUPS:
            raise PolicyError(f"--min must be between 0 and {MAX_GROUPS}, not {self.min_groups}")
        if not 1 <= self.max_groups <= MAX_GROUPS:
            raise PolicyError(f"--max must be between 1 and {MAX_GROUPS}, not {self.max_groups}")
        if self.max_groups < self.min_groups:
            raise PolicyError(
                f"--max ({self.max_groups}) must be at least --min ({self.min_groups})"
            )
        for name in ("idle_s", "min_resident_s", "scale_down_s"):
            if getattr(self, name) < 0:
                raise PolicyError(f"{name} must not be negative")
        if not 0 < self.target_inflight <= 10_000:
            raise PolicyError("--target-inflight must be above 0 (and at most 10000)")

    @property
    def on_demand(self) -> bool:
        return self.min_groups == 0

    @property
    def pinned(self) -> bool:
        """Its groups (up to min_groups) are never unloaded nor evicted."""
        return self.min_groups >= 1

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "on_demand": self.on_demand}

    def describe(self) -> str:
        if self.on_demand:
            kept = f"on demand (unloads after {duration_text(self.idle_s)} idle"
            kept += f", stays at least {duration_text(self.min_resident_s)})"
        else:
            kept = f"pinned: {self.min_groups} group(s) always loaded"
        if self.max_groups > max(self.min_groups, 1):
            kept += (
                f"; up to {self.max_groups} groups above {self.target_inflight:g} requests in "
                f"flight per group, one removed after {duration_text(self.scale_down_s)} calm"
            )
        return kept


DEFAULT = ScalingPolicy()
# Its settings, by name: the store's columns and `model scale`'s fields.
FIELDS = tuple(f.name for f in fields(ScalingPolicy))
