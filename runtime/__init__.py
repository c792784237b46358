"""Applies plans to torch.distributed training: ``wrap(model, plan)`` or ``SCHEDOPT_PLAN=plan.json``.

Example:
    >>> from schedopt.runtime import wrap            # doctest: +SKIP
    >>> model = wrap(model)  # the plan in $SCHEDOPT_PLAN  # doctest: +SKIP
    >>> optimizer = wrap_optimizer(optimizer, model)  # steps per bucket in overlap mode  # doctest: +SKIP
    >>> model = compile(model, "plan.json")  # torch.compile, graphs in the plan's order  # doctest: +SKIP
    >>> model = shard(model, "sharded.json")  # FSDP2 units, reshards and prefetches  # doctest: +SKIP
"""

from __future__ import annotations

from .agreement import check_agreement, plan_hash
from .compiled import CompiledDataParallel, compile
from .optimizer import wrap_optimizer
from .replica import PLAN_ENV
from .wrapper import ScheduledDataParallel, wrap

__all__ = ["PLAN_ENV", "CompiledDataParallel", "ScheduledDataParallel", "compile", "check_agreement", "plan_hash", "records", "shard",
           "wrap", "wrap_optimizer"]


def __getattr__(name: str):
    """``shard`` and ``records`` load FSDP2 and DTensor (a second of imports) only when asked for."""
    if name in ("shard", "records"):
        from . import sharded

        return getattr(sharded, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
