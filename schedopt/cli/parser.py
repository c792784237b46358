"""The subcommands and their flags: a table, no logic."""

from __future__ import annotations

import argparse

from ..cluster import PRESETS
from ..problem import MODES
from .options import (
    _Parser, _add_cluster_options, _add_model_options, _add_problem_options, _duration, _positive_int, _spread,
)
from .plans import _cmd_compare, _cmd_inspect, _cmd_plan, _cmd_simulate, _cmd_sweep
from .runs import _cmd_calibrate, _cmd_diagnose, _cmd_import, _cmd_profile


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="schedopt", description="Plan, simulate and apply communication schedules for "
                     "data-parallel PyTorch training.")
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
    p.add_argument("--progress", action="store_true",
                   help="show a progress bar over the iterations even when stderr is not a terminal")
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
    p.add_argument("--progress", action="store_true",
                   help="show a progress bar over each phase's sizes and samples even when stderr is not a terminal")
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
