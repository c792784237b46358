"""Commands that make and read plans: ``plan``, ``simulate``, ``inspect``, ``compare``, ``sweep``."""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import SchedoptError
from ..io import dumps, write_json_atomic, write_text_atomic
from ..plan import Plan
from ..problem import Problem
from ..units import format_bandwidth, format_duration, format_size, parse_bandwidth
from .options import (
    _cluster, _graph, _parse_options, _print_progress, _problem, _progress_bar, _show_progress, _solver_list,
)


def _cmd_plan(args: argparse.Namespace) -> int:
    from ..solvers import get

    solver = get(args.solver)
    graph = _graph(args)
    problem = _problem(args, graph)
    options = _parse_options(args.option)
    if args.time_limit is not None:
        options["time_limit_s"] = args.time_limit
    if (sys.stderr.isatty() or args.progress) and "on_progress" in inspect.signature(solver).parameters:
        options["on_progress"] = _print_progress
    plan = solver(problem, seed=args.seed, **options)
    plan.save(args.output)
    p, info = plan.predicted, plan.solver
    assert p is not None
    print(
        f"{info.name} [{info.status}] on {graph.name}, {problem.cluster.describe()}, {problem.mode}, "
        f"{problem.execution}: "
        f"iteration {format_duration(p.iteration_s)} (lower bound {format_duration(p.lower_bound_s)}, "
        f"exposed comm {format_duration(p.exposed_comm_s)}{_proven(info)}), " + _plan_shape(plan) + f" -> {args.output}"
    )
    return 0


def _proven(info: Any) -> str:
    """``; cpsat proved 64.3ms, gap 3.09%, for every plan with this forward order``: a solver's own bound,
    where it proved one (above the simulator's lower bound, which holds for every plan, and over the plans
    it names); and where the ranks' varying op times chose another solver's plan, whose."""
    if info.gap is None:
        return ""
    covers = str(info.stats.get("bound_covers", "")).split(" (")[0]
    chosen = info.stats.get("rank_choice", info.name)
    ranks = ""
    if (rank_gap := info.stats.get("rank_gap")) is not None:
        period_s = info.stats["rank_period_s"]
        ranks = (f"; {chosen}'s plan kept, the fastest on the ranks' varying op times" if chosen != info.name else
                 "; on the ranks' varying op times") + (f": {format_duration(period_s)}, {rank_gap:.2%} above the "
                                                        f"bound there ({format_duration(period_s / (1 + rank_gap))})")
    return (f"; {info.name} proved {format_duration(info.bound_s)}, gap {info.gap:.2%}"
            + (f", for {covers}" if covers else "") + ranks)


def _plan_shape(plan: Plan) -> str:
    """``12 buckets``, or for a sharded plan ``13 units, peak 468.0MiB per rank``."""
    if plan.mode != "sharded":
        return f"{len(plan.buckets)} bucket{'s' if len(plan.buckets) != 1 else ''}"
    peak = plan.predicted.peak_memory_bytes if plan.predicted else None
    return f"{len(plan.units)} units" + (f", peak {format_size(peak)} per rank" if peak is not None else "")


def _simulate_summary(graph: Any, plan: Plan, problem: Problem, timeline: Any) -> dict[str, Any]:
    """What ``simulate --format json`` prints."""
    return {
        "model": graph.name,
        "solver": plan.solver.name,
        "mode": timeline.mode,
        "cluster": problem.cluster.to_json(),
        "iteration_s": timeline.iteration_s,
        "compute_s": timeline.compute_s,
        "comm_s": timeline.comm_s,
        "exposed_comm_s": timeline.exposed_comm_s,
        "lower_bound_s": timeline.lower_bound_s,
        "gap_to_lower_bound": timeline.gap,
        "num_buckets": len(plan.buckets),
        "num_units": len(plan.units),
        "peak_memory_bytes": timeline.peak_memory_bytes,
        "peak_memory_s": timeline.peak_memory_s,
        "memory_budget_bytes": plan.memory_budget_bytes,
        "num_steps_simulated": timeline.num_steps,
        "converged": timeline.converged,
        "windows": {name: {"ready_s": w.ready_s, "deadline_s": w.deadline_s, "synced_s": w.synced_s,
                           "width_s": w.width_s, "slack_s": w.slack_s} for name, w in timeline.windows.items()},
    }


def _rank_run(args: argparse.Namespace, problem: Problem, plan: Plan) -> dict[str, Any] | None:
    """The period on the rank model (``schedopt.ranks``) with ``--op-spread`` / ``--step-spread``, each
    as the graph's costs were measured to vary where not given; None where nothing varies."""
    from ..rank_bound import bound_on_ranks
    from ..ranks import RankModel, simulate_ranks

    ranks = args.ranks or problem.cluster.world_size
    measured = RankModel.measured(problem.graph, ranks)
    op = measured.op_spread if args.op_spread is None else args.op_spread
    step = measured.step_spread if args.step_spread is None else args.step_spread
    if not (op or step):
        return None
    model = RankModel(ranks=ranks, op_spread=op, step_spread=step, seed=args.seed)
    run = simulate_ranks(problem, plan, model)
    return {**model.to_json(), "period_s": run.period, "steps": run.steps, "stable": run.stable,
            "lower_bound_s": bound_on_ranks(problem, plan.order, model), "describe": model.describe()}


