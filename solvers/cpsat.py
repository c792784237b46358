"""``cpsat``: the joint optimizer — op order and gradient buckets with OR-Tools CP-SAT.

The model (``barrier`` mode; time in integer ticks, the tick chosen so that
the best heuristic's iteration is about 1e6 ticks):

Data. The forward ops that lead to backward run first, in the hint's order
(their order cannot change when any gradient exists). The remaining ops
(backward, and forward ops nothing in backward waits for) are coarsened:
an op ``u`` whose only successor is ``v``, with ``v``'s only predecessor
``u``, same phase, and ``u`` finishing no gradient, is merged with ``v`` —
exact, because running ``u`` right before ``v`` never delays anything.
Parameters finished by the same op (and of one dtype) form one *unit*:
splitting such a group over two buckets is never better than sending it
whole in the earlier one.

Variables.
- ``start[i]``: start of coarse op i; its interval lies inside
  ``[F, F + sum d]`` (F: the fixed forward prefix), so the compute stream
  never idles, and its domain is cut to ``[F + anc(i), F + sum d - desc(i) -
  d_i]`` (``anc``/``desc``: summed durations of ancestors/descendants).
- ``x[u, b]``: unit u travels in candidate bucket b (b < B, in collective
  order); ``used[b] >= used[b+1]`` breaks symmetry.
- ``bstart[b]``: when bucket b starts; ``bdur[b] = A·used[b] + sum_u c_u·x[u, b]``
  (A: call overhead plus latency steps; ``c_u``: transfer ticks of the unit).

Constraints. ``NoOverlap`` of the op intervals and the DAG's precedences;
each unit in one bucket; a bucket starts after each of its gradients is
ready (``bstart[b] >= end[grad op]`` if ``x[u, b]``) and after the previous
bucket ends; ``T >= F + sum d`` and ``T >= bstart[b] + bdur[b]``.

Cuts that make the bound strong: ``bstart[0] >=`` the earliest any gradient
can exist; ``T >= bstart[0] + sum_b bdur[b]`` (every byte after the first
start); ``T >= end[grad op of u] + A + c_u`` for every unit; a tail cut
per op w: ``T >= end[w] + A + (transfer ticks of every unit finished by w or
by a descendant of w)`` — none of those bytes can leave before w ends; and a
constant *ready-time bound*: the exact bucketing DP (:mod:`.bucketing`) with
every unit ready at its earliest possible time (its op's ancestors alone on
the compute stream), and the unit ready last (the least over which one)
not before every gradient op and their ancestors have run. Ready times are
at least that under any order, and later ready times never shorten the
best bucketing, so the DP's end bounds ``T``; it counts calls against
channel idle time, which the cuts above cannot (GPT-2 on 64 x 100 GbE: the
bound from 2.2% to 1.0% below the warm start; ResNet-50 on 8 x 100 GbE:
proven optimal at once). The ready-time bound lets every gradient be ready
at its earliest at once; the *profile bound* (:func:`.bounds.profile_bound`) makes
their ops share the compute stream: the y-th byte to become ready waits for
the least work of any ancestor-closed set of ops that finishes y bytes (a
knapsack per point of a byte grid, solved by CP-SAT in milliseconds, and the
LP hull between points), and the same DP runs on those ready times (GPT-2 on
64 x 100 GbE: 1.0% -> 0.28% gap).

Objective: minimize T; the iteration is ``T + T_opt`` (the optimizer after the
barrier).

Warm start: the best plan among the heuristics and the exact contiguous
bucketing (:mod:`.bucketing`) on the engine order and on Caramel's
gradient-first order, and on both with the forward ops that no backward op
waits for moved after backward (in ``overlap`` mode those that read no
parameter; the model treats them as free ops like backward); its values
are checked against the model (a solve with every variable fixed to the
hint) and given to CP-SAT with ``AddHint``. If CP-SAT finds nothing better
within the time limit, the hint's plan is returned with status ``FEASIBLE``
and ``options.result = "hint"``.

``overlap`` mode, a cyclic model of one steady-state period ``T``: the
forward ops keep the warm start's order (so each parameter's first reader is
known; forward ops that neither lead to backward nor read a parameter are
free, like backward ops) and run with the backward ops and one update
interval per bucket inside ``[0, T]`` under one ``NoOverlap`` (the next step
occupies ``[T, 2T]``). A bucket's collective of the previous step ended at
``bstart + bdur - T`` in this frame; its update (the bucket's share of the
optimizer, by bytes) starts after that and after the forward op before its
first reader, and ends before that reader (``AddMinEquality`` picks the first
reader among the bucket's units, ``AddElement`` the times) — exactly where the
simulator applies it. Units also split by first reader. The collectives of
the next step queue behind this step's (``bstart[0] + T >= bstart[b] +
bdur[b]``). Cuts: ``T >= end[grad op] + A + c_u + update_u - fstart[reader]``
for every unit; a constant *window bound* — the work that must run between
the start of forward op j and the end of op w (descendants of j that are
ancestors of w) plus one call and the bytes of every unit finished at or
below w and read by j or earlier (these leave after w and are back before j
runs again, one period later); and a *cycle cut* per bucket b: the channel's
busy time from bucket 0 through b, b's update, and the least work from b's
first reader to any gradient (the channel's idle before the next step's
bucket 0) fit in one period. A constant *channel bound* (:func:`.bounds.channel_bound`)
looks at the channel alone, each gradient ready at its earliest and needed
back before the next step's backward by its update and the forward ops from
its first reader on: the buckets sent before and after the bucket of any one
gradient each cost a call but use channel time that would otherwise idle,
so it weighs calls against idle at both ends of the period (on 64 x 100 GbE,
BERT-base: 73.6 -> 77.6 ms, ResNet-50: 16.3 -> 20.7 ms, over the window
bound). A constant *anchor bound* (:meth:`_OverlapModel._anchor_bound`)
follows one large gradient and the backward work X done before its bucket
starts: X delays the anchor's cycle, and the bytes X cannot ready (a
knapsack over the DAG, solved by CP-SAT on a grid of X) queue behind the
anchor (GPT-2's tied embedding on 64 x 100 GbE: 116.2 -> 117.8 ms over the
window bound). The objective ``T`` is the period; the warm
start's values come from running it step by step in ticks until the period
repeats. The overlap warm start adds a local search over buckets
(:mod:`.overlap_search`): buckets sent out of ready order, which no
heuristic tries, are where most of overlap mode's gain is. It runs in
rounds; after each, the backward order becomes the *bucket-first* order of
the buckets found (:func:`.common.bucket_first_order`: each bucket's
backward ancestors, bucket by bucket, which readies every prefix of the
collective order at the earliest) when that is faster, so gradients the
search holds back also let their ops wait (GPT-2 small, 8 x 100 GbE:
119.2 -> 117.6 ms). Every warm start set also has the best plan's
bucket-first order.

Two phases: CP-SAT searches for 70% of the time left; if it has not proven
optimality, the rest goes to a second solve with the incumbent as hint, ``T``
capped at the incumbent, and CP-SAT's objective lower-bound search. Both
bounds are valid; the plan records the higher.

Chunks: none. A chunked bucket is never faster than its chunks cut into
buckets at parameter boundaries (:func:`.common.split_chunks`, a property
test on random plans), so the warm start splits Caramel's chunks and the
model searches buckets only.

Scope of the proven bound: plans with at most ``B`` buckets (``B`` >= the
warm start's count + 2, at least 8, at most the number of units; a chunked
plan counts its pieces), and in ``overlap`` mode the warm start's forward
order and buckets that keep each unit whole (there, splitting a unit can
pay: its first part's update runs while the rest is on the network). The
overlap model's constant bounds (window, channel, anchor) hold for every bucketing.

Time: each heuristic's own search gets 10% of the time limit (only
Caramel's chunk trials take long), the overlap bucket search 50% (its two
starts in parallel processes when ``num_workers >= 2``), the barrier work
profile at most 5% (5 s), CP-SAT the rest. An overlap model of more than
``OVERLAP_MAX_PAIRS`` (unit, bucket) pairs is not solved (CP-SAT's first
propagation of it overruns the limit): the warm start is returned with the
model's constant bound.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import networkx as nx
import numpy as np

from schedopt.errors import SolverError
from schedopt.graph import TrainGraph
from schedopt.orders import engine_order
from schedopt.plan import Plan, SolverInfo
from schedopt.problem import Problem
from schedopt.simulate import simulate, update_costs

from .bounds import (PROFILE_WALL_S, ClosureKnapsack, channel_bound, profile_bound, ready_time_bound,
                     work_profile)
from .bucketing import optimal_contiguous_buckets
from .caramel import caramel_order
from .common import bucket_first_order, first_readers, require_positive, split_chunks
from .interrupt import interruptible
from .overlap_search import SteadyState, improve_buckets
from .registry import SOLVERS, register

__all__ = ["solve_cpsat", "coarsen", "CpsatProgress"]

#: Overlap mode: the bucket search starts from the best plan of this many distinct op orders.
SEARCH_ORDERS = 2
#: The share of CP-SAT's time spent raising the bound (objective lower-bound search) after searching.
BOUND_PHASE_SHARE = 0.3
#: Overlap mode: the periods each start's search may evaluate, over all its rounds. 50k take 2-4 s
#: on the example models, so the searches end on this count, not on the clock, when they run in
#: parallel. From Caramel's start, 4 seeds, mean period: Inception 64 x 100 GbE 21.54 ms with
#: three rounds of 300k in all, 21.48 with one, 21.40 the best of two seeds of 150k (spread
#: 21.1-21.9 in each: the seed matters more); GPT-2 small 64 x 100 GbE 123.09 with the rounds,
#: 124.19 the best of two seeds of 150k.
SEARCH_EVALUATIONS = 300_000
#: ... and at most this many per unit (small problems converge long before; tests stay fast).
SEARCH_EVALUATIONS_PER_UNIT = 2_000
#: Overlap mode: the bucket search's rounds (shares of its evaluations and time); after each, the
#: backward order becomes the bucket-first order of its result if that is faster, and the next round
#: goes on from there (GPT-2 small on 64 x 100 GbE: 126.0 -> 123.5 ms over three rounds).
SEARCH_ROUND_SHARES = (0.5, 0.25, 0.25)
#: Overlap mode: a search process still running this long after its time limit is killed.
SEARCH_GRACE_S = 60.0
#: Overlap mode: the share of the time limit the bucket search may use at most (CP-SAT rarely
#: improves on the search's plan in the large cases; the search does, given time). With two or
#: more workers the starts search in parallel processes (the search is pure Python and CP-SAT has
#: not started), each for this share; else one after the other, splitting it.
SEARCH_SHARE = 0.5
#: The share of the time limit each heuristic's own search may use (Caramel's chunk trials: 40 s
#: unbounded on transformer_like(96), one 0.4 s simulation per trial).
HEURISTIC_SHARE = 0.1
#: The horizon of the best warm start, in ticks.
HORIZON_TICKS = 1_000_000
#: Above this many variables CP-SAT's presolve does not finish within a minute on 2 workers
#: (transformer_like(96) at aten granularity: no solution with it, the hint and a 2.3% bound without).
PRESOLVE_MAX_VARIABLES = 50_000
#: Overlap mode: above this many (unit, bucket) pairs CP-SAT is not run; the warm start is returned
#: with the model's constant bound. Its initial propagation of the cyclic model ignores the time
#: limit (transformer_like(96): 1,156 units x 390 buckets, 56 s for a 10 s limit; transformer_like(48),
#: 123k variables: 65 s for 60) and it found nothing beyond the warm start there; the example models
#: have at most 190 units (Inception), so fewer than 50k pairs even with a bucket per unit.
OVERLAP_MAX_PAIRS = 50_000
#: Barrier mode: the work profile (:func:`.bounds.work_profile`) may take at most this share of the
#: time limit (and :data:`.bounds.PROFILE_WALL_S`).
PROFILE_SHARE = 0.05
#: The anchor bound (:meth:`_OverlapModel._anchor_bound`): anchors tried, knapsack points each, and
#: the deterministic time per knapsack (GPT-2: the second anchor's knapsacks ran into the limit,
#: 8 s for nothing; the first's take 1 s together, all solved).
ANCHOR_BOUND_ANCHORS, ANCHOR_BOUND_POINTS, ANCHOR_POINT_DET_S = 1, 24, 0.05


@dataclass(frozen=True, slots=True)
class CpsatProgress:
    """One improvement reported while CP-SAT runs (seconds)."""

    wall_s: float
    objective_s: float
    bound_s: float


@dataclass
class Coarse:
    """Coarsened ops: ``chains[i]`` are the fine op ids of coarse op i, in order."""

    chains: list[list[str]]
    of: dict[str, int]
    edges: set[tuple[int, int]]


def coarsen(graph: TrainGraph, ops: list[str], *, keep_order: bool = False) -> Coarse:
    """Contract chains ``u -> v`` (u's only successor, v's only predecessor, same phase, u finishes no gradient);
    with ``keep_order`` only where v comes right after u in ``ops``, so every chain is a run of ``ops``."""
    inside = set(ops)
    position = {o: k for k, o in enumerate(ops)}
    sub = graph.dag.subgraph(ops)
    merge_into_pred: dict[str, str] = {}
    for v in ops:
        preds = list(sub.predecessors(v))
        if len(preds) != 1:
            continue
        u = preds[0]
        if (sub.out_degree(u) == 1 and not graph.ops[u].grads
                and graph.ops[u].phase == graph.ops[v].phase
                and len([p for p in graph.dag.predecessors(v) if p in inside]) == 1
                and (not keep_order or position[v] == position[u] + 1)):
            merge_into_pred[v] = u
    chains: list[list[str]] = []
    of: dict[str, int] = {}
    for v in nx.topological_sort(sub):
        if v in merge_into_pred:
            i = of[merge_into_pred[v]]
            chains[i].append(v)
        else:
            i = len(chains)
            chains.append([v])
        of[v] = i
    edges = {(of[u], of[v]) for u, v in sub.edges if of[u] != of[v]}
    return Coarse(chains=chains, of=of, edges=edges)


def _ticks(seconds: float, tick_s: float) -> int:
    return int(round(seconds / tick_s))


class _BucketsMixin:
    """Candidate buckets shared by both models: assignment, symmetry, FIFO and ready times."""

    units: list[list[str]]
    unit_op: list[int]
    c: list[int]
    A: int
    B: int
    start: list[Any]
    end: list[Any]
    coarse: Coarse
    graph: TrainGraph
    head: list[str]  # ops fixed before every free op, in order

    def add_buckets(self, m, horizon: int) -> None:
        U, B = len(self.units), self.B
        self.x = {(u, b): m.NewBoolVar(f"x[{u},{b}]") for u in range(U) for b in range(B)}
        self.used = [m.NewBoolVar(f"used[{b}]") for b in range(B)]
        self.bstart = [m.NewIntVar(0, horizon, f"bstart[{b}]") for b in range(B)]
        self.bdur = [m.NewIntVar(0, horizon, f"bdur[{b}]") for b in range(B)]
        for u in range(U):
            m.AddExactlyOne(self.x[u, b] for b in range(B))
        for b in range(B):
            members = [self.x[u, b] for u in range(U)]
            for x in members:
                m.AddImplication(x, self.used[b])
            m.AddBoolOr(members).OnlyEnforceIf(self.used[b])
            m.Add(self.bdur[b] == self.A * self.used[b] + sum(self.c[u] * self.x[u, b] for u in range(U)))
            if b + 1 < B:
                m.AddImplication(self.used[b + 1], self.used[b])
                m.Add(self.bstart[b + 1] >= self.bstart[b] + self.bdur[b])
            for u in range(U):
                m.Add(self.bstart[b] >= self.end[self.unit_op[u]]).OnlyEnforceIf(self.x[u, b])

    def expand(self, solver) -> tuple[list[str], list[list[str]]]:
        """Read a solution: the fixed head, the free ops by start time, the optimizer; then the buckets."""
        rank = getattr(self, "fixed_rank", range(len(self.coarse.chains)))
        chain_order = sorted(range(len(self.coarse.chains)), key=lambda i: (solver.Value(self.start[i]), rank[i]))
        free = [o for i in chain_order for o in self.coarse.chains[i]]
        optimizer = [o for o in self.graph.ops if self.graph.ops[o].phase == "optimizer"]
        order = self.head + free + optimizer
        return order, self.read_buckets(solver, order)

    def fix_order(self, order: list[str]) -> None:
        """Run the free ops' chains in ``order`` (``eager`` execution: the engine's order is given)."""
        position = {o: k for k, o in enumerate(order)}
        chains = sorted(range(len(self.coarse.chains)), key=lambda i: position[self.coarse.chains[i][0]])
        for a, b in zip(chains, chains[1:]):
            self.model.Add(self.start[b] >= self.end[a])
        self.fixed_rank = {i: k for k, i in enumerate(chains)}

    def read_buckets(self, solver, order: list[str]) -> list[list[str]]:
        """The used buckets of a solution, each in gradient-ready order under ``order``."""
        position = {o: k for k, o in enumerate(order)}
        buckets = []
        for b in range(self.B):
            members = [n for u, unit in enumerate(self.units) if solver.Value(self.x[u, b]) for n in unit]
            if members:
                buckets.append(sorted(members, key=lambda n: position[self.graph.params[n].grad_op]))
        return buckets


class _Model(_BucketsMixin):
    """The CP-SAT model of one barrier-mode problem (see the module docstring)."""

    def __init__(self, problem: Problem, prefix: list[str], free: list[str], tick_s: float, num_buckets: int,
                 profile_wall_s: float = PROFILE_WALL_S):
        from ortools.sat.python import cp_model

        graph, cluster = problem.graph, problem.cluster
        self.graph, self.tick_s, self.head = graph, tick_s, prefix
        self.coarse = coarsen(graph, free, keep_order=not problem.reorders)
        chains = self.coarse.chains
        self.dur = [sum(_ticks(graph.ops[o].duration_s, tick_s) for o in chain) for chain in chains]
        self.fixed = sum(_ticks(graph.ops[o].duration_s, tick_s) for o in prefix)
        total = self.fixed + sum(self.dur)
        self.compute_end = total
        # units: parameters finished by the same op, one dtype
        units: dict[tuple[str, str], list[str]] = {}
        for name, p in graph.params.items():
            units.setdefault((p.grad_op, p.dtype), []).append(name)
        self.units = list(units.values())
        self.unit_op = [self.coarse.of[graph.params[u[0]].grad_op] for u in self.units]
        self.A = 0 if cluster.world_size == 1 else _ticks(cluster.fixed_s, tick_s)
        self.c = [0 if cluster.world_size == 1 else
                  _ticks(cluster.seconds_per_byte * sum(graph.params[n].nbytes for n in u), tick_s)
                  for u in self.units]
        self.B = num_buckets

        m = cp_model.CpModel()
        self.model = m
        n = len(chains)
        dag = nx.DiGraph()
        dag.add_nodes_from(range(n))
        dag.add_edges_from(self.coarse.edges)
        ancestors, descendants = _reach(dag, n), _reach(dag.reverse(copy=False), n)
        anc, desc = _masked_sums(ancestors, self.dur), _masked_sums(descendants, self.dur)
        self.start = [m.NewIntVar(self.fixed + anc[i], total - desc[i] - self.dur[i], f"start[{i}]") for i in range(n)]
        self.end = [m.NewIntVar(self.fixed + anc[i] + self.dur[i], total - desc[i], f"end[{i}]") for i in range(n)]
        intervals = [m.NewIntervalVar(self.start[i], self.dur[i], self.end[i], f"op[{i}]") for i in range(n)]
        m.AddNoOverlap(intervals)
        for i, j in self.coarse.edges:
            m.Add(self.start[j] >= self.end[i])

        horizon = 4 * total + self.A * len(self.units) + sum(self.c) + 1
        U, B = len(self.units), self.B
        self.add_buckets(m, horizon)
        self.T = m.NewIntVar(total, horizon, "T")
        # ready-time bound (see ready_time_bound)
        grad_ops = sorted(set(self.unit_op))
        needed = ancestors[grad_ops].any(axis=0)
        needed[grad_ops] = True
        earliest = [self.fixed + anc[i] + self.dur[i] for i in self.unit_op]
        own = [0] * n  # the bytes each op finishes
        for u in range(U):
            own[self.unit_op[u]] += self.c[u]
        self.profile = work_profile(self.dur, self.coarse.edges, own, wall_s=profile_wall_s)
        all_ready = self.fixed + int(np.asarray(self.dur)[needed].sum())
        self.ready_bound = max(ready_time_bound(earliest, self.c, self.A, all_ready=all_ready),
                               profile_bound(earliest, self.c, self.A, self.fixed, self.profile))
        m.Add(self.T >= self.ready_bound)
        self.static_bound = max(total, self.ready_bound)  # a constant bound (reported if CP-SAT finds nothing)
        for b in range(B):
            m.Add(self.T >= self.bstart[b] + self.bdur[b])
        # cuts
        m.Add(self.bstart[0] >= min(self.fixed + anc[i] + self.dur[i] for i in self.unit_op))
        m.Add(self.T >= self.bstart[0] + sum(self.bdur))
        for u in range(U):
            m.Add(self.T >= self.end[self.unit_op[u]] + self.A + self.c[u])
        # tail cut: every gradient finished by op w or by a descendant of w is ready only after w ends,
        # so all of those bytes (and at least one call) cross the network after end[w]
        after = _masked_sums(descendants, own)
        for w in range(n):
            if own[w] + after[w] > 0:
                m.Add(self.T >= self.end[w] + self.A + own[w] + after[w])
        m.Minimize(self.T)

    # ---------------------------------------------------------------- hints

    def hint(self, order: list[str], buckets: list[list[str]]) -> dict[Any, int]:
        """Return the variable values of a plan (its free ops in ``order``), in ticks."""
        position = {o: k for k, o in enumerate(order)}
        chain_order = sorted(range(len(self.coarse.chains)),
                             key=lambda i: position[self.coarse.chains[i][0]])
        values: dict[Any, int] = {}
        t = self.fixed
        ends = [0] * len(self.dur)
        for i in chain_order:
            values[self.start[i]] = t
            t += self.dur[i]
            values[self.end[i]] = t
            ends[i] = t
        home = {}
        for b, bucket in enumerate(buckets):
            for name in bucket:
                home.setdefault(name, b)
        # a unit goes with the earliest bucket holding any of its parameters
        unit_bucket = [min(home[n] for n in unit) for unit in self.units]
        used_buckets = sorted(set(unit_bucket))
        rank = {b: k for k, b in enumerate(used_buckets)}
        free = 0
        T = self.compute_end
        for k in range(self.B):
            members = [u for u in range(len(self.units)) if k < len(used_buckets) and rank[unit_bucket[u]] == k]
            for u in range(len(self.units)):
                values[self.x[u, k]] = int(u in members)
            values[self.used[k]] = int(bool(members))
            duration = (self.A + sum(self.c[u] for u in members)) if members else 0
            start = max([free] + [ends[self.unit_op[u]] for u in members])
            if k == 0 and not members:
                start = max(start, 0)
            values[self.bstart[k]] = start
            values[self.bdur[k]] = duration
            free = start + duration
            T = max(T, free)
        values[self.T] = T
        return values


class _OverlapModel(_BucketsMixin):
    """The cyclic CP-SAT model of the ``overlap`` steady state (see the module docstring)."""

    def __init__(self, problem: Problem, forward: list[str], backward: list[str], tick_s: float,
                 num_buckets: int):
        """Prepare the data and the constant bound; :meth:`build` creates the CP-SAT model."""
        graph, cluster = problem.graph, problem.cluster
        self.graph, self.forward, self.head = graph, forward, forward
        self.coarse = coarsen(graph, backward, keep_order=not problem.reorders)
        chains = self.coarse.chains
        self.fwd_dur = [_ticks(graph.ops[o].duration_s, tick_s) for o in forward]
        self.dur = [sum(_ticks(graph.ops[o].duration_s, tick_s) for o in chain) for chain in chains]
        first_reader = first_readers(graph, forward)
        per_param = update_costs(graph)
        units: dict[tuple[str, str, int], list[str]] = {}
        for name, p in graph.params.items():
            units.setdefault((p.grad_op, p.dtype, first_reader[name]), []).append(name)
        self.units = list(units.values())
        self.reader = [first_reader[u[0]] for u in self.units]
        self.unit_op = [self.coarse.of[graph.params[u[0]].grad_op] for u in self.units]
        self.upd = [_ticks(sum(per_param[n] for n in u), tick_s) for u in self.units]
        # the constant bounds hold for plans that split a unit too (its first part's update can then
        # run while the rest is on the network): per parameter, or with a unit's least update
        self.param_upd = [[_ticks(per_param[n], tick_s) for n in u] for u in self.units]
        self.param_c = [[_ticks(cluster.seconds_per_byte * graph.params[n].nbytes, tick_s) for n in u]
                        for u in self.units]
        self.A = _ticks(cluster.fixed_s, tick_s)
        self.c = [_ticks(cluster.seconds_per_byte * sum(graph.params[n].nbytes for n in u), tick_s)
                  for u in self.units]
        self.B = num_buckets
        self.position = {o: j for j, o in enumerate(forward)}
        W = self._windows(graph, self.position)  # rows: the units' ops
        self.window_bound = self._window_bound(W)
        # H[j]: the least work from forward op j's start to the end of any gradient (for the cycle cut)
        self.H = [int(round(h)) for h in W.min(axis=0)] + [0]
        self.total = sum(self.fwd_dur) + sum(self.dur) + sum(self.upd)
        self.items = self._items()
        self.channel_bound = self._channel_bound()
        self.anchor_bound = self._anchor_bound()
        self.static_bound = max(self.total, self.A + sum(self.c), self.window_bound, self.channel_bound,
                                self.anchor_bound)

    def build(self) -> None:
        """Create the CP-SAT model (``self.model``) over ``B`` candidate buckets."""
        from ortools.sat.python import cp_model

        graph, forward, position, fwd_dur = self.graph, self.forward, self.position, self.fwd_dur
        chains, total = self.coarse.chains, self.total
        U, B = len(self.units), self.B
        m = cp_model.CpModel()
        self.model = m
        horizon = 3 * (total + self.A * U + sum(self.c)) + 1
        self.T = m.NewIntVar(max(total, self.A + sum(self.c)), horizon, "T")
        # forward ops in their fixed order; backward ops free; all inside the period [0, T]
        self.f = [m.NewIntVar(0, horizon, f"fstart[{j}]") for j in range(len(forward))]
        intervals = [m.NewFixedSizeIntervalVar(self.f[j], fwd_dur[j], f"fwd[{j}]") for j in range(len(forward))]
        for j in range(len(forward) - 1):
            m.Add(self.f[j + 1] >= self.f[j] + fwd_dur[j])
        self.start = [m.NewIntVar(0, horizon, f"start[{i}]") for i in range(len(chains))]
        self.end = [m.NewIntVar(0, horizon, f"end[{i}]") for i in range(len(chains))]
        intervals += [m.NewIntervalVar(self.start[i], self.dur[i], self.end[i], f"op[{i}]") for i in range(len(chains))]
        for i, j in self.coarse.edges:
            m.Add(self.start[j] >= self.end[i])
        for u_op, v_op in graph.dag.edges:
            if u_op in position and v_op in self.coarse.of:
                m.Add(self.start[self.coarse.of[v_op]] >= self.f[position[u_op]] + fwd_dur[position[u_op]])
        for i in range(len(chains)):
            m.Add(self.end[i] <= self.T)
        # buckets, and one update interval each
        self.add_buckets(m, horizon)
        self.vstart = [m.NewIntVar(0, horizon, f"update[{b}]") for b in range(B)]
        self.vdur = [m.NewIntVar(0, sum(self.upd), f"update_time[{b}]") for b in range(B)]
        self.vend: list[Any] = []
        self.first: list[Any] = []
        self.after: list[Any] = []
        self.before: list[Any] = []
        for b in range(B):
            m.Add(self.vdur[b] == sum(self.upd[u] * self.x[u, b] for u in range(U)))
            vend = m.NewIntVar(0, horizon, f"update_end[{b}]")
            self.vend.append(vend)
            intervals.append(m.NewIntervalVar(self.vstart[b], self.vdur[b], vend, f"upd[{b}]"))
            m.Add(vend <= self.T)
            # last step's collective of bucket b ended at bstart + bdur - T in this step's frame
            m.Add(self.vstart[b] >= self.bstart[b] + self.bdur[b] - self.T)
            m.Add(self.bstart[0] + self.T >= self.bstart[b] + self.bdur[b])  # FIFO into the next step
            for u in range(U):
                m.Add(self.f[self.reader[u]] >= vend).OnlyEnforceIf(self.x[u, b])
        # The simulator applies a bucket's update right before the first forward op reading any of its
        # parameters (position first[b]): after the op before it, before it.
        n_fwd = len(forward)
        prev_end = [0] + [self.f[j - 1] + fwd_dur[j - 1] for j in range(1, n_fwd)] + [0]
        starts = [*self.f, self.T]
        for b in range(B):
            first = m.NewIntVar(0, n_fwd, f"first_reader[{b}]")  # n_fwd: unused bucket
            m.AddMinEquality(first, [self.reader[u] * self.x[u, b] + n_fwd * (1 - self.x[u, b]) for u in range(U)])
            after = m.NewIntVar(0, horizon, f"update_after[{b}]")
            before = m.NewIntVar(0, horizon, f"update_before[{b}]")
            m.AddElement(first, prev_end, after)
            m.AddElement(first, starts, before)
            m.Add(self.vstart[b] >= after)
            m.Add(self.vend[b] <= before)
            self.first.append(first)
            self.after.append(after)
            self.before.append(before)
        m.AddNoOverlap(intervals)
        # cut: whatever its bucket, a unit crosses the network and is applied before its next first use
        for u in range(U):
            m.Add(self.T >= self.end[self.unit_op[u]] + self.A + self.c[u] + self.upd[u] - self.f[self.reader[u]])
        m.Add(self.T >= self.static_bound)
        # cycle cut: between the end of this step's bucket b and the start of the next step's bucket 0
        # run b's update and the work from b's first reader to the earliest gradient (H), so the
        # channel's busy time from bucket 0 through b plus that idle fits in one period
        H = self.H
        self.idle = []
        for b in range(B):
            idle = m.NewIntVar(0, max(H), f"idle[{b}]")
            self.idle.append(idle)
            m.AddElement(self.first[b], H, idle)
            m.Add(self.bstart[0] + self.T >= self.bstart[b] + self.bdur[b] + self.vdur[b] + idle)
        m.Minimize(self.T)

    def _windows(self, graph: TrainGraph, position: dict[str, int]) -> np.ndarray:
        """``W[u, j]``: ticks of work that must run between the start of forward op j and the end of unit u's op.

        Nodes: the forward ops (0..nf-1, chained in their fixed order) and the
        coarse backward ops (nf + i). ``W[u, j]`` sums the durations of the
        nodes that are both descendants-or-self of j and ancestors-or-self of
        u's op; all of them run between the start of j and the end of that op
        (0 when it is not below j).
        """
        nf, nc = len(self.forward), len(self.coarse.chains)
        n = nf + nc
        dag = nx.DiGraph()
        dag.add_nodes_from(range(n))
        dag.add_edges_from((j, j + 1) for j in range(nf - 1))
        dag.add_edges_from((nf + i, nf + j) for i, j in self.coarse.edges)
        for a, b in graph.dag.edges:
            if a in position and b in position:
                dag.add_edge(position[a], position[b])
            elif a in position and b in self.coarse.of:
                dag.add_edge(position[a], nf + self.coarse.of[b])
        below = _reach(dag, n)
        below[np.arange(n), np.arange(n)] = True  # below[v, u]: u is an ancestor of v, or v itself
        self.unit_below = below[[nf + i for i in self.unit_op]]  # [u, v]
        self.below_fwd = below[nf:, :nf]  # [coarse op, forward op]: the forward op is its ancestor
        dur = np.array(self.fwd_dur + self.dur, dtype=np.float32)
        # float32 is exact here: every sum is at most the compute time, about 1e6 ticks < 2**24
        return (self.unit_below * dur) @ below[:, :nf].astype(np.float32)

    def _window_bound(self, W: np.ndarray) -> int:
        """A constant lower bound on the period from the work inside transfer windows.

        A unit finished by unit w's op or below it and read first at or before
        forward op j is sent after w ends and must be back before j starts
        again one period later, so (with ``W`` from :meth:`_windows`)

            T >= W[w, j] + A + (transfer of those units)          (w below j)
            T >= W[op(u), reader(u)] + A + c_u + update_p          (every unit u)

        where p is u's parameter with the least update (a plan may split u; its last part's update
        comes after all of u's bytes).
        """
        nf, U = len(self.forward), len(self.units)
        ops = [nf + i for i in self.unit_op]
        readers = np.array(self.reader)
        c = np.array(self.c, dtype=np.float64)
        W = W.astype(np.float64)
        per_unit = W[np.arange(U), readers] + self.A + c + np.array([min(p) for p in self.param_upd])
        finished_below = self.unit_below[:, ops].T  # [w, u]: unit u's op is unit w's op or below it
        read_by = readers[:, None] <= np.arange(nf)[None, :]  # [u, j]
        window_bytes = (finished_below * c) @ read_by  # [w, j]
        windows = np.where((W > 0) & (window_bytes > 0), W + self.A + window_bytes, 0)
        return int(round(max(per_unit.max(initial=0), windows.max(initial=0))))

    def _items(self) -> list[tuple[int, int, int, int]]:
        """One item per parameter (a plan may split a unit; a bucket holds whole parameters):
        ``(coarse op, release, tail, cost)`` in ticks, for the channel and anchor bounds; none
        without backward ops.

        Times count from the start of this step's first backward op: a parameter is ready no earlier
        than its op's backward ancestors and its op have run (``release``), and after its bucket's
        collective the next step's first backward op starts no earlier than its update and the
        forward ops from its first reader through the last one that every backward op waits for
        (``tail``; the forward order is fixed, so a backward op waits for every forward op up to
        its last forward ancestor).
        """
        nf = len(self.forward)
        real = [i for i, chain in enumerate(self.coarse.chains) if self.graph.ops[chain[0]].phase == "backward"]
        if not real:
            return []
        release = (self.unit_below[:, nf:] * np.array(self.dur, dtype=np.int64)).sum(axis=1)
        # the forward ops every backward op waits for: up to the least "last forward ancestor"
        below = self.below_fwd  # [coarse op, forward op]
        last = min(int(np.flatnonzero(below[i]).max(initial=-1)) for i in real)
        suffix = np.concatenate([np.cumsum(np.array(self.fwd_dur[:last + 1], dtype=np.int64)[::-1])[::-1],
                                 np.zeros(nf - last, dtype=np.int64)])
        return [(self.unit_op[u], int(release[u]), int(suffix[self.reader[u]]) + upd, c)
                for u in range(len(self.units)) for upd, c in zip(self.param_upd[u], self.param_c[u])]

    def _channel_bound(self) -> int:
        """The constant *channel bound* (see :func:`.bounds.channel_bound`) over :meth:`_items`."""
        if not self.items:
            return 0
        _, release, tail, cost = (list(x) for x in zip(*self.items))
        return channel_bound(release, tail, cost, self.A)

    def _anchor_bound(self) -> int:
        """The constant *anchor bound* on the period, in ticks (0 without gradients).

        Take a parameter a (the anchor; times from the step's first backward op, as in
        :meth:`_channel_bound`), its bucket's start S, and X the backward work done by S besides a's
        op and its ancestors (``release[a]``), so ``S >= release[a] + X``. Then

            T >= release[a] + X + call + c[a] + tail[a]                                  (a's cycle)

        and the bytes not ready by S, at least ``c(others) - P(X)``, go in later buckets, so

            T >= release[a] + X + 2 call + c[a] + c(others) - P(X) + least tail of the others

        where P(X) is the most bytes of the other parameters any closed set of ops holding a's
        ancestors and X more work finishes: a knapsack, CP-SAT's proven upper bound on a grid of X
        (between points the lower X for the first line, the higher for P). T is at least the least,
        over X, of the larger line. GPT-2's tied embedding: finished last, read first, 24 ms on
        64 x 100 GbE; doing the other layers' weight-gradient ops before it delays it, leaving them
        for later queues their 54 ms of bytes behind it (116.2 -> 117.8 ms over the window bound).
        The anchor is the parameter with the largest ``release + c + tail``.
        """
        if not self.items:
            return 0
        op, release, tail, cost = (list(x) for x in zip(*self.items))
        n = len(self.dur)
        dag = nx.DiGraph(list(self.coarse.edges))
        dag.add_nodes_from(range(n))
        best = 0
        anchors = sorted(range(len(cost)), key=lambda i: -(release[i] + cost[i] + tail[i]))[:ANCHOR_BOUND_ANCHORS]
        for a in anchors:
            others = [i for i in range(len(cost)) if i != a]
            if not others:
                continue
            done = nx.ancestors(dag, op[a]) | {op[a]}
            own = [0] * n
            for i in others:
                own[op[i]] += cost[i]
            ready = sum(own[v] for v in done)  # finished with a's ancestors
            spare = [v for v in range(n) if v not in done]
            if not spare:
                continue
            knapsack = ClosureKnapsack(self.dur, own, dag, spare, ANCHOR_POINT_DET_S)
            points = np.linspace(0, knapsack.work, ANCHOR_BOUND_POINTS + 1)
            most = [ready + knapsack.most_bytes(int(x)) for x in points]
            c_others, tail_others = sum(cost[i] for i in others), min(tail[i] for i in others)
            lines = []
            for k in range(ANCHOR_BOUND_POINTS):
                cycle = release[a] + points[k] + self.A + cost[a] + tail[a]
                late = c_others - most[k + 1]
                queued = release[a] + points[k] + 2 * self.A + cost[a] + late + tail_others if late > 0 else 0
                lines.append(max(cycle, queued))
            best = max(best, int(np.floor(min(lines))))
        return best

    def hint(self, order: list[str], buckets: list[list[str]]) -> dict[Any, int]:
        """Return the variable values of a plan's steady state, in ticks.

        Runs the plan step after step with the model's semantics (an update
        right before the first reader of its bucket, after the bucket's last
        collective ended) until the period repeats, and reads one period.
        """
        home: dict[str, int] = {}
        for b, bucket in enumerate(buckets):
            for name in bucket:
                home.setdefault(name, b)
        unit_bucket = [min(home[n] for n in unit) for unit in self.units]
        rank = {b: k for k, b in enumerate(sorted(set(unit_bucket)))}
        bucket_of = [rank[b] for b in unit_bucket]
        members = [[u for u in range(len(self.units)) if bucket_of[u] == k] for k in range(self.B)]
        size = [(self.A + sum(self.c[u] for u in ms)) if ms else 0 for ms in members]
        upd = [sum(self.upd[u] for u in ms) for ms in members]
        needs: dict[int, list[int]] = {}
        for k, ms in enumerate(members):
            if ms:
                needs.setdefault(min(self.reader[u] for u in ms), []).append(k)
        position = {o: k for k, o in enumerate(order)}
        chain_order = sorted(range(len(self.coarse.chains)), key=lambda i: position[self.coarse.chains[i][0]])
        fwd_dur = self.fwd_dur
        t, channel, prev_end = 0, 0, [0] * self.B
        origins: list[int] = []
        frames: list[dict[Any, int]] = []
        for _ in range(64):
            origin, frame = t, {}
            for j in range(len(self.forward)):
                for k in needs.get(j, ()):
                    t = max(t, prev_end[k])
                    frame[self.vstart[k]] = t - origin
                    t += upd[k]
                frame[self.f[j]] = t - origin
                t += fwd_dur[j]
            end = [0] * len(self.dur)
            for i in chain_order:
                frame[self.start[i]] = t - origin
                t += self.dur[i]
                frame[self.end[i]] = t - origin
                end[i] = t
            for k in range(self.B):
                ready = max((end[self.unit_op[u]] for u in members[k]), default=0)
                start = max(channel, ready)
                frame[self.bstart[k]], frame[self.bdur[k]] = start - origin, size[k]
                channel = prev_end[k] = start + size[k]
            origins.append(origin)
            frames.append(frame)
            if len(origins) >= 4 and origins[-1] - origins[-2] == origins[-2] - origins[-3] == origins[-3] - origins[-4]:
                break
        period = t - origins[-1]
        values = frames[-1]
        values[self.T] = period
        for k in range(self.B):
            values[self.vdur[k]] = upd[k]
            if self.vstart[k] not in values:  # an unused bucket: an empty update at the end of the period
                values[self.vstart[k]] = period  # (inside an op, CP-SAT's NoOverlap rejects even an empty one)
            values[self.vend[k]] = values[self.vstart[k]] + upd[k]
            readers = [self.reader[u] for u in members[k]]
            first = min(readers) if readers else len(self.forward)
            values[self.first[k]] = first
            values[self.idle[k]] = self.H[first]
            values[self.after[k]] = (values[self.f[first - 1]] + fwd_dur[first - 1]) if 0 < first < len(self.forward) else 0
            values[self.before[k]] = values[self.f[first]] if first < len(self.forward) else period
            for u in range(len(self.units)):
                values[self.x[u, k]] = int(bucket_of[u] == k)
            values[self.used[k]] = int(bool(members[k]))
        return values


def _reach(dag: nx.DiGraph, n: int) -> np.ndarray:
    """Boolean matrix: ``reach[v, u]`` when u is an ancestor of v (nodes 0..n-1).

    Rows are filled in topological order, a row being the OR of its
    predecessors' rows, so a sum over ancestors is one masked vector sum
    instead of a graph search per node.
    """
    reach = np.zeros((n, n), dtype=bool)
    for v in nx.topological_sort(dag):
        for u in dag.predecessors(v):
            reach[v] |= reach[u]
            reach[v, u] = True
    return reach


def _masked_sums(reach: np.ndarray, weights: list[int]) -> list[int]:
    w = np.asarray(weights, dtype=np.int64)
    return [int(w[row].sum()) for row in reach]


def _feeds_backward(graph: TrainGraph) -> set[str]:
    """Every op with a backward descendant (one reverse search from all backward ops at once)."""
    feeds: set[str] = set()
    stack = [o for o in graph.ops if graph.ops[o].phase == "backward"]
    while stack:
        for u in graph.dag.predecessors(stack.pop()):
            if u not in feeds:
                feeds.add(u)
                stack.append(u)
    return feeds


def _split_prefix(graph: TrainGraph, order: list[str], *, all_forward: bool = False) -> tuple[list[str], list[str]]:
    """Forward ops with a backward descendant (every forward op with ``all_forward``) run first,
    fixed; the rest are free."""
    feeds = _feeds_backward(graph)
    prefix = [o for o in order if graph.ops[o].phase == "forward" and (all_forward or o in feeds)]
    free = [o for o in order if o not in prefix and graph.ops[o].phase != "optimizer"]
    return prefix, free


def _dead_forward(graph: TrainGraph, mode: str) -> set[str]:
    """The forward ops no backward op waits for (BatchNorm's running-statistics updates at aten
    level: 188 ops, 0.47 ms on Inception). In ``overlap`` mode only those reading no parameter:
    wherever one runs, no bucket's update has to come before it."""
    feeds = _feeds_backward(graph)
    return {o for o, op in graph.ops.items()
            if op.phase == "forward" and o not in feeds and (mode == "barrier" or not op.reads)}


