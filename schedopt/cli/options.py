"""The flags the commands share and how they become graphs, clusters and problems; the checks of
what a command will write, before any work; progress bars."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Iterable, Iterator, NoReturn, Sequence

from ..cluster import Cluster, PRESETS
from ..errors import SchedoptError
from ..io import check_output_dir, check_output_file
from ..load import ImportOptions, load_model, model_file
from ..problem import DEFAULT_MAX_STALE_FRACTION, EXECUTIONS, MODES, Problem
from ..units import format_duration, parse_bandwidth, parse_duration, parse_size


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
    from ..cost import DeviceSpec

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
    from ..ranks import RankModel

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
    from ..solvers import solvers_for

    if text == "all":
        return solvers_for(mode)
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise SchedoptError("--solvers needs at least one name, or 'all'")
    return names


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


def _show_progress(args: argparse.Namespace) -> bool:
    """A progress bar goes to a terminal (or anywhere with --progress), never beside JSON or CSV output."""
    return getattr(args, "format", "table") == "table" and (sys.stderr.isatty() or args.progress)


def _progress_bar(items: Iterable, desc: str = "solvers", unit: str = "solver", *, named: bool = True) -> Iterator:
    """``items`` under a tqdm bar on stderr; ``named``: each item shown beside the bar while it runs."""
    from tqdm import tqdm

    with tqdm(list(items), desc=desc, unit=unit, file=sys.stderr, leave=False) as bar:
        for item in bar:
            if named:
                bar.set_postfix_str(str(item))
            yield item


def _print_progress(event: Any) -> None:
    """Show a solver's objective and bound as they improve (CP-SAT reports every new solution)."""
    gap = (event.objective_s - event.bound_s) / event.objective_s if event.objective_s > 0 else 0.0
    print(f"  {event.wall_s:7.1f}s  objective {format_duration(event.objective_s):>9}  "
          f"bound {format_duration(event.bound_s):>9}  gap {gap:6.2%}", file=sys.stderr, flush=True)
