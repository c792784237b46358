"""CP-SAT against the heuristics on the example models: iteration times, proven gaps, captured headroom.

    python bench/solver_quality.py                       # 60 s per case, both modes
    python bench/solver_quality.py --modes barrier --time-limit 30 --models resnet50,vgg16

For each model, world size (8, 64), network (10gbe, 100gbe) and mode it
prints every solver's iteration time (ms), cpsat's status and its gap to its
own proven bound, and the share of the headroom ``(T_ddp - T) / (T_ddp -
T_bound)`` each solver captures (T_bound: the best bound known, cpsat's or
the simulator's lower bound, whichever is higher). Last lines: whether cpsat
was no slower than the best heuristic everywhere, and the largest gaps.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from schedopt import Cluster, Problem
from schedopt.solvers import get, solvers_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
from heuristics import cached_graph  # noqa: E402
from provenance import begin, write_result  # noqa: E402


#: The case filters and their defaults: every case unless narrowed (``bench/report.py`` names the
#: filters a result narrowed).
CASES = {"models": "resnet50,vgg16,inception,gpt2_small,bert_base", "world_sizes": "8,64",
         "networks": "10gbe,100gbe", "modes": "barrier,overlap"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in CASES.items():
        parser.add_argument(f"--{name.replace('_', '-')}", default=default)
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--execution", default="compiled", choices=["eager", "compiled"],
                        help="compiled (default: the solvers' reordering counts) or eager (engine order fixed)")
    parser.add_argument("--seed", type=int, default=0, help="every solver's seed (default 0)")
    parser.add_argument("--json", help="also write the rows here, with the commit and the machine")
    args = parser.parse_args()
    heuristics = [s for s in solvers_for("barrier") if s != "cpsat"]
    begin()
    rows = []
    print(f"{'model':<11} {'ranks':>5} {'net':<6} {'mode':<7} " + " ".join(f"{h[:9]:>9}" for h in heuristics)
          + f" {'cpsat':>9} {'status':<9} {'gap':>7} {'headroom: best heur':>19} {'cpsat':>6} {'time s':>7}")
    for model in args.models.split(","):
        graph = cached_graph(model, "a100")
        for n in map(int, args.world_sizes.split(",")):
            for net in args.networks.split(","):
                for mode in args.modes.split(","):
                    problem = Problem(graph=graph, cluster=Cluster.preset(net, world_size=n), mode=mode,
                                      execution=args.execution)
                    times = {h: get(h)(problem, seed=args.seed).predicted.iteration_s for h in heuristics}
                    plan = get("cpsat")(problem, time_limit_s=args.time_limit, num_workers=args.workers,
                                        seed=args.seed)
                    t = plan.predicted.iteration_s
                    bound = max(plan.solver.bound_s or 0.0, plan.predicted.lower_bound_s)
                    ddp, best = times["pytorch-ddp"], min(times.values())
                    room = ddp - bound

                    def share(x: float) -> str:
                        return f"{(ddp - x) / room:6.1%}" if room > 1e-12 else "   n/a"

                    gap = plan.solver.gap
                    row = {"model": model, "world_size": n, "network": net, "mode": mode,
                           **{f"{h}_s": v for h, v in times.items()}, "cpsat_s": t,
                           "cpsat_status": plan.solver.status, "cpsat_gap": gap, "bound_s": bound,
                           "solve_time_s": plan.solver.solve_time_s, "no_slower_than_best": t <= best * (1 + 1e-9)}
                    rows.append(row)
                    print(f"{model:<11} {n:>5} {net:<6} {mode:<7} "
                          + " ".join(f"{times[h] * 1e3:9.2f}" for h in heuristics)
                          + f" {t * 1e3:9.2f} {plan.solver.status:<9} "
                          + (f"{gap:7.2%}" if gap is not None else "      -")
                          + f" {share(best):>19} {share(t):>6} {plan.solver.solve_time_s:7.1f}", flush=True)
    ok = all(r["no_slower_than_best"] for r in rows)
    print(f"\ncpsat no slower than the best heuristic in every case: {'yes' if ok else 'NO'}")
    for mode in args.modes.split(","):
        gaps = [r["cpsat_gap"] for r in rows if r["mode"] == mode and r["cpsat_gap"] is not None]
        if gaps:
            print(f"largest cpsat gap to its proven bound, {mode}: {max(gaps):.2%} over {len(gaps)} cases")
    if args.json:
        write_result(args.json, rows, vars(args))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