def _cmd_simulate(args: argparse.Namespace) -> int:
    from ..simulate import simulate
    from ..trace import write_chrome_trace, write_gantt

    plan = Plan.load(args.plan)
    graph = _graph(args)
    problem = plan.problem(graph, _cluster(args, base=plan.cluster), mode=args.mode or plan.mode)
    timeline = simulate(problem, plan)
    if args.trace:
        write_chrome_trace(timeline, args.trace, name=f"{graph.name} / {plan.solver.name}")
    if args.gantt:
        write_gantt(timeline, args.gantt, title=f"{graph.name} / {plan.solver.name}")
    summary = _simulate_summary(graph, plan, problem, timeline)
    ranks = _rank_run(args, problem, plan)
    if ranks is not None:
        summary["ranks"] = ranks
    if not timeline.converged:
        print(f"warning: the steady state did not repeat within {timeline.num_steps} steps; the iteration is the "
              f"mean of the last four periods", file=sys.stderr)
    if args.format == "json":
        print(dumps(summary, indent=2))
        return 0
    print(f"model      {graph.name}  ({len(graph.ops)} ops, {len(graph.params)} params)")
    print(f"plan       {plan.solver.name} [{plan.solver.status}], {_plan_shape(plan)}")
    print(f"cluster    {problem.cluster.describe()}")
    print(f"mode       {timeline.mode}")
    slowed = f" (with compute {problem.cluster.effective_interference:.0%} slower beside the wire)" \
        if problem.cluster.effective_interference else ""
    print(f"iteration  {format_duration(timeline.iteration_s)}   lower bound {format_duration(timeline.lower_bound_s)}"
          f"{slowed}   gap {timeline.gap * 100:.2f}%")
    print(f"compute    {format_duration(timeline.compute_s)}   comm {format_duration(timeline.comm_s)}"
          f"   exposed comm {format_duration(timeline.exposed_comm_s)}")
    if ranks is not None:
        print(f"ranks      {format_duration(ranks['period_s'])} ({ranks['period_s'] / timeline.iteration_s - 1:+.1%}) on "
              f"{ranks['describe']}, mean of {ranks['steps']} steps"
              + ("" if ranks["stable"] else " (not yet stable to 1%)")
              + f"; lower bound on the ranks {format_duration(ranks['lower_bound_s'])}")
    if timeline.peak_memory_bytes is not None:
        budget = f" (budget {format_size(plan.memory_budget_bytes)})" if plan.memory_budget_bytes else ""
        print(f"memory     peak {format_size(timeline.peak_memory_bytes)} per rank{budget} at "
              f"{format_duration(timeline.peak_memory_s)}: {timeline.peak_memory_what}")
    tight = sorted(timeline.windows.items(), key=lambda kv: kv[1].slack_s)[:5]
    print("tightest windows:")
    for name, w in tight:
        print(f"  {name:<40} ready {format_duration(w.ready_s):>9}  deadline {format_duration(w.deadline_s):>9}"
              f"  synced {format_duration(w.synced_s):>9}  slack {w.slack_s * 1e3:+9.3f}ms")
    for label, path in (("trace", args.trace), ("gantt", args.gantt)):
        if path:
            print(f"{label:<10} {path}")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    plan = Plan.load(args.plan)
    graph = _graph(args) if args.model else None
    if graph is not None:
        from ..plan import validate

        validate(plan, graph)
    if args.format == "json":
        print(dumps(plan.to_json(), indent=2))
        return 0
    from ..plan_text import describe_plan

    print(describe_plan(plan, graph))
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from ..report import COLUMNS, compare, comparison_json, format_csv, format_table

    names = _solver_list(args.solvers, args.mode)
    graph = _graph(args)
    problem = _problem(args, graph)
    out = Path(args.out) if args.out else None

    saved: dict[str, tuple[Plan, Any]] = {}  # solver -> (plan, timeline), with --out

    def save(name: str, plan: Plan) -> None:
        if out is None:
            return
        from ..simulate import simulate
        from ..trace import write_chrome_trace, write_gantt

        plan.save(out / f"{name}.plan.json")
        timeline = simulate(problem, plan)
        write_chrome_trace(timeline, out / f"{name}.trace.json", name=f"{graph.name} / {name}")
        write_gantt(timeline, out / f"{name}.gantt.png", title=f"{graph.name} / {name}")
        saved[name] = (plan, timeline)

    def progress(items: list[str]) -> Iterable[str]:
        quiet = not _show_progress(args)
        return items if quiet else _progress_bar(items)

    rows = compare(problem, names, time_limit_s=args.time_limit, seed=args.seed, progress=progress, on_plan=save)
    if args.format == "json":
        print(dumps(comparison_json(problem, rows), indent=2))
    elif args.format == "csv":
        sys.stdout.write(format_csv(rows))
    else:
        print(f"{graph.name}: {len(graph.ops)} ops, {len(graph.params)} params "
              f"({format_size(graph.total_param_bytes)}); {problem.cluster.describe()}; {problem.mode}")
        print(format_table(rows, COLUMNS, drop_empty=True))
        _print_errors(rows)
    if out is not None:
        write_json_atomic(out / "compare.json", comparison_json(problem, rows))
        write_text_atomic(out / "compare.csv", format_csv(rows))
        _write_comparison_chart(problem, saved, rows, out / "compare.png")
    return 0


