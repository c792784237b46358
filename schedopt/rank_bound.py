"""A lower bound on the period on every rank: what the slowest rank costs whatever the plan.

The one-rank bounds (the simulator's, cpsat's) hold on the rank model in expectation
(:mod:`solvers.cpsat.recheck`), but they cannot see stragglers: on 64 ranks whose steps vary by 15%,
cpsat's plan for ResNet-50 (100 GbE) runs 25.7% above its one-rank period, and its one-rank bound
says nothing of why. This bound sees them. In the rank model (:mod:`.ranks`) a bucket's collective starts when the last rank has issued it,
and the next step's first reader of the bucket waits for it to end. So for a parameter ``p``, let
``E(n)`` be when the last rank ends ``p``'s gradient op in step ``n``. Whatever bucket holds ``p``:

- ``overlap``: the bucket settles at or before ``p``'s first reader in step ``n + 1`` (``n + 2`` for
  osp's stage 2, so osp counts two steps), after its collective (at least the cluster's fixed cost),
  and every rank then runs the ops from that reader to ``p``'s gradient op before the bucket is issued
  again: ``E(n + 1) >= E(n) + fixed + max over ranks of that rank's time for those ops``;
- ``barrier``, and a sharded step's reduce-scatters: everything settles before the optimizer, so the
  cycle runs the optimizer, then the next step's ops up to ``p``'s gradient op (two steps' draws).

Each rank's time for a run of ops is at least its step factor (per rank and step) times its speed times
the ops' mean work: the per-op variation averages out inside the maximum by Jensen's inequality, so
leaving it out keeps the bound. The expected maximum over the ranks is estimated on ``samples`` draws
of the rank model's step factors (seeded; fewer past 500 ranks), less two standard errors. The period
is at least the largest such cycle over the parameters; for a run of ops from the step's start or a
reader, the latest gradient op (barrier) or the widest span (overlap) is the largest. With HSDP's shard
groups the maximum is taken within a group (a sharded step's gathers synchronize a group only).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .errors import UnitError
from .problem import Problem
from .ranks import RankModel, lognormal_sigma

__all__ = ["rank_lower_bound"]

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
    first_read: dict[str, int] = {}
    for j, o in enumerate(ops):
        for name in graph.ops[o].reads:
            first_read.setdefault(name, j)
    grads = [position[p.grad_op] for p in graph.params.values() if p.grad_op in position]
    if not grads:
        return 0.0
    sharded = problem.mode == "sharded"
    groups = cluster.replicas if sharded and model.ranks > 1 else 1
    if model.ranks % groups:
        raise UnitError(f"{model.ranks} ranks do not split into the cluster's {groups} replicas")
    factors = _step_factors(model, groups, max(32, min(samples, _MAX_DRAWS // (2 * model.ranks))))
    if problem.mode in ("barrier", "sharded"):  # the optimizer, then the next step up to the latest gradient
        parts, steps = [graph.totals.optimizer_s, prefix[max(grads) + 1]], 1
    else:
        spans = [prefix[position[p.grad_op] + 1] - prefix[first_read[name]] for name, p in graph.params.items()
                 if name in first_read and p.grad_op in position and first_read[name] <= position[p.grad_op]]
        if not spans:
            return 0.0
        parts, steps = [max(spans)], 2 if problem.mode == "osp" else 1
    fixed = 0.0 if sharded else cluster.allreduce_s(0.0)
    cycle = max(_expected_max(f[:, :len(parts)], parts) for f in factors)
    return (fixed + cycle) / steps


def _step_factors(model: RankModel, groups: int, samples: int) -> list[np.ndarray]:
    """Per group of ranks, ``samples`` draws of two steps' factors ``(samples, 2, ranks of the group)``:
    the step factor (log-normal, mean 1) times each rank's speed."""
    rng = np.random.default_rng(model.seed)
    sigma = lognormal_sigma(model.step_spread)
    draws = np.exp(sigma * rng.standard_normal((samples, 2, model.ranks)) - sigma * sigma / 2)
    if model.rank_scale:
        draws *= np.asarray(model.rank_scale, float)
    return np.split(draws, groups, axis=2)


def _expected_max(factors: np.ndarray, parts: Sequence[float]) -> float:
    """The expected largest ``sum_t factors[t] * parts[t]`` over the ranks, less two standard errors."""
    totals = np.einsum("stk,t->sk", factors, np.asarray(parts, float)).max(axis=1)
    if len(totals) < 2:
        return float(totals.mean())
    return max(0.0, float(totals.mean() - 2 * totals.std(ddof=1) / math.sqrt(len(totals))))
