"""What a plan would gain on a traced run: the traced DDP step predicted, and the best plan per mode.

From a diagnosis (:mod:`schedopt.diagnose`) and the model's graph with the trace's op times
(:mod:`schedopt.trace_costs`): the cluster is the one given, or else fitted to the trace's own
all-reduces (their bytes and how long each ran, :func:`schedopt.cluster.calibrate`); DDP's plan
(``pytorch-ddp``) is simulated beside the measured step (the slowest rank's mean step: a period, as
every run in this project is measured, and what the rank model's mean period predicts; given the
plan the run applied, ``applied``, that plan is predicted beside it and DDP's step is the baseline), and every
solver plans each of ``barrier``, ``overlap`` and ``osp``: the best predicted step per mode, its
solver, and its speedup over the predicted DDP step. Traces of a sharded run (all-gathers,
reduce-scatters: FSDP) have a what-if of their own (:mod:`schedopt.whatif_sharded`); this one refuses
them in one line.

Every figure is the rank model's (:mod:`schedopt.ranks`): the trace's ranks, their op times varying as
the traces say. Each rank's own speed: its mean compute per step over the reference rank's (the one
whose trace gave the op times; a rank that is always slower decides every collective). Two spreads,
both coefficients of variation: the ops' (``op_spread`` in the graph's meta, from
:func:`schedopt.trace_costs.op_spread`: one op's time from step to step) and the steps' (each rank's
compute per step around its own mean, pooled over the ranks). An op's measured spread holds the
step's common part as well, and a step's the ops' independent parts (shrunk by how evenly the time spreads over the ops,
``H = sum(d^2) / sum(d)^2``): with the step's common CV ``c`` and the op's own ``o``,
``op^2 = c^2 + o^2`` and ``step^2 = c^2 + o^2 H``, solved for ``c`` and ``o``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

from .cluster import Cluster, calibrate
from .diagnose import Diagnosis, sharded_collectives
from .errors import SchedoptError, SolverError
from .graph import TrainGraph
from .plan import Plan, validate
from .problem import Problem
from .orders import engine_order
from .rank_bound import bound_on_ranks
from .ranks import RankModel, simulate_ranks

__all__ = ["WhatIf", "what_plans_gain", "cluster_from_trace", "rank_model", "check_replicated", "measured_step_s",
           "applied_problem", "prediction_error"]

MODES = ("barrier", "overlap", "osp")
#: wraps a what-if's solves (``"mode solver"`` strings): a progress bar, or nothing
Progress = Callable[[Iterable[str]], Iterable[str]]


@dataclass(frozen=True, slots=True)
class WhatIf:
    measured_s: float  # the traced run's step: DDP's, or the applied plan's
    predicted_ddp_s: float
    cluster: Cluster
    best: dict[str, tuple[str, float]]  # mode -> (solver, predicted step)
    ranks: RankModel = RankModel()
    #: mode -> no plan of the mode is faster on these ranks (the one-rank bound and the slowest rank's)
    bounds: dict[str, float] = field(default_factory=dict)
    applied: tuple[str, str, float] | None = None  # the plan the traced run applied: (solver, mode, predicted step)

    def to_json(self) -> dict[str, Any]:
        ddp_traced = self.applied is None
        data = {"measured_ddp_s": self.measured_s if ddp_traced else None, "predicted_ddp_s": self.predicted_ddp_s,
                "prediction_error": prediction_error(self.predicted_ddp_s, self.measured_s) if ddp_traced else None,
                "cluster": self.cluster.to_json(), "rank_model": self.ranks.to_json(),
                "best": {m: {"solver": s, "predicted_s": t, "speedup_vs_ddp": self.predicted_ddp_s / t,
                             "lower_bound_s": self.bounds.get(m)} for m, (s, t) in self.best.items()}}
        if self.applied is not None:
            solver, mode, t = self.applied
            data["applied"] = {"solver": solver, "mode": mode, "measured_s": self.measured_s, "predicted_s": t,
                               "prediction_error": prediction_error(t, self.measured_s),
                               "speedup_vs_ddp": self.predicted_ddp_s / t}
        return data

    def describe(self) -> str:
        measured = f"measured {self.measured_s * 1e3:.1f} ms (the slowest rank's mean step)"
        if self.applied is None:
            lines = [f"DDP's step: {measured}, predicted {self.predicted_ddp_s * 1e3:.1f} ms "
                     f"({prediction_error(self.predicted_ddp_s, self.measured_s):+.1%}) on {self.cluster.describe()}"]
        else:
            solver, mode, t = self.applied
            lines = [f"the applied plan's step ({mode}, {solver}): {measured}, predicted {t * 1e3:.1f} ms "
                     f"({prediction_error(t, self.measured_s):+.1%}, {self.predicted_ddp_s / t:.3f}x DDP's predicted "
                     f"{self.predicted_ddp_s * 1e3:.1f} ms) on {self.cluster.describe()}"]
        lines.append(f"  rank model: {self.ranks.describe()}")
        lines += [f"  best {mode:8s} {solver} {t * 1e3:.1f} ms ({self.predicted_ddp_s / t:.3f}x DDP, predicted)"
                  + (f"; no {mode} plan under {self.bounds[mode] * 1e3:.1f} ms on these ranks"
                     if mode in self.bounds else "") for mode, (solver, t) in self.best.items()]
        return "\n".join(lines)


def prediction_error(predicted: float, measured: float) -> float:
    """How far a prediction is from what was measured, relative to the measurement."""
    return (predicted - measured) / measured


def applied_problem(plan: Plan, graph: TrainGraph, cluster: Cluster) -> Problem:
    """The problem a traced run's plan ran: its mode and execution on the what-if's graph and cluster.

    Raises:
        InvalidPlanError: the plan is not one of ``graph`` (another model, a mismatched parameter).
    """
    validate(plan, graph)
    return plan.problem(graph, cluster)


def check_replicated(report: Diagnosis, applied: Plan | None = None) -> None:
    """Raise SchedoptError, naming them, where the traces hold collectives only sharded runs issue
    (:func:`~schedopt.diagnose.sharded_collectives`) or an HSDP mesh: :mod:`schedopt.whatif_sharded` is
    their what-if; or where the plan the run applied is a sharded one."""
    report.check_data_parallel()
    if applied is not None and applied.mode == "sharded":
        raise SchedoptError("the traces are of a replicated run (all-reduces), and --plan is a sharded plan "
                            "(FSDP2 units): give the plan the traced run applied")
    kinds = sharded_collectives(report)
    if kinds or report.replicas > 1:
        what = (f"{', '.join(kinds[:3])}: FSDP" if kinds else
                f"FSDP2 as HSDP, {report.replicas} replicas of {report.shard_group}")
        raise SchedoptError(f"the traces are of a sharded run ({what}); this what-if predicts "
                            "replicated (DDP) runs: use schedopt.whatif_sharded.what_sharded_plans_gain")


def cluster_from_trace(report: Diagnosis) -> Cluster:
    """An alpha-beta cluster fitted to the traced collectives (bytes, start to end), on the traced device's
    backend (a CPU trace's ranks ran gloo)."""
    points = [(c.nbytes, c.end_s - c.start_s) for s in report.steps for c in s.collectives
              if c.nbytes and c.end_s > c.start_s]
    n, backend = report.world_size or 2, report.backend
    if not points:
        raise SchedoptError("the traces record no collective's size to fit the link to: give --cluster (a "
                            "`schedopt calibrate` file), or profile with record_shapes=True (examples/train.py "
                            "--profile-sizes)")
    if len({b for b, _ in points}) < 2:  # one size (one bucket): its bandwidth, no latency
        b, t = points[0][0], statistics.median(t for _, t in points)
        return Cluster(world_size=n, bandwidth_Bps=2 * (n - 1) / n * b / t, name="fitted to the trace (one size)",
                       backend=backend)
    fitted = calibrate([b for b, _ in points], [t for _, t in points], world_size=n, name="fitted to the trace")
    return replace(fitted, backend=backend)


def measured_step_s(report: Diagnosis) -> float:
    """The slowest rank's mean traced step: a period, as every run here is measured."""
    return max(statistics.fmean(steps) for steps in _per_rank(report, "step_s").values())


def _per_rank(report: Diagnosis, field: str) -> dict[int, list[float]]:
    """Each rank's ``field`` (a step row's time) over its traced steps, where it is positive."""
    by_rank: dict[int, list[float]] = {}
    for s in report.steps:
        if (value := getattr(s, field)) > 0:
            by_rank.setdefault(s.rank, []).append(value)
    return by_rank


def rank_model(report: Diagnosis, graph: TrainGraph, *, reference_rank: int = 0, seed: int = 0) -> RankModel:
    """The traced ranks, their op times varying as the traces say (see the module docstring); ``graph``'s
    op times are ``reference_rank``'s."""
    by_rank = _per_rank(report, "compute_s")
    means = {r: statistics.fmean(v) for r, v in by_rank.items()}
    within = [statistics.variance(v) / means[r] ** 2 for r, v in by_rank.items() if len(v) > 1]
    step = math.sqrt(statistics.fmean(within)) if within else 0.0
    op = float(graph.meta.get("op_spread", 0.0) or 0.0)
    d = [o.duration_s for o in graph.ops.values() if o.phase != "optimizer"]
    h = sum(x * x for x in d) / sum(d) ** 2 if sum(d) > 0 else 1.0
    common = (max(0.0, (step * step - op * op * h) / (1 - h)) if h < 1 else 0.0) ** 0.5
    common = min(common, op) if op > 0 else common
    own = max(0.0, op * op - common * common) ** 0.5
    ranks = max(1, report.world_size or 1)
    reference = means.get(reference_rank)
    scale = (tuple(means[r] / reference if r in means else 1.0 for r in range(ranks))
             if reference and len(means) > 1 else ())
    return RankModel(ranks=ranks, op_spread=min(own, 5.0), step_spread=min(common, 5.0), seed=seed,
                     rank_scale=scale)


def what_plans_gain(report: Diagnosis, graph: TrainGraph, cluster: Cluster | None = None, *,
                    time_limit_s: float = 10.0, seed: int = 0, reference_rank: int = 0,
                    applied: Plan | None = None, progress: Progress = lambda solves: solves) -> WhatIf:
    """See the module docstring; ``graph``'s op times are ``reference_rank``'s. ``applied``: the plan
    the traced run applied (``SCHEDOPT_PLAN``), predicted beside the measured step instead of DDP.
    ``progress`` wraps the solves, ``"mode solver"`` each (a tqdm bar in the CLI)."""
    from .solvers import get, solvers_for

    check_replicated(report, applied)
    cluster = cluster or cluster_from_trace(report)
    ranks = rank_model(report, graph, reference_rank=reference_rank, seed=seed)
    measured = measured_step_s(report)
    barrier = Problem(graph=graph, cluster=cluster, mode="barrier")
    ddp = simulate_ranks(barrier, get("pytorch-ddp")(barrier, seed=seed), ranks).period
    traced = None
    if applied is not None:
        period = simulate_ranks(applied_problem(applied, graph, cluster), applied, ranks).period
        traced = (applied.solver.name, applied.mode, period)
    best: dict[str, tuple[str, float]] = {}
    for mode, name in map(str.split, progress([f"{mode} {name}" for mode in MODES for name in solvers_for(mode)])):
        problem = Problem(graph=graph, cluster=cluster, mode=mode)
        try:
            plan = get(name)(problem, seed=seed, **({"time_limit_s": time_limit_s} if name == "cpsat" else {}))
        except SolverError:
            continue
        t = simulate_ranks(problem, plan, ranks).period
        if mode not in best or t < best[mode][1]:
            best[mode] = (name, t)
    # per mode, the same for every plan in the engine's order (the traced one)
    bounds = {mode: bound_on_ranks(Problem(graph=graph, cluster=cluster, mode=mode), engine_order(graph), ranks)
              for mode in best}
    return WhatIf(measured_s=measured, predicted_ddp_s=ddp, cluster=cluster, best=best, ranks=ranks, applied=traced,
                  bounds=bounds)
