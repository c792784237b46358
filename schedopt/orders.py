"""Op orders derived from a training graph.

The autograd engine runs, among the backward nodes that are ready, the one
with the highest sequence number (the order its forward op was recorded in);
a parameter's ``AccumulateGrad`` node has the highest priority of all, so its
post-accumulate-grad hook fires as soon as the node that produced its
gradient finishes. :func:`engine_order` reproduces that on a
:class:`TrainGraph`, in one of two ways.

With a recorded ``graph.grad_order`` (the torch importers run the real
``backward()`` under fake tensors and record the hooks), the order is exact
for what the runtime sees and keeps the engine's timing:

1. Forward ops run in source order (the program's order).
2. Backward ops run in source order, which for an aten-level import is the
   order the traced engine ran them in, with one kind of change: the op that
   finishes a gradient waits until the ops finishing every gradient ahead of
   it in ``grad_order`` have run (a chain of extra edges, one per pair of
   consecutive gradient-finishing ops). That moves only the ops that finish
   gradients; on the example models only past ops of the same autograd node
   (the importer splits a linear layer's backward into its weight, input and
   bias parts, which the engine computes in one call and whose hooks fire
   together in the node's own order). Every other op keeps its traced place:
   the weight gradient of a tied language-model head (which finishes no
   gradient itself, only its partial sum) runs where the engine runs it,
   early in backward, not just before the tied gradient is finished at the
   end. The chain closes a cycle only for a recorded order no op order can
   produce (a gradient whose op feeds another's is ready first), i.e. a
   graph file edited by hand; then each backward op runs by its *deadline*
   (the earliest position in ``grad_order`` of a gradient it feeds), which
   meets every producible order but runs work as late as it allows.
3. Optimizer ops run last.

:func:`ready_order` breaks ties between gradients finished by one op (the
weight and bias of a fused backward kernel) by ``grad_order`` too, so the
gradient-ready order under :func:`engine_order` equals the hooks' order.

Without one (ONNX and synthetic graphs), sequence numbers are estimated:

1. Forward ops run in source order.
2. A backward op's sequence number is the source position of its latest
   forward predecessor (the op whose saved tensors it reads); a backward op
   with no forward predecessor continues the node of its backward
   predecessors and takes the highest of theirs.
3. Among ready backward ops, the highest sequence number runs first; ties go
   to source order. Optimizer ops run last.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # networkx is imported where used: a process that only trains (a rank) never loads it
    import networkx as nx

from .graph import TrainGraph

__all__ = ["engine_order", "ready_order", "topological_order"]

_RANK = {"forward": 0, "backward": 1, "optimizer": 2}

# graph -> its engine order: validate() checks every eager plan against it, and simulate() validates
# (0.1 s per call on 12,901 ops; Caramel's chunk trials simulate up to 96 times)
_ENGINE_ORDERS: weakref.WeakKeyDictionary[TrainGraph, tuple[str, ...]] = weakref.WeakKeyDictionary()


def topological_order(graph: TrainGraph) -> list[str]:
    """Return a topological order that follows source order wherever dependencies allow."""
    import networkx as nx
    index = graph.index
    return list(nx.lexicographical_topological_sort(graph.dag, key=index.__getitem__))


def engine_order(graph: TrainGraph) -> list[str]:
    """Return the order PyTorch's autograd engine runs the graph in (see module docstring)."""
    if graph not in _ENGINE_ORDERS:
        _ENGINE_ORDERS[graph] = tuple(_engine_order(graph))
    return list(_ENGINE_ORDERS[graph])


def _engine_order(graph: TrainGraph) -> list[str]:
    if graph.grad_order is not None:
        return _recorded_order(graph)
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
    return _by_phase(graph, graph.dag, lambda op_id: -seq[op_id])


def _recorded_order(graph: TrainGraph) -> list[str]:
    """Source order, with the ops that finish gradients chained in ``grad_order`` (module docstring)."""
    import networkx as nx
    finishing = list(dict.fromkeys(graph.params[name].grad_op for name in graph.grad_order))
    chained = graph.dag.copy()
    chained.add_edges_from(zip(finishing, finishing[1:]))
    if nx.is_directed_acyclic_graph(chained):
        return _by_phase(graph, chained)
    return _by_phase(graph, graph.dag, _deadlines(graph).__getitem__)


def _by_phase(graph: TrainGraph, dag: nx.DiGraph, backward_key=lambda op_id: 0) -> list[str]:
    """A topological order of ``dag``: forward, backward (by ``backward_key``), optimizer; ties by source order."""
    import networkx as nx
    index = graph.index

    def key(op_id: str) -> tuple[int, int, int]:
        phase = _RANK[graph.ops[op_id].phase]
        return (phase, backward_key(op_id) if phase == 1 else 0, index[op_id])

    return list(nx.lexicographical_topological_sort(dag, key=key))


def _deadlines(graph: TrainGraph) -> dict[str, int]:
    """Op id -> the least ``grad_order`` position of a gradient it (or a descendant) finishes."""
    import networkx as nx
    assert graph.grad_order is not None
    never = len(graph.grad_order)
    deadline = dict.fromkeys(graph.ops, never)
    for rank, name in enumerate(graph.grad_order):
        deadline[graph.params[name].grad_op] = min(deadline[graph.params[name].grad_op], rank)
    for op_id in reversed(list(nx.topological_sort(graph.dag))):
        for succ in graph.dag.successors(op_id):
            if deadline[succ] < deadline[op_id]:
                deadline[op_id] = deadline[succ]
    return deadline


def ready_order(graph: TrainGraph, order: Sequence[str]) -> list[str]:
    """Return the parameter names sorted by when their gradient is finished under ``order``.

    Gradients finished by one op keep ``graph.grad_order`` where it is known,
    ``named_parameters()`` order otherwise.
    """
    position = {op_id: i for i, op_id in enumerate(order)}
    rank = {name: i for i, name in enumerate(graph.grad_order or graph.params)}
    return sorted(graph.params, key=lambda name: (position[graph.params[name].grad_op], rank[name]))
