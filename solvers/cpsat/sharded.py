"""CP-SAT for ``sharded`` mode: units, reshard flags and prefetch points chosen jointly under the budget.

Data: the atoms (:func:`..fsdp.atoms`, the modules units are made of, in forward order; the pinned
ones and any parameter outside them form the root unit, gathered first and kept). A unit is a run of
at most ``max_atoms`` consecutive free atoms.

Model, in integer ticks, on the stream's *points* (before and after ops where a hook acts):

- per candidate unit u: ``x[u]`` chosen; per issue point q of its forward all-gather (a unit start
  at most ``window`` atoms back, or the step start) ``fk[u,q]`` kept / ``fr[u,q]`` resharded after
  forward; per issue point of its backward all-gather (a unit end at most ``window`` atoms on)
  ``b[u,q]``; per point by which its reduce-scatter must have ended ``g[u,k]`` (or none: its
  gradient is held to the end of the backward). Every atom is in exactly one chosen unit.
- time: ``T[p]`` the stream reaching point p, ``W[p] >= T[p]`` after its waits,
  ``T[p+1] = W[p] + compute between``; the FIFO channel as a cursor: the collectives issued at p
  start at ``S[p] >= max(channel free, T[p])`` one after another in the simulator's order;
  an op waits (``W >= end``) for the all-gather of its unit.
- memory at every point: the shards, the root, every chosen option's unsharded parameters between
  its static allocation and free points, every gradient from its first op to its ``g`` point;
  at most the budget. Objective: the step's end (the last of the backward and the channel) plus the
  optimizer.

The warm start is the best plan within the budget among the baselines, the greedy starts
(:func:`_greedy_starts`) and the two plans of the finest units (:mod:`..fine_units`: the pipelined
units and the least-memory plan); the model is hinted with the best of those whose units are its candidates
(``stats["hinted"]`` names it). The plan read back is re-simulated: the simulator is the judge of
time and memory, and the warm start is returned when CP-SAT's plan is not better (``stats["result"]``); a
plan over budget tightens the next model's cap by its excess (at most :data:`ROUNDS` solves). The
bound reported is :func:`schedopt.shard_sim.sharded_lower_bound` (valid for every sharded plan within the budget);
the model's own bound holds only inside its windows and is recorded as ``stats["model_bound_s"]``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

from schedopt.errors import OverBudgetError, SolverError
from schedopt.orders import engine_order
from schedopt.plan import Plan, SolverInfo
from schedopt.problem import Problem
from schedopt.shard_sim import memory_floor, peak_memory, sharded_lower_bound
from schedopt.sharding import ROOT, Geometry, Unit, UnitSpan, assign_params
from schedopt.simulate import simulate
from schedopt.units import format_size

from ..fine_units import least_memory_plan, pipelined_plan
from ..fsdp import atoms, block_groups, build_units
from ..registry import SOLVERS, solvers_for
from .recheck import on_ranks

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

__all__ = ["solve_sharded", "ShardedOptions"]

#: CP-SAT solves at most: each plan is re-simulated, and one over budget tightens the next model's cap by the excess
ROUNDS = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardedOptions:
    time_limit_s: float = 60.0
    num_workers: int = 2
    seed: int = 0
    #: the most atoms (blocks) one unit may hold
    max_atoms: int = 6
    #: how many atoms back (forward) or on (backward) an all-gather may be issued
    window: int = 3
    #: the points after its post-backward by which a reduce-scatter may be required to end
    grad_window: int = 3
    #: ticks of the model's horizon (the warm start's step)
    horizon_ticks: int = 4000
    #: also start from units finer than a block (a block's own layers: the pipelined and least-memory
    #: plans). False keeps every unit whole modules of the block level, for a model that changes a
    #: layer's output in place (FSDP2 warns that a unit returning a view loses its pre-backward hook then)
    fine_units: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.fine_units, bool):
            raise SolverError(f"cpsat's sharded fine_units must be true or false, got {self.fine_units!r}")
        least = {"num_workers": 1, "max_atoms": 1, "window": 0, "grad_window": 0, "horizon_ticks": 100}
        for name, low in least.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise SolverError(f"cpsat's sharded {name} must be a whole number of at least {low}, got {value!r}")


@dataclass(frozen=True, slots=True)
class _Candidate:
    first: int  # atom range [first, last]
    last: int
    modules: tuple[str, ...]
    params: tuple[str, ...]
    nbytes: int
    span: UnitSpan


class _Data:
    """Atoms, candidate units and the stream's points, for one problem."""

    def __init__(self, problem: Problem, max_atoms: int) -> None:
        graph = problem.graph
        self.order = engine_order(graph)
        names, pinned = atoms(graph)
        self.free = [m for m in names if m not in pinned]
        self.pinned = pinned
        tree = graph.modules
        groups = [[m] for m in self.free]
        root_params = assign_params(tree, [*groups, [ROOT]])[-1]
        self.root = Unit(modules=(ROOT,), params=tuple(root_params), reshard_after_forward=False)
        probe = [Unit(modules=tuple(self.free[a:b + 1]), params=())
                 for a in range(len(self.free)) for b in range(a, min(a + max_atoms, len(self.free)))]
        probe = [replace(u, params=tuple(assign_params(tree, [u.modules])[0])) for u in probe]
        units = probe + ([self.root] if root_params else [])
        geometry = Geometry(graph, self.order, units)
        index = {m: k for k, m in enumerate(self.free)}
        self.candidates = [
            _Candidate(first=index[u.modules[0]], last=index[u.modules[-1]], modules=u.modules, params=u.params,
                       nbytes=n, span=s) for u, n, s in zip(probe, geometry.nbytes, geometry.spans)]
        self.root_span = geometry.spans[-1] if root_params else None
        self.root_bytes = geometry.nbytes[-1] if root_params else 0
        self.durations = [graph.ops[o].duration_s for o in geometry.compute_ops]
        self.prefix = [0.0]
        for d in self.durations:
            self.prefix.append(self.prefix[-1] + d)
        self.n_ops = len(self.durations)
        self.total_bytes = sum(c.nbytes for c in self.candidates if c.first == c.last) + self.root_bytes
        self.first_atom_ff = {c.first: c.span.forward_first for c in self.candidates if c.first == c.last}
        self.last_atom_bf = {c.last: c.span.backward_first for c in self.candidates if c.first == c.last}


