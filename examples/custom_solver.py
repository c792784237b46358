"""A heuristic of your own, registered beside the built-in solvers and compared with them.

    python examples/custom_solver.py [--world-size 64] [--network 100gbe] [--mode overlap]

The rule here, "doubling buckets", is a toy that shows the interface, not a recommendation:
gradients in the order the autograd engine finishes them, each bucket twice the bytes of the one
before (the first ``first_mb``), so that the first all-reduce starts early and the late, large
buckets pay few latencies. A solver is a function of a :class:`~schedopt.Problem` that returns a
:class:`~schedopt.plan.Plan`; ``register`` gives it a name, checks the options a caller passes
against its signature, validates every plan it returns against the graph and attaches the
simulator's prediction. ``compare`` then runs it beside the others on the same problem, DDP's
plan the baseline of every speedup.
"""

from __future__ import annotations

import argparse

from schedopt import Cluster, Problem
from schedopt.orders import engine_order, ready_order
from schedopt.plan import Plan, SolverInfo
from schedopt.report import compare, format_table
from schedopt.solvers import register
from schedopt.synthetic import transformer_like


@register("doubling")
def solve_doubling(problem: Problem, *, first_mb: float = 1.0, time_limit_s: float | None = None,
                   seed: int = 0) -> Plan:
    """The engine's op order; gradients in ready order, each bucket twice the bytes of the one before."""
    graph = problem.graph
    order = engine_order(graph)
    buckets: list[list[str]] = [[]]
    cap, held = first_mb * 2**20, 0
    for name in ready_order(graph, order):
        buckets[-1].append(name)
        held += graph.params[name].nbytes
        if held >= cap:
            buckets.append([])
            cap, held = 2 * cap, 0
    return Plan.for_problem(problem, order=order, buckets=[b for b in buckets if b],
                            solver=SolverInfo(name="doubling", options={"first_mb": first_mb}))


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=64)
    parser.add_argument("--network", default="100gbe")
    parser.add_argument("--mode", default="overlap", choices=("barrier", "overlap", "osp"))
    parser.add_argument("--time-limit", type=float, default=10.0, help="cpsat's, in seconds")
    args = parser.parse_args(argv)
    graph = transformer_like(12)  # a GPT-like stack with analytic op costs; any imported graph works
    problem = Problem(graph=graph, cluster=Cluster.preset(args.network, world_size=args.world_size), mode=args.mode)
    rows = compare(problem, ["pytorch-ddp", "horovod", "caramel", "doubling", "cpsat"], time_limit_s=args.time_limit)
    print(format_table(rows, drop_empty=True))
    return rows


if __name__ == "__main__":
    main()
