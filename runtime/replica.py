"""What every schedopt runtime does first: find the plan, check it on every rank, make the replicas equal.

Shared by :func:`~schedopt.runtime.wrap` (eager) and
:func:`~schedopt.runtime.compile`:

1. the plan is the argument, a path, or the file ``$SCHEDOPT_PLAN`` names;
2. torch.distributed must be initialized;
3. every rank all-gathers a hash of its plan and of its live model's parameters
   (:mod:`~schedopt.runtime.agreement`): a mismatch raises on every rank, never hangs;
4. parameters and buffers are broadcast from rank 0, as DDP does at construction;
   :meth:`Replica.sync_buffers` does it again for the buffers before each forward
   (DDP's default).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from schedopt.errors import InvalidPlanError
from schedopt.plan import Plan

from .agreement import check_agreement
from .broadcast import broadcast_states

__all__ = ["PLAN_ENV", "Replica", "resolve_plan"]

#: The environment variable that names the plan a runtime applies when given none.
PLAN_ENV = "SCHEDOPT_PLAN"


def resolve_plan(plan: Plan | str | os.PathLike[str] | None) -> Plan | None:
    """Return ``plan`` loaded if it is a path; with None, the plan ``$SCHEDOPT_PLAN`` names, or None."""
    if plan is None:
        plan = os.environ.get(PLAN_ENV) or None
    if plan is None or isinstance(plan, Plan):
        return plan
    return Plan.load(plan)


@dataclass(frozen=True, slots=True, eq=False)
class Replica:
    """One rank's copy of the model, checked against the plan and equal to rank 0's."""

    module: nn.Module
    plan: Plan
    process_group: Any
    world_size: int
    #: the trainable parameters by name, in ``named_parameters()`` order (the plan's names)
    params: dict[str, nn.Parameter]
    #: the module's buffers (detached), broadcast from rank 0
    buffers: list[torch.Tensor]

    @classmethod
    def join(cls, module: nn.Module, plan: Plan, process_group: Any = None, *, who: str) -> "Replica":
        """Steps 2-4 of the module docstring; ``who`` names the runtime in the error.

        Raises:
            InvalidPlanError: torch.distributed is not initialized.
            PlanMismatchError: on every rank, when the ranks hold different plans or the model differs.
        """
        from schedopt.importers.pytorch import trainable_parameters

        if not dist.is_initialized():
            raise InvalidPlanError(f"{who} needs torch.distributed initialized (torchrun, init_process_group)")
        check_agreement(plan, module, process_group)
        buffers = [b.detach() for b in module.buffers()]
        broadcast_states([p.detach() for p in module.parameters()] + buffers, process_group)
        return cls(module=module, plan=plan, process_group=process_group,
                   world_size=dist.get_world_size(process_group), params=trainable_parameters(module),
                   buffers=buffers)

    @property
    def syncs_buffers(self) -> bool:
        return bool(self.buffers) and self.world_size > 1

    def sync_buffers(self) -> None:
        """Broadcast the buffers from rank 0 (blocking), as DDP does before each forward."""
        if self.syncs_buffers:
            broadcast_states(self.buffers, self.process_group)
