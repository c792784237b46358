"""The data step: ops contracted into chains, and ancestor sums over the contracted DAG.

An op ``u`` whose only successor is ``v``, with ``v``'s only predecessor ``u``,
same phase, and ``u`` finishing no gradient, is merged with ``v``: exact,
because running ``u`` right before ``v`` never delays anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np

from schedopt.graph import TrainGraph

__all__ = ["Coarse", "coarsen", "reach", "masked_sums", "ticks"]


@dataclass
class Coarse:
    """Coarsened ops: ``chains[i]`` are the fine op ids of coarse op i, in order."""

    chains: list[list[str]]
    of: dict[str, int]
    edges: set[tuple[int, int]]


def coarsen(graph: TrainGraph, ops: list[str], *, keep_order: bool = False) -> Coarse:
    """Contract chains ``u -> v`` (u's only successor, v's only predecessor, same phase, u finishes no gradient);
    with ``keep_order`` only where v comes right after u in ``ops``, so every chain is a run of ``ops``."""
    inside = set(ops)
    position = {o: k for k, o in enumerate(ops)}
    sub = graph.dag.subgraph(ops)
    merge_into_pred: dict[str, str] = {}
    for v in ops:
        preds = list(sub.predecessors(v))
        if len(preds) != 1:
            continue
        u = preds[0]
        if (sub.out_degree(u) == 1 and not graph.ops[u].grads
                and graph.ops[u].phase == graph.ops[v].phase
                and len([p for p in graph.dag.predecessors(v) if p in inside]) == 1
                and (not keep_order or position[v] == position[u] + 1)):
            merge_into_pred[v] = u
    chains: list[list[str]] = []
    of: dict[str, int] = {}
    for v in nx.topological_sort(sub):
        if v in merge_into_pred:
            i = of[merge_into_pred[v]]
            chains[i].append(v)
        else:
            i = len(chains)
            chains.append([v])
        of[v] = i
    edges = {(of[u], of[v]) for u, v in sub.edges if of[u] != of[v]}
    return Coarse(chains=chains, of=of, edges=edges)


def reach(dag: nx.DiGraph, n: int) -> np.ndarray:
    """Boolean matrix: ``reach[v, u]`` when u is an ancestor of v (nodes 0..n-1).

    Rows are filled in topological order, a row being the OR of its
    predecessors' rows, so a sum over ancestors is one masked vector sum
    instead of a graph search per node.
    """
    out = np.zeros((n, n), dtype=bool)
    for v in nx.topological_sort(dag):
        for u in dag.predecessors(v):
            out[v] |= out[u]
            out[v, u] = True
    return out


def masked_sums(rows: np.ndarray, weights: list[int]) -> list[int]:
    """Per row of a boolean matrix, the sum of ``weights`` where it is True."""
    w = np.asarray(weights, dtype=np.int64)
    return [int(w[row].sum()) for row in rows]


def ticks(seconds: float, tick_s: float) -> int:
    """``seconds`` in whole ticks (rounded to the nearest)."""
    return int(round(seconds / tick_s))
