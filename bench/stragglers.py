"""Stragglers at scale: how much of each solver's advantage over DDP survives ranks whose op times vary.

    python bench/stragglers.py --json bench/results/stragglers.json --plot bench/results/stragglers.png

Per model (A100 op costs), world size (8, 64) on 100 GbE and mode (barrier, overlap), every solver
plans on one rank as today (cpsat warm-started, ``--time-limit`` each); then each plan, and DDP's,
runs on the rank model (``schedopt.ranks``) at each of ``--spreads``: every op varying per rank and
step (``OP``, a coefficient of variation), and each rank's whole step as well (``OP/STEP``; seeded).
A row: the solver's speedup over DDP on one rank and at each spread, how much it changed, and the
case's lower bound on one rank and at each spread (``bounds_s``: the larger of the simulator's and the
slowest rank's, :mod:`schedopt.rank_bound`), so that a straggler loss no plan avoids is told apart. A
collective waits for the slowest rank, so a plan whose collectives sit on the critical path pays for
every straggler; one that hides them has slack. Independent per-op variation mostly averages out
over a step's hundreds of ops; a whole slow step (contention, a slow host) does not.

Sharded data parallel too (``--modes sharded,hsdp``, no memory budget; ``sharded-peak``,
``hsdp-peak``: within FSDP2 per block's peak per rank): every sharded solver against FSDP2 per block
(``fsdp-per-block``) instead of DDP. ``hsdp`` shards over one node's ranks
(``--gpus-per-node``, linked by ``--shard-network``) and replicates across nodes: the forward's
all-gathers wait for the slowest rank of a node, each reduce-scatter's all-reduce across the replicas
for every rank (world sizes of one node are skipped: there HSDP is FSDP).

    python bench/stragglers.py --models gpt2_small,bert_base,resnet50 --world-sizes 8,64 \
        --modes sharded,hsdp,sharded-peak,hsdp-peak \
        --json bench/results/stragglers_sharded.json --plot bench/results/stragglers_sharded.png

Prints the table (and each solver's median change per spread); ``--plot`` draws the speedups.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from schedopt import Cluster, Problem
from schedopt.cluster import PRESETS
from schedopt.errors import SolverError
from schedopt.orders import engine_order
from schedopt.rank_bound import bound_on_ranks
from schedopt.ranks import RankModel, simulate_ranks
from schedopt.solvers import get, solvers_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
from heuristics import cached_graph  # noqa: E402
from provenance import begin, write_result  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,vgg16,inception,gpt2_small,bert_base")
    parser.add_argument("--world-sizes", default="8,64")
    parser.add_argument("--network", default="100gbe")
    parser.add_argument("--modes", default="barrier,overlap",
                        help="of barrier, overlap, osp, sharded, hsdp, sharded-peak, hsdp-peak")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="hsdp: the ranks each unit is sharded over")
    parser.add_argument("--shard-network", choices=sorted(PRESETS), default="nvlink",
                        help="hsdp: the link inside a node (default nvlink)")
    parser.add_argument("--spreads", default="0.02,0.05,0.02/0.05,0.02/0.15",
                        help="comma-separated OP or OP/STEP coefficients of variation: per op, rank and step; and per "
                             "rank and step, shared by its ops (the traces measured 11-17%%)")
    parser.add_argument("--time-limit", type=float, default=10.0, help="cpsat's, per case (seconds)")
    parser.add_argument("--seed", type=int, default=0, help="the solvers' and the rank model's seed")
    parser.add_argument("--json", help="write the rows here, with the commit and the machine")
    parser.add_argument("--plot", help="write the speedups per spread here (PNG)")
    return parser


def parse_spreads(text: str) -> list[tuple[float, float]]:
    """``"0.02,0.02/0.05"`` -> ``[(0.02, 0.0), (0.02, 0.05)]``: (op, step) coefficients of variation."""
    out = []
    for item in text.split(","):
        op, _, step = item.strip().partition("/")
        out.append((float(op), float(step or 0.0)))
    return out


def label(spread: list[float] | tuple[float, float]) -> str:
    op, step = spread
    return f"{op:.0%} op" + (f"/{step:.0%} step" if step else "")


#: Each mode's baseline, whose plan every speedup is measured against (DDP's, where not named).
BASELINES = {"sharded": "fsdp-per-block"}


def problem_of(graph, mode: str, n: int, args: argparse.Namespace) -> Problem | None:
    """The case's problem: ``hsdp`` is ``sharded`` on nodes of ``--gpus-per-node`` ranks (None at one node);
    ``-peak`` after either, within FSDP2 per block's peak per rank (no more memory than the baseline)."""
    mode, _, peak = mode.partition("-")
    if mode != "hsdp":
        problem = Problem(graph=graph, cluster=Cluster.preset(args.network, world_size=n), mode=mode)
    elif n <= args.gpus_per_node or n % args.gpus_per_node:
        print(f"  hsdp at {n} ranks: not {args.gpus_per_node}-rank nodes times more than one, skipped", file=sys.stderr)
        return None
    else:
        inside = PRESETS[args.shard_network]
        cluster = Cluster.preset(args.network, world_size=n, replicas=n // args.gpus_per_node,
                                 shard_bandwidth_Bps=inside["bandwidth_Bps"], shard_latency_s=inside["latency_s"])
        problem = Problem(graph=graph, cluster=cluster, mode="sharded")
    if peak:
        budget = get(BASELINES["sharded"])(problem).predicted.peak_memory_bytes
        problem = replace(problem, memory_budget_bytes=math.ceil(budget))
    return problem