def _before(j: int) -> tuple[int, int]:
    return (j, 1)


def _after(j: int) -> tuple[int, int]:
    return (j + 1, 0)


class _Model:
    """The CP-SAT model of :mod:`this module <.sharded>` over :class:`_Data`."""

    def __init__(self, problem: Problem, data: _Data, options: ShardedOptions, tick_s: float,
                 budget: float | None) -> None:
        from ortools.sat.python import cp_model  # imported where used: the solvers' heuristics run without it

        self.problem, self.data, self.options, self.tick, self.budget = problem, data, options, tick_s, budget
        self.m = cp_model.CpModel()
        self.cost = lambda nbytes, kind="all-gather": max(1, round(problem.cluster.shard_collective_s(nbytes, kind)
                                                                   / tick_s))
        self.issue: dict[tuple[int, int], list[tuple[Any, Any, int, int]]] = {}  # point -> (order key, lit, dur, id)
        self.waits: dict[tuple[int, int], list[tuple[int, Any]]] = {}  # point -> (collective id, lit)
        self.mem: list[tuple[tuple[int, int], tuple[int, int], int, Any]] = []  # (from, to, bytes, lit)
        self.rs_free: list[tuple[int, Any, tuple[int, int]]] = []  # (collective id, lit, point): end <= T[point]
        self.n_coll = 0
        self._choices()
        self._root()
        self._points()
        self._time()
        self._memory()

    def _coll(self, point, key, lit, nbytes, kind: str = "all-gather") -> int:
        cid = self.n_coll
        self.n_coll += 1
        self.issue.setdefault(point, []).append((key, lit, self.cost(nbytes, kind), cid))
        return cid

    def _choices(self) -> None:
        d, m, o = self.data, self.m, self.options
        A = len(d.free)
        self.in_root: dict[int, Any] = {}
        self.x = {k: m.NewBoolVar(f"x[{c.first},{c.last}]") for k, c in enumerate(d.candidates)}
        for a in range(A):
            self.in_root[a] = m.NewBoolVar(f"root[{a}]")  # the atom left to the root unit
            m.AddExactlyOne([self.x[k] for k, c in enumerate(d.candidates) if c.first <= a <= c.last]
                            + [self.in_root[a]])
        starts = {a: [self.x[k] for k, c in enumerate(d.candidates) if c.first == a] for a in range(A)}
        ends = {a: [self.x[k] for k, c in enumerate(d.candidates) if c.last == a] for a in range(A)}
        self.fk, self.fr, self.b, self.g = {}, {}, {}, {}
        end_bwd = _after(d.n_ops - 1)
        for k, c in enumerate(d.candidates):
            sp = c.span
            qs = [q for q in range(max(0, c.first - o.window), c.first + 1)] + ([-1] if c.first <= o.window else [])
            for q in qs:
                fk, fr = m.NewBoolVar(f"fk[{k},{q}]"), m.NewBoolVar(f"fr[{k},{q}]")
                if q >= 0 and q != c.first:
                    m.AddBoolOr(starts[q]).OnlyEnforceIf(fk)
                    m.AddBoolOr(starts[q]).OnlyEnforceIf(fr)
                self.fk[k, q], self.fr[k, q] = fk, fr
                point = _before(0 if q < 0 else d.first_atom_ff[q])
                for lit, free in ((fk, _after(sp.backward_last)), (fr, _after(sp.forward_last))):
                    cid = self._coll(point, (0, c.first), lit, c.nbytes)
                    self.waits.setdefault(_before(sp.forward_first), []).append((cid, lit))
                    self.mem.append((point, free, c.nbytes, lit))
            m.Add(sum(self.fk[k, q] + self.fr[k, q] for q in qs) == self.x[k])
            resharded = sum(self.fr[k, q] for q in qs)
            bqs = [q for q in range(c.last, min(A, c.last + o.window + 1))]
            for q in bqs:
                lit = m.NewBoolVar(f"b[{k},{q}]")
                if q != c.last:
                    m.AddBoolOr(ends[q]).OnlyEnforceIf(lit)
                self.b[k, q] = lit
                point = _before(min(d.last_atom_bf[q], sp.backward_first))
                cid = self._coll(point, (1, -c.first), lit, c.nbytes)
                self.waits.setdefault(_before(sp.backward_first), []).append((cid, lit))
                self.mem.append((point, _after(sp.backward_last), c.nbytes, lit))
            m.Add(sum(self.b[k, q] for q in bqs) == resharded)
            rs = self._coll(_after(sp.backward_last), (2, -c.first), self.x[k], c.nbytes, "reduce-scatter")
            self.g[k] = []
            for step in range(o.grad_window + 1):
                lit = m.NewBoolVar(f"g[{k},{step}]")
                self.g[k].append((lit, rs, step))
            m.Add(sum(lit for lit, _, _ in self.g[k]) == self.x[k])
        self.end_bwd = end_bwd

    def _root(self) -> None:
        """The root unit: its own parameters and the atoms left to it, gathered first, kept, reduce-scattered
        at the end of the backward; each atom in it is one more part of its collectives (bandwidth only)."""
        d = self.data
        cluster = self.problem.cluster
        beta = lambda nbytes, kind: round((cluster.shard_collective_s(nbytes, kind) - cluster.shard_collective_s(0, kind))
                                          / self.tick)
        one = self.m.NewConstant(1)
        parts = [(one, d.root_bytes, (self.cost(d.root_bytes), self.cost(d.root_bytes, "reduce-scatter")),
                  d.root_span.grad_first if d.root_span else None)]
        singles = {c.first: c for c in d.candidates if c.first == c.last}
        parts += [(self.in_root[a], singles[a].nbytes,
                   (beta(singles[a].nbytes, "all-gather"), beta(singles[a].nbytes, "reduce-scatter")),
                   singles[a].span.grad_first) for a in sorted(self.in_root)]
        rs_point = _after(d.root_span.backward_last if d.root_span else d.n_ops - 1)
        for j, (lit, nbytes, dur, grad_first) in enumerate(parts):
            if not nbytes:
                continue
            cid = self.n_coll
            self.n_coll += 1
            self.issue.setdefault(_before(0), []).append(((-1, j), lit, dur[0], cid))
            self.waits.setdefault(_before(0), []).append((cid, lit))
            self.mem.append((_before(0), self.end_bwd, nbytes, lit))
            self.mem.append((_before(grad_first), self.end_bwd, nbytes, lit))
            self.issue.setdefault(rs_point, []).append(((2, 1, j), lit, dur[1], self.n_coll))
            self.n_coll += 1

    def _points(self) -> None:
        d = self.data
        pts = {_before(0), self.end_bwd, *self.issue, *self.waits}
        pts |= {p for a, b, _, _ in self.mem for p in (a, b)}
        for c in self.data.candidates:
            pts.add(_before(c.span.grad_first))
        self.points = sorted(pts)
        self.pos = {p: i for i, p in enumerate(self.points)}
        # reduce-scatter frees: step s after the post-backward point
        for k, c in enumerate(d.candidates):
            start = self.pos[_after(c.span.backward_last)]
            for lit, rs, step in self.g[k]:
                if step < self.options.grad_window and start + step + 1 < len(self.points):
                    until = self.points[start + step + 1]
                    self.rs_free.append((rs, lit, until))
                else:
                    until = self.end_bwd
                self.mem.append((_before(c.span.grad_first), until, c.nbytes, lit))

    def _time(self) -> None:
        m, d = self.m, self.data
        horizon = self.options.horizon_ticks * 4
        ticks = lambda s: round(s / self.tick)
        P = len(self.points)
        self.T = [m.NewIntVar(0, horizon, f"T[{p}]") for p in self.points]
        self.W = [m.NewIntVar(0, horizon, f"W[{p}]") for p in self.points]
        m.Add(self.T[0] == 0)
        for i in range(P - 1):
            seg = ticks(d.prefix[self.points[i + 1][0]]) - ticks(d.prefix[self.points[i][0]])
            m.Add(self.W[i] >= self.T[i])
            m.Add(self.T[i + 1] == self.W[i] + seg)
        m.Add(self.W[P - 1] >= self.T[P - 1])
        ends: dict[int, Any] = {}
        channel = m.NewConstant(0)
        for i, p in enumerate(self.points):
            batch = sorted(self.issue.get(p, ()), key=lambda e: e[0])
            if not batch:
                continue
            start = m.NewIntVar(0, horizon, f"S[{p}]")
            m.Add(start >= channel)
            m.Add(start >= self.T[i])
            acc = []
            for _, lit, dur, cid in batch:
                acc.append(dur * lit)
                ends[cid] = start + sum(acc)
            channel = m.NewIntVar(0, horizon, f"C[{p}]")
            m.Add(channel == start + sum(acc))
        for p, needs in self.waits.items():
            for cid, lit in needs:
                m.Add(self.W[self.pos[p]] >= ends[cid]).OnlyEnforceIf(lit)
        for cid, lit, p in self.rs_free:
            m.Add(ends[cid] <= self.T[self.pos[p]]).OnlyEnforceIf(lit)
        self.makespan = m.NewIntVar(0, horizon, "makespan")
        m.Add(self.makespan >= self.W[P - 1])
        m.Add(self.makespan >= channel)
        m.Minimize(self.makespan)

    def _memory(self) -> None:
        budget = self.budget
        if budget is None:
            return
        scale = 2**16  # bytes per memory unit (CP-SAT's coefficients stay small)
        n = self.problem.cluster.shard_group
        base = self.data.total_bytes / n
        cap = int((budget - base) // scale)
        for i, p in enumerate(self.points):
            terms = [(-(-nbytes // scale)) * lit for a, b, nbytes, lit in self.mem if a <= p < b]
            if terms:
                self.m.Add(sum(terms) <= cap)

    # -------------------------------------------------------------- hint/read

    def hint(self, units: list[Unit]) -> bool:
        """Hint a plan's units where they are candidates; False where they are not."""
        d = self.data
        where = {(c.first, c.last): k for k, c in enumerate(d.candidates)}
        index = {m_: a for a, m_ in enumerate(d.free)}
        blocks = [u for u in units if not u.is_root]
        try:
            chosen = [(where[(index[u.modules[0]], index[u.modules[-1]])], u) for u in blocks]
        except KeyError:
            return False
        if any(len(u.modules) != d.candidates[k].last - d.candidates[k].first + 1 for k, u in chosen):
            return False
        covered = {a for u in blocks for a in (index[x] for x in u.modules)}
        for a, var in self.in_root.items():
            self.m.AddHint(var, a not in covered)
        picked = {k for k, _ in chosen}
        for k, var in self.x.items():
            self.m.AddHint(var, k in picked)
        starts = [d.candidates[k].first for k, _ in chosen]
        offset = 1 if units[0].is_root else 0
        for pos, (k, u) in enumerate(chosen):
            back = pos + offset - u.prefetch_forward - offset  # the issuing unit, among the blocks
            q = starts[back] if back >= 0 else -1
            q = q if (k, q) in self.fk else d.candidates[k].first
            for (kk, qq), var in self.fk.items():
                if kk == k:
                    self.m.AddHint(var, qq == q and not u.reshard_after_forward)
                    self.m.AddHint(self.fr[kk, qq], qq == q and u.reshard_after_forward)
        return True

    def read(self, solver: "cp_model.CpSolver") -> list[list[Any]]:
        """(modules, reshard, forward issue atom, backward issue atom) per chosen unit, forward order."""
        d, out = self.data, []
        for k, c in enumerate(d.candidates):
            if not solver.Value(self.x[k]):
                continue
            fq = next(q for (kk, q) in self.fk if kk == k and solver.Value(self.fk[kk, q]) + solver.Value(self.fr[kk, q]))
            reshard = any(solver.Value(self.fr[kk, q]) for (kk, q) in self.fr if kk == k)
            bq = next((q for (kk, q) in self.b if kk == k and solver.Value(self.b[kk, q])), c.last)
            out.append([c, reshard, fq, bq])
        return sorted(out, key=lambda e: e[0].first)


def _plan_of(problem: Problem, data: _Data, picked: list[list[Any]], name: str, stats: dict) -> Plan:
    """The plan of the model's choice: issue atoms turned into prefetch distances in units."""
    starts = [c.first for c, *_ in picked]
    ends = [c.last for c, *_ in picked]
    units = build_units(problem.graph, [c.modules for c, *_ in picked], reshard=[r for _, r, _, _ in picked])
    offset = 1 if units and units[0].is_root else 0
    out = list(units)
    for pos, (c, _, fq, bq) in enumerate(picked):
        k = pos + offset
        fwd = k if fq < 0 else pos - starts.index(fq)
        bwd = ends.index(bq) - pos
        out[k] = replace(out[k], prefetch_forward=min(fwd, k), prefetch_backward=min(bwd, len(out) - 1 - k))
    return Plan.for_problem(problem, order=data.order, units=out, solver=SolverInfo(name=name, stats=stats))


def _greedy_starts(problem: Problem) -> list[Plan]:
    """The warm starts beyond the baselines: every atom its own unit, kept unsharded, gathered 1, 2, 4 or
    all units ahead (where the budget allows it: the barrier-like case); from the two-ahead one, the
    largest kept unit resharded, one after another, until the plan fits the budget (then prefetch
    lowered); and the most atoms kept at the end per prefetch distance (:func:`_keep_last_starts`)."""
    graph, budget = problem.graph, problem.memory_budget_bytes
    names, pinned = atoms(graph)
    groups = [[m] for m in names if m not in pinned]
    if not groups:
        return []

    def plan_of(units: list[Unit], name: str) -> tuple[Plan, float]:
        plan = Plan.for_problem(problem, order=engine_order(graph), units=units, solver=SolverInfo(name=name))
        return plan, peak_memory(graph, plan)[0]

    out = []
    for ahead in (1, 2, 4, len(groups)):
        plan, peak = plan_of(build_units(graph, groups, reshard=[False] * len(groups), prefetch_forward=ahead),
                             f"keep-all-ahead-{ahead}")
        if budget is None or peak <= budget:
            out.append(plan)
    units = build_units(graph, groups, reshard=[False] * len(groups), prefetch_forward=2)
    plan, peak = plan_of(units, "greedy-reshard")
    nbytes = {u.modules: sum(graph.params[p].nbytes for p in u.params) for u in units}
    for _ in range(2 * len(units) + 2):
        if budget is None or peak <= budget:
            out.append(plan)
            break
        kept = [k for k, u in enumerate(units[:-1]) if not u.is_root and not u.reshard_after_forward]
        if kept:
            k = max(kept, key=lambda k: nbytes[units[k].modules])
            units[k] = replace(units[k], reshard_after_forward=True)
        else:
            units = [replace(u, prefetch_forward=max(0, u.prefetch_forward - 1),
                             prefetch_backward=max(0, u.prefetch_backward - 1)) for u in units]
        plan, peak = plan_of(units, "greedy-reshard")
    return out + _keep_last_starts(problem, plan_of)


def _keep_last_starts(problem: Problem, plan_of) -> list[Plan]:
    """Per forward and backward prefetch distance (0-2), FSDP2's per-block layout with its last k blocks
    kept unsharded after forward and the rest resharded, k the most that fits the budget: the plans
    that trade prefetch memory for fewer all-gathers again (one simulated plan per k, k from the top)."""
    budget, graph = problem.memory_budget_bytes, problem.graph
    groups = block_groups(graph)
    if budget is None or not groups:
        return []
    out = []
    for ahead in (0, 1, 2):
        for behind in (0, 1, 2):
            for k in range(len(groups), 0, -1):
                reshard = [i < len(groups) - k for i in range(len(groups))]
                units = build_units(graph, groups, reshard=reshard, prefetch_forward=ahead, prefetch_backward=behind)
                plan, peak = plan_of(units, f"keep-last-{k}")
                if peak <= budget:
                    out.append(plan)
                    break
    return out


def _warm_starts(problem: Problem, fine_units: bool = True) -> list[Plan]:
    """Every start within the budget, fastest first: the fastest baseline (asynchronous where that is no
    slower), the greedy starts, and with ``fine_units`` the two plans of the finest units
    (:mod:`..fine_units`: the pipelined units and the least memory, simulated there); OverBudgetError
    naming the finest units' least peak, the memory floor and each baseline's least where none fits."""
    baselines, leasts = [], {}
    for name in solvers_for("sharded"):
        if name == "cpsat":
            continue
        try:
            baselines.append(SOLVERS[name](problem))
        except OverBudgetError as exc:
            leasts[name] = exc.least_peak_bytes
        except SolverError:  # a layout this graph cannot have (no module tree): not a start
            continue
    starts = [_asynchronous(problem, min(baselines, key=lambda p: p.predicted.iteration_s))] if baselines else []
    if problem.graph.modules is not None:
        starts += [s.with_prediction(simulate(problem, s).prediction()) for s in _greedy_starts(problem)]
    least, least_peak = least_memory_plan(problem) if fine_units else (None, min(leasts.values(), default=0.0))
    starts += [p for p in (pipelined_plan(problem) if fine_units else None, least) if p is not None]
    if not starts:
        others = ", ".join(f"{name} {format_size(peak)}" for name, peak in leasts.items())
        finest = (f"its finest units (a layer each, every one resharded, no prefetch) peak at {format_size(least_peak)}"
                  if fine_units else "with units of whole blocks (fine_units false)")
        raise OverBudgetError(
            f"cpsat: no sharded plan within the memory budget of {format_size(problem.memory_budget_bytes)} per "
            f"rank: {finest}, and no plan can peak under {format_size(memory_floor(problem)[0])}"
            + (f"; the baselines' least: {others}" if others else ""), least_peak)
    return sorted(starts, key=lambda p: p.predicted.iteration_s)  # stable: the baseline first among equals


def _asynchronous(problem: Problem, plan: Plan) -> Plan:
    """``plan`` with its all-gathers issued asynchronously (what schedopt's runtime configures on gloo;
    the baselines are FSDP2's default), where that is no slower and within the budget."""
    if plan.async_unshard:
        return plan
    faster = replace(plan, async_unshard=True)
    timed = simulate(problem, faster)
    budget = problem.memory_budget_bytes
    if timed.iteration_s <= plan.predicted.iteration_s and (budget is None or timed.peak_memory_bytes <= budget):
        return faster.with_prediction(timed.prediction())
    return plan


#: Told each better step found (and the lower bound) as the solve goes: the warm starts' best, then CP-SAT's.
Report = Callable[[float, float], None]


def solve_sharded(problem: Problem, options: ShardedOptions, report: Report | None = None) -> Plan:
    """CP-SAT's sharded plan, never worse than the best baseline within budget (see the module docstring);
    where the problem's ranks vary, the best of it and the warm starts on them (:func:`.recheck.on_ranks`)."""
    started = time.perf_counter()
    starts = _warm_starts(problem, options.fine_units)
    plan = _solve_sharded(problem, options, starts, started, report or (lambda _step, _bound: None))
    if problem.rank_model is None:
        return plan
    return on_ranks(problem, plan, [(s.predicted.iteration_s, s) for s in starts], keep=len(starts))


def _solve_sharded(problem: Problem, options: ShardedOptions, starts: list[Plan], started: float,
                   report: Report) -> Plan:
    from ortools.sat.python import cp_model

    best = starts[0]
    bound = sharded_lower_bound(problem)
    report(best.predicted.iteration_s, bound)
    stats: dict[str, Any] = {"warm_start": best.solver.name, "warm_start_step_s": best.predicted.iteration_s}

    def finish(plan: Plan, status: str, **more: Any) -> Plan:
        info = SolverInfo(name="cpsat", status=status, objective_s=simulate(problem, plan).iteration_s,
                          bound_s=bound, options={"time_limit_s": options.time_limit_s, "seed": options.seed},
                          stats={**stats, **more})
        return replace(plan, solver=info)

    if problem.graph.modules is None or problem.cluster.world_size == 1:
        return finish(best, "FEASIBLE", result="warm start", why="no module tree or one rank: nothing to choose")
    data = _Data(problem, options.max_atoms)
    if not data.free:
        return finish(best, "FEASIBLE", result="warm start", why="no module outside the root to make units of")
    budget = problem.memory_budget_bytes
    margin, rounds, plan, peak = 0.0, [], None, 0.0
    for attempt in range(ROUNDS):  # the model's memory is the simulator's at its points; re-solve tighter if not
        left = options.time_limit_s - (time.perf_counter() - started)
        if left < 1.0:
            break
        model = _Model(problem, data, options, tick_s=best.predicted.iteration_s / options.horizon_ticks,
                       budget=None if budget is None else budget - margin)
        # the fastest start whose units are the model's candidates (the pipelined units' finer ones are not)
        stats["hinted"] = next((s.solver.name for s in starts if model.hint(list(s.units))), None)
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = left * (0.7 if attempt == 0 else 1 / (ROUNDS - attempt))
        solver.parameters.num_workers = options.num_workers
        solver.parameters.random_seed = options.seed
        status = solver.Solve(model.m)
        rounds.append(solver.StatusName(status))
        stats.update(cp_status=rounds, num_candidates=len(data.candidates), num_points=len(model.points))
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return finish(best, "FEASIBLE", result="warm start", why=f"CP-SAT found no solution ({rounds[-1]})")
        stats["model_bound_s"] = solver.BestObjectiveBound() * model.tick + problem.graph.totals.optimizer_s
        plan = _plan_of(problem, data, model.read(solver), "cpsat", stats)
        peak = peak_memory(problem.graph, plan)[0]
        if budget is None or peak <= budget:
            break
        margin += peak - budget + 2**16
    else:
        return finish(best, "FEASIBLE", result="warm start", why=f"CP-SAT's plans simulated over budget {ROUNDS} times")
    if plan is None or budget is not None and peak > budget:
        return finish(best, "FEASIBLE", result="warm start", why="out of time for CP-SAT (or its plan over budget)")
    t = simulate(problem, plan)
    if t.iteration_s >= best.predicted.iteration_s:
        return finish(best, "FEASIBLE", result="warm start", why="CP-SAT's plan simulates no faster")
    report(t.iteration_s, bound)
    gap_ok = t.iteration_s <= bound * (1 + 1e-9)
    return finish(plan, "OPTIMAL" if gap_ok else "FEASIBLE", result="model")
