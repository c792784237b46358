"""One CP-SAT question the relaxations ask again and again: is there a solution with ``T <= target``?"""

from __future__ import annotations

from typing import Any

from ..interrupt import interruptible

__all__ = ["solve_capped"]


def solve_capped(model: Any, T: Any, target: int, seconds: float, num_workers: int,
                 seed: int) -> tuple[Any, str, bool]:
    """Solve ``model`` with ``T``'s upper bound set to ``target`` (the model keeps it for the next
    question, which sets it anew); the solver, its status name and whether it found a solution."""
    from ortools.sat.python import cp_model

    model.Proto().variables[T.Index()].domain[1] = target
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = num_workers
    solver.parameters.random_seed = seed
    with interruptible(solver):
        status = solver.Solve(model)
    return solver, solver.StatusName(status), status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
