"""A scheduling problem: a training graph on a cluster in one synchronization mode.

- ``barrier`` (what DDP does): forward, backward, then the optimizer once
  every collective has finished. A gradient's window is
  ``[ready(p), end of backward]``.
- ``overlap`` (still exact synchronous SGD): each bucket's parameters are
  updated once its collective ends, and the next step's first op reading a
  parameter waits only for that parameter's update. The window is
  ``[ready(p), first use of p in the next step]``; the iteration time is the
  steady-state period.

- ``sharded`` (FSDP2's sharded data parallel): parameters live sharded over
  the ranks; each unit of modules is all-gathered before its forward (and,
  if resharded after it, again before its backward) and its gradients are
  reduce-scattered; the optimizer runs on the shards once every
  reduce-scatter is done. ``memory_budget_bytes`` caps the peak per rank of
  parameters and gradients (:mod:`schedopt.sharding`).

Execution, how the plan's op order is run:

- ``eager`` (default): eager PyTorch runs forward in program order and
  backward in the autograd engine's order (:func:`schedopt.orders.engine_order`),
  so an eager plan keeps that order and chooses buckets and chunks only.
  ``schedopt.runtime.wrap`` applies eager plans.
- ``compiled``: the order is free (Caramel's computation scheduling); only a
  runtime that executes the graph itself (``torch.compile``) can apply it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from .cluster import Cluster
from .errors import SchedoptError
from .graph import TrainGraph

__all__ = ["Problem", "MODES", "BUCKET_MODES", "Mode", "DEFERRED_MODES", "EXECUTIONS", "Execution", "DEFAULT_MAX_STALE_FRACTION"]

Mode = Literal["barrier", "overlap", "osp", "sharded"]
MODES: tuple[str, ...] = ("barrier", "overlap", "osp", "sharded")
#: The modes whose plans are gradient buckets all-reduced across replicas (``wrap``); ``sharded``
#: plans are units of modules (``shard``).
BUCKET_MODES: tuple[str, ...] = ("barrier", "overlap", "osp")
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
    ``memory_budget_bytes`` (``sharded`` mode): the most parameter and gradient bytes a rank may
    hold at once (None: no limit).

    A graph whose op times were measured in a traced run (its meta says ``interference_in_op_times``,
    :mod:`schedopt.trace_costs`) already holds the slowdown the run's collectives caused: its problem's
    cluster has no ``interference``, so that no simulation adds it again.
    """

    graph: TrainGraph
    cluster: Cluster
    mode: Mode = "barrier"
    execution: Execution = "eager"
    max_stale_fraction: float = DEFAULT_MAX_STALE_FRACTION
    memory_budget_bytes: int | None = None
    #: the ranks to choose plans on (a :class:`schedopt.ranks.RankModel`, e.g. ``RankModel.measured``):
    #: cpsat re-checks its best candidates on it and keeps the one whose period there is shortest.
    #: None: one rank, every rank alike (a model whose ranks do not vary is kept as None)
    rank_model: Any = None

    def __post_init__(self) -> None:
        if self.rank_model is not None:
            from .ranks import RankModel

            if not isinstance(self.rank_model, RankModel):
                raise SchedoptError(f"rank_model must be a schedopt.ranks.RankModel, got {self.rank_model!r}")
            if not self.rank_model.varies:
                object.__setattr__(self, "rank_model", None)
        if self.graph.meta.get("interference_in_op_times") and self.cluster.interference:
            object.__setattr__(self, "cluster", replace(self.cluster, interference=0.0))
        if self.mode not in MODES:
            raise SchedoptError(f"unknown mode {self.mode!r}; valid: {', '.join(MODES)}")
        if self.execution not in EXECUTIONS:
            raise SchedoptError(f"unknown execution {self.execution!r}; valid: {', '.join(EXECUTIONS)}")
        fraction = self.max_stale_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
            raise SchedoptError(f"max_stale_fraction must be a number from 0 to 1, got {fraction!r}")
        budget = self.memory_budget_bytes
        if budget is not None:
            if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
                raise SchedoptError(f"memory_budget_bytes must be a positive whole number of bytes, got {budget!r}")
            if self.mode != "sharded":
                raise SchedoptError(f"a memory budget applies to sharded plans; this problem is in {self.mode} mode")
        if self.cluster.replicas > 1 and self.mode != "sharded":
            raise SchedoptError(f"replicas (HSDP) apply to sharded plans; this problem is in {self.mode} mode")
        if self.mode == "sharded" and self.execution != "eager":
            raise SchedoptError("sharded mode runs the autograd engine's order through FSDP2; plan it with "
                                "execution eager")

    @property
    def deferred(self) -> bool:
        """True when updates wait for the next forward's reads (``overlap`` and ``osp``)."""
        return self.mode in DEFERRED_MODES

    @property
    def reorders(self) -> bool:
        """True when a solver may change the op order (``compiled`` execution)."""
        return self.execution == "compiled"
