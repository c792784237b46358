"""Sharded plans, simulated: cpsat against FSDP2's layouts under a memory budget.

    python bench/sharded.py --json bench/results/sharded.json --plot out/sharded.png

For GPT-2 small, BERT base and a 1B-parameter ``transformer_like`` (A100 op costs), at 8 and 64
ranks on 100 GbE and ``ib-hdr``, with the memory budget at 100% and 60% of ``fsdp-per-block``'s
peak, it prints each solver's step (ms) and peak memory, or why it has no plan within the budget (and with no
budget at all: the barrier-like case, where every unit may stay unsharded),
cpsat's proven bound and its speedup over ``fsdp-per-block``. Last lines: the budgets below the least
peak any plan can hold (:func:`schedopt.shard_sim.memory_floor`), whether cpsat was never
slower than the best baseline within the same budget, in how many cases it was at least 1.15x
``fsdp-per-block`` at no more memory, and its gap to the bound where the budget lets every unit stay
unsharded. ``--plot`` draws each solver's step against the memory its plans hold, with the budgets.
``--replicas R [--shard-network nvlink]``: the same as HSDP, R replicas per case, their inside link
the named one (``bench/results/sharded_hsdp.json``).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

from schedopt import Cluster, Problem
from schedopt.cluster import PRESETS
from schedopt.errors import SolverError
from schedopt.shard_sim import memory_floor, sharded_lower_bound
from schedopt.solvers import get, solvers_for
from schedopt.synthetic import transformer_like

sys.path.insert(0, str(Path(__file__).resolve().parent))
from heuristics import cached_graph  # noqa: E402
from provenance import begin, write_result  # noqa: E402

BASELINES = [s for s in solvers_for("sharded") if s != "cpsat"]


def graph_of(name: str):
    if name == "transformer_1b":  # 18 blocks of hidden 2048: 1.01e9 parameters
        return transformer_like(18, hidden=2048, num_heads=16, seq_len=1024, batch_size=4)
    return cached_graph(name, "a100")


def cluster_of(net: str, n: int, args: argparse.Namespace) -> Cluster:
    """The case's cluster: the preset at ``n`` ranks, as ``--replicas`` HSDP replicas where given, their
    inside link ``--shard-network``'s."""
    inside = PRESETS[args.shard_network] if args.shard_network else {}
    return Cluster.preset(net, world_size=n, replicas=args.replicas, shard_bandwidth_Bps=inside.get("bandwidth_Bps"),
                          shard_latency_s=inside.get("latency_s"))


