"""A scheduling problem: a training graph on a cluster in one synchronization mode.

- ``barrier`` (what DDP does): forward, backward, then the optimizer once
  every collective has finished. A gradient's window is
  ``[ready(p), end of backward]``.
- ``overlap`` (still exact synchronous SGD): each bucket's parameters are
  updated once its collective ends, and the next step's first op reading a
  parameter waits only for that parameter's update. The window is
  ``[ready(p), first use of p in the next step]``; the iteration time is the
  steady-state period.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .cluster import Cluster
from .errors import SchedoptError
from .graph import TrainGraph

__all__ = ["Problem", "MODES", "Mode"]

Mode = Literal["barrier", "overlap"]
MODES: tuple[str, ...] = ("barrier", "overlap")


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """What a solver schedules: ``graph`` on ``cluster`` in ``mode``."""

    graph: TrainGraph
    cluster: Cluster
    mode: Mode = "barrier"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SchedoptError(f"unknown mode {self.mode!r}; valid: {', '.join(MODES)}")
