"""Every solver on the example models: iteration time, speedup over pytorch-ddp, gap to the lower bound.

    python bench/heuristics.py                          # resnet50 vgg16 inception gpt2_small, 8 ranks, 10gbe
    python bench/heuristics.py --network 100gbe --mode overlap --world-size 64

Graphs are imported at aten level on the A100 roofline (cached under
out/bench/graphs). The last line checks that caramel is no slower than
pytorch-ddp on every model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from schedopt import Cluster, Problem, TrainGraph
from schedopt.load import ImportOptions, load_model
from schedopt.report import compare, format_table
from schedopt.solvers import solvers_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import begin, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def cached_graph(name: str, device: str) -> TrainGraph:
    path = ROOT / "out" / "bench" / "graphs" / f"{name}.{device}.json"
    if path.exists():
        return TrainGraph.load(path)
    graph = load_model(f"{ROOT / 'examples' / 'models.py'}:{name}", ImportOptions(device=device))
    graph.save(path)
    return graph


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,vgg16,inception,gpt2_small")
    parser.add_argument("--network", default="10gbe")
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--mode", default="barrier", choices=["barrier", "overlap"])
    parser.add_argument("--device", default="a100")
    parser.add_argument("--execution", default="compiled", choices=["eager", "compiled"],
                        help="compiled (default: the solvers' reordering counts) or eager (engine order fixed)")
    parser.add_argument("--time-limit", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0, help="every solver's seed (default 0)")
    parser.add_argument("--json", help="write the rows here, with the commit and the machine")
    args = parser.parse_args()
    solvers = [s for s in solvers_for(args.mode) if s != "cpsat"] if args.time_limit is None else solvers_for(args.mode)
    begin()
    slower, all_rows = [], []
    for name in args.models.split(","):
        graph = cached_graph(name, args.device)
        problem = Problem(graph=graph, cluster=Cluster.preset(args.network, world_size=args.world_size),
                          mode=args.mode, execution=args.execution)
        rows = compare(problem, solvers, time_limit_s=args.time_limit, seed=args.seed)
        all_rows += [{"model": name, **row} for row in rows]
        print(f"\n{name}: {len(graph.ops)} ops, {len(graph.params)} params; {problem.cluster.describe()}; {args.mode}")
        print(format_table(rows, ("solver", "iteration_s", "speedup_vs_ddp", "gap_to_lower_bound", "lower_bound_s",
                                  "num_buckets", "solve_time_s")))
        by = {r["solver"]: r for r in rows}
        if by["caramel"]["iteration_s"] > by["pytorch-ddp"]["iteration_s"] * (1 + 1e-9):
            slower.append(name)
    print(f"\ncaramel no slower than pytorch-ddp on every model: {'yes' if not slower else 'NO: ' + ', '.join(slower)}")
    if args.json:
        write_result(args.json, all_rows, vars(args))
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
