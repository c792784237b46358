"""Op orders derived from a training graph.

The autograd engine runs, among the backward nodes that are ready, the one
with the highest sequence number (the order its forward op was recorded in).
:func:`engine_order` reproduces that on a :class:`TrainGraph`:

1. Forward ops run in source order.
2. A backward op's sequence number is the source position of its latest
   forward predecessor (the op whose saved tensors it reads); a backward op
   with no forward predecessor continues the node of its backward
   predecessors and takes the highest of theirs.
3. Among ready backward ops, the highest sequence number runs first; ties go
   to source order. Optimizer ops run last.
"""

from __future__ import annotations

from typing import Sequence

import networkx as nx

from .graph import TrainGraph

__all__ = ["engine_order", "ready_order", "topological_order"]

_RANK = {"forward": 0, "backward": 1, "optimizer": 2}


def topological_order(graph: TrainGraph) -> list[str]:
    """Return a topological order that follows source order wherever dependencies allow."""
    index = graph.index
    return list(nx.lexicographical_topological_sort(graph.dag, key=index.__getitem__))


def engine_order(graph: TrainGraph) -> list[str]:
    """Return the order PyTorch's autograd engine would run the graph in (see module docstring)."""
    index = graph.index
    seq: dict[str, int] = {}
    for op_id in topological_order(graph):
        op = graph.ops[op_id]
        if op.phase == "forward":
            seq[op_id] = index[op_id]
            continue
        preds = list(graph.dag.predecessors(op_id))
        forward = [index[p] for p in preds if graph.ops[p].phase == "forward"]
        seq[op_id] = max(forward) if forward else max((seq[p] for p in preds), default=-1)

    def key(op_id: str) -> tuple[int, int, int]:
        phase = _RANK[graph.ops[op_id].phase]
        return (phase, -seq[op_id] if phase == 1 else 0, index[op_id])

    return list(nx.lexicographical_topological_sort(graph.dag, key=key))


def ready_order(graph: TrainGraph, order: Sequence[str]) -> list[str]:
    """Return the parameter names sorted by when their gradient is finished under ``order``."""
    position = {op_id: i for i, op_id in enumerate(order)}
    return sorted(graph.params, key=lambda name: position[graph.params[name].grad_op])
