"""Checking solver options against the solver's signature: names, types and ranges, before any work.

The rules, for each option a solver function declares with an ``int``,
``float`` or ``bool`` annotation (``X | None`` allows None):

- ``int``: an integer (not a bool, not ``1.5``, not ``1e9`` written as a
  float), at least 1; ``seed`` from 0 to 2**31 - 1 (CP-SAT's 32-bit seed).
- ``float``: a finite number (not NaN, not infinite, not a bool), above 0.
- ``bool``: True or False.
- an upper bound where the solver registers one (``limits``), so that a typo
  such as ``max_chunks=1e9`` cannot run for minutes.

Every message names the solver, the option and the value.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Mapping

from schedopt.errors import SolverError

__all__ = ["check_options", "SEED_MAX"]

#: The largest seed every solver accepts (CP-SAT's ``random_seed`` is a 32-bit signed integer).
SEED_MAX = 2**31 - 1


def _kind(parameter: inspect.Parameter) -> tuple[str | None, bool]:
    """(``"int"``, ``"float"``, ``"bool"`` or None, whether None is allowed) from the annotation text."""
    text = parameter.annotation if isinstance(parameter.annotation, str) else getattr(
        parameter.annotation, "__name__", str(parameter.annotation))
    parts = [p.strip() for p in str(text).split("|")]
    optional = "None" in parts
    rest = [p for p in parts if p != "None"]
    return (rest[0] if len(rest) == 1 and rest[0] in ("int", "float", "bool") else None), optional


def check_options(solver: str, signature: inspect.Signature, options: Mapping[str, Any], *,
                  limits: Mapping[str, float] | None = None) -> None:
    """Raise :class:`SolverError` for the first option of ``options`` that breaks the rules above."""
    limits = limits or {}
    for name, value in options.items():
        parameter = signature.parameters.get(name)
        if parameter is None:
            continue  # the registry names unknown options
        kind, optional = _kind(parameter)
        if kind is None or (value is None and optional):
            continue
        where = f"solver {solver!r} option {name}"
        if kind == "bool":
            if not isinstance(value, bool):
                raise SolverError(f"{where} must be true or false, got {value!r}")
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SolverError(f"{where} must be a number, got {value!r}")
        if kind == "int":
            if not isinstance(value, int):
                raise SolverError(f"{where} must be an integer, got {value!r}")
            low, high = (0, SEED_MAX) if name == "seed" else (1, limits.get(name, math.inf))
            if not low <= value <= high:
                top = "" if high == math.inf else f" to {int(high)}"
                raise SolverError(f"{where} must be an integer from {low}{top}, got {value!r}")
        elif not math.isfinite(value) or not value > 0 or value > limits.get(name, math.inf):
            top = f" and at most {limits[name]:g}" if name in limits else ""
            raise SolverError(f"{where} must be a finite number above 0{top}, got {value!r}")
