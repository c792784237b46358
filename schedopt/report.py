"""Compare solvers on one problem and format the results (table, JSON, CSV).

``compare --format json`` prints one versioned object (:func:`comparison_json`):
``{"schema": "schedopt.compare/1", "model", "cluster", "mode", "execution", "rows"}``,
``model`` the graph's name, ``cluster`` the cluster's JSON form, and ``rows``
one object per solver. The keys of a row are stable; scripts parse them:

========================  =====================================================
``solver``                registered solver name
``status``                ``HEURISTIC``, ``OPTIMAL``, ``FEASIBLE``, ...
``iteration_s``           simulated iteration time of the solver's plan
``lower_bound_s``         the simulator's lower bound (same for every solver)
``bound_s``               the solver's own proven bound, or null
``gap``                   ``(objective - bound) / objective`` from the solver, or null
``gap_to_lower_bound``    ``(iteration - lower_bound) / iteration``
``exposed_comm_s``        iteration time not covered by compute
``comm_s``                time the network is busy per iteration
``compute_s``             forward + backward + optimizer time
``peak_memory_bytes``     sharded mode: the peak per rank of parameter and
                          gradient bytes (null in the other modes)
``num_buckets``           number of buckets (collectives before chunking)
``num_units``             sharded mode: number of FSDP units (0 otherwise)
``solve_time_s``          wall-clock time the solver took
``speedup_vs_ddp``        DDP's iteration time / this iteration time; DDP is
                          the ``pytorch-ddp`` plan in ``barrier`` mode, as
                          torch runs it, in every mode
``perfect_overlap_s``     ``max(compute, comm)``: no plan in any mode is faster
                          (compute, and one all-reduce of every byte; without
                          the cluster's interference, which ``lower_bound_s``
                          adds)
``headroom_share``        ``(T_ddp - T) / (T_ddp - perfect_overlap_s)``: the
                          share of what DDP leaves on the table this plan
                          takes (null when DDP is at the bound)
``error``                 sharded mode: why a solver has no plan within the
                          memory budget (its row's times are null)
``period_s``              the plan's period on the problem's rank model (every
                          rank's ops varying as measured; null without one)
``speedup_vs_fsdp``       sharded mode: FSDP2 per block's iteration (the
                          ``fsdp-per-block`` plan within the same budget,
                          torchtitan's layout) / this one; null in the other
                          modes and where that layout does not fit the budget
``period_lower_bound_s``  no plan in this plan's op order has a shorter
                          expected period on the rank model: the larger of
                          ``lower_bound_s`` and the slowest rank's bound
                          (:mod:`.rank_bound`); null without a rank model
========================  =====================================================

Schema ``schedopt.compare/6`` added ``period_lower_bound_s`` to ``/5``'s. Schema ``schedopt.compare/5``
added ``speedup_vs_fsdp`` to ``/4``'s. Schema ``/4`` added ``period_s`` to ``/3``'s. Schema ``/3``
added ``peak_memory_bytes``, ``num_units`` and, in sharded rows without a plan, ``error`` to ``/2``'s.
Schema ``/2`` added the last two keys to ``/1``'s, and measures the speedup in ``overlap`` mode against
DDP as it runs (``/1``: against DDP's buckets in overlap mode).
"""

from __future__ import annotations

import csv
import io
from typing import Any, Callable, Iterable, Sequence

from .plan import Plan
from .problem import DEFAULT_MAX_STALE_FRACTION, Problem

__all__ = ["COLUMNS", "COMPARE_SCHEMA", "SWEEP_COLUMNS", "compare", "comparison_json", "comparison_row", "sweep",
           "format_table", "format_csv", "perfect_overlap_s"]

COMPARE_SCHEMA = "schedopt.compare/6"

