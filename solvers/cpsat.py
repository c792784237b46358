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
start); ``T >= end[grad op of u] + A + c_u`` for every unit.

Objective: minimize T; the iteration is ``T + T_opt`` (the optimizer after the
barrier).

Warm start: the best plan among the heuristics and the exact contiguous
bucketing (:mod:`.bucketing`) on the engine order and on Caramel's
gradient-first order; its values are checked against the model (a solve
with every variable fixed to the hint) and given to CP-SAT with
``AddHint``. If CP-SAT finds nothing better within the time limit, the hint's
plan is returned with status ``FEASIBLE`` and ``options.result = "hint"``.

``overlap`` mode: the model above does not describe the steady-state period
of overlapped steps; the solver returns the best warm-start plan for that
mode, evaluated by the simulator, with status ``FEASIBLE`` (see the closing
notes of the CP-SAT issue).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import networkx as nx

from schedopt.errors import SolverError
from schedopt.graph import TrainGraph
from schedopt.orders import engine_order
from schedopt.plan import Plan, SolverInfo
from schedopt.problem import Problem
from schedopt.simulate import simulate

from .bucketing import optimal_contiguous_buckets
from .caramel import caramel_order
from .common import require_positive
from .registry import SOLVERS, register

__all__ = ["solve_cpsat", "coarsen", "CpsatProgress"]

#: The horizon of the best warm start, in ticks.
HORIZON_TICKS = 1_000_000


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


def coarsen(graph: TrainGraph, ops: list[str]) -> Coarse:
    """Contract chains ``u -> v`` (u's only successor, v's only predecessor, same phase, u finishes no gradient)."""
    inside = set(ops)
    sub = graph.dag.subgraph(ops)
    merge_into_pred: dict[str, str] = {}
    for v in ops:
        preds = list(sub.predecessors(v))
        if len(preds) != 1:
            continue
        u = preds[0]
        if (sub.out_degree(u) == 1 and not graph.ops[u].grads
                and graph.ops[u].phase == graph.ops[v].phase
                and len([p for p in graph.dag.predecessors(v) if p in inside]) == 1):
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


class _Model:
    """The CP-SAT model of one barrier-mode problem (see the module docstring)."""

    def __init__(self, problem: Problem, prefix: list[str], free: list[str], tick_s: float, num_buckets: int):
        from ortools.sat.python import cp_model

        graph, cluster = problem.graph, problem.cluster
        self.graph, self.tick_s, self.prefix = graph, tick_s, prefix
        self.coarse = coarsen(graph, free)
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
        anc = [sum(self.dur[a] for a in nx.ancestors(dag, i)) for i in range(n)]
        desc = [sum(self.dur[d] for d in nx.descendants(dag, i)) for i in range(n)]
        self.start = [m.NewIntVar(self.fixed + anc[i], total - desc[i] - self.dur[i], f"start[{i}]") for i in range(n)]
        self.end = [m.NewIntVar(self.fixed + anc[i] + self.dur[i], total - desc[i], f"end[{i}]") for i in range(n)]
        intervals = [m.NewIntervalVar(self.start[i], self.dur[i], self.end[i], f"op[{i}]") for i in range(n)]
        m.AddNoOverlap(intervals)
        for i, j in self.coarse.edges:
            m.Add(self.start[j] >= self.end[i])

        horizon = 4 * total + self.A * len(self.units) + sum(self.c) + 1
        U, B = len(self.units), self.B
        self.x = {(u, b): m.NewBoolVar(f"x[{u},{b}]") for u in range(U) for b in range(B)}
        self.used = [m.NewBoolVar(f"used[{b}]") for b in range(B)]
        self.bstart = [m.NewIntVar(0, horizon, f"bstart[{b}]") for b in range(B)]
        self.bdur = [m.NewIntVar(0, horizon, f"bdur[{b}]") for b in range(B)]
        self.T = m.NewIntVar(total, horizon, "T")
        for u in range(U):
            m.AddExactlyOne(self.x[u, b] for b in range(B))
        for b in range(B):
            members = [self.x[u, b] for u in range(U)]
            for x in members:
                m.AddImplication(x, self.used[b])
            m.AddBoolOr(members).OnlyEnforceIf(self.used[b])
            if b + 1 < B:
                m.AddImplication(self.used[b + 1], self.used[b])
                m.Add(self.bstart[b + 1] >= self.bstart[b] + self.bdur[b])
            m.Add(self.bdur[b] == self.A * self.used[b] + sum(self.c[u] * self.x[u, b] for u in range(U)))
            for u in range(U):
                m.Add(self.bstart[b] >= self.end[self.unit_op[u]]).OnlyEnforceIf(self.x[u, b])
            m.Add(self.T >= self.bstart[b] + self.bdur[b])
        # cuts
        m.Add(self.bstart[0] >= min(self.fixed + anc[i] + self.dur[i] for i in self.unit_op))
        m.Add(self.T >= self.bstart[0] + sum(self.bdur))
        for u in range(U):
            m.Add(self.T >= self.end[self.unit_op[u]] + self.A + self.c[u])
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

    def expand(self, solver) -> tuple[list[str], list[list[str]]]:
        """Read the op order and the buckets of a solution."""
        chain_order = sorted(range(len(self.coarse.chains)), key=lambda i: solver.Value(self.start[i]))
        free = [o for i in chain_order for o in self.coarse.chains[i]]
        optimizer = [o for o in self.graph.ops if self.graph.ops[o].phase == "optimizer"]
        order = self.prefix + free + optimizer
        position = {o: k for k, o in enumerate(order)}
        buckets = []
        for b in range(self.B):
            members = [n for u, unit in enumerate(self.units) if solver.Value(self.x[u, b]) for n in unit]
            if members:
                buckets.append(sorted(members, key=lambda n: position[self.graph.params[n].grad_op]))
        return order, buckets


