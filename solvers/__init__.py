"""Schedulers: heuristics and the OR-Tools solver, all behind one registry.

Example:
    >>> from schedopt.solvers import SOLVERS, get
    >>> "pytorch-ddp" in SOLVERS
    True
"""

from __future__ import annotations

# Importing a strategy module registers it; the registry keeps this order.
from . import bytescheduler, caramel, ddp, horovod, mgwfbp, tictac  # noqa: F401
from . import cpsat  # noqa: F401  (it warm-starts from the solvers above)
from . import fsdp  # noqa: F401  (sharded mode's baselines)
from .registry import SOLVERS, SolverFn, get, register, solvers_for

__all__ = ["SOLVERS", "SolverFn", "get", "register", "solvers_for"]