def case_rows(problem: Problem, spreads: list[tuple[float, float]], *, time_limit: float, seed: int) -> list[dict]:
    """Every solver's plan on one rank and on the rank model at each spread; the baseline's row first."""
    plans = {}
    for name in solvers_for(problem.mode):
        try:
            plans[name] = get(name)(problem, seed=seed, **({"time_limit_s": time_limit} if name == "cpsat" else {}))
        except SolverError as exc:
            print(f"  {exc}" if str(exc).startswith(name) else f"  {name}: {exc}", file=sys.stderr)
    ranks = problem.cluster.world_size
    models = [RankModel(ranks=ranks, op_spread=op, step_spread=step, seed=seed) for op, step in spreads]
    periods, took = {}, {}
    for name, plan in plans.items():
        periods[name], took[name] = [plan.predicted.iteration_s], []
        for model in models:
            started = time.perf_counter()
            periods[name].append(simulate_ranks(problem, plan, model).period)
            took[name].append(time.perf_counter() - started)
    baseline = BASELINES.get(problem.mode, "pytorch-ddp")
    base = periods[baseline]
    # no plan in the engine's order (every plan here) is faster, on one rank and on each spread's ranks
    order = engine_order(problem.graph)
    bounds = [bound_on_ranks(problem, order, m) for m in [RankModel(ranks=ranks), *models]]
    return [{"solver": name, "baseline": baseline, "periods_s": p, "speedup": [d / t for d, t in zip(base, p)],
             "change": [(d / t) / (base[0] / p[0]) - 1 for d, t in zip(base[1:], p[1:])], "rank_model_s": took[name],
             "bounds_s": bounds}
            for name, p in sorted(periods.items(), key=lambda kv: kv[0] != baseline)]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    spreads = parse_spreads(args.spreads)
    begin()
    started, rows = time.monotonic(), []
    print(f"{'model':<11} {'ranks':>5} {'mode':<12} {'solver':<14} {'1 rank':>7} "
          + " ".join(f"{label(s):>13}" for s in spreads) + "  change")
    for model in args.models.split(","):
        graph = cached_graph(model, "a100")
        for n in map(int, args.world_sizes.split(",")):
            for mode in args.modes.split(","):
                problem = problem_of(graph, mode, n, args)
                if problem is None:
                    continue
                for r in case_rows(problem, spreads, time_limit=args.time_limit, seed=args.seed):
                    rows.append({"model": model, "world_size": n, "network": args.network, "mode": mode,
                                 "replicas": problem.cluster.replicas, "spreads": spreads, **r})
                    print(f"{model:<11} {n:>5} {mode:<12} {r['solver']:<14} "
                          + f"{r['speedup'][0]:7.3f}x " + " ".join(f"{x:12.3f}x" for x in r["speedup"][1:]) + "  "
                          + " ".join(f"{c:+.1%}" for c in r["change"]))
    summary(rows, spreads)
    slowest = max(rows, key=lambda r: max(r["rank_model_s"]))
    print(f"slowest rank-model run: {max(slowest['rank_model_s']):.2f} s ({slowest['model']}, {slowest['world_size']} "
          f"ranks, {slowest['mode']}, {slowest['solver']})")
    if args.json:
        write_result(args.json, rows, vars(args))
    if args.plot:
        plot(rows, spreads, args.plot)
    print(f"stragglers bench: {time.monotonic() - started:.0f} s")
    return 0


