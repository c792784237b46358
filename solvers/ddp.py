"""``pytorch-ddp``: what ``torch.nn.parallel.DistributedDataParallel`` does.

Order: the autograd engine order (:func:`schedopt.orders.engine_order`).

Buckets: DDP rebuilds its buckets after the first iteration from the order in
which gradients actually became ready (``Reducer::rebuild_buckets``), with
the size limits ``[first_bucket_bytes_cap, bucket_bytes_cap]`` = [1 MiB,
25 MiB] by default (``_DEFAULT_FIRST_BUCKET_BYTES``, ``bucket_cap_mb``;
1 MB = 2**20 bytes). ``compute_bucket_assignment_by_size`` walks the
tensors in that order, one accumulator per dtype, adds each tensor to its
accumulator and closes the bucket as soon as its size reaches the current
limit, the tensor that crosses the limit included; after the first bucket of
a dtype closes, that dtype's limit moves to the next (last) value. Leftover
accumulators become the last buckets. Buckets are all-reduced in index order.
"""

from __future__ import annotations

from typing import Sequence

from schedopt.orders import engine_order, ready_order
from schedopt.plan import Plan, SolverInfo
from schedopt.problem import Problem

from .registry import register

__all__ = ["ddp_bucket_assignment", "solve_pytorch_ddp"]

_MB = 1024 * 1024


def ddp_bucket_assignment(
    sizes_bytes: Sequence[int],
    limits_bytes: Sequence[int],
    dtypes: Sequence[str] | None = None,
) -> list[list[int]]:
    """Return DDP's buckets as lists of tensor indices, for tensors given in gradient-ready order.

    Example:
        >>> ddp_bucket_assignment([600_000, 600_000, 600_000], [1 << 20, 25 << 20])
        [[0, 1], [2]]
    """
    dtypes = list(dtypes) if dtypes is not None else ["float32"] * len(sizes_bytes)
    result: list[list[int]] = []
    open_buckets: dict[str, tuple[list[int], int]] = {}
    limit_index: dict[str, int] = {}
    for i, (size, dtype) in enumerate(zip(sizes_bytes, dtypes)):
        indices, total = open_buckets.get(dtype, ([], 0))
        indices.append(i)
        total += size
        level = limit_index.setdefault(dtype, 0)
        if total >= limits_bytes[level]:
            result.append(indices)
            open_buckets.pop(dtype, None)
            limit_index[dtype] = min(level + 1, len(limits_bytes) - 1)
        else:
            open_buckets[dtype] = (indices, total)
    result.extend(indices for indices, _ in open_buckets.values())
    return result


@register("pytorch-ddp")
def solve_pytorch_ddp(
    problem: Problem,
    *,
    bucket_cap_mb: float = 25.0,
    first_bucket_mb: float = 1.0,
    time_limit_s: float | None = None,
    seed: int = 0,
) -> Plan:
    """Return DDP's schedule: autograd engine order, ready-order buckets of 1 MiB then 25 MiB."""
    graph = problem.graph
    order = engine_order(graph)
    names = ready_order(graph, order)
    params = [graph.params[n] for n in names]
    limits = [int(first_bucket_mb * _MB), int(bucket_cap_mb * _MB)]
    assignment = ddp_bucket_assignment([p.nbytes for p in params], limits, [p.dtype for p in params])
    return Plan.for_problem(
        problem,
        order=order,
        buckets=[[names[i] for i in indices] for indices in assignment],
        solver=SolverInfo(
            name="pytorch-ddp",
            options={"bucket_cap_mb": bucket_cap_mb, "first_bucket_mb": first_bucket_mb},
        ),
    )
