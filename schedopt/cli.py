"""The ``schedopt`` command line.

Every command reports bad input with one line on stderr and exit status 2.
Subcommands import the solvers only when they need them.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NoReturn, Sequence

from .cluster import PRESETS, Cluster
from .errors import SchedoptError
from .io import check_output_dir, check_output_file, dumps, write_json_atomic, write_text_atomic
from .load import ImportOptions, load_model, model_file, model_kind
from .plan import Plan
from .problem import DEFAULT_MAX_STALE_FRACTION, EXECUTIONS, MODES, Problem
from .units import format_bandwidth, format_duration, format_size, parse_bandwidth, parse_duration, parse_size

__all__ = ["main"]

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except SchedoptError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _spread(text: str) -> float:
    """A coefficient of variation: ``0.05`` or ``5%``, from 0 to 5."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a coefficient of variation such as 0.05 or 5%, got {text!r}") from None
    if not 0 <= value <= 5:
        raise argparse.ArgumentTypeError(f"a coefficient of variation must be from 0 to 5 (500%), got {text!r}")
    return value


def _size(text: str) -> int:
    try:
        size = parse_size(text)
    except SchedoptError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if size <= 0:
        raise argparse.ArgumentTypeError(f"a memory budget must be more than 0 bytes, got {text!r}")
    return size


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model import (for .onnx and file.py:factory models)")
    group.add_argument("--level", choices=["aten", "module"], default="aten",
                       help="torch trace level: aten (exact training step, default) or module (fast, coarse)")
    group.add_argument("--device", default="a100", help="device preset for op costs (a100, h100, h200, v100, cpu)")
    group.add_argument("--batch-size", type=_positive_int, default=None, help="passed to the model factory")


def _graph(args: argparse.Namespace, spec: str | None = None):
    from .cost import DeviceSpec

    DeviceSpec.preset(args.device)  # refuse an unknown device before any import work
    return load_model(spec or args.model, ImportOptions(level=args.level, device=args.device,
                                                        batch_size=args.batch_size))


def _add_problem_options(parser: argparse.ArgumentParser) -> None:
    """The mode, execution and solve options of ``plan``, ``compare`` and ``sweep``."""
    parser.add_argument("--mode", choices=MODES, default="barrier")
    parser.add_argument("--max-stale-fraction", type=float, default=DEFAULT_MAX_STALE_FRACTION,
                        help=f"osp mode: the most parameter bytes (share) read one step stale "
                             f"(default {DEFAULT_MAX_STALE_FRACTION:g}; 0 gives the overlap plan)")
    parser.add_argument("--memory-budget", type=_size, default=None, metavar="SIZE",
                        help="sharded mode: the most parameter and gradient bytes per rank, e.g. 12GiB")
    parser.add_argument("--execution", choices=EXECUTIONS, default="eager",
                        help="eager (default): keep the autograd engine's order, choose buckets and chunks; "
                             "compiled: reorder ops too (needs a compiled runtime)")
    parser.add_argument("--time-limit", type=_duration, default=None, help="solver time limit, e.g. 30 or 30s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rank-model", choices=("measured", "none"), default="measured",
                        help="measured (default): where the graph's op times were measured (a profile, a trace), "
                             "cpsat keeps the best of its candidates on every rank, each varying as measured; "
                             "none: one rank")


def _problem(args: argparse.Namespace, graph: Any) -> Problem:
    """The problem ``plan`` and ``compare`` solve: with the ranks varying as the graph's costs were
    measured to vary, unless ``--rank-model none``."""
    from .ranks import RankModel

    cluster = _cluster(args)
    return Problem(graph=graph, cluster=cluster, mode=args.mode, execution=args.execution,
                   max_stale_fraction=args.max_stale_fraction, memory_budget_bytes=args.memory_budget,
                   rank_model=RankModel.measured(graph, cluster.world_size) if args.rank_model == "measured" else None)


