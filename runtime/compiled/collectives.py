"""Put the plan's gradient collectives into a compiled backward graph.

For each collective of the plan's layout (:mod:`schedopt.layout`, the simulator's and the
eager runtime's: a bucket, or one chunk of it), in plan order:

1. Right after the last node producing one of its gradients (and after the
   previous collective): the bucket's flat buffer (``empty``, at its first
   chunk), each new gradient written into its view scaled by 1/world size
   (``torch.mul(grad, 1/world, out=view)``: the eager runtime's copy, and
   DDP's), and ``_c10d_functional.all_reduce_(slice, "sum")`` in place on
   the chunk's slice: the collective starts while the rest of the backward
   runs, and no gradient is copied twice.
2. In ``barrier`` mode every ``wait_tensor`` goes just before the graph's
   output, in plan order: as late as the mode allows.
3. Each parameter's averaged gradient is its view of the reduced buffer and
   becomes the graph's output for that parameter, so autograd writes the
   average into ``.grad``, as DDP does.

Functional collectives are ordinary graph nodes, so the order the graph holds
is the order they are issued; on NCCL each runs on the communicator's stream
and ``wait_tensor`` makes the compute stream wait for it, never the host.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import fx

from schedopt.layout import bucket_layout
from schedopt.plan import Plan

__all__ = ["insert_collectives"]

aten = torch.ops.aten
c10d = torch.ops._c10d_functional


def insert_collectives(graph: fx.Graph, grads: Mapping[str, fx.Node], plan: Plan,
                       params: Mapping[str, torch.Tensor], *, group_name: str,
                       world_size: int) -> tuple[dict[str, fx.Node], list[tuple[int, int, int]]]:
    """Insert the plan's collectives into ``graph`` (see the module docstring).

    Args:
        graph: a backward graph, already in its final order.
        grads: each trainable parameter's gradient node.
        plan: whose buckets and chunks to issue.
        params: the live trainable parameters (their element counts, shapes, dtypes and devices).
        group_name: the process group's name (``ProcessGroup.group_name``).
        world_size: its size.

    Returns:
        The averaged gradient node of each parameter, and ``(bucket, chunk, numel)`` of each
        collective in issue order.
    """
    order = {n: i for i, n in enumerate(graph.nodes)}
    output = next(n for n in graph.nodes if n.op == "output")
    scale = 1.0 / world_size
    layout = bucket_layout(plan.buckets, numel={name: p.numel() for name, p in params.items()},
                           itemsize={name: p.element_size() for name, p in params.items()})
    spans = {name: (span.start, span.end) for name, span in layout.spans.items()}
    cursor = anchor = None  # the last node inserted; the gradient node it follows
    buffers: list[fx.Node] = []
    works: list[fx.Node] = []
    issued: list[tuple[int, int, int]] = []

    def insert(target, args, kwargs=None) -> fx.Node:
        nonlocal cursor
        with graph.inserting_after(cursor):
            cursor = graph.call_function(target, args, kwargs or {})
        return cursor

    written: set[str] = set()
    for collective in layout.collectives:  # step 1
        k = collective.bucket
        last = max((grads[n] for n in collective.params), key=order.__getitem__)
        if anchor is None or order[last] > order[anchor]:
            anchor = cursor = last
        if collective.chunk == 0:
            first = params[plan.buckets[k].params[0]]
            buffers.append(insert(torch.empty, ((layout.bucket_numel[k],),),
                                  {"dtype": first.dtype, "device": first.device}))
        for name in collective.params:  # the eager runtime's hook: torch.mul(grad, 1/world, out=bucket view)
            if name not in written:
                written.add(name)
                view = insert(_span, (buffers[k], *spans[name], tuple(params[name].shape)))
                insert(torch.mul, (grads[name], scale), {"out": view})
        piece = insert(_span, (buffers[k], collective.start, collective.end, (collective.numel,)))
        works.append(insert(c10d.all_reduce_.default, (piece, "sum", group_name)))
        issued.append((k, collective.chunk, collective.numel))
    averaged: dict[str, fx.Node] = {}
    with graph.inserting_before(output):
        waited = [graph.call_function(c10d.wait_tensor.default, (work,)) for work in works]  # step 2
        for k, bucket in enumerate(plan.buckets):  # step 3: views of the reduced buffers, after every wait
            for name in bucket.params:
                averaged[name] = graph.call_function(_span, (buffers[k], *spans[name], tuple(params[name].shape)),
                                                     {"after": waited})
    return averaged, issued


def _span(buffer: torch.Tensor, start: int, end: int, shape: tuple[int, ...], *, after: Any = None) -> torch.Tensor:
    """Return elements ``[start, end)`` of a flat buffer, shaped (``after``: nodes it must follow)."""
    return buffer[start:end].view(shape)
