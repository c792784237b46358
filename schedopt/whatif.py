"""What a plan would gain on a traced run: the traced DDP step predicted, and the best plan per mode.

From a diagnosis (:mod:`schedopt.diagnose`) and the model's graph with the trace's op times
(:mod:`schedopt.trace_costs`): the cluster is the one given, or else fitted to the trace's own
all-reduces (their bytes and how long each ran, :func:`schedopt.cluster.calibrate`); DDP's plan
(``pytorch-ddp``) is simulated beside the measured step (the median over steps of the slowest
rank's), and every solver plans each of ``barrier``, ``overlap`` and ``osp``: the best predicted step
per mode, its solver, and its speedup over the predicted DDP step.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from .cluster import Cluster, calibrate
from .diagnose import Diagnosis
from .errors import SchedoptError, SolverError
from .graph import TrainGraph
from .problem import Problem

__all__ = ["WhatIf", "what_plans_gain", "cluster_from_trace"]

MODES = ("barrier", "overlap", "osp")


@dataclass(frozen=True, slots=True)
class WhatIf:
    measured_ddp_s: float
    predicted_ddp_s: float
    cluster: Cluster
    best: dict[str, tuple[str, float]]  # mode -> (solver, predicted step)

    def to_json(self) -> dict[str, Any]:
        return {"measured_ddp_s": self.measured_ddp_s, "predicted_ddp_s": self.predicted_ddp_s,
                "prediction_error": (self.predicted_ddp_s - self.measured_ddp_s) / self.measured_ddp_s,
                "cluster": self.cluster.to_json(),
                "best": {m: {"solver": s, "predicted_s": t, "speedup_vs_ddp": self.predicted_ddp_s / t}
                         for m, (s, t) in self.best.items()}}

    def describe(self) -> str:
        lines = [f"DDP's step: measured {self.measured_ddp_s * 1e3:.1f} ms (median, the slower rank's), predicted "
                 f"{self.predicted_ddp_s * 1e3:.1f} ms ({(self.predicted_ddp_s - self.measured_ddp_s) / self.measured_ddp_s:+.1%})"
                 f" on {self.cluster.describe()}"]
        lines += [f"  best {mode:8s} {solver} {t * 1e3:.1f} ms ({self.predicted_ddp_s / t:.3f}x DDP, predicted)"
                  for mode, (solver, t) in self.best.items()]
        return "\n".join(lines)


def cluster_from_trace(report: Diagnosis) -> Cluster:
    """An alpha-beta cluster fitted to the traced collectives (bytes, start to end)."""
    points = [(c.nbytes, c.end_s - c.start_s) for s in report.steps for c in s.collectives
              if c.nbytes and c.end_s > c.start_s]
    n = report.world_size or 2
    if not points:
        raise SchedoptError("the trace has no collective with its size to fit a cluster to; give --cluster")
    if len({b for b, _ in points}) < 2:  # one size (one bucket): its bandwidth, no latency
        b, t = points[0][0], statistics.median(t for _, t in points)
        return Cluster(world_size=n, bandwidth_Bps=2 * (n - 1) / n * b / t, name="fitted to the trace (one size)")
    return calibrate([b for b, _ in points], [t for _, t in points], world_size=n, name="fitted to the trace")


def what_plans_gain(report: Diagnosis, graph: TrainGraph, cluster: Cluster | None = None, *,
                    time_limit_s: float = 10.0, seed: int = 0) -> WhatIf:
    """See the module docstring."""
    from .simulate import simulate
    from .solvers import get, solvers_for

    cluster = cluster or cluster_from_trace(report)
    by_step: dict[int, float] = {}
    for s in report.steps:
        by_step[s.step] = max(by_step.get(s.step, 0.0), s.step_s)
    measured = statistics.median(by_step.values())
    barrier = Problem(graph=graph, cluster=cluster, mode="barrier")
    ddp = simulate(barrier, get("pytorch-ddp")(barrier, seed=seed)).iteration_s
    best: dict[str, tuple[str, float]] = {}
    for mode in MODES:
        problem = Problem(graph=graph, cluster=cluster, mode=mode)
        for name in solvers_for(mode):
            try:
                plan = get(name)(problem, seed=seed, **({"time_limit_s": time_limit_s} if name == "cpsat" else {}))
            except SolverError:
                continue
            t = plan.predicted.iteration_s
            if mode not in best or t < best[mode][1]:
                best[mode] = (name, t)
    return WhatIf(measured_ddp_s=measured, predicted_ddp_s=ddp, cluster=cluster, best=best)
