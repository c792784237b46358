"""schedopt: plan and apply communication/computation schedules for data-parallel training.

The core (this package's top-level modules) imports numpy and networkx only;
torch, onnx and ortools stay in ``schedopt.importers``, ``schedopt.runtime``
and ``schedopt.solvers``.
"""

from __future__ import annotations

from .cluster import Cluster, calibrate
from .cost import DeviceSpec
from .errors import (
    GraphImportError,
    InvalidGraphError,
    InvalidPlanError,
    OverBudgetError,
    PlanMismatchError,
    SchedoptError,
    SolverError,
    UnitError,
    UnsupportedOptimizerError,
    UnusedParameterError,
)
from .graph import Op, Param, TrainGraph
from .plan import Bucket, Plan
from .problem import Problem
from .simulate import Timeline, lower_bound, simulate

__version__ = "0.1.0"

__all__ = [
    "Bucket",
    "Cluster",
    "DeviceSpec",
    "GraphImportError",
    "InvalidGraphError",
    "InvalidPlanError",
    "Op",
    "OverBudgetError",
    "Param",
    "Plan",
    "PlanMismatchError",
    "Problem",
    "SchedoptError",
    "SolverError",
    "Timeline",
    "TrainGraph",
    "UnitError",
    "UnsupportedOptimizerError",
    "UnusedParameterError",
    "calibrate",
    "lower_bound",
    "simulate",
]
