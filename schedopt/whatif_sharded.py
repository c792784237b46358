"""What a sharded plan would gain on a traced FSDP run: the traced step beside FSDP2 per block, and the
best plan within the same memory.

The traces say when each all-gather and reduce-scatter ran, but not reliably how many bytes of which
unit it moved (an all-gather's recorded size is the shard on one backend, the whole unit on another),
so the collectives' costs come from a calibrated cluster (``schedopt calibrate`` measures FSDP2's own
all-gathers and reduce-scatters), moved to the traced world size and device (``gloo`` on a CPU trace,
``nccl`` on a CUDA one). The op times are the trace's (:mod:`schedopt.trace_costs`).

The traced run is predicted as FSDP2 per block (``fsdp-per-block``: torchtitan's layout, FSDP2's
defaults), the layout most runs use; the traced all-gathers per step are counted beside the number that
layout issues, so a run laid out otherwise shows it; given the plan the run applied (``applied``,
``diagnose --plan``), that plan is the layout instead. Every sharded solver then plans within that
layout's predicted peak per rank: the best is at no more memory than the traced run's layout.

On one rank, unlike the replicated what-if: on two sets of traces of gpt_tied (FSDP2 per block, 2
gloo ranks) one rank read -4.0% and +0.2% of the measured step, the rank model fitted to the traces
(:func:`schedopt.whatif.rank_model`) +6.5% and +6.1%. FSDP2 syncs the ranks at every unit's
collectives, and the traced spread, drawn per op and rank independently, makes each sync wait for a
straggler the run did not have.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any

from .cluster import Cluster
from .diagnose import Diagnosis, collective_kind, is_sharded
from .errors import OverBudgetError, SchedoptError
from .graph import TrainGraph
from .plan import Plan
from .problem import Problem
from .simulate import simulate
from .report import SHARDED_BASELINE
from .units import format_size
from .whatif import Progress, applied_problem, measured_step_s, prediction_error

__all__ = ["ShardedWhatIf", "check_inputs", "what_sharded_plans_gain"]

#: the layout a traced FSDP run is predicted as: sharded mode's baseline, FSDP2 per block
TRACED_LAYOUT = SHARDED_BASELINE


@dataclass(frozen=True, slots=True)
class ShardedWhatIf:
    measured_s: float  # the slowest rank's mean traced step
    predicted_s: float  # FSDP2 per block, simulated on the trace's op times
    peak_bytes: float  # its predicted peak per rank: the budget of the plans below
    traced_gathers: float  # all-gathers per step in the traces (mean over ranks and steps)
    layout_gathers: int  # what FSDP2 per block issues per step
    cluster: Cluster
    best: dict[str, tuple[float, float]]  # solver -> (predicted step, peak per rank), fastest first
    applied: str | None = None  # the solver of the plan the traced run applied, where given: the layout then

    def to_json(self) -> dict[str, Any]:
        return {"layout": self.applied or TRACED_LAYOUT, "applied": self.applied is not None,
                "measured_s": self.measured_s, "predicted_s": self.predicted_s,
                "prediction_error": prediction_error(self.predicted_s, self.measured_s),
                "peak_memory_bytes": self.peak_bytes, "traced_all_gathers_per_step": self.traced_gathers,
                "layout_all_gathers_per_step": self.layout_gathers, "cluster": self.cluster.to_json(),
                "best": {name: {"predicted_s": t, "peak_memory_bytes": peak, "speedup_vs_layout": self.predicted_s / t}
                         for name, (t, peak) in self.best.items()}}

    def describe(self) -> str:
        error = prediction_error(self.predicted_s, self.measured_s)
        # the layout predicted: its name, what speedups are over, and where its all-gathers are counted
        layout, short, issued = ((f"the applied plan ({self.applied})", "the plan", "in the plan") if self.applied
                                 else ("FSDP2 per block", "per block", "per block"))
        lines = [f"the traced step: measured {self.measured_s * 1e3:.1f} ms (the slowest rank's mean step), "
                 f"predicted as {layout} {self.predicted_s * 1e3:.1f} ms ({error:+.1%}), peak "
                 f"{format_size(self.peak_bytes)} per rank, on {self.cluster.describe()}",
                 f"  all-gathers per step: {self.traced_gathers:.1f} traced, {self.layout_gathers} {issued}"
                 + ("" if round(self.traced_gathers) == self.layout_gathers else
                    f" (the traced run is laid out otherwise: the prediction is {short}'s)")]
        lines += [f"  {name:15s} {t * 1e3:.1f} ms ({self.predicted_s / t:.3f}x {short}, predicted), peak "
                  f"{format_size(peak)}" for name, (t, peak) in self.best.items()]
        return "\n".join(lines)


def check_inputs(report: Diagnosis, cluster: Cluster | None, applied: Plan | None = None) -> None:
    """Raise SchedoptError where the traces are not of a sharded run, no cluster gives the costs, or the
    plan the run applied is not a sharded one."""
    report.check_data_parallel()
    if applied is not None and applied.mode != "sharded":
        raise SchedoptError(f"the traces are of a sharded run, and --plan is a bucketed plan ({applied.mode} mode): "
                            "give the sharded plan the traced run applied")
    if not is_sharded(report):
        raise SchedoptError("the traces hold no all-gather or reduce-scatter, nor an HSDP mesh: not a sharded run")
    if cluster is None:
        raise SchedoptError("a sharded run's what-if needs the collectives' costs: give --cluster (from "
                            "torchrun ... -m schedopt calibrate, which measures FSDP2's all-gathers and "
                            "reduce-scatters)")
    traced_cluster(report, cluster)  # its measured costs fit the traced shard groups


def traced_cluster(report: Diagnosis, cluster: Cluster) -> Cluster:
    """``cluster`` over the traced ranks, mesh and device."""
    replicas = cluster.replicas if report.shard_group is None else report.replicas
    return replace(cluster.with_ranks(report.world_size or cluster.world_size, replicas),
                   backend=report.backend)


def what_sharded_plans_gain(report: Diagnosis, graph: TrainGraph, cluster: Cluster | None, *,
                            time_limit_s: float = 10.0, seed: int = 0, applied: Plan | None = None,
                            progress: Progress = lambda solves: solves) -> ShardedWhatIf:
    """See the module docstring; ``applied``: the plan the traced run applied (``SCHEDOPT_PLAN``), the
    layout predicted and planned against instead of FSDP2 per block; ``progress`` as for
    :func:`.whatif.what_plans_gain`.

    Raises:
        SchedoptError: the traces are not of a sharded run, no cluster is given, or its measured costs
            are of shard groups of another size than the traced ones.
    """
    from .solvers import get, solvers_for

    check_inputs(report, cluster, applied)
    assert cluster is not None
    problem = Problem(graph=graph, cluster=traced_cluster(report, cluster), mode="sharded")
    if applied is None:
        layout = get(TRACED_LAYOUT)(problem, seed=seed)
    else:
        predicted = simulate(applied_problem(applied, graph, problem.cluster), applied).prediction()
        layout = replace(applied, predicted=predicted)
    peak = layout.predicted.peak_memory_bytes
    within = replace(problem, memory_budget_bytes=int(peak))
    best = {}
    for _, name in map(str.split, progress([f"sharded {name}" for name in solvers_for("sharded")])):
        try:
            plan = get(name)(within, seed=seed, **({"time_limit_s": time_limit_s} if name == "cpsat" else {}))
        except OverBudgetError:
            continue
        best[name] = (plan.predicted.iteration_s, plan.predicted.peak_memory_bytes)
    return ShardedWhatIf(measured_s=measured_step_s(report), predicted_s=layout.predicted.iteration_s,
                         peak_bytes=peak, traced_gathers=_gathers_per_step(report),
                         layout_gathers=_layout_gathers(layout, problem.cluster),
                         cluster=problem.cluster, best=dict(sorted(best.items(), key=lambda kv: kv[1][0])),
                         applied=applied.solver.name if applied is not None else None)


def _gathers_per_step(report: Diagnosis) -> float:
    gathers = [sum(collective_kind(c.name) == "all-gather" for c in s.collectives) for s in report.steps]
    return statistics.fmean(gathers) if gathers else 0.0


def _layout_gathers(layout: Plan, cluster: Cluster) -> int:
    """The all-gathers per step FSDP2 issues for ``layout``: one per unit and one more per resharded unit,
    none where each shard group is one rank (HSDP replicas of one: nothing to gather)."""
    if cluster.shard_group == 1:
        return 0
    return len(layout.units) + sum(u.reshard_after_forward for u in layout.units)

