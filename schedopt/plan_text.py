"""A plan as ``schedopt inspect`` prints it: what it was made for, what it predicts, and its buckets or units.

Sizes come from the graph where one is given, else from the parameters' shapes and dtypes the plan
records (plans of schema 2 on); a plan older than that prints no sizes.
"""

from __future__ import annotations

import math

from .graph import DTYPE_SIZES, TrainGraph
from .plan import PLAN_SCHEMA, Plan
from .sharding import Unit
from .units import format_duration, format_size


def describe_plan(plan: Plan, graph: TrainGraph | None = None) -> str:
    """The lines ``schedopt inspect`` prints for ``plan``."""
    s, p = plan.solver, plan.predicted
    old = f" (a {plan.schema} plan: made before plans recorded it, its order chosen freely)" \
        if plan.schema != PLAN_SCHEMA else ""
    gap = f", gap {s.gap * 100:.2f}%" if s.gap is not None else ""
    lines = [f"model      {plan.model.name}  ({plan.model.num_params} params, {plan.model.fingerprint[:23]}...)",
             f"cluster    {plan.cluster.describe()}",
             f"mode       {plan.mode}",
             f"execution  {plan.execution}{old}",
             f"solver     {s.name} [{s.status}] in {format_duration(s.solve_time_s)}{gap}"]
    if p is not None:
        lines.append(f"predicted  iteration {format_duration(p.iteration_s)}, lower bound "
                     f"{format_duration(p.lower_bound_s)}, exposed comm {format_duration(p.exposed_comm_s)}")
    lines.append(f"order      {len(plan.order)} ops")
    sizes = _param_sizes(plan, graph)
    lines += _unit_lines(plan, sizes) if plan.mode == "sharded" else _bucket_lines(plan, sizes)
    return "\n".join(lines)


def _param_sizes(plan: Plan, graph: TrainGraph | None) -> dict[str, int]:
    """Each parameter's bytes: the graph's, or from the shapes the plan records (none in the oldest plans)."""
    if graph is not None:
        return {name: p.nbytes for name, p in graph.params.items()}
    return {name: math.prod(shape) * DTYPE_SIZES.get(dtype, 4) for name, shape, dtype in plan.model.params or ()}


def _size(sizes: dict[str, int], params) -> str:
    return format_size(sum(sizes[n] for n in params)) if sizes else ""


def _span(names) -> str:
    return names[0] + (f" .. {names[-1]}" if len(names) > 1 else "")


def _bucket_lines(plan: Plan, sizes: dict[str, int]) -> list[str]:
    lines = [f"buckets    {len(plan.buckets)} ({sum(b.chunks for b in plan.buckets)} collectives)"]
    for k, b in enumerate(plan.buckets):
        chunks = f" x{b.chunks}" if b.chunks > 1 else ""
        lines.append(f"  {k:>3}  {len(b.params):>4} params  {_size(sizes, b.params):>9}{chunks}  {_span(b.params)}")
    return lines


def _unit_lines(plan: Plan, sizes: dict[str, int]) -> list[str]:
    """The memory line, then one row per unit in forward order: what FSDP2 is told for it."""
    p, budget = plan.predicted, plan.memory_budget_bytes
    peak = format_size(p.peak_memory_bytes) if p is not None and p.peak_memory_bytes is not None else "not predicted"
    within = f" (budget {format_size(budget)})" if budget is not None else " (no budget)"
    kept = sum(not u.reshard_after_forward for u in plan.units)
    gathers = "are issued asynchronously" if plan.async_unshard else "block the host"
    lines = [f"memory     peak {peak} per rank{within}",
             f"units      {len(plan.units)} in forward order, {kept} kept after forward (on gloo the all-gathers "
             f"{gathers})",
             *([f"           {plan.solver.stats['budget']} (its own knobs peak over the budget)"]
               if plan.solver.stats.get("budget") else []),
             "    #  params   gathered  reshard  prefetch fwd/bwd  modules"]
    lines += [_unit_row(k, u, sizes) for k, u in enumerate(plan.units)]
    return lines


def _unit_row(k: int, unit: Unit, sizes: dict[str, int]) -> str:
    reshard = "yes" if unit.reshard_after_forward else "kept"
    prefetch = f"{unit.prefetch_forward}/{unit.prefetch_backward}"
    modules = "(the root module)" if unit.is_root else _span(unit.modules)
    if len(unit.modules) > 2:
        modules += f" ({len(unit.modules)} modules)"
    return f"  {k:>3}  {len(unit.params):>6}  {_size(sizes, unit.params):>9}  {reshard:>7}  {prefetch:>16}  {modules}"
