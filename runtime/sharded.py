"""``shard``: a sharded plan applied through torch's own FSDP2, ``fully_shard`` per unit.

schedopt chooses what FSDP2 leaves to the user and FSDP2 does the rest: its optimizer handling,
DTensor state dicts, ``torch.distributed.checkpoint``, mixed precision and NCCL streams are the
user's as before. For a plan (``schedopt plan --mode sharded``), before FSDP2's first collective:

1. the ranks agree (:func:`~schedopt.runtime.agreement.check_agreement`: plan hash and the live
   model's parameters on every rank; a mismatch raises :class:`PlanMismatchError` on every rank);
2. the plan is checked against the live model, the same way on every rank: every unit's modules
   exist and FSDP2 would give each unit the parameters the plan lists
   (:class:`InvalidPlanError`), and the plan's peak memory per rank, moved to the live world size,
   is within its budget (:class:`MemoryBudgetError`);
3. ``fully_shard`` runs on each unit (a list of modules where it has several), the deepest first,
   the root last, with the unit's ``reshard_after_forward`` and the caller's ``mp_policy``;
4. each unit's all-gather is issued where the plan says: ``set_modules_to_forward_prefetch`` on
   the unit ``prefetch_forward`` units earlier and ``set_modules_to_backward_prefetch`` on the unit
   ``prefetch_backward`` units later (an explicit list replaces FSDP2's implicit one-unit backward
   prefetch, so a unit with none gets an empty list);
5. on CPU (gloo), with the plan's ``async_unshard``, FSDP2 issues the all-gathers asynchronously
   (``_set_unshard_async_op``), so a prefetched one overlaps compute; on CUDA FSDP2's own streams
   do that and its default is kept;
6. every unit's collectives are FSDP2's, wrapped in a recorder
   (:mod:`~schedopt.runtime.shard_record`): :func:`records` returns each step's collectives and
   peak memory;
7. as ``wrap`` does, rank 0 logs one warning when the steps run more than 25% off the plan's
   prediction (:mod:`~schedopt.runtime.pace`). A step begins at each forward whose backward
   reduce-scatters: gradients enabled and FSDP2's gradient sync on, so evaluation forwards and
   accumulation micro-steps (``set_requires_gradient_sync(False)``) are not timed.

With no plan (and no ``$SCHEDOPT_PLAN``), ``shard`` is FSDP2 as torchtitan lays it out: a unit per
repeated block, the root for the rest, FSDP2's defaults otherwise, said in one log line.
"""

from __future__ import annotations

import logging
import math
import os
import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from schedopt.errors import InvalidPlanError, MemoryBudgetError
from schedopt.importers.pytorch import module_tree, trainable_parameters
from schedopt.plan import Plan
from schedopt.sharding import ROOT, Unit, assign_params
from schedopt.units import format_size

from .agreement import check_agreement
from .pace import PaceCheck
from .replica import resolve_plan
from .shard_record import ShardRecorder

__all__ = ["shard", "records", "per_block_units"]

log = logging.getLogger("schedopt.runtime")

_RECORDERS: "weakref.WeakKeyDictionary[nn.Module, ShardRecorder]" = weakref.WeakKeyDictionary()


