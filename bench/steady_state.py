"""The steady-state engine's speed for its three users: the bucket search, the simulator, the CP-SAT hint.

    python bench/steady_state.py                        # resnet50, gpt2_small, transformer_like(12)
    python bench/steady_state.py --models resnet50 --json out/steady.json --seed 1

For each graph (overlap mode, 8 ranks on 100 GbE, Caramel's order and
buckets): the milliseconds per evaluation of :meth:`SteadyState.period` on
``--candidates`` random bucketings (the search's inner loop), of
:func:`schedopt.simulate` (every op, events and windows) and of the overlap
model's hint (integer ticks), each the median of ``--rounds`` rounds taken in
turn (A B C A B C ...), and whether every run converged.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

from schedopt import Cluster, Problem, simulate
from schedopt.solvers import get
from schedopt.solvers.cpsat import CpsatOptions
from schedopt.solvers.cpsat.overlap import OverlapModel
from schedopt.solvers.cpsat.phases import overlap_ops
from schedopt.solvers.overlap_search import SteadyState
from schedopt.synthetic import transformer_like

sys.path.insert(0, str(Path(__file__).resolve().parent))
from heuristics import cached_graph  # noqa: E402
from provenance import begin, write_result  # noqa: E402


def random_buckets(rng: random.Random, units: int, count: int) -> list[list[int]]:
    """``count`` runs of consecutive units, in a random collective order."""
    cuts = sorted(rng.sample(range(1, units), min(count, units) - 1))
    buckets = [list(range(a, b)) for a, b in zip([0, *cuts], [*cuts, units])]
    rng.shuffle(buckets)
    return buckets


def measure(name: str, graph, *, seed: int, candidates: int, rounds: int) -> dict:
    problem = Problem(graph=graph, cluster=Cluster.preset("100gbe", world_size=8), mode="overlap",
                      execution="compiled")
    plan = get("caramel")(problem)
    state = SteadyState(problem, plan.order)
    rng = random.Random(seed)
    draws = [random_buckets(rng, len(state.units), 8) for _ in range(candidates)]
    tick_s = plan.predicted.iteration_s / CpsatOptions().horizon_ticks
    model = OverlapModel(problem, *overlap_ops(graph, plan.order), tick_s, 8, CpsatOptions())
    model.build()
    buckets = [list(b.params) for b in plan.buckets]

    def search() -> float:
        started = time.perf_counter()
        for b in draws:
            state.period(b)
        return (time.perf_counter() - started) / len(draws)

    def simulator() -> float:
        started = time.perf_counter()
        assert simulate(problem, plan).converged
        return time.perf_counter() - started

    def hint() -> float:
        started = time.perf_counter()
        model.hint(list(plan.order), buckets)
        assert model.hint_converged
        return time.perf_counter() - started

    times: dict[str, list[float]] = {"search_period_ms": [], "simulate_ms": [], "cpsat_hint_ms": []}
    for _ in range(rounds):
        for key, fn in zip(times, (search, simulator, hint)):
            times[key].append(fn() * 1e3)
    return {"graph": name, "ops": len(graph.ops), "units": len(state.units),
            **{key: statistics.median(values) for key, values in times.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,gpt2_small,transformer_like:12",
                        help="example models, or transformer_like:N")
    parser.add_argument("--candidates", type=int, default=500, help="random bucketings per search round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the rows here, with the commit and the machine")
    args = parser.parse_args()
    begin()
    rows = []
    print(f"{'graph':<22} {'ops':>6} {'units':>6} {'search ms':>10} {'simulate ms':>12} {'hint ms':>9}")
    for name in args.models.split(","):
        graph = (transformer_like(int(name.split(":")[1])) if name.startswith("transformer_like:")
                 else cached_graph(name, "a100"))
        row = measure(name, graph, seed=args.seed, candidates=args.candidates, rounds=args.rounds)
        rows.append(row)
        print(f"{name:<22} {row['ops']:>6} {row['units']:>6} {row['search_period_ms']:>10.4f} "
              f"{row['simulate_ms']:>12.3f} {row['cpsat_hint_ms']:>9.3f}", flush=True)
    if args.json:
        write_result(args.json, rows, vars(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
