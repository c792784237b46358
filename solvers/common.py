"""Helpers the schedulers share: compute timelines, gradient groups, option checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from schedopt.errors import SolverError
from schedopt.graph import TrainGraph

__all__ = ["GradGroup", "compute_end_times", "first_readers", "grad_groups", "require_positive"]


@dataclass(frozen=True, slots=True)
class GradGroup:
    """The parameters one op finishes, and when (compute stream alone)."""

    op: str
    ready_s: float
    params: tuple[str, ...]
    nbytes: int


def compute_end_times(graph: TrainGraph, order: Sequence[str]) -> dict[str, float]:
    """Return when each forward/backward op ends when the compute stream runs ``order`` alone."""
    t = 0.0
    end: dict[str, float] = {}
    for op_id in order:
        op = graph.ops[op_id]
        if op.phase == "optimizer":
            continue
        t += op.duration_s
        end[op_id] = t
    return end


def grad_groups(graph: TrainGraph, order: Sequence[str]) -> list[GradGroup]:
    """Return the gradient-finishing ops in ``order`` with their parameters (``named_parameters`` order)."""
    end = compute_end_times(graph, order)
    by_op: dict[str, list[str]] = {}
    for name, p in graph.params.items():
        by_op.setdefault(p.grad_op, []).append(name)
    groups = [
        GradGroup(op=op_id, ready_s=end[op_id], params=tuple(names),
                  nbytes=sum(graph.params[n].nbytes for n in names))
        for op_id, names in by_op.items()
    ]
    position = {op_id: i for i, op_id in enumerate(order)}
    return sorted(groups, key=lambda g: position[g.op])


def first_readers(graph: TrainGraph, ops: Sequence[str]) -> dict[str, int]:
    """Return parameter -> index in ``ops`` of the first op reading it; ``len(ops)`` when none does.

    In ``overlap`` mode that op is where the parameter's bucket is updated.
    """
    first = dict.fromkeys(graph.params, len(ops))
    for i in reversed(range(len(ops))):
        for name in graph.ops[ops[i]].reads:
            first[name] = i
    return first


def require_positive(**values: float) -> None:
    """Raise :class:`SolverError` naming the first option that is not a positive number."""
    for name, value in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise SolverError(f"option {name} must be a positive number, got {value!r}")
