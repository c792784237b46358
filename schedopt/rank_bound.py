"""A lower bound on the period on every rank: what the slowest rank costs whatever the plan.

The one-rank bounds (the simulator's, cpsat's) hold on the rank model in expectation
(:mod:`solvers.cpsat.recheck`), but they cannot see stragglers: on 64 ranks whose steps vary by 15%,
cpsat's plan for ResNet-50 (100 GbE) runs 25.7% above its one-rank period, and its one-rank bound says
nothing of why. This bound sees them. In the rank model (:mod:`.ranks`) a bucket's collective starts
when the last rank has issued it, and the next step's first reader of the bucket waits for it to end.
So for a parameter ``p``, let ``E(n)`` be when the last rank ends ``p``'s gradient op in step ``n``.
Whatever bucket holds ``p``:

- ``overlap``: every chunk holding part of ``p`` is issued after ``E(n)``, so ``p``'s bytes cross
  after it (at least ``allreduce_s(p's bytes)``: the cost is affine, so splitting them costs more);
  the bucket settles at or before ``p``'s first reader in step ``n + 1`` (``n + 2`` for osp's stage 2,
  so osp counts two steps), and every rank then runs the ops from that reader to ``p``'s gradient op
  before ``E(n + 1)``;
- ``barrier``: the gradients finished at or after ``p``'s all cross after ``E(n)`` and everything
  settles before the optimizer, which every rank then runs, and the next step's ops up to ``p``'s
  gradient op; a sharded step's reduce-scatters alike (their cost left out).

Each rank's time for a run of ops is at least its step factor (per rank and step) times its speed
times the ops' mean work: the per-op variation averages out inside the maximum by Jensen's inequality,
so leaving it out keeps the bound. So the expected cycle is at least the transfer plus the expected
largest step factor over the ranks times the run's work (plus, in barrier, the optimizer at the
fastest rank's speed: its step's factor is independent of the next one's). That expected maximum is
estimated on ``samples`` seeded draws (fewer past 1000 ranks) less two standard errors; the bound is
the largest cycle over the parameters. With HSDP's shard groups the maximum is taken within a group
(a sharded step's gathers synchronize a group only).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .errors import UnitError
from .problem import Problem
from .ranks import RankModel, lognormal_sigma
from .shard_sim import running_bytes
from .simulate import lower_bound

__all__ = ["rank_lower_bound", "bound_on_ranks"]

#: draws of the step factors behind the expected maximum over the ranks; fewer where the ranks are many
#: (at most _MAX_DRAWS numbers: the maximum of many ranks varies little from draw to draw)
SAMPLES, _MAX_DRAWS = 4096, 4_000_000


def rank_lower_bound(problem: Problem, order: Sequence[str], model: RankModel, *, samples: int = SAMPLES) -> float:
    """A lower bound on the expected period on ``model``'s ranks of every plan of ``problem`` that runs
    ``order`` (see the module docstring); 0.0 where no parameter has a gradient and a reader."""
    graph, cluster = problem.graph, problem.cluster
    ops = [o for o in order if graph.ops[o].phase != "optimizer"]
    position = {o: j for j, o in enumerate(ops)}
    prefix = np.concatenate([[0.0], np.cumsum([graph.ops[o].duration_s for o in ops])])
    grad = {name: position[p.grad_op] for name, p in graph.params.items() if p.grad_op in position}
    if not grad:
        return 0.0
    groups = cluster.replicas if problem.mode == "sharded" and model.ranks > 1 else 1
    if model.ranks % groups:
        raise UnitError(f"{model.ranks} ranks do not split into the cluster's {groups} replicas")
    slowest = _slowest(model, groups, max(32, min(samples, _MAX_DRAWS // model.ranks)))
    if problem.mode in ("barrier", "sharded"):  # every gradient from g on crosses, the optimizer runs, then 0..g
        wire = cluster.allreduce_s if problem.mode == "barrier" else (lambda nbytes: 0.0)
        after = dict(running_bytes(grad, {name: graph.params[name].nbytes for name in grad}, reverse=True))
        least_speed = min(model.rank_scale or (1.0,))
        return max(wire(after[g]) + slowest * prefix[g + 1] for g in after) + least_speed * graph.totals.optimizer_s
    first_read: dict[str, int] = {}
    for j, o in enumerate(ops):
        for name in graph.ops[o].reads:
            first_read.setdefault(name, j)
    cycles = [cluster.allreduce_s(graph.params[name].nbytes) + slowest * (prefix[g + 1] - prefix[first_read[name]])
              for name, g in grad.items() if first_read.get(name, g + 1) <= g]
    return max(cycles, default=0.0) / (2 if problem.mode == "osp" else 1)


def bound_on_ranks(problem: Problem, order: Sequence[str], model: RankModel) -> float:
    """What no plan of ``problem`` in ``order`` beats on ``model``'s ranks, in expectation: the larger of the
    one-rank lower bound (:func:`.simulate.lower_bound`, which holds there too) and :func:`rank_lower_bound`."""
    return max(lower_bound(problem), rank_lower_bound(problem, order, model))


def _slowest(model: RankModel, groups: int, samples: int) -> float:
    """The expected largest step factor (log-normal, mean 1) times speed over the ranks of a group, the
    largest over the groups, each estimated on ``samples`` seeded draws less two standard errors."""
    rng = np.random.default_rng(model.seed)
    sigma = lognormal_sigma(model.step_spread)
    draws = np.exp(sigma * rng.standard_normal((samples, model.ranks)) - sigma * sigma / 2)
    if model.rank_scale:
        draws *= np.asarray(model.rank_scale, float)
    best = 0.0
    for group in np.split(draws, groups, axis=1):
        top = group.max(axis=1)
        spread = 2 * top.std(ddof=1) / math.sqrt(samples) if samples > 1 else 0.0
        best = max(best, float(top.mean()) - spread)
    return best
