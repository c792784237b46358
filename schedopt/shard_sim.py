"""The ``sharded`` step on the simulator's machine: FSDP2's collectives, waits and memory.

The same walker as the other modes (:class:`schedopt.steady.Machine`: one compute stream, one
FIFO channel, compute slowed by the cluster's interference while a collective is on the wire).
FSDP2 has no cross-step overlap (the optimizer runs after the last reduce-scatter, and every unit
starts the next step sharded), so one step is the steady state. Per op of the step, in order:

1. the all-gathers whose issue point is this op's pre-hook (:class:`schedopt.sharding.Geometry`)
   are sent, forward ones first in unit order, then backward ones, the hook's own unit first;
2. the stream waits for the all-gathers this op needs (its unit's forward or backward one);
3. the op runs; after it, the reduce-scatters of units whose post-backward it is are sent.

The optimizer runs once the backward and every reduce-scatter are done. Costs: one all-gather or
reduce-scatter of B unsharded bytes takes :meth:`schedopt.cluster.Cluster.shard_collective_s`.

Memory per rank, parameters and gradients (activations are the same for every plan and left out):
the shards of every unit always (``sum B_i / n``), plus a unit's unsharded parameters from the
issue of its all-gather (when FSDP2 allocates the output) to its reshard (after its forward when
``reshard_after_forward``, else at its post-backward; a backward all-gather's until the
post-backward, where FSDP2 reshards after backward), plus its unsharded gradient from the start of
its first gradient op to the end of its reduce-scatter. At one instant frees count before
allocations. The timeline reports the peak, when it occurs and what is alive then.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .cluster import Cluster
from .graph import TrainGraph
from .orders import engine_order
from .plan import Plan
from .problem import Problem
from .sharding import Geometry
from .steady import Machine

__all__ = ["ShardedStep", "run_sharded_step", "peak_memory", "sharded_lower_bound"]

AG, AG_B, RS = "all-gather", "all-gather (backward)", "reduce-scatter"


@dataclass(slots=True)
class ShardedStep:
    """One simulated sharded step: op times, collectives, memory."""

    op_start: list[float] = field(default_factory=list)
    op_end: list[float] = field(default_factory=list)
    #: per collective: (kind, unit, issue, start, end), in channel order
    collectives: list[tuple[str, int, float, float, float]] = field(default_factory=list)
    #: per wait of the stream: (op position, unit, kind, from, to)
    waits: list[tuple[int, int, str, float, float]] = field(default_factory=list)
    #: (time, +/- bytes, what) per allocation and free of unsharded parameters or gradients
    memory_deltas: list[tuple[float, float, str]] = field(default_factory=list)
    sharded_bytes: float = 0.0
    backward_end_s: float = 0.0
    #: when the optimizer starts: the backward and every reduce-scatter done
    optimizer_start_s: float = 0.0
    end_s: float = 0.0

    def memory_curve(self) -> list[tuple[float, float]]:
        """(time, bytes held after the change) for every change, frees first at one instant."""
        level, curve = self.sharded_bytes, [(0.0, self.sharded_bytes)]
        for t, delta, _ in sorted(self.memory_deltas, key=lambda d: (d[0], d[1])):
            level += delta
            curve.append((t, level))
        return curve

    def peak(self) -> tuple[float, float, str]:
        """(peak bytes, when, what is alive then)."""
        alive: dict[str, float] = {}
        level, best = self.sharded_bytes, (self.sharded_bytes, 0.0, "the shards only")
        for t, delta, what in sorted(self.memory_deltas, key=lambda d: (d[0], d[1])):
            level += delta
            alive[what] = alive.get(what, 0.0) + delta
            if level > best[0] + 1e-6:
                held = [name for name, b in alive.items() if b > 0.5]
                best = (level, t, ", ".join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else ""))
        return best


def _hooks(geometry: Geometry) -> tuple[dict, dict, dict, dict, dict]:
    """Per op position: the all-gathers issued before it, those it waits for, the units whose gradients
    it starts, those it ends the forward of (resharded) and those it ends the backward of."""
    issue: dict[int, list[tuple[int, int, str]]] = {}
    wait: dict[int, list[tuple[str, int]]] = {}
    grad_first: dict[int, list[int]] = {}
    reshard: dict[int, list[int]] = {}
    post: dict[int, list[int]] = {}
    for i, (unit, span) in enumerate(zip(geometry.units, geometry.spans)):
        issue.setdefault(geometry.forward_issue(i), []).append((0, i, AG))
        wait.setdefault(span.forward_first, []).append((AG, i))
        if unit.reshard_after_forward:
            issue.setdefault(geometry.backward_issue(i), []).append((1, -i, AG_B))
            wait.setdefault(span.backward_first, []).append((AG_B, i))
            reshard.setdefault(span.forward_last, []).append(i)
        grad_first.setdefault(span.grad_first, []).append(i)
        post.setdefault(span.backward_last, []).append(i)
    for entries in issue.values():
        entries.sort()
    for units in post.values():
        units.sort(reverse=True)
    return issue, wait, grad_first, reshard, post


def run_sharded_step(graph: TrainGraph, plan: Plan, cluster: Cluster) -> ShardedStep:
    """Simulate one step of a sharded plan (see the module docstring)."""
    geometry = Geometry(graph, plan.order, plan.units)
    issue, wait, grad_first, reshard, post = _hooks(geometry)
    n = cluster.world_size
    step = ShardedStep(sharded_bytes=sum(geometry.nbytes) / n)
    machine = Machine(cluster.effective_interference)
    ends: dict[tuple[str, int], float] = {}

    def send(kind: str, i: int, at: float) -> float:
        issued, start, end = machine.send(at, cluster.shard_collective_s(geometry.nbytes[i]))
        step.collectives.append((kind, i, issued, start, end))
        ends[(kind, i)] = end
        return end

    for j, op_id in enumerate(geometry.compute_ops):
        for _, i, kind in issue.get(j, ()):
            i = abs(i)
            send(kind, i, machine.t)
            step.memory_deltas.append((machine.t, geometry.nbytes[i], f"unit {i} parameters"))
        for kind, i in wait.get(j, ()):
            if ends[(kind, i)] > machine.t:
                step.waits.append((j, i, kind, machine.t, ends[(kind, i)]))
                machine.t = ends[(kind, i)]
        for i in grad_first.get(j, ()):
            step.memory_deltas.append((machine.t, geometry.nbytes[i], f"unit {i} gradients"))
        start, end = machine.run(graph.ops[op_id].duration_s)
        step.op_start.append(start)
        step.op_end.append(end)
        for i in reshard.get(j, ()):
            step.memory_deltas.append((end, -geometry.nbytes[i], f"unit {i} parameters"))
        for i in post.get(j, ()):
            step.memory_deltas.append((end, -geometry.nbytes[i], f"unit {i} parameters"))
            done = send(RS, i, end)
            step.memory_deltas.append((done, -geometry.nbytes[i], f"unit {i} gradients"))
    step.backward_end_s = machine.t
    t = step.optimizer_start_s = max([machine.t] + [c[4] for c in step.collectives])
    for op_id in plan.order:
        if graph.ops[op_id].phase == "optimizer":
            t += graph.ops[op_id].duration_s
    step.end_s = t
    return step


def peak_memory(graph: TrainGraph, plan: Plan) -> tuple[float, float, str]:
    """A sharded plan's peak memory per rank on its own cluster: (bytes, when, what is alive then)."""
    return run_sharded_step(graph, plan, plan.cluster).peak()


