"""Put the plan's gradient collectives into a compiled backward graph.

For each collective of the plan (:class:`~schedopt.runtime.buckets.BucketLayout`'s
slices: a bucket, or one chunk of it), in plan order:

1. Right after the last node producing one of its gradients (and after the
   previous collective), flatten the gradients overlapping its slice, join
   them (``cat``), scale by 1/world size (``mul``, as the eager runtime and
   DDP's reducer) and issue ``_c10d_functional.all_reduce(..., "sum")``:
   the collective starts while the rest of the backward runs.
2. In ``barrier`` mode every ``wait_tensor`` goes just before the graph's
   output, in plan order: as late as the mode allows.
3. Each parameter's averaged gradient is cut back out of the reduced slices
   and becomes the graph's output for that parameter, so autograd writes the
   average into ``.grad``, as DDP does.

Functional collectives are ordinary graph nodes, so the order the graph holds
is the order they are issued; on NCCL each runs on the communicator's stream
and ``wait_tensor`` makes the compute stream wait for it, never the host.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
from torch import fx

from schedopt.plan import Plan, chunk_bounds

__all__ = ["insert_collectives"]

aten = torch.ops.aten
c10d = torch.ops._c10d_functional


def insert_collectives(graph: fx.Graph, grads: Mapping[str, fx.Node], plan: Plan,
                       numels: Mapping[str, int], shapes: Mapping[str, Sequence[int]], *,
                       group_name: str, world_size: int) -> tuple[dict[str, fx.Node], list[tuple[int, int, int]]]:
    """Insert the plan's collectives into ``graph`` (see the module docstring).

    Args:
        graph: a backward graph, already in its final order.
        grads: each trainable parameter's gradient node.
        plan: whose buckets and chunks to issue.
        numels, shapes: each parameter's element count and shape.
        group_name: the process group's name (``ProcessGroup.group_name``).
        world_size: its size.

    Returns:
        The averaged gradient node of each parameter, and ``(bucket, chunk, numel)`` of each
        collective in issue order.
    """
    order = {n: i for i, n in enumerate(graph.nodes)}
    output = next(n for n in graph.nodes if n.op == "output")
    scale = 1.0 / world_size
    flat: dict[str, fx.Node] = {}
    cursor: fx.Node | None = None  # the last node inserted
    reduced: list[tuple[fx.Node, int, int, Sequence[str]]] = []  # (result, start, end, params) per collective
    issued: list[tuple[int, int, int]] = []

    def after(node: fx.Node, target, args) -> fx.Node:
        with graph.inserting_after(node):
            return graph.call_function(target, args)

    spans: dict[str, tuple[int, int]] = {}  # each gradient's elements in its bucket's flat layout
    for bucket in plan.buckets:
        offset = 0
        for name in bucket.params:
            spans[name] = (offset, offset + numels[name])
            offset += numels[name]
    anchor: fx.Node | None = None
    for k, bucket in enumerate(plan.buckets):  # step 1
        numel = spans[bucket.params[-1]][1]
        for j, (start, end) in enumerate(chunk_bounds(numel, bucket.chunks)):
            members = [n for n in bucket.params if spans[n][0] < end and start < spans[n][1]]
            last = max((grads[n] for n in members), key=order.__getitem__)
            if anchor is None or order[last] > order[anchor]:
                anchor = cursor = last
            pieces = []
            for name in members:
                if name not in flat:
                    cursor = flat[name] = after(cursor, aten.reshape.default, (grads[name], [-1]))
                a, b = spans[name]
                piece = flat[name]
                if start > a or end < b:
                    cursor = piece = after(cursor, aten.slice.Tensor, (piece, 0, max(start, a) - a, min(end, b) - a))
                pieces.append(piece)
            joined = pieces[0]
            if len(pieces) > 1:
                cursor = joined = after(cursor, aten.cat.default, (pieces,))
            cursor = scaled = after(cursor, aten.mul.Tensor, (joined, scale))
            cursor = work = after(cursor, c10d.all_reduce.default, (scaled, "sum", group_name))
            reduced.append((work, start, end, members))
            issued.append((k, j, end - start))
    pieces_of: dict[str, list[fx.Node]] = {}
    with graph.inserting_before(output):
        for work, start, end, members in reduced:  # step 2
            result = graph.call_function(c10d.wait_tensor.default, (work,))
            for name in members:
                a, b = spans[name]
                lo, hi = max(start, a), min(end, b)
                piece = result if (lo, hi) == (start, end) else graph.call_function(
                    aten.slice.Tensor, (result, 0, lo - start, hi - start))
                pieces_of.setdefault(name, []).append(piece)
        averaged: dict[str, fx.Node] = {}
        for name, pieces in pieces_of.items():  # step 3
            joined = pieces[0] if len(pieces) == 1 else graph.call_function(aten.cat.default, (pieces,))
            averaged[name] = graph.call_function(aten.view.default, (joined, list(shapes[name])))
    return averaged, issued