def run_case(graph, cluster: Cluster, net: str, fraction: float, per_block: tuple[float, float], time_limit: float,
             seed: int) -> dict:
    """One case; ``per_block``: fsdp-per-block's step and peak with no budget."""
    per_block_s, per_block_peak = per_block
    # per-block's own plan fits the 100% budget; none: every unit may stay unsharded (barrier-like)
    budget = None if fraction is None else math.ceil(per_block_peak * fraction)
    problem = Problem(graph=graph, cluster=cluster, mode="sharded", memory_budget_bytes=budget)
    floor = memory_floor(problem)[0]
    row = {"model": graph.name, "world_size": cluster.world_size, "network": net, "replicas": cluster.replicas,
           "budget_fraction": fraction, "memory_budget_bytes": budget, "memory_floor_bytes": floor}
    # the least step of any plan within the budget and fsdp-per-block's own peak: what "faster at no
    # more memory" can reach at most (None: no plan fits)
    cap = per_block_peak if budget is None else min(budget, per_block_peak)
    row["no_more_memory_bound_s"] = (sharded_lower_bound(replace(problem, memory_budget_bytes=math.ceil(cap)))
                                     if cap >= floor else None)
    for name in [*BASELINES, "cpsat"]:
        try:
            options = {"time_limit_s": time_limit} if name == "cpsat" else {}
            plan = get(name)(problem, seed=seed, **options)
            row[f"{name}_s"] = plan.predicted.iteration_s
            row[f"{name}_peak_bytes"] = plan.predicted.peak_memory_bytes
            if name == "cpsat":
                row.update(cpsat_bound_s=plan.solver.bound_s, cpsat_gap=plan.solver.gap,
                           cpsat_result=plan.solver.stats.get("result"),
                           cpsat_resharded=sum(u.reshard_after_forward for u in plan.units),
                           cpsat_units=len(plan.units))
        except SolverError as exc:
            row[f"{name}_s"], row[f"{name}_error"] = None, str(exc)
    base = [row[f"{b}_s"] for b in BASELINES if row[f"{b}_s"] is not None]
    row["best_baseline_s"] = min(base) if base else None
    cp, pb = row["cpsat_s"], row["fsdp-per-block_s"]
    row["speedup_vs_per_block"] = pb / cp if cp and pb else None
    row["most_speedup_at_no_more_memory"] = (per_block_s / row["no_more_memory_bound_s"]
                                             if row["no_more_memory_bound_s"] else None)
    row["no_slower_than_best"] = cp is None and not base or (cp is not None and (not base or cp <= min(base) * (1 + 1e-9)))
    row["barrier_like"] = cp is not None and (budget is None or row["cpsat_resharded"] == 0)
    return row


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = sorted({(r["model"], r["world_size"], r["network"]) for r in rows})
    cols = min(4, len(cases))
    grid = -(-len(cases) // cols)
    fig, axes = plt.subplots(grid, cols, figsize=(3.6 * cols, 3.0 * grid), squeeze=False)
    for ax in axes.flat[len(cases):]:
        ax.axis("off")
    for ax, case in zip(axes.flat, cases):
        mine = [r for r in rows if (r["model"], r["world_size"], r["network"]) == case]
        for name, marker in zip([*BASELINES, "cpsat"], "sD^o"):
            pts = sorted({(r[f"{name}_peak_bytes"] / 2**20, r[f"{name}_s"] * 1e3) for r in mine if r[f"{name}_s"]})
            if pts:
                ax.plot(*zip(*pts), marker=marker, linestyle="-" if name == "cpsat" else "none", label=name)
        for r in mine:
            if r["memory_budget_bytes"] is not None:
                ax.axvline(r["memory_budget_bytes"] / 2**20, color="#bbbbbb", linewidth=0.7, linestyle=":")
        ax.set_title(f"{case[0]}\n{case[1]} x {case[2]}", fontsize=8)
        ax.set_xlabel("peak memory per rank (MiB); dotted: budgets", fontsize=7)
    for row in axes:
        row[0].set_ylabel("step (ms)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def summarize(rows: list[dict]) -> None:
    """The last lines: why cpsat had no plan, and the checks over every case."""
    for r in rows:
        if r.get("cpsat_error"):
            print(f"{r['model']} {r['world_size']} x {r['network']} at {r['budget_fraction']:.0%} of per-block's "
                  f"peak: {r['cpsat_error']}")
    fast = sum(1 for r in rows if (r["speedup_vs_per_block"] or 0) >= 1.15
               and (r["memory_budget_bytes"] is not None or r["cpsat_peak_bytes"] <= r["fsdp-per-block_peak_bytes"]))
    print(f"\ncpsat never slower than the best baseline within the budget: "
          f"{'yes' if all(r['no_slower_than_best'] for r in rows) else 'NO'}")
    print(f"cpsat at least 1.15x fsdp-per-block at no more memory: {fast} of {len(rows)} cases")
    below = [r for r in rows if r["memory_budget_bytes"] is not None and r["memory_budget_bytes"] < r["memory_floor_bytes"]]
    print(f"budgets below the least peak any plan can hold (no plan exists): {len(below)} of {len(rows)} cases"
          + "".join(f"\n  {r['model']} {r['world_size']} x {r['network']} at {r['budget_fraction']:.0%}: "
                    f"{r['memory_budget_bytes'] / 2**20:.0f} MiB < {r['memory_floor_bytes'] / 2**20:.0f} MiB"
                    for r in below))
    reachable = [r for r in rows if (r["most_speedup_at_no_more_memory"] or 0) >= 1.15]
    print(f"cases where a plan at no more memory than fsdp-per-block could be 1.15x faster at all (its step at "
          f"least 1.15x the lower bound within the budget and its own peak): {len(reachable)} of {len(rows)}"
          + "".join(f"\n  {r['model']} {r['world_size']} x {r['network']} at "
                    f"{'no budget' if r['budget_fraction'] is None else format(r['budget_fraction'], '.0%')}: "
                    f"at most {r['most_speedup_at_no_more_memory']:.3f}x" for r in reachable))
    gaps = [r["cpsat_gap"] for r in rows if r["barrier_like"] and r["cpsat_gap"] is not None]
    if gaps:
        print(f"cpsat's gap to its bound where nothing is resharded: at most {max(gaps):.2%} over {len(gaps)} cases")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2_small,bert_base,transformer_1b")
    parser.add_argument("--world-sizes", default="8,64")
    parser.add_argument("--networks", default="100gbe,ib-hdr")
    parser.add_argument("--fractions", default="1.0,0.6,none",
                        help="budgets, as shares of fsdp-per-block's peak; none: no budget (barrier-like)")
    parser.add_argument("--replicas", type=int, default=1, help="HSDP: the ranks as this many replicas (default 1)")
    parser.add_argument("--shard-network", choices=sorted(PRESETS), default=None,
                        help="HSDP: the link inside a replica (default: the case's network)")
    parser.add_argument("--time-limit", type=float, default=20.0, help="cpsat's, per case")
    parser.add_argument("--seed", type=int, default=0, help="every solver's seed (default 0)")
    parser.add_argument("--json", help="also write the rows here, with the commit and the machine")
    parser.add_argument("--plot", help="write step time against memory budget per solver (PNG)")
    args = parser.parse_args()
    begin()
    rows = []
    print(f"{'model':<22} {'ranks':>5} {'net':<7} {'budget':>6} " + " ".join(f"{b:>15}" for b in BASELINES)
          + f" {'cpsat':>15} {'bound':>8} {'vs block':>8} {'at most':>8}")
    for model in args.models.split(","):
        graph = graph_of(model)
        for n in map(int, args.world_sizes.split(",")):
            for net in args.networks.split(","):
                cluster = cluster_of(net, n, args)
                predicted = get("fsdp-per-block")(Problem(graph=graph, cluster=cluster, mode="sharded")).predicted
                per_block = (predicted.iteration_s, predicted.peak_memory_bytes)
                for fraction in (None if f == "none" else float(f) for f in args.fractions.split(",")):
                    row = run_case(graph, cluster, net, fraction, per_block, args.time_limit, args.seed)
                    rows.append(row)

                    def cell(name: str) -> str:
                        t = row[f"{name}_s"]
                        return f"{'over budget':>15}" if t is None else \
                            f"{t * 1e3:7.2f}/{row[f'{name}_peak_bytes'] / 2**20:5.0f}M"

                    sp = row["speedup_vs_per_block"]
                    bound = row.get("cpsat_bound_s")
                    print(f"{graph.name:<22} {n:>5} {net:<7} {'none' if fraction is None else f'{fraction:.0%}':>6} " + " ".join(cell(b) for b in BASELINES)
                          + f" {cell('cpsat')} {bound * 1e3 if bound else float('nan'):8.2f} "
                          + (f"{sp:7.3f}x" if sp else "       -")
                          + (f" {most:7.3f}x" if (most := row["most_speedup_at_no_more_memory"]) else "        -"),
                          flush=True)
    summarize(rows)
    if args.json:
        write_result(args.json, rows, vars(args))
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