def shard(module: nn.Module, plan: Plan | str | os.PathLike[str] | None = None, *, mesh: Any = None,
          mp_policy: MixedPrecisionPolicy | None = None) -> nn.Module:
    """Return ``module`` sharded by FSDP2 under ``plan`` (see the module docstring).

    Args:
        module: the model, on its device, the same on every rank.
        plan: a sharded :class:`~schedopt.plan.Plan` or the path of one; with None, the plan
            ``$SCHEDOPT_PLAN`` names; with neither, FSDP2 per repeated block (torchtitan's layout).
        mesh: FSDP2's device mesh (None: the world on the default device, as ``fully_shard``); a
            2-D mesh with named dimensions is HSDP, replicated over the first and sharded over the second.
        mp_policy: FSDP2's mixed-precision policy, passed to every ``fully_shard`` call.

    Raises:
        InvalidPlanError: torch.distributed is not initialized, the plan is not a sharded one
            (bucketed plans are :func:`~schedopt.runtime.wrap`'s), or a unit does not fit the model.
        PlanMismatchError: on every rank, when the ranks hold different plans or the model differs.
        MemoryBudgetError: on every rank, when the plan's peak at this world size exceeds its budget.

    Example:
        >>> model = shard(model)  # the plan in $SCHEDOPT_PLAN  # doctest: +SKIP
        >>> optimizer = torch.optim.AdamW(model.parameters())  # on the shards, FSDP2's way  # doctest: +SKIP
    """
    if not dist.is_initialized():
        raise InvalidPlanError("shard needs torch.distributed initialized (torchrun, init_process_group)")
    plan = resolve_plan(plan)
    kwargs: dict[str, Any] = {"mesh": mesh} if mesh is not None else {}
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    if plan is None:
        units = per_block_units(module)
        log.info("schedopt.runtime.shard: no plan (set $SCHEDOPT_PLAN or pass one): FSDP2 per repeated block, "
                 "%d units, FSDP2's defaults", len(units))
        _apply(module, units, kwargs)
        return module
    if plan.mode != "sharded":
        raise InvalidPlanError(f"shard applies sharded plans (FSDP2 units); this is a {plan.mode} plan of buckets: "
                               "apply it with schedopt.runtime.wrap")
    groups = [mesh.get_group(d) for d in range(mesh.ndim)] if mesh is not None else [None]
    for group in groups:  # each rank agrees with its peers along every dimension: the whole mesh agrees
        check_agreement(plan, module, group, note_world=False)
    leads = all(dist.get_rank(g) == 0 for g in groups)  # the mesh's first rank: it logs
    live = _layout(mesh)
    if live != (plan.cluster.shard_group, plan.cluster.replicas) and leads:
        log.warning("schedopt.runtime.shard: units sharded over %d ranks and replicated over %d, the plan's over %d "
                    "and %d: its units apply, its prediction does not (plan with --world-size %d --replicas %d)",
                    *live, plan.cluster.shard_group, plan.cluster.replicas, live[0] * live[1], live[1])
    _check_units(plan, module)
    _check_budget(plan, module, live[0])
    states = _apply(module, list(plan.units), kwargs)
    _prefetch(plan.units, states)
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    if plan.async_unshard and device.type == "cpu":
        module._set_unshard_async_op(True)  # type: ignore[operator]
    _pace(module, plan, leads=leads)
    return module


def records(module: nn.Module) -> ShardRecorder | None:
    """The recorder of a module :func:`shard` applied a plan or layout to (None otherwise)."""
    return _RECORDERS.get(module)


def per_block_units(module: nn.Module) -> list[Unit]:
    """torchtitan's layout of a live model: a unit per child of its largest repeated container that
    shares no parameter outside itself (every one resharded after forward but the last), the root kept."""
    tree = module_tree(module)
    container = tree.largest_repeated_container()
    shared = _shared_params(module)
    blocks = [] if container is None else [
        c for c in tree.child_paths(container) if tree.params_under(c) and not shared & set(tree.params_under(c))]
    *owned, rest = assign_params(tree, [*[[b] for b in blocks], [ROOT]])  # the root takes what no block holds
    units = [Unit(modules=(b,), params=tuple(p), reshard_after_forward=k + 1 < len(blocks), prefetch_backward=0)
             for k, (b, p) in enumerate(zip(blocks, owned))]
    return [Unit(modules=(ROOT,), params=tuple(rest), reshard_after_forward=False, prefetch_backward=0), *units]


def _shared_params(module: nn.Module) -> set[str]:
    """The names (first names) of parameters registered under more than one name: tied weights."""
    first: dict[int, str] = {}
    shared: set[str] = set()
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) in first:
            shared.add(first[id(p)])
        else:
            first[id(p)] = name
    return shared


def _pace(module: nn.Module, plan: Plan, *, leads: bool) -> None:
    """Step 7: time the steps at the forwards whose backward reduce-scatters (module docstring); the
    mesh's first rank (``leads``) reports."""
    pace = PaceCheck(plan.predicted.iteration_s if plan.predicted else None, report=leads)
    groups = [g for m in module.modules() if isinstance(m, FSDPModule)
              for g in m._get_fsdp_state()._fsdp_param_groups]  # type: ignore[operator]

    def begin(*_: Any) -> None:
        if torch.is_grad_enabled() and (not groups or groups[0].reduce_grads):
            pace.step()

    module.register_forward_pre_hook(begin, prepend=True)


