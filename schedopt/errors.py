"""The exceptions schedopt raises; the CLI turns each into one line and exit status 2."""

from __future__ import annotations

__all__ = [
    "SchedoptError",
    "UnitError",
    "InvalidGraphError",
    "GraphImportError",
    "InvalidPlanError",
    "MemoryBudgetError",
    "TraceError",
    "CalibrationError",
    "PlanMismatchError",
    "SolverError",
    "OverBudgetError",
    "UnusedParameterError",
    "CompileError",
    "UnsupportedOptimizerError",
    "LaunchError",
    "no_trainable_parameters",
]


class SchedoptError(Exception):
    """Base class of every error schedopt raises on purpose."""


class UnitError(SchedoptError, ValueError):
    """A quantity such as ``10Gbps`` or ``20us`` could not be parsed."""


class InvalidGraphError(SchedoptError, ValueError):
    """A training graph breaks an invariant (cycle, missing grad op, ...)."""


class GraphImportError(SchedoptError):
    """A model or graph file could not be read or traced."""


class InvalidPlanError(SchedoptError, ValueError):
    """A plan is malformed or does not fit the graph it is applied to."""


class PlanMismatchError(InvalidPlanError):
    """A plan was made for another model (fingerprints differ)."""


class MemoryBudgetError(InvalidPlanError):
    """A sharded plan would hold more memory per rank than its budget on the live run."""


class CalibrationError(SchedoptError):
    """A measured all-reduce sweep that an alpha-beta model does not explain over the sizes plans issue."""


class TraceError(SchedoptError, ValueError):
    """A profiler trace cannot be read, or traces of different runs were mixed."""


class SolverError(SchedoptError):
    """A solver name is unknown, or a solver was given options it refuses."""


class OverBudgetError(SolverError):
    """A sharded solver found no plan within the memory budget; ``least_peak_bytes`` is the least peak
    per rank it reached (its layout's, every unit resharded, nothing prefetched)."""

    def __init__(self, message: str, least_peak_bytes: float) -> None:
        super().__init__(message)
        self.least_peak_bytes = least_peak_bytes


class UnusedParameterError(SchedoptError, RuntimeError):
    """A trainable parameter got no gradient in a synchronized step (the runtime cannot send it)."""


class CompileError(SchedoptError):
    """``torch.compile`` gave graphs the compiled runtime cannot apply a plan to (a graph break, an op
    the plan does not have)."""


class UnsupportedOptimizerError(SchedoptError, TypeError):
    """An optimizer, or a use of one, that overlap mode cannot defer per bucket (LBFGS, a closure)."""


class LaunchError(SchedoptError, RuntimeError):
    """The environment torchrun sets to join a process group is missing, empty or malformed."""


def no_trainable_parameters(name: str) -> str:
    """The one message every route (aten, module, ONNX, graph JSON) gives for a model without
    trainable parameters."""
    return f"{name} has no trainable parameters: there are no gradients to synchronize"
