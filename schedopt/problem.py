"""A scheduling problem: a training graph on a cluster in one synchronization mode.

- ``barrier`` (what DDP does): forward, backward, then the optimizer once
  every collective has finished. A gradient's window is
  ``[ready(p), end of backward]``.
- ``overlap`` (still exact synchronous SGD): each bucket's parameters are
  updated once its collective ends, and the next step's first op reading a
  parameter waits only for that parameter's update. The window is
  ``[ready(p), first use of p in the next step]``; the iteration time is the
  steady-state period.

Execution, how the plan's op order is run:

- ``eager`` (default): eager PyTorch runs forward in program order and
  backward in the autograd engine's order (:func:`schedopt.orders.engine_order`),
  so an eager plan keeps that order and chooses buckets and chunks only.
  ``schedopt.runtime.wrap`` applies eager plans.
- ``compiled``: the order is free (Caramel's computation scheduling); only a
  runtime that executes the graph itself (``torch.compile``) can apply it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .cluster import Cluster
from .errors import SchedoptError
from .graph import TrainGraph

__all__ = ["Problem", "MODES", "Mode", "DEFERRED_MODES", "EXECUTIONS", "Execution", "DEFAULT_MAX_STALE_FRACTION"]

Mode = Literal["barrier", "overlap", "osp"]
MODES: tuple[str, ...] = ("barrier", "overlap", "osp")
#: The modes whose updates wait for the next forward's reads, not for the end of backward.
DEFERRED_MODES: tuple[str, ...] = ("overlap", "osp")
#: ``osp`` mode: the share of parameter bytes a plan may leave stale for a step, by default.
DEFAULT_MAX_STALE_FRACTION = 0.5
Execution = Literal["eager", "compiled"]
EXECUTIONS: tuple[str, ...] = ("eager", "compiled")


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """What a solver schedules: ``graph`` on ``cluster`` in ``mode``, run with ``execution``.

    ``max_stale_fraction`` (``osp`` mode): the most parameter bytes, as a share of all, whose
    buckets a plan may put in stage 2 (read one step stale, corrected by the local gradient).
    """

    graph: TrainGraph
    cluster: Cluster
    mode: Mode = "barrier"
    execution: Execution = "eager"
    max_stale_fraction: float = DEFAULT_MAX_STALE_FRACTION

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SchedoptError(f"unknown mode {self.mode!r}; valid: {', '.join(MODES)}")
        if self.execution not in EXECUTIONS:
            raise SchedoptError(f"unknown execution {self.execution!r}; valid: {', '.join(EXECUTIONS)}")
        fraction = self.max_stale_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
            raise SchedoptError(f"max_stale_fraction must be a number from 0 to 1, got {fraction!r}")

    @property
    def deferred(self) -> bool:
        """True when updates wait for the next forward's reads (``overlap`` and ``osp``)."""
        return self.mode in DEFERRED_MODES

    @property
    def reorders(self) -> bool:
        """True when a solver may change the op order (``compiled`` execution)."""
        return self.execution == "compiled"