def _overlap_ops(graph: TrainGraph, order: Sequence[str], *, reorder: bool = True) -> tuple[list[str], list[str]]:
    """The overlap model's fixed forward ops and free ops (backward, and :func:`_dead_forward`'s
    when ``reorder``), in ``order``."""
    dead = _dead_forward(graph, "overlap") if reorder else set()
    forward = [o for o in order if graph.ops[o].phase == "forward" and o not in dead]
    return forward, [o for o in order if graph.ops[o].phase == "backward" or o in dead]


def _defer_dead_forward(graph: TrainGraph, order: list[str], dead: set[str]) -> list[str]:
    """``order`` with the ops of ``dead`` (see :func:`_dead_forward`) moved after the last backward op.

    That never hurts: the compute ends (and the next step starts) at the same time and every
    gradient is ready earlier. It is valid: such an op has no backward descendant, so no op it
    precedes is left before it.
    """
    head = [o for o in order if o not in dead and graph.ops[o].phase != "optimizer"]
    optimizer = [o for o in order if graph.ops[o].phase == "optimizer"]
    return head + [o for o in order if o in dead] + optimizer


def _warm_starts(problem: Problem, seed: int, time_limit_s: float,
                 num_workers: int = 1) -> list[tuple[float, Plan]]:
    """The heuristics' plans, the exact contiguous bucketing of the engine and Caramel orders (each
    also with :func:`_dead_forward`'s ops deferred) and, in ``overlap`` mode, the local search of
    :mod:`.overlap_search` from the best plans of distinct orders; each with its simulated iteration
    time (every plan is simulated once: at scale that is most of the cost)."""
    graph = problem.graph
    heuristics = (SOLVERS[name](problem, seed=seed, time_limit_s=HEURISTIC_SHARE * time_limit_s)
                  for name in SOLVERS if name != "cpsat")
    scored = [(plan.predicted.iteration_s, plan) for plan in heuristics]

    def add(order, buckets, name: str) -> None:
        plan = Plan.for_problem(problem, order=order, buckets=buckets, solver=SolverInfo(name=name))
        scored.append((simulate(problem, plan).iteration_s, plan))

    for k, (t, plan) in enumerate(scored):  # Caramel's chunks as buckets: never slower, and the model has none
        if any(b.chunks > 1 for b in plan.buckets):
            split = replace(plan, buckets=tuple(split_chunks(graph, plan.buckets)), predicted=None,
                            solver=replace(plan.solver, name=f"{plan.solver.name}-split"))
            t_split = simulate(problem, split).iteration_s
            if t_split <= t:
                scored[k] = (t_split, split)
    dead = _dead_forward(graph, problem.mode) if problem.reorders else set()
    orders = list(dict.fromkeys((tuple(engine_order(graph)), tuple(caramel_order(problem)))))
    orders += [deferred for order in orders if (deferred := _defer_dead_forward(graph, order, dead)) != order]
    for order in orders:
        add(order, optimal_contiguous_buckets(graph, order, problem.cluster)[0], "contiguous-dp")
    _, best = min(scored, key=lambda tp: tp[0])
    buckets = [b.params for b in best.buckets]
    if problem.reorders and (rerun := bucket_first_order(graph, best.order, buckets)) != list(best.order):
        add(rerun, buckets, f"{best.solver.name}-bucket-first")
    if problem.mode != "overlap" or problem.cluster.world_size == 1 or not graph.params:
        return scored
    # the best plan per order, an order and its deferred variant counting as one (distinct starts
    # matter: the search's result depends on the order much more than on the deferral)
    by_order: dict[tuple[str, ...], tuple[float, Plan]] = {}
    for t, plan in scored:
        key = tuple(o for o in plan.order if o not in dead)
        if key not in by_order or t < by_order[key][0]:
            by_order[key] = (t, plan)
    starts = sorted(by_order.values(), key=lambda tp: tp[0])[:SEARCH_ORDERS]
    # one process per start when the workers allow: the search is pure Python and CP-SAT has not
    # started yet, so the other core would idle (each start then gets the whole share of the time).
    # Each start has its own seed: the search's basin depends on it (Inception, 64 x 100 GbE, seeds
    # 0-3: 3.96%, 5.71%, 3.56%, 5.15% gap with one seed for both starts; 5.15% -> 4.36% for seed 3)
    processes = min(num_workers, len(starts))
    jobs = [(problem, list(plan.order), [list(b.params) for b in plan.buckets], seed + 1000 * k,
             SEARCH_SHARE * time_limit_s * processes / len(starts)) for k, (_, plan) in enumerate(starts)]
    for found in _run_searches(jobs, processes):
        for order, buckets, t in found:
            scored.append((t, Plan.for_problem(problem, order=order, buckets=buckets,
                                               solver=SolverInfo(name="overlap-search"))))
    return scored