def _add_cluster_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    group = parser.add_argument_group("cluster")
    group.add_argument("--world-size", type=_positive_int, default=None,
                       help="number of data-parallel ranks" + (" (default 8)" if defaults else ""))
    group.add_argument("--network", choices=sorted(PRESETS), default=None,
                       help="network preset" + (" (default 10gbe)" if defaults else ""))
    group.add_argument("--bandwidth", help="per-rank bus bandwidth, e.g. 10Gbps or 1.25GB/s (overrides the preset)")
    group.add_argument("--latency", help="all-reduce step latency alpha, e.g. 20us (overrides the preset)")
    group.add_argument("--algorithm", choices=["ring", "tree"], default=None, help="all-reduce algorithm")
    group.add_argument("--replicas", type=_positive_int, default=None,
                       help="sharded mode: HSDP, the ranks in this many replica groups, each unit sharded over "
                            "world-size / replicas ranks (default 1: FSDP)")
    group.add_argument("--shard-network", choices=sorted(PRESETS), default=None,
                       help="HSDP: the link inside a replica (e.g. nvlink), which its all-gathers and "
                            "reduce-scatters use; --network is then the link across replicas")
    group.add_argument("--cluster", metavar="FILE", default=None,
                       help="a cluster JSON (from 'schedopt calibrate'); the options above override its fields")


def _cluster(args: argparse.Namespace, base: Cluster | None = None) -> Cluster:
    """Build the cluster from the options, starting from ``--cluster``, else ``base`` (a plan's), when given."""
    if getattr(args, "cluster", None):
        if args.network is not None:
            raise SchedoptError("give --cluster or --network, not both")
        base = Cluster.load(args.cluster)
    elif base is None or args.network is not None:  # a preset; 8 ranks unless told otherwise
        base = Cluster.preset(args.network or "10gbe", world_size=args.world_size or (base.world_size if base else 8))
    overrides: dict[str, Any] = {}
    if args.world_size is not None:
        overrides["world_size"] = args.world_size
    if args.bandwidth is not None:
        overrides["bandwidth_Bps"] = parse_bandwidth(args.bandwidth)
    if args.latency is not None:
        overrides["latency_s"] = parse_duration(args.latency)
    if args.algorithm is not None:
        overrides["algorithm"] = args.algorithm
    if args.replicas is not None:
        overrides["replicas"] = args.replicas
    if args.shard_network is not None:  # the link inside a replica, instead of the costs measured there
        link = PRESETS[args.shard_network]
        overrides.update(shard_bandwidth_Bps=link["bandwidth_Bps"], shard_latency_s=link["latency_s"], shard_costs=None)
    if not overrides:
        return base
    if "bandwidth_Bps" in overrides or "latency_s" in overrides:  # another link than the one measured
        overrides.update(name="custom", shard_costs=None)
    ranks = {key: overrides.pop(key) for key in ("world_size", "replicas") if key in overrides}
    cluster = Cluster(**{**base.to_json(), **overrides})
    if not ranks:
        return cluster
    return cluster.with_ranks(ranks.get("world_size", cluster.world_size), ranks.get("replicas", cluster.replicas))


