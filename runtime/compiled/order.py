"""Reorder an FX graph so its matched nodes run in the plan's order.

Executing a ``GraphModule`` runs its nodes in graph order, so the order the
graph holds is the order that runs (the compiled runtime runs the graph
itself, no Inductor that could move nodes). :func:`reorder` is a list
schedule over the graph's data dependencies:

1. A matched node's priority is its position in the plan's order.
2. Any other node (views, ``getitem``, a node of the loss) takes the least
   priority among its users, so it runs just before the first of them; a
   node whose only user is the graph's output runs right after its inputs.
3. Repeatedly run the ready node of least ``(priority, original position)``
   (Kahn's algorithm with a heap).

If the plan's order respects the graph's dependencies, the matched nodes
come out exactly in plan order; :func:`reorder` checks that they do.
"""

from __future__ import annotations

import heapq
import math
from typing import Mapping

from torch import fx

from schedopt.errors import CompileError

__all__ = ["reorder"]


def reorder(graph: fx.Graph, ids: Mapping[fx.Node, str], position: Mapping[str, int]) -> None:
    """Move ``graph``'s nodes so that the matched ones run in the plan's order (in place).

    Args:
        graph: the graph; placeholders stay first and the output last.
        ids: the plan op id of each matched node.
        position: each op id's position in the plan's order.

    Raises:
        CompileError: the graph makes a node wait for one the plan runs later.
    """
    rank = {node: position[op] for node, op in ids.items()}
    nodes = [n for n in graph.nodes if n.op not in ("placeholder", "output")]
    index = {n: i for i, n in enumerate(nodes)}  # the graph's own order breaks ties
    priority: dict[fx.Node, float] = {}
    for node in reversed(nodes):  # step 2, users first
        if node in rank:
            priority[node] = rank[node]
        else:
            users = [priority[u] for u in node.users if u in priority]
            priority[node] = min(users) if users else math.nan
    for node in nodes:  # a node only the output reads: right after its inputs
        if math.isnan(priority[node]):
            inputs = [priority[i] for i in node.all_input_nodes if i in priority]
            priority[node] = max(inputs) if inputs else -math.inf
    waiting = {n: sum(1 for i in n.all_input_nodes if i in index) for n in nodes}
    ready = [(priority[n], index[n], n) for n in nodes if waiting[n] == 0]
    heapq.heapify(ready)
    schedule: list[fx.Node] = []
    while ready:  # step 3
        _, _, node = heapq.heappop(ready)
        schedule.append(node)
        for user in node.users:
            if user in waiting:
                waiting[user] -= 1
                if waiting[user] == 0:
                    heapq.heappush(ready, (priority[user], index[user], user))
    assert len(schedule) == len(nodes), "an FX graph is acyclic"
    output = next(n for n in graph.nodes if n.op == "output")
    for node in schedule:  # each moved to just before the output: the schedule's order, after the placeholders
        output.prepend(node)
    graph.lint()
    ran = [n for n in schedule if n in rank]
    for before, after in zip(ran, ran[1:]):
        if rank[before] > rank[after]:
            raise CompileError(
                f"the plan runs {ids[after]!r} (position {rank[after]}) before {ids[before]!r} (position "
                f"{rank[before]}), but the compiled graph cannot: {after.name} depends on {before.name} "
                "through a dependency the plan's graph does not have"
            )