def cases_of(rows: list[dict], mode: str) -> list[tuple]:
    """The (model, world size, mode) cases of ``mode`` with bounds (rows before ``bounds_s`` was recorded: none)."""
    return list(dict.fromkeys((r["model"], r["world_size"], r["mode"]) for r in rows
                              if r["mode"] == mode and "bounds_s" in r))


def best_over_bound(rows: list[dict], case: tuple, i: int) -> float:
    """The case's best period at spread ``i`` (0: one rank) over its lower bound there."""
    mine = [r for r in rows if (r["model"], r["world_size"], r["mode"]) == case]
    return min(r["periods_s"][i] for r in mine) / mine[0]["bounds_s"][i]


def _planned(rows: list[dict]) -> list[dict]:
    """The rows of every solver but its case's baseline (DDP's rows before the baseline was recorded)."""
    return [r for r in rows if r["solver"] != r.get("baseline", "pytorch-ddp")]


def summary(rows: list[dict], spreads: list[tuple[float, float]]) -> None:
    """Each solver's median change in speedup over its baseline, per mode, spread and world size; and how
    far the best plan of each case is from the bound on the ranks, at most."""
    for mode in dict.fromkeys(r["mode"] for r in rows):
        if cases := cases_of(rows, mode):
            worst = [max(best_over_bound(rows, case, i) for case in cases) for i in range(len(spreads) + 1)]
            print(f"{mode:<12} the best plan over the lower bound, at most: "
                  + ", ".join(f"{name} {w:.3f}x" for name, w in zip(["1 rank", *map(label, spreads)], worst)))
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine_all = [r for r in _planned(rows) if r["mode"] == mode]
        for solver in sorted({r["solver"] for r in mine_all}):
            mine = [r for r in mine_all if r["solver"] == solver]
            parts = [f"{label(s)} at {n} ranks "
                     f"{statistics.median(r['change'][i] for r in mine if r['world_size'] == n):+.1%}"
                     for i, s in enumerate(spreads) for n in sorted({r["world_size"] for r in mine})]
            print(f"{mode:<12} {solver:<14} median change of its speedup over {mine[0].get('baseline', 'pytorch-ddp')}: "
                  + ", ".join(parts))


def plot(rows: list[dict], spreads: list[tuple[float, float]], path: str) -> None:
    """One panel per world size and mode: each solver's speedup over its baseline (median over models)
    per spread."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = sorted({(r["world_size"], r["mode"]) for r in rows})
    columns = min(4, len(cases))
    height = math.ceil(len(cases) / columns)
    fig, axes = plt.subplots(height, columns, figsize=(4.2 * columns, 3.6 * height), sharey=True, squeeze=False)
    for ax in axes.flat[len(cases):]:
        ax.set_visible(False)
    names = ["1 rank", *(label(s) for s in spreads)]
    color = {s: f"C{i}" for i, s in enumerate(sorted({r["solver"] for r in _planned(rows)}))}  # one per solver
    for ax, (n, mode) in zip(axes.flat, cases):
        case = [r for r in _planned(rows) if (r["world_size"], r["mode"]) == (n, mode)]
        for solver in sorted({r["solver"] for r in case}):
            mine = [r["speedup"] for r in case if r["solver"] == solver]
            ax.plot(range(len(names)), [statistics.median(s[i] for s in mine) for i in range(len(names))],
                    marker="o", label=solver, color=color[solver])
        ax.axhline(1.0, color="grey", lw=0.8)
        baseline = next((r.get("baseline", "pytorch-ddp") for r in rows if r["mode"] == mode), "pytorch-ddp")
        ax.set_title(f"{n} ranks, {mode} (over {baseline})", fontsize=9)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=7)
        ax.legend(fontsize=7)
    for row in axes:
        row[0].set_ylabel("speedup (median over models)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