def _parse_options(pairs: Sequence[str]) -> dict[str, Any]:
    """Parse ``key=value`` solver options; values are JSON when they parse as JSON, else strings."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SchedoptError(f"bad solver option {pair!r}: expected key=value")
        flag = {"seed": "--seed", "time_limit_s": "--time-limit"}.get(key.replace("-", "_"))
        if flag:
            raise SchedoptError(f"solver option {key!r} has a flag of its own: use {flag}")
        try:
            options[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            options[key.replace("-", "_")] = value
    return options


def _solver_list(text: str, mode: str) -> list[str]:
    from .solvers import solvers_for

    if text == "all":
        return solvers_for(mode)
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise SchedoptError("--solvers needs at least one name, or 'all'")
    return names


# ---------------------------------------------------------------- commands


def _describe_graph(graph) -> str:
    totals = graph.totals
    flops = sum(op.flops for op in graph.ops.values() if op.phase != "optimizer")
    return (f"{graph.name}: {len(graph.ops)} ops ({len(graph.ops_in('forward'))} forward, "
            f"{len(graph.ops_in('backward'))} backward), {len(graph.params)} params "
            f"({format_size(graph.total_param_bytes)}), {flops / 1e9:.3g} GFLOP per step; "
            f"forward {format_duration(totals.forward_s)}, backward {format_duration(totals.backward_s)}, "
            f"optimizer {format_duration(totals.optimizer_s)}")


def _cmd_import(args: argparse.Namespace) -> int:
    graph = _graph(args)
    costs = None
    if args.trace_in:
        from .kineto import trace_files
        from .trace_costs import trace_costs

        costs = trace_costs(graph, trace_files([args.trace_in])[0])
        graph = costs.graph
    graph.save(args.output)
    print(f"{_describe_graph(graph)} -> {args.output}")
    if costs is not None:
        print(costs.describe())
    return 0


def _runnable(args: argparse.Namespace, what: str) -> Any:
    """The factory ``args.model`` names, called (``args.batch_size``): ``what`` runs the model, so an ONNX
    file or a graph JSON is refused."""
    if model_kind(args.model) != "factory":
        raise SchedoptError(f"{what} runs the model, so it needs path/to/file.py:factory, got {args.model!r}")
    from .importers import load_factory

    return load_factory(args.model, batch_size=args.batch_size)


def _cmd_profile(args: argparse.Namespace) -> int:
    import os

    from .importers.profile import on_device, profile_launched, profile_torch

    spec = _runnable(args, "profile")
    launched = "RANK" in os.environ or "WORLD_SIZE" in os.environ  # under torchrun: every rank profiles at once
    device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if args.on == "cuda" and launched else args.on
    model, inputs = on_device(spec.model, spec.example_inputs, device)
    if launched:
        done = profile_launched(model, inputs, loss_fn=spec.loss_fn, name=spec.name, iterations=args.iterations)
        if done is None:  # not rank 0
            return 0
        graph, reports = done
    else:
        graph, report = profile_torch(model, inputs, loss_fn=spec.loss_fn, name=spec.name, iterations=args.iterations)
        reports = [report]
    graph.save(args.output)
    print(_describe_graph(graph))
    for rank, report in enumerate(reports):
        print(("" if not launched else f"rank {rank}: ")
              + f"measured step {format_duration(report.measured_step_s)} on {report.device} "
              f"(mean of {report.num_iterations}); predicted from op times {format_duration(report.predicted_step_s)}"
              f" ({report.error * 100:+.1f}%)"
              + (f"; op times scaled by +{report.overhead:.1%} to take the engine's time between them" if report.overhead else "")
              + ("" if launched else f" -> {args.output}"))
    if launched:
        print(f"each op's median over the ranks -> {args.output}")
    return 0


def _print_progress(event: Any) -> None:
    """Show a solver's objective and bound as they improve (CP-SAT reports every new solution)."""
    gap = (event.objective_s - event.bound_s) / event.objective_s if event.objective_s > 0 else 0.0
    print(f"  {event.wall_s:7.1f}s  objective {format_duration(event.objective_s):>9}  "
          f"bound {format_duration(event.bound_s):>9}  gap {gap:6.2%}", file=sys.stderr, flush=True)


def _cmd_plan(args: argparse.Namespace) -> int:
    from .solvers import get

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
    p = plan.predicted
    assert p is not None
    print(
        f"{plan.solver.name} [{plan.solver.status}] on {graph.name}, {problem.cluster.describe()}, {problem.mode}, "
        f"{problem.execution}: "
        f"iteration {format_duration(p.iteration_s)} (lower bound {format_duration(p.lower_bound_s)}, "
        f"exposed comm {format_duration(p.exposed_comm_s)}), " + _plan_shape(plan) + f" -> {args.output}"
    )
    return 0


