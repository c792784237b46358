"""Commands that read a model or a run: ``import``, ``profile``, ``calibrate``, ``diagnose``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..cluster import Cluster
from ..errors import SchedoptError
from ..io import dumps, write_json_atomic
from ..load import model_kind
from ..plan import Plan
from ..units import format_duration, format_size, parse_size
from .options import _graph, _progress_bar, _show_progress


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
        from ..kineto import trace_files
        from ..trace_costs import trace_costs

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
    from ..importers import load_factory

    return load_factory(args.model, batch_size=args.batch_size)


def _cmd_profile(args: argparse.Namespace) -> int:
    import os

    from ..importers.profile import on_device, profile_launched, profile_torch

    spec = _runnable(args, "profile")
    launched = "RANK" in os.environ or "WORLD_SIZE" in os.environ  # under torchrun: every rank profiles at once
    device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if args.on == "cuda" and launched else args.on
    model, inputs = on_device(spec.model, spec.example_inputs, device)
    progress = None if not _show_progress(args) else (
        lambda steps: _progress_bar(steps, "profile", "iteration", named=False))
    if launched:
        done = profile_launched(model, inputs, loss_fn=spec.loss_fn, name=spec.name, iterations=args.iterations,
                                progress=progress)
        if done is None:  # not rank 0
            return 0
        graph, reports = done
    else:
        graph, report = profile_torch(model, inputs, loss_fn=spec.loss_fn, name=spec.name, iterations=args.iterations,
                                      progress=progress)
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


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from ..rendezvous import check_rendezvous_env

    check_rendezvous_env(what="schedopt calibrate (it measures the real process group)")
    if int(os.environ["WORLD_SIZE"]) % args.replicas:
        raise SchedoptError(f"--replicas {args.replicas} must divide the {os.environ['WORLD_SIZE']} ranks torchrun "
                            "started (HSDP's mesh: replicas x ranks in each)")
    from ..runtime.calibrate import calibrate_launched

    model = None
    if args.model:  # the compute whose interference is measured: the model that will train
        spec = _runnable(args, "calibrate --model")
        model = (spec.name, spec.forward_backward())
    progress = (lambda items, what: _progress_bar(items, f"calibrate {what}", "sample" if what == "interference"
                                                  else "size", named=False)) if _show_progress(args) else None
    result = calibrate_launched(args.backend, min_bytes=parse_size(args.min_size),
                                max_bytes=parse_size(args.max_size), time_limit_s=args.time_limit,
                                algorithm=args.algorithm, force=args.force, model=model, replicas=args.replicas,
                                progress=progress)
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


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from ..diagnose import diagnose, format_report, plot_step
    from ..kineto import load_traces

    if args.plan and not args.model:
        raise SchedoptError("--plan (the plan the traced run applied) needs --model, the traced model")
    traces = load_traces(args.traces)
    report = diagnose(traces)
    data = report.to_json()
    if args.save_cluster:
        _save_traced_cluster(report, args.save_cluster)
    whatif = None
    if args.model:  # the traced step predicted, and what the best plans would gain
        from ..diagnose import is_sharded
        from ..plan import validate
        from ..trace_costs import trace_costs
        from ..whatif import check_replicated, what_plans_gain
        from ..whatif_sharded import check_inputs, what_sharded_plans_gain

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
    from ..diagnose import is_sharded
    from ..whatif import cluster_from_trace

    if is_sharded(report):
        raise SchedoptError("--save-cluster fits the link to a replicated run's all-reduces; these traces are of a "
                            "sharded run: measure its collectives with `torchrun ... -m schedopt calibrate`")
    cluster = cluster_from_trace(report)
    cluster.save(path)
    print(f"cluster    {cluster.describe()} -> {path}", file=sys.stderr)