def _print_errors(rows: list[dict[str, Any]], case: Callable[[dict[str, Any]], str] = lambda row: "") -> None:
    """Why each row without a plan has none, a line each under the table: its ``case`` and its solver."""
    for row in rows:
        if row.get("error"):  # solvers' errors name them already
            prefix = "" if row["error"].startswith(f"{row['solver']}:") else f"{row['solver']}: "
            print(f"{case(row)}{prefix}{row['error']}")


def _write_comparison_chart(problem: Problem, saved: dict[str, tuple[Plan, Any]], rows: list[dict[str, Any]],
                            path: Path) -> None:
    """The baseline's timeline (DDP in barrier mode, as torch runs it; sharded: FSDP2 per block) above the
    best plan's, on one time axis; nothing where no solver has a plan (every one over the memory budget)."""
    from ..report import BASELINE, SHARDED_BASELINE, ddp_timeline
    from ..trace import write_gantt_comparison

    planned = [r for r in rows if r.get("iteration_s") is not None and r["solver"] in saved]
    if not planned:
        return
    best = min(planned, key=lambda r: r["iteration_s"])["solver"]
    baseline = SHARDED_BASELINE if problem.mode == "sharded" else BASELINE
    shown = []
    if baseline in saved:
        plan, timeline = saved[baseline]
        shown.append((baseline, timeline if problem.mode in ("barrier", "sharded") else ddp_timeline(problem, plan)))
    if best != baseline:
        shown.append((best, saved[best][1]))
    write_gantt_comparison([(f"{problem.graph.name} / {name}", timeline) for name, timeline in shown], path)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from ..plots import write_sweep_plot
    from ..report import SWEEP_COLUMNS, format_csv, format_table, sweep

    names = _solver_list(args.solvers, args.mode)
    bandwidths = [parse_bandwidth(b) for b in args.bandwidths.split(",") if b.strip()]
    try:
        world_sizes = [int(n) for n in args.world_sizes.split(",") if n.strip()]
    except ValueError:
        raise SchedoptError(f"--world-sizes must be whole numbers, got {args.world_sizes!r}") from None
    if not bandwidths or not world_sizes or min(world_sizes) < 1:
        raise SchedoptError("--bandwidths and --world-sizes need at least one value each (world sizes >= 1)")
    graph = _graph(args)
    base = _cluster(args)
    quiet = not _show_progress(args)
    rows = sweep(graph, base, bandwidths_Bps=bandwidths, world_sizes=world_sizes, solvers=names, mode=args.mode,
                 execution=args.execution, time_limit_s=args.time_limit, seed=args.seed,
                 max_stale_fraction=args.max_stale_fraction, memory_budget_bytes=args.memory_budget,
                 measured_ranks=args.rank_model == "measured",
                 progress=(lambda cases: cases) if quiet else (lambda cases: _progress_bar(cases, "cases", "case")))
    out = Path(args.out) if args.out else None
    plot = args.plot or (str(out / "sweep.png") if out else None)
    if out is not None:
        write_text_atomic(out / "sweep.csv", format_csv(rows, SWEEP_COLUMNS))
        write_json_atomic(out / "sweep.json", rows)
    if plot:
        write_sweep_plot(rows, plot, title=f"{graph.name}, {args.mode} mode")
    if args.format == "json":
        print(dumps(rows, indent=2))
    elif args.format == "csv":
        sys.stdout.write(format_csv(rows, SWEEP_COLUMNS))
    else:
        print(format_table(rows, ("world_size", "bandwidth_Bps", "solver", "iteration_s", "peak_memory_bytes",
                                  "lower_bound_s", "gap_to_lower_bound", "num_buckets", "num_units", "speedup_vs_ddp",
                                  "speedup_vs_fsdp"),
                           drop_empty=True))
        _print_errors(rows, lambda row: f"{row['world_size']} ranks at {format_bandwidth(row['bandwidth_Bps'])}: ")
        for label, path in (("csv", out / "sweep.csv" if out else None), ("plot", plot)):
            if path:
                print(f"{label:<5} {path}")
    return 0