def _plan_shape(plan: Plan) -> str:
    """``12 buckets``, or for a sharded plan ``13 units, peak 468.0MiB per rank``."""
    if plan.mode != "sharded":
        return f"{len(plan.buckets)} buckets"
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
    from .ranks import RankModel, simulate_ranks

    ranks = args.ranks or problem.cluster.world_size
    measured = RankModel.measured(problem.graph, ranks)
    op = measured.op_spread if args.op_spread is None else args.op_spread
    step = measured.step_spread if args.step_spread is None else args.step_spread
    if not (op or step):
        return None
    model = RankModel(ranks=ranks, op_spread=op, step_spread=step, seed=args.seed)
    run = simulate_ranks(problem, plan, model)
    return {**model.to_json(), "period_s": run.period, "steps": run.steps, "stable": run.stable,
            "describe": model.describe()}


def _cmd_simulate(args: argparse.Namespace) -> int:
    from .simulate import simulate
    from .trace import write_chrome_trace, write_gantt

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
              + ("" if ranks["stable"] else " (not yet stable to 1%)"))
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


#: The options that name a file a command writes; ``--out`` names a directory.
_FILE_OUTPUTS = ("output", "trace", "gantt", "plot", "json", "save_cluster")


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before any work, outputs that cannot be written or would overwrite the command's inputs."""
    model = getattr(args, "model", None)
    inputs = tuple(str(v) for v in (model and model_file(model), getattr(args, "plan", None),
                                    getattr(args, "cluster", None)) if v)
    for name in _FILE_OUTPUTS:
        value = getattr(args, name, None)
        if value is not None:
            check_output_file(value, inputs=inputs, what=f"--{name.replace('_', '-')}")
    if getattr(args, "out", None) is not None:
        check_output_dir(args.out)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from .rendezvous import check_rendezvous_env

    check_rendezvous_env(what="schedopt calibrate (it measures the real process group)")
    if int(os.environ["WORLD_SIZE"]) % args.replicas:
        raise SchedoptError(f"--replicas {args.replicas} must divide the {os.environ['WORLD_SIZE']} ranks torchrun "
                            "started (HSDP's mesh: replicas x ranks in each)")
    from .runtime.calibrate import calibrate_launched

    model = None
    if args.model:  # the compute whose interference is measured: the model that will train
        spec = _runnable(args, "calibrate --model")
        model = (spec.name, spec.forward_backward())
    result = calibrate_launched(args.backend, min_bytes=parse_size(args.min_size),
                                max_bytes=parse_size(args.max_size), time_limit_s=args.time_limit,
                                algorithm=args.algorithm, force=args.force, model=model, replicas=args.replicas)
    if result is None:  # not rank 0
        return 0
    result.cluster.save(args.output, calibration=result.to_json())
    if result.cluster.replicas > 1:
        print(f"all-reduces across the {result.cluster.replicas} replicas (one rank of each):")
    for m in result.measurements:
        print(f"  {format_size(m.nbytes):>10}  {format_duration(m.median_s):>10}  "
              f"(model {format_duration(result.link.allreduce_s(m.nbytes))}, {m.num_repeats} runs)")
    fitted = {kind: (fixed, per_byte) for kind, fixed, per_byte in result.cluster.shard_costs or ()}
    for kind, swept in result.shard_measurements.items():  # FSDP2's collectives, per unsharded byte
        fixed, per_byte = fitted[kind]
        inside = " (inside each replica)" if result.cluster.replicas > 1 else ""
        print(f"{kind}s over {result.cluster.shard_group} ranks{inside}:")
        for m in swept:
            print(f"  {format_size(m.nbytes):>10}  {format_duration(m.median_s):>10}  "
                  f"(fit {format_duration(fixed + per_byte * m.nbytes)}, {m.num_repeats} runs)")
    q = result.quality
    print(f"{result.backend}, {result.cluster.describe()}; fit R^2 {q.r2:.4f}, worst residual "
          f"{q.worst_residual:.1%} at {format_size(q.worst_size_bytes)}; interference measured on "
          f"{result.interference_of} -> {args.output}")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    plan = Plan.load(args.plan)
    graph = _graph(args) if args.model else None
    if graph is not None:
        from .plan import validate

        validate(plan, graph)
    if args.format == "json":
        print(dumps(plan.to_json(), indent=2))
        return 0
    from .plan_text import describe_plan

    print(describe_plan(plan, graph))
    return 0


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from .diagnose import diagnose, format_report, plot_step
    from .kineto import load_traces

    if args.plan and not args.model:
        raise SchedoptError("--plan (the plan the traced run applied) needs --model, the traced model")
    traces = load_traces(args.traces)
    report = diagnose(traces)
    data = report.to_json()
    if args.save_cluster:
        _save_traced_cluster(report, args.save_cluster)
    whatif = None
    if args.model:  # the traced step predicted, and what the best plans would gain
        from .diagnose import is_sharded
        from .plan import validate
        from .trace_costs import trace_costs
        from .whatif import check_replicated, what_plans_gain
        from .whatif_sharded import check_inputs, what_sharded_plans_gain

        cluster = Cluster.load(args.cluster) if args.cluster else None
        applied = Plan.load(args.plan) if args.plan else None
        sharded = is_sharded(report)
        if sharded:  # refused before the graph's import and the op matching
            check_inputs(report, cluster, applied)
        else:
            check_replicated(report, applied)
        graph = _graph(args)
        if applied is not None:
            validate(applied, graph)  # a plan of another model: before the op matching
        costs = trace_costs(graph, traces[0].path)
        limit = args.time_limit or 10.0
        progress = (lambda solves: solves) if not _show_progress(args) else (lambda solves: _progress_bar(solves))
        whatif = what_sharded_plans_gain(report, costs.graph, cluster, time_limit_s=limit, applied=applied,
                                         progress=progress) if sharded else \
            what_plans_gain(report, costs.graph, cluster, time_limit_s=limit, reference_rank=traces[0].rank or 0,
                            applied=applied, progress=progress)
        data["what_if"] = {**whatif.to_json(), "trace_costs": costs.describe()}
    if args.json:
        write_json_atomic(args.json, data)
    if args.format == "json":
        print(dumps(data, indent=2))
    else:
        print(format_report(report))
        if whatif is not None:
            print(data["what_if"]["trace_costs"])
            print(whatif.describe())
    if args.plot:
        plot_step(report, traces, args.plot)
    return 0


