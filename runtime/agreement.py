"""Agreement before the first collective: every rank runs the same plan on the model it was made for.

DDP's reducer re-derives its bucket order at run time, and ranks that disagree
hang in a collective. A plan fixes the order offline, so the ranks only have
to check once that they hold the same plan and the model it was made for:

1. Each rank hashes its plan (canonical JSON) and lists its live model's
   trainable parameters ``(name, shape, dtype)`` in ``named_parameters()``
   order (milliseconds, even for GPT-2).
2. One ``all_gather_object`` shares both.
3. Every rank compares the same gathered data, so all of them reach the same
   verdict and raise the same :class:`~schedopt.errors.PlanMismatchError`
   naming the ranks and parameters that differ; none is left waiting.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any, Sequence

from schedopt.errors import PlanMismatchError
from schedopt.graph import params_fingerprint
from schedopt.plan import Plan

__all__ = ["plan_hash", "live_params", "check_agreement", "describe_param_differences"]

log = logging.getLogger("schedopt.runtime")

ParamEntry = tuple[str, tuple[int, ...], str]


def plan_hash(plan: Plan) -> str:
    """Return a hash of everything in ``plan`` that changes what the ranks do."""
    data = plan.to_json()
    data.pop("predicted", None)
    data["solver"] = {"name": data["solver"]["name"]}  # solve times differ between two solves of one plan
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def live_params(module: Any) -> list[ParamEntry]:
    """Return ``(name, shape, dtype)`` of the trainable parameters of a live module."""
    from schedopt.importers.pytorch import torch_dtype_name, trainable_parameters

    return [(name, tuple(int(d) for d in p.shape), torch_dtype_name(p.dtype))
            for name, p in trainable_parameters(module).items()]


def describe_param_differences(expected: Sequence[ParamEntry], actual: Sequence[ParamEntry], *,
                               limit: int = 4) -> str:
    """Name what differs between two parameter lists: missing, unexpected, reshaped, retyped, reordered."""
    want = {name: (shape, dtype) for name, shape, dtype in expected}
    have = {name: (shape, dtype) for name, shape, dtype in actual}
    parts = []

    def listed(names: list[str]) -> str:
        more = f" and {len(names) - limit} more" if len(names) > limit else ""
        return ", ".join(names[:limit]) + more

    if missing := [n for n in want if n not in have]:
        parts.append(f"missing {listed(missing)}")
    if extra := [n for n in have if n not in want]:
        parts.append(f"not in the plan {listed(extra)}")
    changed = [f"{n} {list(have[n][0])} {have[n][1]} (planned {list(want[n][0])} {want[n][1]})"
               for n in want if n in have and have[n] != want[n]]
    if changed:
        parts.append(f"changed {listed(changed)}")
    if not parts and [n for n, *_ in expected] != [n for n, *_ in actual]:
        parts.append("the same parameters in another order")
    return "; ".join(parts) or "none"


def check_agreement(plan: Plan, module: Any, process_group: Any = None, *, note_world: bool = True) -> None:
    """Check on every rank that all ranks hold ``plan`` and the model it was made for; with
    ``note_world``, the group's first rank logs a warning when the group is not as large as the plan's
    world.

    Raises:
        PlanMismatchError: on every rank alike, naming the ranks whose plan
            differs, or the parameters in which the live model differs from
            the plan's (or from another rank's).
    """
    import torch.distributed as dist

    mine = (plan_hash(plan), live_params(module))
    world = dist.get_world_size(process_group)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine, group=process_group)
    hashes = [h for h, _ in gathered]
    if len(set(hashes)) > 1:
        groups: dict[str, list[int]] = {}
        for rank, h in enumerate(hashes):
            groups.setdefault(h, []).append(rank)
        described = "; ".join(f"ranks {ranks} hold plan {h}" for h, ranks in groups.items())
        raise PlanMismatchError(f"the ranks hold different plans ({described}); launch every rank with one plan")
    for rank, (_, params) in enumerate(gathered):
        if params_fingerprint(params) == plan.model.params_fingerprint:
            continue
        if plan.model.params is not None:
            what = describe_param_differences(plan.model.params, params)
        else:  # a plan without its parameter list: compare with the names its buckets hold
            planned = [name for group in (*plan.buckets, *plan.units) for name in group.params]
            what = describe_param_differences([(n, (), "") for n in planned], [(n, (), "") for n, _, _ in params])
            if what == "none":
                what = "a parameter's shape or dtype"
        raise PlanMismatchError(
            f"the plan was made for model {plan.model.name!r}, but the model on rank {rank} differs from it: "
            f"{what}; replan for this model (schedopt plan)"
        )
    if note_world and plan.cluster.world_size != world and dist.get_rank(process_group) == 0:
        log.warning("plan %s was made for %d ranks and runs on %d: its %s apply, its prediction does not",
                    plan.solver.name, plan.cluster.world_size, world, "units" if plan.units else "buckets")
