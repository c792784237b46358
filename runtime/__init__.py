"""Applies plans to torch.distributed training: ``wrap(model, plan)`` or ``SCHEDOPT_PLAN=plan.json``.

Example:
    >>> from schedopt.runtime import wrap            # doctest: +SKIP
    >>> model = wrap(model)  # the plan in $SCHEDOPT_PLAN  # doctest: +SKIP
    >>> optimizer = wrap_optimizer(optimizer, model)  # steps per bucket in overlap mode  # doctest: +SKIP
"""

from __future__ import annotations

from .agreement import check_agreement, plan_hash
from .optimizer import wrap_optimizer
from .wrapper import PLAN_ENV, ScheduledDataParallel, wrap

__all__ = ["PLAN_ENV", "ScheduledDataParallel", "check_agreement", "plan_hash", "wrap", "wrap_optimizer"]
