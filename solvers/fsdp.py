"""FSDP2 baselines for ``sharded`` mode, and the unit building blocks every sharded solver shares.

- ``fsdp-per-block`` (torchtitan's layout): ``fully_shard`` on every repeated block (the children
  of the model's largest ``ModuleList``/``Sequential``), then on the root, which takes what is
  left (embeddings, final norm, head). Every block is resharded after its forward except the last
  (its backward starts at once; torchtitan keeps it). Prefetch as FSDP2 runs by default on CUDA:
  the next unit's all-gather is issued while this one computes (the CPU runs ahead of the GPU:
  FSDP2's implicit forward prefetch, distance 1) and the backward prefetches one unit (its
  explicit default).
- ``fsdp-root``: one unit, the root, never resharded: DDP's memory with sharded optimizer state.
- ``fsdp-size``: units greedily in forward order up to a byte cap at which a collective's fixed
  cost is a tenth of its transfer time (SimpleFSDP's automatic bucketing and torch's
  bandwidth-derived FSDP bucket sizes take the same view), clipped to 50 MB - 2 GB.

The baselines are FSDP2 as it comes: on gloo each all-gather blocks the host (``async_unshard``
false; on nccl FSDP2's streams overlap it either way). Every solver's plan is within
``problem.memory_budget_bytes``; a baseline whose layout is over
budget is retried with every unit resharded and no prefetch (the least its layout can hold), and
otherwise fails with one line naming that smallest peak.

The building blocks: :func:`atoms`, the modules units are made of (the root's children, the
largest container expanded into its blocks, in forward order), and :func:`build_units`, units from
groups of atoms, the root taking the rest.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from schedopt.errors import OverBudgetError, SolverError
from schedopt.graph import TrainGraph
from schedopt.orders import engine_order
from schedopt.plan import Plan, SolverInfo
from schedopt.problem import Problem
from schedopt.shard_sim import peak_memory
from schedopt.sharding import ROOT, Geometry, Unit, assign_params, forward_sorted
from schedopt.units import format_size

from .registry import register

__all__ = ["atoms", "block_groups", "coarsen", "fine_atoms", "build_units", "fit_budget", "size_cap_bytes",
           "solve_fsdp_per_block", "solve_fsdp_root", "solve_fsdp_size"]

SHARDED = ("sharded",)
MIN_CAP_BYTES, MAX_CAP_BYTES = 50_000_000, 2_000_000_000


def _root_units(graph: TrainGraph) -> list[Unit]:
    return [Unit(modules=(ROOT,), params=tuple(graph.params), reshard_after_forward=False, prefetch_backward=0)]


def atoms(graph: TrainGraph) -> tuple[list[str], list[str]]:
    """(the modules units are made of in forward order, those among them that must stay in the root).

    The root's children that hold parameters, the model's largest container replaced by its blocks.
    A module stays in the root when a forward op reads its parameters after a later module's
    forward began (a tied embedding read again by the head): FSDP2 would reshard it too early.
    """
    tree = graph.modules
    assert tree is not None
    container = tree.largest_repeated_container()
    out: list[str] = []
    for child in tree.child_paths(ROOT):
        if not tree.params_under(child):
            continue
        if child == container:
            out += [c for c in tree.child_paths(child) if tree.params_under(c)]
        else:
            out.append(child)
    order = engine_order(graph)
    probe = [Unit(modules=(m,), params=tuple(p)) for m, p in zip(out, assign_params(tree, [[m] for m in out]))]
    spans = Geometry(graph, order, probe).spans
    ranked = sorted(range(len(out)), key=lambda k: spans[k].forward_first)
    out = [out[k] for k in ranked]
    spans = [spans[k] for k in ranked]
    pinned = [m for k, m in enumerate(out) if k + 1 < len(out) and spans[k].forward_last > spans[k + 1].forward_first]
    return out, pinned


def build_units(graph: TrainGraph, groups: Sequence[Sequence[str]], *, reshard: Sequence[bool] | None = None,
                prefetch_forward: int = 1, prefetch_backward: int = 1) -> list[Unit]:
    """Units of ``groups`` (lists of module paths) plus the root for the rest, in forward order.

    ``reshard[k]``: group k's ``reshard_after_forward`` (default: every group but the last); the root
    is kept. Prefetch distances are capped at the units before and after each one.
    """
    tree = graph.modules
    assert tree is not None
    reshard = list(reshard) if reshard is not None else [k + 1 < len(groups) for k in range(len(groups))]
    modules = [tuple(g) for g in groups]
    params = assign_params(tree, [*modules, (ROOT,)])
    units = [Unit(modules=m, params=tuple(p), reshard_after_forward=r) for m, p, r in zip(modules, params, reshard)]
    if params[-1]:
        units.append(Unit(modules=(ROOT,), params=tuple(params[-1]), reshard_after_forward=False))
    units = forward_sorted(graph, engine_order(graph), [u for u in units if u.params])
    m = len(units)
    return [replace(u, prefetch_forward=min(prefetch_forward, k), prefetch_backward=min(prefetch_backward, m - 1 - k))
            for k, u in enumerate(units)]


def _plan(problem: Problem, units: Sequence[Unit], name: str, **stats) -> Plan:
    # the baselines are FSDP2 as it comes: on gloo each all-gather blocks the host (no _set_unshard_async_op)
    return Plan.for_problem(problem, order=engine_order(problem.graph), units=units, async_unshard=False,
                            solver=SolverInfo(name=name, stats=stats))


def fit_budget(problem: Problem, units: Sequence[Unit], name: str, **stats) -> Plan:
    """The plan of ``units``; over budget, the same units all resharded with no prefetch; else OverBudgetError."""
    plan = _plan(problem, units, name, **stats)
    budget = problem.memory_budget_bytes
    if budget is None:
        return plan
    peak = peak_memory(problem.graph, plan)[0]
    if peak <= budget:
        return plan
    lean = [replace(u, reshard_after_forward=not u.is_root or u.reshard_after_forward, prefetch_forward=0,
                    prefetch_backward=0) for u in units]
    lean_plan = _plan(problem, lean, name, **stats, budget="every unit resharded, no prefetch: the layout's least peak")
    least = peak_memory(problem.graph, lean_plan)[0]
    if least <= budget:
        return lean_plan
    raise OverBudgetError(f"{name}: its units peak at {format_size(least)} per rank at the least (every unit "
                          f"resharded, no prefetch), over the memory budget of {format_size(budget)}", least)


def _needs_modules(problem: Problem, name: str) -> None:
    if problem.graph.modules is None:
        raise SolverError(f"{name}: this graph records no module tree (written by an older schedopt); re-import the "
                          "model, or plan it with fsdp-root")


@register("fsdp-root", modes=SHARDED)
def solve_fsdp_root(problem: Problem, *, seed: int = 0, time_limit_s: float | None = None) -> Plan:
    """One unit, the whole model, kept unsharded from its all-gather to its reduce-scatter."""
    return fit_budget(problem, _root_units(problem.graph), "fsdp-root")


def fine_atoms(graph: TrainGraph) -> list[str]:
    """The free atoms (:func:`atoms`, the root's pinned ones left out) split as finely as ``fully_shard``
    groups them: a module that owns no parameter itself is replaced by its children that hold some,
    down to the modules that own theirs. In the order of :func:`atoms` (forward order, by block)."""
    tree = graph.modules
    assert tree is not None
    names, pinned = atoms(graph)
    owning = set(tree.owners.values())

    def split(path: str) -> list[str]:
        if path in owning:
            return [path]
        return [leaf for child in tree.child_paths(path) if tree.params_under(child) for leaf in split(child)]

    return [leaf for m in names if m not in pinned for leaf in split(m)]


def coarsen(graph: TrainGraph, modules: Sequence[str]) -> list[str]:
    """``modules`` (a unit of :func:`fine_atoms`) with every module whose parameter-holding children are all
    in it named instead of them, bottom up: the same parameters for ``fully_shard``, in fewer names."""
    tree = graph.modules
    assert tree is not None
    out, owning = list(modules), set(tree.owners.values())
    while True:
        parents = {p for m in out if (p := m.rpartition(".")[0]) and p not in owning}
        whole = [p for p in parents if (kids := [c for c in tree.child_paths(p) if tree.params_under(c)])
                 and set(kids) <= set(out)]
        if not whole:
            return out
        for parent in whole:
            kids = set(tree.child_paths(parent))
            at = min(k for k, m in enumerate(out) if m in kids)
            out = [m for m in out[:at] if m not in kids] + [parent] + [m for m in out[at:] if m not in kids]


@register("fsdp-per-block", modes=SHARDED)
def solve_fsdp_per_block(problem: Problem, *, seed: int = 0, time_limit_s: float | None = None) -> Plan:
    """torchtitan's layout: a unit per repeated block, the root for the rest (see the module docstring)."""
    _needs_modules(problem, "fsdp-per-block")
    container = problem.graph.modules.largest_repeated_container()
    if container is None:
        return fit_budget(problem, _root_units(problem.graph), "fsdp-per-block", note="no repeated blocks: one unit")
    blocks = block_groups(problem.graph)
    return fit_budget(problem, build_units(problem.graph, blocks), "fsdp-per-block", blocks=container)


def block_groups(graph: TrainGraph) -> list[list[str]]:
    """The repeated blocks (children of the largest repeated container) that hold parameters, one group
    each; a block read again later (a tied weight) stays in the root. Empty without such a container."""
    tree = graph.modules
    assert tree is not None
    container = tree.largest_repeated_container()
    if container is None:
        return []
    _, pinned = atoms(graph)
    return [[c] for c in tree.child_paths(container) if tree.params_under(c) and c not in pinned]


def size_cap_bytes(problem: Problem) -> int:
    """The unit size at which a collective's fixed cost is a tenth of its transfer, clipped to 50 MB - 2 GB."""
    cluster = problem.cluster
    n = cluster.shard_group
    if n == 1:
        return MAX_CAP_BYTES
    fixed = cluster.shard_collective_s(0.0)
    per_byte = cluster.shard_collective_s(1e9) / 1e9 - fixed / 1e9  # the all-gather's, measured or the ring's
    return int(min(max(10 * fixed / per_byte, MIN_CAP_BYTES), MAX_CAP_BYTES))


@register("fsdp-size", modes=SHARDED)
def solve_fsdp_size(problem: Problem, *, seed: int = 0, time_limit_s: float | None = None) -> Plan:
    """Units greedily in forward order up to :func:`size_cap_bytes` (see the module docstring)."""
    _needs_modules(problem, "fsdp-size")
    graph = problem.graph
    cap = size_cap_bytes(problem)
    names, pinned = atoms(graph)
    sizes = dict(zip(names, (sum(graph.params[p].nbytes for p in ps)
                             for ps in assign_params(graph.modules, [[m] for m in names]))))
    groups: list[list[str]] = []
    total = 0
    for m in names:
        if m in pinned:
            continue
        if groups and total + sizes[m] <= cap:
            groups[-1].append(m)
            total += sizes[m]
        else:
            groups.append([m])
            total = sizes[m]
    return fit_budget(problem, build_units(graph, groups), "fsdp-size", cap_bytes=cap)
