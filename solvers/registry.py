"""The solver registry: every scheduling strategy, baselines included, by name.

A solver is a plain function ``(problem, *, time_limit_s=None, seed=0,
**options) -> Plan``. :func:`register` records it; the registered callable
checks the options against the solver's signature (names, types and ranges:
:mod:`schedopt.solvers.options`), times the solve, checks
the returned plan with :func:`schedopt.plan.validate` and attaches the
simulator's prediction, so every plan leaving the registry is complete.
"""

from __future__ import annotations

import functools
import inspect
import time
from dataclasses import replace
from typing import Any, Callable

from schedopt.errors import SolverError

from .options import check_options
from .stages import StageOptions, choose_stages, stale_fraction
from schedopt.plan import Plan, validate
from schedopt.problem import BUCKET_MODES, Problem
from schedopt.simulate import simulate

__all__ = ["SOLVERS", "register", "get", "solvers_for", "SolverFn"]

SolverFn = Callable[..., Plan]

#: Registered solvers by name, in registration order.
SOLVERS: dict[str, SolverFn] = {}
#: The modes each registered solver plans.
MODES_OF: dict[str, tuple[str, ...]] = {}


def solvers_for(mode: str) -> list[str]:
    """The names of the solvers that plan ``mode``, in registration order."""
    return [name for name in SOLVERS if mode in MODES_OF[name]]


def register(name: str, *, limits: dict[str, float] | None = None,
             modes: tuple[str, ...] = BUCKET_MODES) -> Callable[[SolverFn], SolverFn]:
    """Register a solver function under ``name``; ``limits`` caps numeric options (name -> largest value);
    ``modes``: the modes it plans (bucketed all-reduces by default; ``sharded`` plans units).

    Example:
        >>> @register("my-solver")  # doctest: +SKIP
        ... def solve_mine(problem, *, time_limit_s=None, seed=0): ...
    """

    def decorate(fn: SolverFn) -> SolverFn:
        if name in SOLVERS:
            raise ValueError(f"solver {name!r} is already registered")
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def run(problem: Problem, *, stages: Any = None, **options: Any) -> Plan:
            if problem.mode not in modes:
                raise SolverError(f"solver {name!r} does not plan {problem.mode} mode ("
                                  + ("it plans bucketed all-reduces" if "sharded" not in modes else
                                     "it plans FSDP units") + f"); {problem.mode} mode is planned by "
                                  f"{', '.join(solvers_for(problem.mode))}")
            if stages is not None and problem.mode != "osp":
                raise SolverError(f"the stages option tunes the osp stage choice; this problem is in {problem.mode} mode")
            stage_options = StageOptions.make(stages) if problem.mode == "osp" else None  # checked before any work
            try:
                signature.bind(problem, **options)
            except TypeError:
                valid = [p for p in signature.parameters if p != "problem"]
                unknown = sorted(set(options) - set(valid))
                raise SolverError(
                    f"solver {name!r} has no option {', '.join(map(repr, unknown))}; options: {', '.join(valid)}"
                ) from None
            check_options(name, signature, options, limits=limits)
            started = time.perf_counter()
            if problem.mode == "osp":  # every solver plans overlap; the stage-2 set is chosen after it
                plan = _osp(problem, fn(replace(problem, mode="overlap"), **options), stage_options)
            else:
                plan = fn(problem, **options)
            elapsed = time.perf_counter() - started
            validate(plan, problem.graph)
            if not plan.solver.solve_time_s:
                plan = replace(plan, solver=replace(plan.solver, solve_time_s=elapsed))
            return plan.with_prediction(simulate(problem, plan).prediction())

        SOLVERS[name] = run
        MODES_OF[name] = tuple(modes)
        return run

    return decorate


def _osp(problem: Problem, plan: Plan, stages: "StageOptions | None" = None) -> Plan:
    """An ``overlap`` plan made ``osp`` (:func:`.stages.choose_stages`); the solver's objective and
    proven bound were for ``overlap`` and are dropped (``stats["osp"]`` says so)."""
    osp = choose_stages(problem, plan, stages)  # its first simulate validates the overlap plan
    stats = {**plan.solver.stats, "stale_fraction": stale_fraction(problem, osp.buckets),
             "osp": "stage 2 chosen greedily on the overlap plan; the overlap objective and bound do not apply"}
    return replace(osp, solver=replace(plan.solver, objective_s=None, bound_s=None, stats=stats))


def get(name: str) -> SolverFn:
    """Return the registered solver ``name``.

    Raises:
        SolverError: no solver has that name; the message lists the valid ones.
    """
    try:
        return SOLVERS[name]
    except KeyError:
        raise SolverError(f"unknown solver {name!r}; valid: {', '.join(SOLVERS)}") from None