def _run_searches(jobs: list[tuple], processes: int) -> list[list[tuple[list[str], list[list[str]], float]]]:
    """:func:`_search_buckets` for every job, in ``processes`` forked processes when more than one.

    Fork, not spawn: the children need nothing from ``__main__`` (spawn would rerun a script that has
    no main guard). Children still running :data:`SEARCH_GRACE_S` past their time are killed, never
    waited for, and the searches count as having found nothing; without processes the jobs run
    here, one after the other, each in its share of the time.
    """
    if processes <= 1:
        return [_search_buckets(*job) for job in jobs]
    try:
        pool = multiprocessing.get_context("fork").Pool(processes)
    except OSError:
        return [_search_buckets(*job[:-1], job[-1] / processes) for job in jobs]
    try:
        return pool.starmap_async(_search_buckets, jobs).get(timeout=max(job[-1] for job in jobs) + SEARCH_GRACE_S)
    except multiprocessing.TimeoutError:
        return []
    finally:
        pool.terminate()
        pool.join()


def _search_buckets(problem: Problem, order: list[str], buckets: list[list[str]], seed: int,
                    time_s: float) -> list[tuple[list[str], list[list[str]], float]]:
    """Rounds of :func:`.overlap_search.improve_buckets` from one start, each followed by the
    bucket-first order of what it found (kept when faster); every plan met, with its period."""
    found = []
    for k, share in enumerate(SEARCH_ROUND_SHARES):
        state = SteadyState(problem, order)
        evaluations = min(SEARCH_EVALUATIONS, SEARCH_EVALUATIONS_PER_UNIT * len(state.units))
        result, _ = improve_buckets(state, state.ready_order_buckets(buckets),
                                    max_evaluations=max(1, int(share * evaluations)), seed=seed + k,
                                    time_limit_s=share * time_s)
        buckets = state.names(result)
        candidates = [order]
        if problem.reorders and (rerun := bucket_first_order(problem.graph, order, buckets)) != order:
            candidates.append(rerun)
        for candidate in candidates:
            plan = Plan.for_problem(problem, order=candidate, buckets=buckets, solver=SolverInfo(name="search"))
            found.append((candidate, buckets, simulate(problem, plan).iteration_s))
        order = min(found[-len(candidates):], key=lambda f: f[2])[0]
    return found


