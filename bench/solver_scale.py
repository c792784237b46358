"""How CP-SAT scales: model size, time to first solution, final gap and peak memory.

    python bench/solver_scale.py                          # 60 s per case
    python bench/solver_scale.py --time-limit 120 --cases transformer_like:96

Cases: ``transformer_like`` with 12, 48 and 96 blocks at aten granularity
(transformer_like(96) has 12,901 ops) and every example model imported at
aten level. Each case runs in its own process (peak MiB is that process's
peak resident memory). "warm s" is the time spent on the warm starts (every
heuristic, the bucket DP, in overlap mode the bucket search), "model s"
building the CP-SAT model and checking the hint; "first s" is when CP-SAT
reported its first solution (the warm start, repaired into the model); "gap"
is to CP-SAT's own bound.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import begin, write_result  # noqa: E402

CASES = ["transformer_like:12", "transformer_like:48", "transformer_like:96", "resnet50", "vgg16", "inception",
         "gpt2_small", "bert_base"]


def run_case(case: str, network: str, world_size: int, mode: str, time_limit: float,
             execution: str = "compiled", *, seed: int = 0) -> dict:
    from schedopt import Cluster, Problem
    from schedopt.solvers import get
    from schedopt.synthetic import transformer_like

    from heuristics import cached_graph

    started = time.perf_counter()
    if case.startswith("transformer_like:"):
        graph = transformer_like(int(case.split(":")[1]), granularity="aten")
    else:
        graph = cached_graph(case, "a100")
    problem = Problem(graph=graph, cluster=Cluster.preset(network, world_size=world_size), mode=mode,
                      execution=execution)
    plan = get("cpsat")(problem, time_limit_s=time_limit, seed=seed)
    o = plan.solver.stats
    return {
        "case": case, "ops": len(graph.ops), "params": len(graph.params),
        "coarse_ops": o.get("num_coarse_ops"), "variables": o.get("num_variables"),
        "first_solution_s": o.get("first_solution_s"), "warm_start_s": o.get("warm_start_s"),
        "model_s": o.get("model_s"), "solve_s": plan.solver.solve_time_s,
        "wall_s": time.perf_counter() - started, "status": plan.solver.status, "result": o.get("result"),
        "gap": plan.solver.gap, "iteration_s": plan.predicted.iteration_s,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--network", default="100gbe")
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--mode", default="barrier")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--execution", default="compiled", choices=["eager", "compiled"],
                        help="compiled (default: the solvers' reordering counts) or eager (engine order fixed)")
    parser.add_argument("--seed", type=int, default=0, help="cpsat's seed (default 0)")
    parser.add_argument("--json", help="write the rows here, with the commit and the machine")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_case(args.one, args.network, args.world_size, args.mode, args.time_limit, args.execution,
                                  seed=args.seed)))
        return 0
    begin()
    rows = []
    print(f"{args.network}, {args.world_size} ranks, {args.mode}, time limit {args.time_limit:g} s")
    print(f"{'case':<22} {'ops':>6} {'coarse':>6} {'vars':>7} {'warm s':>6} {'model s':>7} {'first s':>8} "
          f"{'solve s':>8} {'wall s':>7} {'status':<9} {'result':<7} {'gap':>7} {'peak MiB':>9}")
    for case in args.cases.split(","):
        proc = subprocess.run([sys.executable, __file__, "--one", case, "--network", args.network,
                               "--world-size", str(args.world_size), "--mode", args.mode,
                               "--execution", args.execution, "--seed", str(args.seed),
                               "--time-limit", str(args.time_limit)],
                              capture_output=True, text=True, timeout=args.time_limit * 4 + 600)
        if proc.returncode != 0:
            print(f"{case:<22} FAILED: {proc.stderr.strip().splitlines()[-1] if proc.stderr else '?'}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append(r)
        first, warm, built = (f"{r[key]:.1f}" if r[key] is not None else "-"
                              for key in ("first_solution_s", "warm_start_s", "model_s"))
        gap = f"{r['gap']:.2%}" if r["gap"] is not None else "-"
        print(f"{case:<22} {r['ops']:>6} {r['coarse_ops'] or '-':>6} {r['variables'] or '-':>7} {warm:>6} {built:>7} "
              f"{first:>8} {r['solve_s']:>8.1f} {r['wall_s']:>7.1f} {r['status']:<9} {r['result']:<7} {gap:>7} "
              f"{r['peak_mib']:>9.0f}", flush=True)
    if args.json:
        write_result(args.json, rows, vars(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
