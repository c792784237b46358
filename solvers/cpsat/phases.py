"""Which ops the models fix and which they order: the forward prefix, dead forward ops, free ops.

In ``barrier`` mode the forward ops that lead to backward run first, fixed
(no gradient exists before them); in ``overlap`` mode every forward op keeps
its order (each parameter's first reader must be known). Forward ops that no
backward op waits for are free like backward ops (:func:`dead_forward`).
"""

from __future__ import annotations

from typing import Sequence

from schedopt.graph import TrainGraph

__all__ = ["feeds_backward", "split_prefix", "dead_forward", "overlap_ops", "defer_dead_forward"]


def feeds_backward(graph: TrainGraph) -> set[str]:
    """Every op with a backward descendant (one reverse search from all backward ops at once)."""
    feeds: set[str] = set()
    stack = [o for o in graph.ops if graph.ops[o].phase == "backward"]
    while stack:
        for u in graph.dag.predecessors(stack.pop()):
            if u not in feeds:
                feeds.add(u)
                stack.append(u)
    return feeds


def split_prefix(graph: TrainGraph, order: list[str], *, all_forward: bool = False) -> tuple[list[str], list[str]]:
    """Forward ops with a backward descendant (every forward op with ``all_forward``) run first,
    fixed; the rest are free."""
    feeds = feeds_backward(graph)
    prefix = [o for o in order if graph.ops[o].phase == "forward" and (all_forward or o in feeds)]
    free = [o for o in order if o not in prefix and graph.ops[o].phase != "optimizer"]
    return prefix, free


def dead_forward(graph: TrainGraph, mode: str) -> set[str]:
    """The forward ops no backward op waits for (BatchNorm's running-statistics updates at aten
    level: 188 ops, 0.47 ms on Inception). In ``overlap`` mode only those reading no parameter:
    wherever one runs, no bucket's update has to come before it."""
    feeds = feeds_backward(graph)
    return {o for o, op in graph.ops.items()
            if op.phase == "forward" and o not in feeds and (mode == "barrier" or not op.reads)}


def overlap_ops(graph: TrainGraph, order: Sequence[str], *, reorder: bool = True) -> tuple[list[str], list[str]]:
    """The overlap model's fixed forward ops and free ops (backward, and :func:`dead_forward`'s
    when ``reorder``), in ``order``."""
    dead = dead_forward(graph, "overlap") if reorder else set()
    forward = [o for o in order if graph.ops[o].phase == "forward" and o not in dead]
    return forward, [o for o in order if graph.ops[o].phase == "backward" or o in dead]


def defer_dead_forward(graph: TrainGraph, order: list[str], dead: set[str]) -> list[str]:
    """``order`` with the ops of ``dead`` (see :func:`dead_forward`) moved after the last backward op.

    That never hurts: the compute ends (and the next step starts) at the same time and every
    gradient is ready earlier. It is valid: such an op has no backward descendant, so no op it
    precedes is left before it.
    """
    head = [o for o in order if o not in dead and graph.ops[o].phase != "optimizer"]
    optimizer = [o for o in order if graph.ops[o].phase == "optimizer"]
    return head + [o for o in order if o in dead] + optimizer