def _save_traced_cluster(report: Any, path: str) -> None:
    """``diagnose --save-cluster``: the link fitted to the traced all-reduces, as a cluster file that ``plan
    --cluster`` reads (a sharded run's all-gathers and reduce-scatters are FSDP2's: calibrate those)."""
    from .diagnose import is_sharded
    from .whatif import cluster_from_trace

    if is_sharded(report):
        raise SchedoptError("--save-cluster fits the link to a replicated run's all-reduces; these traces are of a "
                            "sharded run: measure its collectives with `torchrun ... -m schedopt calibrate`")
    cluster = cluster_from_trace(report)
    cluster.save(path)
    print(f"cluster    {cluster.describe()} -> {path}", file=sys.stderr)


def _cmd_compare(args: argparse.Namespace) -> int:
    from .report import COLUMNS, compare, comparison_json, format_csv, format_table

    names = _solver_list(args.solvers, args.mode)
    graph = _graph(args)
    problem = _problem(args, graph)
    out = Path(args.out) if args.out else None

    saved: dict[str, tuple[Plan, Any]] = {}  # solver -> (plan, timeline), with --out

    def save(name: str, plan: Plan) -> None:
        if out is None:
            return
        from .simulate import simulate
        from .trace import write_chrome_trace, write_gantt

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
    from .report import BASELINE, ddp_timeline
    from .trace import write_gantt_comparison

    planned = [r for r in rows if r.get("iteration_s") is not None and r["solver"] in saved]
    if not planned:
        return
    best = min(planned, key=lambda r: r["iteration_s"])["solver"]
    baseline = "fsdp-per-block" if problem.mode == "sharded" else BASELINE
    shown = []
    if baseline in saved:
        plan, timeline = saved[baseline]
        shown.append((baseline, timeline if problem.mode in ("barrier", "sharded") else ddp_timeline(problem, plan)))
    if best != baseline:
        shown.append((best, saved[best][1]))
    write_gantt_comparison([(f"{problem.graph.name} / {name}", timeline) for name, timeline in shown], path)


