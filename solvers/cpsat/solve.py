"""The driver: warm start, model, hint, two CP-SAT phases, read back — and a record of what happened.

Phase 1 searches for ``1 - bound_phase_share`` of the time left; if it has not
proven optimality, phase 2 (the rest) re-solves with the incumbent as hint,
``T`` capped at the incumbent, and CP-SAT's objective lower-bound search. Both
bounds are valid; the plan records the higher (inception, 64 x 100 GbE,
barrier: a 2.9% gap instead of 5.3% in 60 s). Models too big to presolve get
all the time for the search. The plan is never worse than the warm start:
when CP-SAT finds nothing better the warm start is returned with
``stats["result"] = "hint"`` and ``stats["why"]``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from schedopt.errors import SolverError
from schedopt.plan import Plan, SolverInfo
from schedopt.problem import MODES, Problem
from schedopt.simulate import lower_bound, simulate

from ..interrupt import interruptible
from ..registry import register
from .barrier import BarrierModel, barrier_units
from .buckets import unit_buckets
from .config import CpsatOptions
from .deadline import MIN_PHASE_S, Deadline
from .overlap import OverlapModel, overlap_units
from .phases import overlap_ops, split_prefix
from .recheck import on_ranks
from .relaxation import Relaxation, max_calls, order_of, relax
from .sharded import ShardedOptions, solve_sharded
from .split_bound import in_order, split_bound
from .warm import warm_starts

__all__ = ["solve_cpsat", "CpsatProgress"]



@dataclass(frozen=True, slots=True)
class CpsatProgress:
    """One improvement reported while CP-SAT runs (seconds)."""

    wall_s: float
    objective_s: float
    bound_s: float


@register("cpsat", modes=MODES)
def solve_cpsat(
    problem: Problem,
    *,
    time_limit_s: float | None = 60.0,
    num_workers: int = 2,
    seed: int = 0,
    max_buckets: int | None = None,
    on_progress: Callable[[CpsatProgress], None] | None = None,
    tuning: Mapping[str, Any] | None = None,
) -> Plan:
    """Return the CP-SAT plan (see :mod:`schedopt.solvers.cpsat`); never worse than its warm start.

    ``tuning`` sets any other field of :class:`.CpsatOptions`. The call ends within
    ``time_limit_s`` plus about 2 s.

    Raises:
        SolverError: a bad option, ``max_buckets`` below the warm start's bucket count, or a warm
            start the model rejects (a bug).
    """
    if problem.mode == "sharded":
        if max_buckets is not None:
            raise SolverError("max_buckets applies to bucketed modes; a sharded plan has units")
        known = set(ShardedOptions.__dataclass_fields__) - {"time_limit_s", "num_workers", "seed"}
        unknown = sorted(set(tuning or {}) - known)
        if unknown:
            raise SolverError(f"cpsat has no sharded tuning {', '.join(map(repr, unknown))}; valid: {', '.join(sorted(known))}")
        started = time.perf_counter()
        report = None if on_progress is None else (lambda step_s, bound_s: on_progress(CpsatProgress(
            wall_s=time.perf_counter() - started, objective_s=step_s, bound_s=min(bound_s, step_s))))
        return solve_sharded(problem, ShardedOptions(time_limit_s=60.0 if time_limit_s is None else time_limit_s,
                                                     num_workers=num_workers, seed=seed, **dict(tuning or {})),
                             report)
    options = CpsatOptions.make(tuning, time_limit_s=60.0 if time_limit_s is None else time_limit_s,
                                num_workers=num_workers, seed=seed, max_buckets=max_buckets)
    return _Solve(problem, options, on_progress).run()


class _Solve:
    """One solve: its clock, its warm start, and ``stats``, the record of what happened."""

    def __init__(self, problem: Problem, options: CpsatOptions, on_progress):
        self.problem, self.options, self.on_progress = problem, options, on_progress
        self.deadline = Deadline(options.time_limit_s)
        self.stats: dict[str, Any] = {}
        # barrier: the optimizer runs after T; overlap: the updates are inside the period
        self.opt_s = problem.graph.totals.optimizer_s if problem.mode == "barrier" else 0.0

    def run(self) -> Plan:
        """The plan; where the problem's ranks vary, the best of it and the best warm starts on them."""
        plan = self.floored(self.solve())
        if self.problem.rank_model is None or not self.problem.graph.params:
            return plan
        return on_ranks(self.problem, plan, self.candidates)

    def solve(self) -> Plan:
        problem, options, stats = self.problem, self.options, self.stats
        self.candidates = candidates = warm_starts(problem, options, self.deadline, notes=stats)
        stats["warm_start_s"] = self.deadline.elapsed()
        self.hint_s, _, self.hint_plan = min((t, k, p) for k, (t, p) in enumerate(candidates))
        stats["warm_start"] = self.hint_plan.solver.name
        if self.on_progress is not None:  # the first figure: the warm starts' best (their search: up to half the time)
            self.report_bound(lower_bound(problem))
        if not problem.graph.params or problem.cluster.world_size == 1:
            return self.fallback("OPTIMAL", "nothing to communicate", bound_s=self.hint_s, covers="every plan")
        self.tick_s = self.hint_s / options.horizon_ticks
        if self.deadline.left() < 2 * MIN_PHASE_S:
            return self.fallback("FEASIBLE", "no time left for a model after the warm start", covers="nothing",
                                 timed_out=True)
        model = self.model()
        if isinstance(model, Plan):
            return model
        self.add_hint(model)
        stats["model_s"] = self.deadline.elapsed() - stats["warm_start_s"]  # building it, checking the hint
        if self.deadline.left() < 2 * MIN_PHASE_S:
            return self.fallback("FEASIBLE", "no time left for CP-SAT after the warm start",
                                 bound_s=self.constant_bound(model), covers=self.covers(model, constant=True),
                                 timed_out=True)
        return self.search(model)

    def floored(self, plan: Plan) -> Plan:
        """``plan`` with its bound raised to the simulator's lower bound where that is higher: it holds
        for every plan, and unlike the CP-SAT models it counts interference (compute slowed beside the
        wire: on gloo at 20%, ResNet-18 overlap, 706 against the model's 677 ms)."""
        info, floor = plan.solver, lower_bound(self.problem)
        if info.objective_s is None or (info.bound_s is not None and info.bound_s >= floor):
            return plan
        stats = {**info.stats, "simulator_bound_s": floor, "bound_covers": "every plan (the simulator's lower bound)"}
        return replace(plan, solver=replace(info, bound_s=min(floor, info.objective_s), stats=stats))

    # ---------------------------------------------------------------- model

    def model(self) -> BarrierModel | OverlapModel | Plan:
        """The CP-SAT model of the problem, or the warm start's plan when no model is worth solving."""
        problem, graph, options = self.problem, self.problem.graph, self.options
        hint_buckets = [list(b.params) for b in self.hint_plan.buckets]
        units = barrier_units(graph)
        self.B = options.max_buckets or min(len(units), max(len(hint_buckets) + 2, 8))
        if problem.mode == "barrier":
            self.check_max_buckets(units, hint_buckets)
            head, free = split_prefix(graph, list(self.hint_plan.order), all_forward=not problem.reorders)
            profile_s = min(options.bounds.profile_wall_s, options.profile_share * options.time_limit_s)
            model: BarrierModel | OverlapModel = BarrierModel(problem, head, free, self.tick_s, self.B,
                                                              profile_wall_s=profile_s, bounds=options.bounds)
        else:
            forward, backward = overlap_ops(graph, self.hint_plan.order, reorder=problem.reorders)
            read = {name for o in forward for name in graph.ops[o].reads}
            if set(graph.params) - read:
                return self.fallback("FEASIBLE", "a parameter no forward op reads: the overlap model needs a "
                                     "first use", covers="nothing")
            self.check_max_buckets(overlap_units(graph, forward), hint_buckets)  # before the costly bounds
            # the optional constant bounds may take half of what is left; CP-SAT gets the rest
            until = time.perf_counter() + options.bounds_share * self.deadline.left()
            model = OverlapModel(problem, forward, backward, self.tick_s, self.B, options, until=until)
            if model.skipped:
                self.stats["bounds_skipped"] = f"{' and '.join(model.skipped)} (out of time)"
            self.relax(model)
            if len(model.units) * self.B > options.overlap_max_pairs:
                self.stats.update(num_coarse_ops=len(model.coarse.chains), num_units=len(model.units),
                                  num_buckets=self.B)
                return self.fallback("FEASIBLE", f"the overlap model ({len(model.units)} units x {self.B} "
                                     f"buckets) is too large for CP-SAT; the warm start with the model's "
                                     f"constant bound", bound_s=self.constant_bound(model),
                                     covers=self.covers(model, constant=True))
            model.build()
        if not problem.reorders:  # eager: the engine's order, buckets only
            model.fix_order(list(self.hint_plan.order))
        self.stats.update(_model_size(model, self.B))
        return model

    def relax(self, model: OverlapModel) -> None:
        """The closure relaxation (:mod:`.relaxation`) where few calls can beat the warm start: its
        bound joins the model's constant bound, its solution (as a plan) the warm starts."""
        options, stats = self.options, self.stats
        upper = options.horizon_ticks  # the warm start's period, in ticks
        calls = max_calls(model.items, model.A, upper)
        if not model.items or calls > options.relaxation_max_calls:
            stats["relaxation"] = f"skipped: up to {calls} calls could beat the warm start"
            self.split(model, upper)
            return
        result = relax(model.items, model.dur, model.coarse.edges, model.A, upper,
                       options.relaxation_share * self.deadline.left(),
                       num_workers=options.num_workers, seed=options.seed, floor=model.static_bound,
                       on_step=lambda bound: self.report_bound(self.seconds(bound)))
        stats.update(relaxation=result.status, relaxation_bound_s=self.seconds(result.bound))
        model.static_bound = max(model.static_bound, result.bound)
        if result.calls is None or not self.problem.reorders:  # eager: the engine's order stays
            return
        plan = self.relaxed_plan(model, result)
        plan_s = stats["relaxation_plan_s"] = simulate(self.problem, plan).iteration_s
        self.candidates.append((plan_s, plan))
        needed = len(set(unit_buckets(model.units, [list(b.params) for b in plan.buckets])))
        if plan_s < self.hint_s and (options.max_buckets is None or needed <= options.max_buckets):
            # the new hint; the model gets candidate buckets for it (it reads B when it is built)
            self.hint_s, self.hint_plan = plan_s, plan
            self.B = model.B = max(self.B, min(needed + 2, len(model.units)))
            stats["warm_start"] = "relaxation"

    def split(self, model: OverlapModel, upper: int) -> None:
        """The anchor-split relaxation (:mod:`.split_bound`), where the closure relaxation has too many
        calls to solve: its bound joins the model's constant bound. Eager: the releases are the ops'
        ends in the engine's order (every plan of the problem keeps it)."""
        options, reorders = self.options, self.problem.reorders
        items = model.items if reorders else in_order(model.items, model.dur, model.coarse.chains,
                                                      list(self.hint_plan.order))
        result = split_bound(items, model.dur, model.coarse.edges, model.A, floor=model.static_bound,
                             upper=upper, seconds=options.split_share * self.deadline.left(),
                             min_share=options.split_min_share, max_items=options.split_max_items,
                             num_workers=options.num_workers, seed=options.seed, closures=reorders)
        self.stats.update(split_bound=result.status, split_bound_s=self.seconds(result.bound))
        if result.bound > model.static_bound:
            model.static_bound = result.bound
            self.report_bound(self.seconds(result.bound))

    def report_bound(self, bound_s: float) -> None:
        """A bound proven before CP-SAT's phases (seconds), reported against the best plan so far."""
        if self.on_progress is not None:
            self.on_progress(CpsatProgress(wall_s=self.deadline.elapsed(), objective_s=self.hint_s,
                                           bound_s=min(bound_s, self.hint_s)))

    def relaxed_plan(self, model: OverlapModel, result: Relaxation) -> Plan:
        """A relaxation's solution as a plan: the backward ops by the call that first needs them, the
        calls as buckets."""
        position = {o: k for k, o in enumerate(self.hint_plan.order)}
        order = model.full_order(order_of(result.level, model.coarse.chains, model.coarse.edges, position))
        buckets = [model.in_ready_order([model.item_params[i] for i in c], order) for c in result.calls]
        return Plan.for_problem(self.problem, order=order, buckets=buckets, solver=SolverInfo(name="relaxation"))

    def check_max_buckets(self, units: list[list[str]], hint_buckets: list[list[str]]) -> None:
        needed = len(set(unit_buckets(units, hint_buckets)))
        if self.B < needed:
            raise SolverError(f"solver 'cpsat' option max_buckets={self.B} is below the {needed} buckets of its "
                              f"warm start ({self.hint_plan.solver.name}); give at least {needed}")

    def add_hint(self, model: BarrierModel | OverlapModel) -> None:
        """Hint the warm start's values, checked against the model first."""
        hint = model.hint(list(self.hint_plan.order), [list(b.params) for b in self.hint_plan.buckets])
        for var, value in hint.items():
            model.model.AddHint(var, value)
        self.stats["hint"] = "every variable"
        verdict = _check_hint(model.model, min(self.options.hint_check_s, max(self.deadline.left(), MIN_PHASE_S)))
        if verdict != "infeasible":
            if verdict == "unknown":
                self.stats["hint"] = "every variable, unchecked (the check ran out of time)"
            return
        if self.problem.mode == "barrier":
            raise SolverError("the warm start does not satisfy the CP-SAT model (a bug in the hint)")
        # the steady state of the warm start is not 1-periodic: keep only its buckets as hints
        model.model.ClearHints()
        buckets = {v.Index() for v in model.x.values()} | {v.Index() for v in model.used}
        for var, value in hint.items():
            if var.Index() in buckets:
                model.model.AddHint(var, value)
        self.stats["hint"] = "buckets only (the warm start's steady state does not repeat every step)"

    # ---------------------------------------------------------------- solve

    def search(self, model: BarrierModel | OverlapModel) -> Plan:
        """Phase 1, phase 2 where it may raise the bound, then the plan read back."""
        from ortools.sat.python import cp_model

        options, stats = self.options, self.stats
        self.proven = 0  # the best bound of an earlier phase, in ticks
        presolve = stats["num_variables"] <= options.presolve_max_variables
        solver, status = self.phase(model, self.deadline.left() * (1 - options.bound_phase_share))
        status_name = solver.StatusName(status)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            # the model's constant bound still holds (compute, all bytes, the overlap window bound)
            return self.fallback("FEASIBLE", f"CP-SAT found no solution ({status_name})",
                                 bound_s=self.constant_bound(model), covers=self.covers(model, constant=True),
                                 timed_out=status == cp_model.UNKNOWN)
        best_bound = solver.BestObjectiveBound()
        stats["search_bound_s"] = self.seconds(best_bound)
        timed_out = status != cp_model.OPTIMAL
        if status == cp_model.FEASIBLE and self.deadline.left() > 0.5 and presolve:
            second, status2 = self.bound_phase(model, solver)
            if status2 in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                stats["lb_search_bound_s"] = self.seconds(second.BestObjectiveBound())
                best_bound = max(best_bound, second.BestObjectiveBound())
                if second.ObjectiveValue() < solver.ObjectiveValue():
                    solver = second
                if status2 == cp_model.OPTIMAL:
                    status, status_name, timed_out = status2, "OPTIMAL", False
        stats["timed_out"] = timed_out
        best_bound = min(best_bound, solver.ObjectiveValue())
        return self.read_back(model, solver, status_name, self.seconds(best_bound))

    def phase(self, model: BarrierModel | OverlapModel, seconds: float, **parameters: Any):
        """One CP-SAT solve of ``model`` for ``seconds``; progress reported as it improves."""
        from ortools.sat.python import cp_model

        run = self

        class Progress(cp_model.CpSolverSolutionCallback):
            def on_solution_callback(self) -> None:
                run.stats.setdefault("first_solution_s", run.deadline.elapsed())
                if run.on_progress is not None:
                    bound = max(self.BestObjectiveBound(), run.proven)
                    run.on_progress(CpsatProgress(wall_s=run.deadline.elapsed(),
                                                  objective_s=run.seconds(self.ObjectiveValue()),
                                                  bound_s=run.seconds(bound)))

        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(seconds, MIN_PHASE_S)
        solver.parameters.num_workers = self.options.num_workers
        solver.parameters.random_seed = self.options.seed
        solver.parameters.cp_model_presolve = self.stats["num_variables"] <= self.options.presolve_max_variables
        for key, value in parameters.items():
            setattr(solver.parameters, key, value)
        with interruptible(solver):
            status = solver.Solve(model.model, Progress())
        return solver, status

    def bound_phase(self, model: BarrierModel | OverlapModel, first):
        """Phase 2: the incumbent as hint and as a cap on ``T``, CP-SAT's objective lower-bound search."""
        m = model.model
        m.ClearHints()
        for i in range(len(m.Proto().variables)):
            var = m.GetIntVarFromProtoIndex(i)
            m.AddHint(var, first.Value(var))
        m.Add(model.T <= int(first.ObjectiveValue()))
        self.proven = int(first.BestObjectiveBound())
        return self.phase(model, self.deadline.left(), use_objective_lb_search=True)

    # ---------------------------------------------------------------- read back

    def read_back(self, model: BarrierModel | OverlapModel, solver, status_name: str, bound_s: float) -> Plan:
        """The solution as a plan, or the warm start when the solution is not faster."""
        order, buckets = model.expand(solver)
        plan = Plan.for_problem(self.problem, order=order, buckets=buckets, solver=SolverInfo(name="cpsat"))
        plan_s = simulate(self.problem, plan).iteration_s
        covers = self.covers(model, constant=False)
        if plan_s >= self.hint_s:
            self.stats["tick_s"] = self.tick_s
            return self.fallback(status_name, "CP-SAT did not improve on its warm start",
                                 bound_s=min(bound_s, self.hint_s), covers=covers)
        self.stats.update(result="cp-sat", tick_s=self.tick_s, hint_s=self.hint_s, bound_covers=covers)
        info = SolverInfo(name="cpsat", status=status_name, solve_time_s=self.deadline.elapsed(),
                          objective_s=self.seconds(solver.ObjectiveValue()), bound_s=min(bound_s, plan_s),
                          options=self.options.asked(), stats=dict(self.stats))
        return replace(plan, solver=info)

    def fallback(self, status: str, why: str, *, covers: str, bound_s: float | None = None,
                 timed_out: bool | None = None) -> Plan:
        """The warm start's plan, saying why and what its bound covers."""
        self.stats.update(result="hint", why=why, bound_covers=covers)
        if timed_out is not None:
            self.stats["timed_out"] = timed_out
        info = SolverInfo(name="cpsat", status=status, solve_time_s=self.deadline.elapsed(),
                          objective_s=self.hint_s, bound_s=bound_s, options=self.options.asked(),
                          stats=dict(self.stats))
        return replace(self.hint_plan, solver=info, predicted=None)

    # ---------------------------------------------------------------- units

    def seconds(self, value: float) -> float:
        """A model objective or bound (ticks) as an iteration time."""
        return value * self.tick_s + self.opt_s

    def constant_bound(self, model: BarrierModel | OverlapModel) -> float:
        """The model's constant bound (valid whatever CP-SAT does), as an iteration time."""
        return min(self.seconds(model.static_bound), self.hint_s)

    def covers(self, model: BarrierModel | OverlapModel, *, constant: bool) -> str:
        """What the proven bound holds for."""
        if isinstance(model, OverlapModel) and constant:
            return "every plan with this forward order (the model's constant bounds)"
        scope = f"plans of at most {self.B} buckets"
        if not self.problem.reorders:
            scope += " in the engine's order"
        if isinstance(model, OverlapModel):
            scope += ", the warm start's forward order, each unit (same op, dtype, first reader) whole"
        return scope


def _model_size(model: BarrierModel | OverlapModel, num_buckets: int) -> dict[str, int]:
    proto = model.model.Proto()
    return {"num_coarse_ops": len(model.coarse.chains), "num_units": len(model.units), "num_buckets": num_buckets,
            "num_variables": len(proto.variables), "num_constraints": len(proto.constraints)}


def _check_hint(model, seconds: float) -> str:
    """Solve once with every hinted variable fixed to its hint: ``"feasible"``, ``"infeasible"``, or
    ``"unknown"`` when ``seconds`` were not enough to tell."""
    from ortools.sat.python import cp_model

    check = cp_model.CpSolver()
    check.parameters.fix_variables_to_their_hinted_value = True
    check.parameters.max_time_in_seconds = seconds
    check.parameters.num_workers = 1
    with interruptible(check):
        status = check.Solve(model)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return "feasible"
    return "infeasible" if status in (cp_model.INFEASIBLE, cp_model.MODEL_INVALID) else "unknown"
