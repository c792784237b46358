"""What reordering is worth: the best predicted iteration with the engine's order fixed and with a free order.

    python bench/execution_value.py                      # 20 s cpsat solves, both modes
    python bench/execution_value.py --models resnet50 --world-sizes 8 --time-limit 5

For each example model (a100 op costs), world size (8, 64) on 100 GbE and
mode (barrier, overlap), every solver plans twice: ``--execution eager``
(backward in the autograd engine's order, forward in the program's: what
eager PyTorch runs, buckets and chunks chosen) and ``--execution compiled``
(the op order free too: what a compiled runtime could run). It prints the
best of each (and which solver), DDP's iteration for scale, and
``eager / compiled``: how much faster the step could be if the runtime ran
the plan's order. Last line: the largest and the median ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from schedopt import Cluster, Problem
from schedopt.solvers import get, solvers_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
from heuristics import cached_graph  # noqa: E402
from provenance import begin, write_result  # noqa: E402

EXECUTIONS = ("eager", "compiled")


def best_plan(problem: Problem, *, time_limit_s: float, workers: int, seed: int) -> tuple[str, float, float]:
    """``(solver, iteration_s, ddp_s)``: the fastest predicted plan of every solver for ``problem``."""
    times = {}
    for name in solvers_for(problem.mode):
        options = {"time_limit_s": time_limit_s, "num_workers": workers} if name == "cpsat" else {}
        times[name] = get(name)(problem, seed=seed, **options).predicted.iteration_s
    solver = min(times, key=times.__getitem__)
    return solver, times[solver], times["pytorch-ddp"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,vgg16,inception,gpt2_small,bert_base")
    parser.add_argument("--world-sizes", default="8,64")
    parser.add_argument("--network", default="100gbe")
    parser.add_argument("--modes", default="barrier,overlap")
    parser.add_argument("--time-limit", type=float, default=20.0, help="cpsat's limit per solve, in seconds")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="every solver's seed (default 0)")
    parser.add_argument("--json", help="also write the rows here, with the commit and the machine")
    args = parser.parse_args(argv)
    begin()
    rows = []
    print(f"{'model':<11} {'ranks':>5} {'mode':<8} {'ddp ms':>9} {'eager ms':>9} {'(solver)':<13} "
          f"{'compiled ms':>11} {'(solver)':<13} {'eager/compiled':>14}")
    for model in args.models.split(","):
        graph = cached_graph(model, "a100")
        for n in map(int, args.world_sizes.split(",")):
            for mode in args.modes.split(","):
                cluster = Cluster.preset(args.network, world_size=n)
                found = {ex: best_plan(Problem(graph=graph, cluster=cluster, mode=mode, execution=ex),
                                       time_limit_s=args.time_limit, workers=args.workers, seed=args.seed)
                         for ex in EXECUTIONS}
                (eager_by, eager_s, ddp_s), (compiled_by, compiled_s, _) = found["eager"], found["compiled"]
                rows.append({"model": model, "world_size": n, "network": args.network, "mode": mode,
                             "ddp_s": ddp_s, "eager_s": eager_s, "eager_solver": eager_by,
                             "compiled_s": compiled_s, "compiled_solver": compiled_by,
                             "ratio": eager_s / compiled_s})
                print(f"{model:<11} {n:>5} {mode:<8} {ddp_s * 1e3:9.2f} {eager_s * 1e3:9.2f} {eager_by:<13} "
                      f"{compiled_s * 1e3:11.2f} {compiled_by:<13} {eager_s / compiled_s:14.3f}", flush=True)
    ratios = [r["ratio"] for r in rows]
    worst = max(rows, key=lambda r: r["ratio"])
    print(f"\neager/compiled: median {statistics.median(ratios):.3f}, largest {worst['ratio']:.3f} "
          f"({worst['model']}, {worst['world_size']} ranks, {worst['mode']})")
    if args.json:
        write_result(args.json, rows, vars(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