COLUMNS: tuple[str, ...] = (
    "solver",
    "status",
    "iteration_s",
    "peak_memory_bytes",
    "lower_bound_s",
    "bound_s",
    "gap",
    "gap_to_lower_bound",
    "exposed_comm_s",
    "comm_s",
    "compute_s",
    "num_buckets",
    "num_units",
    "solve_time_s",
    "speedup_vs_ddp",
    "perfect_overlap_s",
    "headroom_share",
    "period_s",
    "speedup_vs_fsdp",
    "period_lower_bound_s",
)

BASELINE = "pytorch-ddp"
#: sharded mode's own baseline: FSDP2 per repeated block, as torchtitan lays it out
SHARDED_BASELINE = "fsdp-per-block"


def comparison_json(problem: Problem, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Return the versioned JSON object of a comparison (see the module docstring)."""
    return {"schema": COMPARE_SCHEMA, "model": problem.graph.name, "cluster": problem.cluster.to_json(),
            "mode": problem.mode, "execution": problem.execution, "rows": list(rows)}


def perfect_overlap_s(problem: Problem) -> float:
    """``max(compute, comm)`` of ``problem``'s graph on its cluster (the optimizer counted as compute, every
    byte in one all-reduce): the physical limit, below every lower bound of the simulator (with
    interference compute beside the wire runs slower; each gradient's cycle adds its transfer)."""
    replicated = _replicated(problem)  # a sharded problem's graph and cluster, replicated
    graph, cluster = replicated.graph, replicated.cluster
    compute = graph.totals.forward_s + graph.totals.backward_s + graph.totals.optimizer_s
    if not graph.params or cluster.world_size == 1:
        return compute
    return max(compute, cluster.allreduce_s(graph.total_param_bytes))


def ddp_iteration_s(problem: Problem, ddp_plan: Plan) -> float:
    """DDP's iteration as torch runs it: the ``pytorch-ddp`` plan in ``barrier`` mode, whatever the problem's."""
    if problem.mode == "barrier":
        return ddp_plan.predicted.iteration_s  # type: ignore[union-attr]
    return ddp_timeline(problem, ddp_plan).iteration_s


def _replicated(problem: Problem) -> Problem:
    """The problem DDP's baseline runs in: ``problem`` itself, or its graph and cluster replicated
    (``barrier``) where it is sharded."""
    from dataclasses import replace

    return problem if problem.mode != "sharded" else replace(problem, mode="barrier", memory_budget_bytes=None,
                                                              cluster=replace(problem.cluster, replicas=1))


def ddp_timeline(problem: Problem, ddp_plan: Plan):
    """The ``pytorch-ddp`` plan's buckets run as torch's DDP runs them: ``barrier`` mode, one stage."""
    from dataclasses import replace

    from .simulate import simulate

    plan = replace(ddp_plan, mode="barrier", buckets=tuple(replace(b, stage=1) for b in ddp_plan.buckets))
    return simulate(replace(problem, mode="barrier", memory_budget_bytes=None), plan)


def comparison_row(plan: Plan, *, baseline_s: float | None, perfect_s: float | None = None,
                   period_s: float | None = None, fsdp_s: float | None = None,
                   period_bound_s: float | None = None) -> dict[str, Any]:
    """Return the comparison row of one solver's plan (its prediction must be set); ``fsdp_s``: FSDP2 per
    block's iteration, in sharded mode; ``period_s`` and ``period_bound_s``: on the rank model."""
    predicted = plan.predicted
    assert predicted is not None, "plans from the registry carry a prediction"
    iteration = predicted.iteration_s
    return {
        "solver": plan.solver.name,
        "status": plan.solver.status,
        "iteration_s": iteration,
        "peak_memory_bytes": predicted.peak_memory_bytes,
        "lower_bound_s": predicted.lower_bound_s,
        "bound_s": plan.solver.bound_s,
        "gap": plan.solver.gap,
        "gap_to_lower_bound": (iteration - predicted.lower_bound_s) / iteration if iteration > 0 else 0.0,
        "exposed_comm_s": predicted.exposed_comm_s,
        "comm_s": predicted.comm_s,
        "compute_s": predicted.compute_s,
        "num_buckets": len(plan.buckets),
        "num_units": len(plan.units),
        "solve_time_s": plan.solver.solve_time_s,
        "speedup_vs_ddp": baseline_s / iteration if baseline_s and iteration > 0 else None,
        "perfect_overlap_s": perfect_s,
        "headroom_share": (baseline_s - iteration) / (baseline_s - perfect_s)
        if baseline_s is not None and perfect_s is not None and baseline_s - perfect_s > 1e-12 * baseline_s else None,
        "period_s": period_s,
        "speedup_vs_fsdp": fsdp_s / iteration if fsdp_s and iteration > 0 else None,
        "period_lower_bound_s": period_bound_s,
    }


def compare(
    problem: Problem,
    solvers: Sequence[str],
    *,
    time_limit_s: float | None = None,
    seed: int = 0,
    progress: Callable[[Iterable[str]], Iterable[str]] = lambda names: names,
    on_plan: Callable[[str, Plan], None] | None = None,
) -> list[dict[str, Any]]:
    """Run each solver on ``problem`` and return one comparison row per solver.

    ``pytorch-ddp`` always runs (it is the speedup baseline: in sharded mode, on the same graph and
    cluster replicated) and is reused when it is also in ``solvers``; in sharded mode so does
    ``fsdp-per-block`` (``speedup_vs_fsdp``). ``progress`` wraps the
    iteration (a tqdm bar in the CLI); ``on_plan`` sees every plan (to save it). In sharded mode a
    solver with no plan within the memory budget gets a row with ``error`` and null times.
    """
    from .errors import OverBudgetError
    from .solvers import get  # the core reaches solvers only through their public entry point

    runners = {name: get(name) for name in solvers}  # unknown names fail before any work
    plans: dict[str, Plan] = {}
    failed: dict[str, str] = {}
    if BASELINE not in runners or problem.mode == "sharded":
        ddp = get(BASELINE)(_replicated(problem), time_limit_s=time_limit_s, seed=seed)
    for name in progress(list(solvers)):
        try:
            plans[name] = runners[name](problem, time_limit_s=time_limit_s, seed=seed)
        except OverBudgetError as exc:
            failed[name] = str(exc)
            continue
        if on_plan is not None:
            on_plan(name, plans[name])
    baseline = ddp_iteration_s(_replicated(problem), plans.get(BASELINE) if problem.mode != "sharded" and
                               BASELINE in runners else ddp)
    perfect = perfect_overlap_s(problem)
    fsdp = _fsdp_iteration_s(problem, plans, failed, seed) if problem.mode == "sharded" else None
    return [comparison_row(plans[name], baseline_s=baseline, perfect_s=perfect, fsdp_s=fsdp,
                           **_on_ranks(problem, plans[name])) if name in plans else
            {**dict.fromkeys(COLUMNS), "solver": name, "status": "OVER_BUDGET", "error": failed[name]}
            for name in solvers]


def _on_ranks(problem: Problem, plan: Plan) -> dict[str, float | None]:
    """``plan``'s period on ``problem``'s rank model and the bound on it for its op order (None without one)."""
    from .rank_bound import bound_on_ranks
    from .ranks import period

    if problem.rank_model is None:
        return {"period_s": None, "period_bound_s": None}
    return {"period_s": period(problem, plan),
            "period_bound_s": bound_on_ranks(problem, plan.order, problem.rank_model)}


def _fsdp_iteration_s(problem: Problem, plans: dict[str, Plan], failed: dict[str, str], seed: int) -> float | None:
    """FSDP2 per block's iteration on ``problem`` (the compared plan where it was compared); None where
    that layout does not fit the budget."""
    from .errors import OverBudgetError
    from .solvers import get

    if SHARDED_BASELINE in failed:
        return None
    try:
        plan = plans.get(SHARDED_BASELINE) or get(SHARDED_BASELINE)(problem, seed=seed)
    except OverBudgetError:
        return None
    return plan.predicted.iteration_s


SWEEP_COLUMNS: tuple[str, ...] = ("world_size", "bandwidth_Bps", *COLUMNS)


def sweep(
    graph: Any,
    base: Any,
    *,
    bandwidths_Bps: Sequence[float],
    world_sizes: Sequence[int],
    solvers: Sequence[str],
    mode: str = "barrier",
    max_stale_fraction: float = DEFAULT_MAX_STALE_FRACTION,
    execution: str = "eager",
    time_limit_s: float | None = None,
    seed: int = 0,
    memory_budget_bytes: int | None = None,
    measured_ranks: bool = False,
    progress: Callable[[Iterable[tuple[int, float]]], Iterable[tuple[int, float]]] = lambda cases: cases,
) -> list[dict[str, Any]]:
    """Compare ``solvers`` on ``graph`` for every world size and bandwidth; one row per (case, solver).

    ``base`` is the :class:`~schedopt.cluster.Cluster` whose latency, call
    overhead and algorithm every case keeps; ``measured_ranks``: each case's problem has the rank
    model of its world size with the spreads ``graph``'s costs were measured to have
    (:meth:`~schedopt.ranks.RankModel.measured`), where they vary.
    """
    from dataclasses import replace

    from .ranks import RankModel

    rows: list[dict[str, Any]] = []
    cases = [(n, bw) for n in world_sizes for bw in bandwidths_Bps]
    for world_size, bandwidth in progress(cases):
        # each case's own link: costs measured on the base's (shard_costs) do not describe it
        cluster = replace(base, world_size=world_size, bandwidth_Bps=bandwidth, name="sweep", shard_costs=None)
        problem = Problem(graph=graph, cluster=cluster, mode=mode, execution=execution,  # type: ignore[arg-type]
                          max_stale_fraction=max_stale_fraction, memory_budget_bytes=memory_budget_bytes,
                          rank_model=RankModel.measured(graph, world_size) if measured_ranks else None)
        for row in compare(problem, solvers, time_limit_s=time_limit_s, seed=seed):
            rows.append({"world_size": world_size, "bandwidth_Bps": bandwidth, **row})
    return rows


_COUNTS = ("num_buckets", "num_units")
_HEADERS = {"peak_memory_bytes": "peak_memory", "bandwidth_Bps": "bandwidth", "perfect_overlap_s": "max(comp,comm)_ms",
            "headroom_share": "headroom"}


def _cell(value: Any, column: str) -> str:
    if value is None:
        return "-"
    if column.endswith("_s") and isinstance(value, float):
        return f"{value * 1e3:.3f}"
    if column in ("gap", "gap_to_lower_bound", "headroom_share") and isinstance(value, float):
        return f"{value * 100:.2f}%"
    if column.endswith("_bytes"):
        from .units import format_size

        return format_size(value)
    if column.startswith("speedup_vs_"):
        return f"{value:.3f}x"
    if column == "bandwidth_Bps":
        from .units import format_bandwidth

        return format_bandwidth(value)
    return str(value)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] = COLUMNS, *, drop_empty: bool = False) -> str:
    """Return rows as an aligned text table; seconds are shown in milliseconds. ``drop_empty``: leave out
    the columns no row fills (null everywhere, or a count of buckets or units that is 0 everywhere: the
    other modes' columns), as a person reads it; JSON and CSV keep every key."""
    if drop_empty:
        columns = [c for c in columns if any(row.get(c) not in (None, 0) if c in _COUNTS else row.get(c) is not None
                                             for row in rows)] if rows else list(columns)
    header = [_HEADERS.get(c, c[:-2] + "_ms" if c.endswith("_s") else c) for c in columns]
    cells = [[_cell(row.get(c), c) for c in columns] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    for r in cells:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(lines)


def format_csv(rows: Sequence[dict[str, Any]], columns: Sequence[str] = COLUMNS) -> str:
    """Return rows as CSV with a header line; seconds stay in seconds."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: "" if row.get(c) is None else row.get(c) for c in columns})
    return out.getvalue()