def _check_units(plan: Plan, module: nn.Module) -> None:
    """Every unit's modules exist in the live model and FSDP2 would give it exactly the plan's parameters."""
    modules = dict(module.named_modules())
    for k, unit in enumerate(plan.units):
        for path in unit.modules:
            if path not in modules:
                raise InvalidPlanError(f"the plan's unit {k} names module {path!r}, which the model does not have; "
                                       "replan for this model (schedopt plan --mode sharded)")
    tree = module_tree(module)
    for k, (unit, got) in enumerate(zip(plan.units, assign_params(tree, [u.modules for u in plan.units]))):
        if set(got) != set(unit.params):
            wrong = sorted(set(got) ^ set(unit.params))[:3]
            raise InvalidPlanError(f"the plan's unit {k} ({', '.join(map(repr, unit.modules))}) would get other "
                                   f"parameters from fully_shard on this model: {', '.join(wrong)}")


def _check_budget(plan: Plan, module: nn.Module, world: int) -> None:
    """The plan's predicted peak moved to ``world`` shards (the shards change, the unsharded units do not)."""
    budget, predicted = plan.memory_budget_bytes, plan.predicted
    if budget is None or predicted is None or predicted.peak_memory_bytes is None:
        return
    total = sum(p.numel() * p.element_size() for p in trainable_parameters(module).values())
    peak = predicted.peak_memory_bytes - total / plan.cluster.shard_group + total / world
    if peak > budget:
        raise MemoryBudgetError(f"sharded over {world} ranks this plan holds {format_size(peak)} per rank at its peak, "
                                f"over its memory budget of {format_size(budget)} (planned sharded over "
                                f"{plan.cluster.shard_group} ranks); replan for this world size")


@dataclass(frozen=True, slots=True)
class _Applied:
    """One unit as FSDP2 holds it: the module whose state it is (its first), and all of them."""

    head: nn.Module
    modules: tuple[nn.Module, ...]


def _layout(mesh: Any) -> tuple[int, int]:
    """(the ranks each unit is sharded over, the replicas) on FSDP2's mesh: it shards over the last
    dimension and replicates over the others (None: the world, one replica)."""
    if mesh is None:
        return dist.get_world_size(), 1
    return mesh.size(mesh.ndim - 1), math.prod(mesh.size(d) for d in range(mesh.ndim - 1))


def _apply(module: nn.Module, units: Sequence[Unit], kwargs: dict[str, Any]) -> list[_Applied]:
    """``fully_shard`` every unit, the deepest first and the root last; attach the recorder."""
    named = dict(module.named_modules())
    applied = [_Applied(head=named[u.modules[0]], modules=tuple(named[m] for m in u.modules)) for u in units]
    depth = [min(m.count(".") + (m != ROOT) for m in u.modules) for u in units]
    for k in sorted(range(len(units)), key=lambda k: -depth[k]):
        target = list(applied[k].modules) if len(applied[k].modules) > 1 else applied[k].head
        fully_shard(target, reshard_after_forward=units[k].reshard_after_forward, **kwargs)
    recorder = ShardRecorder(module, [a.modules for a in applied])
    replicated = _layout(kwargs.get("mesh"))[1] > 1  # HSDP: an all-reduce across the replicas after each
    for k, a in enumerate(applied):
        gather, scatter = recorder.comms(k)
        a.head.set_custom_all_gather(gather)  # type: ignore[operator]
        a.head.set_custom_reduce_scatter(scatter)  # type: ignore[operator]
        if replicated:
            a.head.set_all_reduce_hook(recorder.all_reduce_hook(scatter))  # type: ignore[operator]
    recorder.attach()
    _RECORDERS[module] = recorder
    return applied


def _prefetch(units: Sequence[Unit], applied: Sequence[_Applied]) -> None:
    """The plan's issue points as FSDP2's explicit prefetch lists, every unit's (empty where none)."""
    forward: list[list[nn.Module]] = [[] for _ in units]
    backward: list[list[nn.Module]] = [[] for _ in units]
    for i, unit in enumerate(units):
        if unit.prefetch_forward:
            forward[i - unit.prefetch_forward].append(applied[i].head)
        if unit.reshard_after_forward and unit.prefetch_backward:
            backward[i + unit.prefetch_backward].insert(0, applied[i].head)  # the later unit's first
    for k, a in enumerate(applied):
        a.head.set_modules_to_forward_prefetch(forward[k])  # type: ignore[operator]
        a.head.set_modules_to_backward_prefetch(backward[k])  # type: ignore[operator]
