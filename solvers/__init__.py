"""Schedulers: heuristics and the OR-Tools solver, all behind one registry.

Example:
    >>> from schedopt.solvers import SOLVERS, get
    >>> "pytorch-ddp" in SOLVERS
    True
"""

from __future__ import annotations

from . import ddp  # noqa: F401  (registers pytorch-ddp)
from .registry import SOLVERS, SolverFn, get, register

__all__ = ["SOLVERS", "SolverFn", "get", "register"]
