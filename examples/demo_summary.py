"""Print measured training steps beside DDP's and beside the simulator's prediction (the end of ``make demo``).

    python examples/demo_summary.py GRAPH CLUSTER DDP_PLAN:DDP_RUN.json PLAN:RUN.json ...

GRAPH is the profiled graph, CLUSTER the calibrated cluster JSON; each pair is a plan
and the ``--json`` output of ``examples/train.py`` run with it; the first is the baseline (``--ddp``,
or ``--fsdp`` for sharded plans), and a sharded run's peak memory is printed beside its prediction.
"""

from __future__ import annotations

import json
import sys

from schedopt import Cluster, Plan, TrainGraph
from schedopt.ranks import RankModel, period


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    graph, cluster = TrainGraph.load(argv[0]), Cluster.load(argv[1])
    rows, peaks = [], []
    for pair in argv[2:]:
        plan_path, _, run_path = pair.partition(":")
        plan = Plan.load(plan_path)
        run = json.loads(open(run_path).read())
        # every rank, its ops varying as the profile measured; a collective waits for the last (a sharded
        # plan on one rank: FSDP2 syncs at every unit, and the profile's spread makes each sync wait for a
        # straggler the run does not have; docs/simulator.md)
        problem = plan.problem(graph, cluster, rank_model=None if plan.mode == "sharded"
                               else RankModel.measured(graph, cluster.world_size))
        predicted = period(problem, plan)
        rows.append((run["kind"], plan.solver.name, run["period_s"], predicted, run["step_s"]))
        if run.get("rank0_peak_bytes") and plan.predicted and plan.predicted.peak_memory_bytes:
            peaks.append(f"{run['kind']}: peak {max(run['rank0_peak_bytes']) / 2**20:.1f} MiB per rank measured, "
                         f"{plan.predicted.peak_memory_bytes / 2**20:.1f} predicted")
    base, base_s, base_predicted, base_steps = rows[0][0], rows[0][2], rows[0][3], rows[0][4]
    print(f"{'run':16s} {'plan':14s} {'measured':>10s} {'predicted':>10s} {'error':>7s} {'vs ' + base:>7s} "
          f"{'(predicted)':>11s}  steps (mean of {len(base_steps)}, from-to)")
    for kind, solver, measured, predicted, steps in rows:
        print(f"{kind:16s} {solver:14s} {measured * 1e3:8.1f}ms {predicted * 1e3:8.1f}ms "
              f"{(predicted - measured) / measured:+7.1%} {base_s / measured:6.3f}x "
              f"{f'({base_predicted / predicted:.3f}x)':>11s}  "
              f"{min(steps) * 1e3:.0f}-{max(steps) * 1e3:.0f} ms")
    print("\n".join(peaks + [f"{cluster.describe()}; measured on this machine, 2 gloo ranks on localhost"]))
    print("one launch each, and launches on a shared host differ from one another: bench/testbed.py "
          "interleaves rounds and compares medians")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
