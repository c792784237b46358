"""Helpers the schedulers share: compute timelines, gradient groups, option checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from schedopt.errors import SolverError
from schedopt.graph import TrainGraph
from schedopt.plan import Bucket, chunk_bounds

__all__ = ["GradGroup", "compute_end_times", "first_readers", "grad_groups", "require_positive",
           "split_chunks"]


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


def split_chunks(graph: TrainGraph, buckets: Sequence[Bucket]) -> list[Bucket]:
    """Return ``buckets`` with every chunked bucket cut into one-chunk buckets at parameter boundaries.

    A parameter goes with the chunk its first element lies in. Under the simulator's cost (one
    FIFO channel, ``fixed + bytes x seconds_per_byte`` per call) that is never slower: the calls
    are the same or fewer, a chunk that gains a parameter's tail already waited for that
    parameter, the next one loses as many bytes as it gains, so no call ends later than before;
    in ``overlap`` mode each piece's update then runs before its own first reader, no earlier than
    the whole bucket's did, after a collective that ended no later. Chunks therefore never have
    to be searched over when buckets are (``cpsat`` has none).
    """
    out: list[Bucket] = []
    for bucket in buckets:
        if bucket.chunks == 1:
            out.append(bucket)
            continue
        numel = sum(graph.params[n].numel for n in bucket.params)
        bounds = chunk_bounds(numel, bucket.chunks)
        pieces: list[list[str]] = [[] for _ in bounds]
        offset, j = 0, 0
        for name in bucket.params:
            while j + 1 < len(bounds) and offset >= bounds[j][1]:
                j += 1
            pieces[j].append(name)
            offset += graph.params[name].numel
        out += [Bucket(params=tuple(piece)) for piece in pieces if piece]
    return out
