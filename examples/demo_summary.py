"""Print measured training steps beside DDP's and beside the simulator's prediction (the end of ``make demo``).

    python examples/demo_summary.py GRAPH CLUSTER DDP_PLAN:DDP_RUN.json PLAN:RUN.json ...

GRAPH is the profiled graph, CLUSTER the calibrated cluster JSON; each pair is a plan
and the ``--json`` output of ``examples/train.py`` run with it (``--ddp`` for the first).
"""

from __future__ import annotations

import json
import sys

from schedopt import Cluster, Plan, Problem, TrainGraph
from schedopt.ranks import RankModel, period


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    graph, cluster = TrainGraph.load(argv[0]), Cluster.load(argv[1])
    rows = []
    for pair in argv[2:]:
        plan_path, _, run_path = pair.partition(":")
        plan = Plan.load(plan_path)
        run = json.loads(open(run_path).read())
        # every rank, its ops varying as the profile measured; a collective waits for the last
        problem = Problem(graph=graph, cluster=cluster, mode=plan.mode,
                          rank_model=RankModel.measured(graph, cluster.world_size))
        predicted = period(problem, plan)
        rows.append((run["kind"], plan.solver.name, run["period_s"], predicted, run["step_s"]))
    ddp_s, ddp_predicted, ddp_steps = rows[0][2], rows[0][3], rows[0][4]
    print(f"{'run':9s} {'plan':12s} {'measured':>10s} {'predicted':>10s} {'error':>7s} {'vs ddp':>7s} "
          f"{'(predicted)':>11s}  steps (mean of {len(ddp_steps)}, from-to)")
    for kind, solver, measured, predicted, steps in rows:
        print(f"{kind:9s} {solver:12s} {measured * 1e3:8.1f}ms {predicted * 1e3:8.1f}ms "
              f"{(predicted - measured) / measured:+7.1%} {ddp_s / measured:6.3f}x "
              f"{f'({ddp_predicted / predicted:.3f}x)':>11s}  "
              f"{min(steps) * 1e3:.0f}-{max(steps) * 1e3:.0f} ms")
    print(f"{cluster.describe()}; measured on this machine, 2 gloo ranks on localhost")
    print("one launch each, and launches on a shared host differ from one another: bench/testbed.py "
          "interleaves rounds and compares medians")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