def _show_progress(args: argparse.Namespace) -> bool:
    """A progress bar goes to a terminal (or anywhere with --progress), never beside JSON or CSV output."""
    return args.format == "table" and (sys.stderr.isatty() or args.progress)


def _progress_bar(items: list, desc: str = "solvers", unit: str = "solver") -> Iterator:
    from tqdm import tqdm

    with tqdm(items, desc=desc, unit=unit, file=sys.stderr, leave=False) as bar:
        for item in bar:
            bar.set_postfix_str(str(item))
            yield item


def _cmd_sweep(args: argparse.Namespace) -> int:
    from .plots import write_sweep_plot
    from .report import SWEEP_COLUMNS, format_csv, format_table, sweep

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
                 measured_ranks=args.rank_model == "measured", progress=(lambda cases: cases) if quiet else (lambda cases: _progress_bar(cases, "cases", "case")))
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
                                  "lower_bound_s", "gap_to_lower_bound", "num_buckets", "num_units", "speedup_vs_ddp"),
                           drop_empty=True))
        _print_errors(rows, lambda row: f"{row['world_size']} ranks at {format_bandwidth(row['bandwidth_Bps'])}: ")
        for label, path in (("csv", out / "sweep.csv" if out else None), ("plot", plot)):
            if path:
                print(f"{label:<5} {path}")
    return 0