def _split_prefix(graph: TrainGraph, order: list[str]) -> tuple[list[str], list[str]]:
    """Forward ops with a backward descendant run first (fixed); the rest are free."""
    backward = [o for o in graph.ops if graph.ops[o].phase == "backward"]
    feeds_backward: set[str] = set()
    for o in backward:
        feeds_backward |= nx.ancestors(graph.dag, o)
    prefix = [o for o in order if graph.ops[o].phase == "forward" and o in feeds_backward]
    free = [o for o in order if o not in prefix and graph.ops[o].phase != "optimizer"]
    return prefix, free


def _warm_starts(problem: Problem, seed: int) -> list[Plan]:
    graph = problem.graph
    plans = [SOLVERS[name](problem, seed=seed) for name in SOLVERS if name != "cpsat"]
    for order in (engine_order(graph), caramel_order(problem)):
        buckets, _ = optimal_contiguous_buckets(graph, order, problem.cluster)
        plans.append(Plan.for_problem(problem, order=order, buckets=buckets,
                                      solver=SolverInfo(name="contiguous-dp")))
    return plans


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
    candidates = _warm_starts(problem, seed)
    scored = sorted(((simulate(problem, p).iteration_s, k, p) for k, p in enumerate(candidates)))
    hint_s, _, hint_plan = scored[0]
    options = {"time_limit_s": time_limit_s, "num_workers": num_workers, "seed": seed,
               "warm_start": hint_plan.solver.name}

    def fallback(status: str, reason: str, bound_s: float | None = None) -> Plan:
        info = SolverInfo(name="cpsat", status=status, solve_time_s=time.perf_counter() - started,
                          objective_s=hint_s, bound_s=bound_s, options={**options, "result": "hint", "why": reason})
        return replace(hint_plan, solver=info, predicted=None)

    if problem.mode != "barrier":
        return fallback("FEASIBLE", "the CP-SAT model covers barrier mode; overlap returns the best warm start")
    if not graph.params or problem.cluster.world_size == 1:
        return fallback("OPTIMAL", "nothing to communicate", bound_s=hint_s)

    tick_s = hint_s / HORIZON_TICKS
    prefix, free = _split_prefix(graph, hint_plan.order)
    hint_buckets = [list(b.params) for b in hint_plan.buckets]
    num_units = len({(p.grad_op, p.dtype) for p in graph.params.values()})
    B = max_buckets or min(num_units, max(len(hint_buckets) + 2, 8))
    if B < 1:
        raise SolverError(f"option max_buckets must be >= 1, got {max_buckets}")
    model = _Model(problem, prefix, free, tick_s, B)
    hint = model.hint(hint_plan.order, hint_buckets)
    for var, value in hint.items():
        model.model.AddHint(var, value)
    _check_hint(model.model)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(time_limit_s - (time.perf_counter() - started), 0.5)
    solver.parameters.num_workers = num_workers
    solver.parameters.random_seed = seed
    opt_s = graph.totals.optimizer_s

    class Progress(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            if on_progress is not None:
                on_progress(CpsatProgress(wall_s=time.perf_counter() - started,
                                          objective_s=self.ObjectiveValue() * tick_s + opt_s,
                                          bound_s=self.BestObjectiveBound() * tick_s + opt_s))

    status = solver.Solve(model.model, Progress())
    status_name = solver.StatusName(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return fallback("FEASIBLE", f"CP-SAT found no solution ({status_name})")
    bound_s = solver.BestObjectiveBound() * tick_s + opt_s
    order, buckets = model.expand(solver)
    plan = Plan.for_problem(problem, order=order, buckets=buckets, solver=SolverInfo(name="cpsat"))
    plan_s = simulate(problem, plan).iteration_s
    if plan_s >= hint_s:
        return fallback("OPTIMAL" if status == cp_model.OPTIMAL else "FEASIBLE",
                        "CP-SAT did not improve on its warm start", bound_s=min(bound_s, hint_s))
    info = SolverInfo(name="cpsat", status=status_name, solve_time_s=time.perf_counter() - started,
                      objective_s=solver.ObjectiveValue() * tick_s + opt_s, bound_s=min(bound_s, plan_s),
                      options={**options, "result": "cp-sat", "tick_s": tick_s,
                               "num_coarse_ops": len(model.coarse.chains), "num_units": len(model.units),
                               "num_buckets": B, "hint_s": hint_s})
    return replace(plan, solver=info)


def _check_hint(model) -> None:
    """Solve once with every variable fixed to its hint: a rejected hint is a bug in :meth:`_Model.hint`."""
    from ortools.sat.python import cp_model

    check = cp_model.CpSolver()
    check.parameters.fix_variables_to_their_hinted_value = True
    check.parameters.max_time_in_seconds = 30.0
    check.parameters.num_workers = 1
    status = check.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise SolverError(f"the warm start does not satisfy the CP-SAT model ({check.StatusName(status)})")