def sharded_lower_bound(problem: Problem) -> float:
    """A lower bound on the step of every sharded plan of ``problem`` (eager: the engine's order).

    ``T_opt + max(compute, a + AG_min + b + max(c, RS_min), AG(all) + RS(all))``: ``a`` is the
    compute before the first op that reads a parameter (it may run before any all-gather ends),
    ``b`` from that op to the last gradient op, ``c`` what follows it; ``AG_min`` the all-gather of
    the smallest parameter that first op reads (its unit holds at least that), ``RS_min`` the
    reduce-scatter of the smallest gradient the last gradient op finishes; every byte is gathered
    and reduce-scattered at least once, and an affine cost with a non-negative intercept makes
    every split dearer.
    """
    graph, cluster = problem.graph, problem.cluster
    order = [o for o in engine_order(graph) if graph.ops[o].phase != "optimizer"]
    durations = [graph.ops[o].duration_s for o in order]
    t_opt = graph.totals.optimizer_s
    compute = sum(durations)
    if not graph.params or cluster.world_size == 1:
        return compute + t_opt
    first = next(j for j, o in enumerate(order) if graph.ops[o].reads or graph.ops[o].grads)
    last = max(j for j, o in enumerate(order) if graph.ops[o].grads)
    names_first = graph.ops[order[first]].reads or graph.ops[order[first]].grads
    ag_min = min(cluster.shard_collective_s(graph.params[p].nbytes) for p in names_first)
    rs_min = min(cluster.shard_collective_s(graph.params[p].nbytes) for p in graph.ops[order[last]].grads)
    a, b, c = sum(durations[:first]), sum(durations[first:last + 1]), sum(durations[last + 1:])
    channel = 2 * cluster.shard_collective_s(graph.total_param_bytes)
    return t_opt + max(compute, a + ag_min + b + max(c, rs_min), channel)