# ------------------------------------------------------------------ parser


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="schedopt", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("import", help="import a model (.onnx or file.py:factory) into a graph JSON")
    p.add_argument("model", help="model: .onnx, path/to/file.py:factory, or graph JSON")
    _add_model_options(p)
    p.add_argument("-o", "--output", default="graph.json", help="where to write the graph (default graph.json)")
    p.add_argument("--trace", dest="trace_in", metavar="TRACE",
                   help="take op times from this torch.profiler trace of the model's training (a file, "
                                   "or a directory: its first rank's), matched by op kind and order")
    p.set_defaults(run=_cmd_import)

    p = sub.add_parser("profile", help="measure per-op times of a real training step on this machine "
                                          "(under torchrun: on every rank at once)")
    p.add_argument("model", help="path/to/file.py:factory")
    p.add_argument("--batch-size", type=_positive_int, default=None, help="passed to the model factory")
    p.add_argument("--iterations", type=_positive_int, default=10, help="timed iterations (default 10)")
    p.add_argument("--on", choices=("cpu", "cuda"), default="cpu", help="where the step runs (default cpu)")
    p.add_argument("-o", "--output", default="graph.json", help="where to write the graph (default graph.json)")
    p.set_defaults(run=_cmd_profile)

    p = sub.add_parser("plan", help="solve for an op order and buckets; write plan.json")
    p.add_argument("model", help="model: graph JSON, .onnx, or path/to/file.py:factory")
    _add_model_options(p)
    p.add_argument("--solver", required=True, help="solver name (see 'schedopt compare --solvers all')")
    _add_cluster_options(p, defaults=True)
    _add_problem_options(p)
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="solver option (repeatable)")
    p.add_argument("--progress", action="store_true",
                   help="print the solver's objective and bound as they improve, even when stderr is not a terminal")
    p.add_argument("-o", "--output", default="plan.json", help="where to write the plan (default plan.json)")
    p.set_defaults(run=_cmd_plan)

    p = sub.add_parser("simulate", help="simulate a plan; write a Chrome trace and a Gantt chart")
    p.add_argument("plan", help="plan JSON")
    p.add_argument("model", help="the model the plan was made for (graph JSON, .onnx, file.py:factory)")
    _add_model_options(p)
    _add_cluster_options(p, defaults=False)
    p.add_argument("--mode", choices=MODES, default=None, help="override the plan's mode")
    p.add_argument("--trace", help="write a Chrome trace (chrome://tracing, Perfetto)")
    p.add_argument("--gantt", help="write a Gantt chart PNG")
    p.add_argument("--format", choices=["table", "json"], default="table")
    group = p.add_argument_group("the rank model (every rank, op times varying; docs/simulator.md)")
    group.add_argument("--op-spread", type=_spread, default=None,
                       help="each op's variation per rank and step (5%%; default: as the graph's op times were "
                            "measured to vary by a profile or trace, else 0)")
    group.add_argument("--step-spread", type=_spread, default=None,
                       help="each rank's whole-step variation per step (5%%; default as for --op-spread)")
    group.add_argument("--ranks", type=_positive_int, default=None, help="ranks to simulate (default: the cluster's)")
    group.add_argument("--seed", type=int, default=0, help="the rank model's draws (default 0)")
    p.set_defaults(run=_cmd_simulate)

    p = sub.add_parser("calibrate", help="(under torchrun) measure all-reduce times, fit alpha and beta")
    p.add_argument("-o", "--output", default="cluster.json", help="where rank 0 writes the cluster JSON")
    p.add_argument("--min-size", default="4KiB", help="smallest all-reduce (default 4KiB)")
    p.add_argument("--max-size", default="256MiB", help="largest all-reduce (default 256MiB)")
    p.add_argument("--time-limit", type=_duration, default=60.0,
                   help="stop growing the size when the next one would pass this (default 60s)")
    p.add_argument("--algorithm", choices=["ring", "tree"], default="ring", help="the model to fit")
    p.add_argument("--backend", choices=["gloo", "nccl"], default=None, help="default: nccl with CUDA, else gloo")
    p.add_argument("--force", action="store_true",
                   help="write the fit even when it misses a size from 1 MiB up by more than 50%% (a warning)")
    p.add_argument("--model", help="file.py:factory: measure how much slower this model's forward and backward run "
                                   "beside the collectives (default: a matmul stands in for it)")
    p.add_argument("--batch-size", type=_positive_int, default=None, help="passed to the model factory")
    p.add_argument("--replicas", type=_positive_int, default=1,
                   help="HSDP: measure each collective on the group it runs on in this many replica groups of "
                        "consecutive ranks (FSDP2's 2-D mesh): all-reduces across them, all-gathers and "
                        "reduce-scatters inside one (default 1: over every rank)")
    p.set_defaults(run=_cmd_calibrate)

    p = sub.add_parser("inspect", help="show what a plan holds")
    p.add_argument("plan", help="plan JSON")
    p.add_argument("model", nargs="?", help="the plan's model: check the plan against it and show bucket sizes")
    _add_model_options(p)
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(run=_cmd_inspect)

    p = sub.add_parser("diagnose", help="read torch.profiler traces (one per rank): what the run's communication "
                                        "exposed, per step, and why")
    p.add_argument("traces", nargs="+", help="trace files (Chrome/Kineto JSON, .json.gz) or a directory of them")
    p.add_argument("--json", help=f"also write the diagnosis here (schema {'schedopt.diagnosis/1'})")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--plot", help="draw one step of every rank, the exposed communication marked (PNG)")
    p.add_argument("--model", help="the traced model (file.py:factory or .onnx): predict the traced DDP step from "
                                   "the trace's op times and say what the best plan per mode would gain")
    p.add_argument("--cluster", help="with --model: the cluster file (default: fitted to the trace's collectives)")
    p.add_argument("--time-limit", type=_duration, default=None, help="with --model: cpsat's limit per mode (10s)")
    p.add_argument("--plan", help="with --model: the plan the traced run applied (SCHEDOPT_PLAN), predicted beside "
                                  "its measured step in place of DDP (sharded runs: of FSDP2 per block)")
    p.add_argument("--save-cluster", metavar="CLUSTER", help="write the link fitted to the traced all-reduces "
                   "here, a cluster file for plan --cluster")
    p.add_argument("--progress", action="store_true", help="with --model: show a progress bar over the solves even "
                                                            "when stderr is not a terminal")
    _add_model_options(p)
    p.set_defaults(run=_cmd_diagnose)

    p = sub.add_parser("compare", help="run several solvers on one model and cluster")
    p.add_argument("model", help="model: graph JSON, .onnx, or path/to/file.py:factory")
    _add_model_options(p)
    p.add_argument("--solvers", default="all", help="'all' or a comma-separated list (default all)")
    _add_cluster_options(p, defaults=True)
    _add_problem_options(p)
    p.add_argument("--format", choices=["table", "json", "csv"], default="table")
    p.add_argument("--out", help="directory for each solver's plan, trace and Gantt chart")
    p.add_argument("--progress", action="store_true", help="show a progress bar even when stderr is not a terminal")
    p.set_defaults(run=_cmd_compare)

    p = sub.add_parser("sweep", help="compare solvers across bandwidths and world sizes; CSV and a plot")
    p.add_argument("model", help="model: graph JSON, .onnx, or path/to/file.py:factory")
    _add_model_options(p)
    p.add_argument("--bandwidths", default="1Gbps,10Gbps,25Gbps,100Gbps,400Gbps",
                   help="comma-separated bandwidths (default 1Gbps,10Gbps,25Gbps,100Gbps,400Gbps)")
    p.add_argument("--world-sizes", default="8,64", help="comma-separated rank counts (default 8,64)")
    p.add_argument("--solvers", default="all", help="'all' or a comma-separated list (default all)")
    p.add_argument("--network", choices=sorted(PRESETS), default=None,
                   help="preset whose latency and call overhead every case keeps (default 10gbe)")
    p.add_argument("--latency", help="all-reduce step latency alpha for every case, e.g. 20us")
    p.add_argument("--algorithm", choices=["ring", "tree"], default=None)
    p.add_argument("--replicas", type=_positive_int, default=None,
                   help="sharded mode: HSDP replica groups in every case (each world size a multiple of it)")
    p.add_argument("--shard-network", choices=sorted(PRESETS), default=None,
                   help="HSDP: the link inside a replica in every case (e.g. nvlink)")
    p.add_argument("--cluster", metavar="FILE", default=None,
                   help="a cluster JSON whose latency, call overhead and algorithm every case keeps")
    _add_problem_options(p)
    p.add_argument("--format", choices=["table", "json", "csv"], default="table")
    p.add_argument("--out", help="directory for sweep.csv, sweep.json and sweep.png")
    p.add_argument("--plot", help="where to draw the plot (default DIR/sweep.png with --out)")
    p.add_argument("--progress", action="store_true", help="show a progress bar even when stderr is not a terminal")
    p.set_defaults(run=_cmd_sweep, world_size=None, bandwidth=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _check_outputs(args)
        return int(args.run(args))
    except SchedoptError as exc:
        print(f"schedopt: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("schedopt: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: stop quietly, as Unix tools do.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