@register("cpsat")
def solve_cpsat(
    problem: Problem,
    *,
    time_limit_s: float | None = 60.0,
    num_workers: int = 2,
    seed: int = 0,
    max_buckets: int | None = None,
    on_progress: Callable[[CpsatProgress], None] | None = None,
) -> Plan:
    """Return the CP-SAT plan (see the module docstring); never worse than its warm start.

    Raises:
        SolverError: a bad option, or a warm start the model rejects (a bug).
    """
    from ortools.sat.python import cp_model

    started = time.perf_counter()
    time_limit_s = 60.0 if time_limit_s is None else time_limit_s
    require_positive(time_limit_s=time_limit_s, num_workers=num_workers)
    graph = problem.graph
    candidates = _warm_starts(problem, seed, time_limit_s, num_workers)
    warm_start_s = time.perf_counter() - started
    hint_s, _, hint_plan = min((t, k, p) for k, (t, p) in enumerate(candidates))
    options = {"time_limit_s": time_limit_s, "num_workers": num_workers, "seed": seed,
               "warm_start": hint_plan.solver.name, "warm_start_s": warm_start_s}

    sizes: dict[str, Any] = {}

    def fallback(status: str, reason: str, bound_s: float | None = None) -> Plan:
        info = SolverInfo(name="cpsat", status=status, solve_time_s=time.perf_counter() - started,
                          objective_s=hint_s, bound_s=bound_s,
                          options={**options, **sizes, "result": "hint", "why": reason})
        return replace(hint_plan, solver=info, predicted=None)

    if not graph.params or problem.cluster.world_size == 1:
        return fallback("OPTIMAL", "nothing to communicate", bound_s=hint_s)

    tick_s = hint_s / HORIZON_TICKS
    hint_buckets = [list(b.params) for b in hint_plan.buckets]
    if max_buckets is not None and max_buckets < 1:
        raise SolverError(f"option max_buckets must be >= 1, got {max_buckets}")
    num_units = len({(p.grad_op, p.dtype) for p in graph.params.values()})
    B = max_buckets or min(num_units, max(len(hint_buckets) + 2, 8))
    if problem.mode == "barrier":
        prefix, free = _split_prefix(graph, list(hint_plan.order), all_forward=not problem.reorders)
        model: _Model | _OverlapModel = _Model(problem, prefix, free, tick_s, B,
                                               profile_wall_s=min(PROFILE_WALL_S, PROFILE_SHARE * time_limit_s))
    else:
        forward, backward = _overlap_ops(graph, hint_plan.order, reorder=problem.reorders)
        read = {name for o in forward for name in graph.ops[o].reads}
        if set(graph.params) - read:
            return fallback("FEASIBLE", "a parameter no forward op reads: the overlap model needs a first use")
        model = _OverlapModel(problem, forward, backward, tick_s, B)
        if len(model.units) * B > OVERLAP_MAX_PAIRS:
            sizes.update(num_coarse_ops=len(model.coarse.chains), num_units=len(model.units), num_buckets=B)
            return fallback("FEASIBLE", f"the overlap model ({len(model.units)} units x {B} buckets) is too "
                            f"large for CP-SAT; the warm start with the model's constant bound",
                            bound_s=min(model.static_bound * tick_s, hint_s))
        model.build()
    if not problem.reorders:  # eager: the engine's order, buckets only
        model.fix_order(list(hint_plan.order))
    sizes.update(_model_size(model, B))
    hint = model.hint(hint_plan.order, hint_buckets)
    for var, value in hint.items():
        model.model.AddHint(var, value)
    if not _hint_is_feasible(model.model):
        if problem.mode == "barrier":
            raise SolverError("the warm start does not satisfy the CP-SAT model (a bug in the hint)")
        # the steady state of the warm start is not 1-periodic: keep only its buckets as hints
        model.model.ClearHints()
        for var, value in hint.items():
            if var in model.x.values() or var in model.used:
                model.model.AddHint(var, value)

    options["model_s"] = time.perf_counter() - started - warm_start_s  # building it and checking the hint
    opt_s = graph.totals.optimizer_s if problem.mode == "barrier" else 0.0  # overlap: updates are in T
    first_solution_s: list[float] = []
    proven = [0]  # the best bound of an earlier phase, in ticks

    class Progress(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            if not first_solution_s:
                first_solution_s.append(time.perf_counter() - started)
            if on_progress is not None:
                bound = max(self.BestObjectiveBound(), proven[0])
                on_progress(CpsatProgress(wall_s=time.perf_counter() - started,
                                          objective_s=self.ObjectiveValue() * tick_s + opt_s,
                                          bound_s=bound * tick_s + opt_s))

    def run(seconds: float, **parameters: Any):
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = seconds
        solver.parameters.num_workers = num_workers
        solver.parameters.random_seed = seed
        solver.parameters.cp_model_presolve = sizes["num_variables"] <= PRESOLVE_MAX_VARIABLES
        for key, value in parameters.items():
            setattr(solver.parameters, key, value)
        with interruptible(solver):
            status = solver.Solve(model.model, Progress())
        return solver, status

    # Phase 1 searches; phase 2 (the rest of the time) raises the bound from below, with the
    # incumbent as hint and as a cap on T. Both bounds are valid: the plan records the higher.
    # (On inception, 64 x 100 GbE, barrier: a 2.9% gap instead of 5.3% in 60 s.) Models too big
    # to presolve get all the time for the search.
    left = max(time_limit_s - (time.perf_counter() - started), 0.5)
    solver, status = run(left * (1 - BOUND_PHASE_SHARE))
    status_name = solver.StatusName(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        # the model's constant bound still holds (compute, all bytes, the overlap window bound)
        return fallback("FEASIBLE", f"CP-SAT found no solution ({status_name})",
                        bound_s=min(model.static_bound * tick_s + opt_s, hint_s))
    best_bound = solver.BestObjectiveBound()
    phase_bounds = {"search_bound_s": best_bound * tick_s + opt_s}
    left = time_limit_s - (time.perf_counter() - started)
    if status == cp_model.FEASIBLE and left > 0.5 and sizes["num_variables"] <= PRESOLVE_MAX_VARIABLES:
        m = model.model
        m.ClearHints()
        for i in range(len(m.Proto().variables)):
            var = m.GetIntVarFromProtoIndex(i)
            m.AddHint(var, solver.Value(var))
        m.Add(model.T <= int(solver.ObjectiveValue()))
        proven[0] = int(best_bound)
        second, status2 = run(left, use_objective_lb_search=True)
        if status2 in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            phase_bounds["lb_search_bound_s"] = second.BestObjectiveBound() * tick_s + opt_s
            best_bound = max(best_bound, second.BestObjectiveBound())
            if second.ObjectiveValue() < solver.ObjectiveValue():
                solver = second
            if status2 == cp_model.OPTIMAL:
                status, status_name = status2, "OPTIMAL"
    best_bound = min(best_bound, solver.ObjectiveValue())
    bound_s = best_bound * tick_s + opt_s
    order, buckets = model.expand(solver)
    plan = Plan.for_problem(problem, order=order, buckets=buckets, solver=SolverInfo(name="cpsat"))
    plan_s = simulate(problem, plan).iteration_s
    if plan_s >= hint_s:
        sizes.update(phase_bounds, tick_s=tick_s)
        return fallback("OPTIMAL" if status == cp_model.OPTIMAL else "FEASIBLE",
                        "CP-SAT did not improve on its warm start", bound_s=min(bound_s, hint_s))
    info = SolverInfo(name="cpsat", status=status_name, solve_time_s=time.perf_counter() - started,
                      objective_s=solver.ObjectiveValue() * tick_s + opt_s, bound_s=min(bound_s, plan_s),
                      options={**options, "result": "cp-sat", "tick_s": tick_s, "hint_s": hint_s, **phase_bounds,
                               **_model_size(model, B), "first_solution_s": first_solution_s[0]})
    return replace(plan, solver=info)


def _model_size(model: _Model | _OverlapModel, num_buckets: int) -> dict[str, int]:
    proto = model.model.Proto()
    return {"num_coarse_ops": len(model.coarse.chains), "num_units": len(model.units), "num_buckets": num_buckets,
            "num_variables": len(proto.variables), "num_constraints": len(proto.constraints)}


def _hint_is_feasible(model) -> bool:
    """Solve once with every hinted variable fixed to its hint; True when the model accepts it."""
    from ortools.sat.python import cp_model

    check = cp_model.CpSolver()
    check.parameters.fix_variables_to_their_hinted_value = True
    check.parameters.max_time_in_seconds = 10.0
    check.parameters.num_workers = 1
    with interruptible(check):
        status = check.Solve(model)
    return status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
