"""The ``sharded`` step on the simulator's machine: FSDP2's collectives, waits and memory.

The same walker as the other modes (:class:`schedopt.steady.Machine`: one compute stream, one
FIFO channel, compute slowed by the cluster's interference while a collective is on the wire).
FSDP2 has no cross-step overlap (the optimizer runs after the last reduce-scatter, and every unit
starts the next step sharded), so one step is the steady state. Per op of the step, in order:

1. the all-gathers whose issue point is this op's pre-hook (:class:`schedopt.sharding.Geometry`)
   are sent, forward ones first in unit order, then backward ones, the hook's own unit first;
2. the stream waits for the all-gathers this op needs (its unit's forward or backward one);
3. the op runs; after it, the reduce-scatters of units whose post-backward it is are sent.

On ``gloo`` (:attr:`schedopt.cluster.Cluster.backend`) the host runs the collectives: the stream
waits for each reduce-scatter it sends (FSDP2 calls it synchronously in the post-backward hook), and
for each all-gather it sends unless the plan issues them asynchronously (``async_unshard``). On
``nccl`` both run on their own streams and the stream waits only where an op needs its unit.

The optimizer runs once the backward and every reduce-scatter are done. Costs: one all-gather or
reduce-scatter of B unsharded bytes takes :meth:`schedopt.cluster.Cluster.shard_collective_s` (measured
per kind where ``schedopt calibrate`` measured them).

Memory per rank, parameters and gradients (activations are the same for every plan and left out):
the shards of every unit always (``sum B_i / n``), plus a unit's unsharded parameters from the
issue of its all-gather (when FSDP2 allocates the output) to its reshard (after its forward when
``reshard_after_forward``, else at its post-backward; a backward all-gather's until the
post-backward, where FSDP2 reshards after backward), plus its unsharded gradient from the start of
its first gradient op (for a parameter several forward ops read, its first backward touch: autograd
holds the first part until the last arrives) to the end of its reduce-scatter. At one instant frees count before
allocations. The timeline reports the peak, when it occurs and what is alive then.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate, repeat

import numpy as np

from .cluster import Cluster
from .graph import TrainGraph
from .orders import engine_order
from .plan import Plan
from .problem import Problem
from .runs import Sides, joint_runs, least_runs
from .sharding import Geometry
from .steady import Machine, StepProgram, least_span

__all__ = ["ShardedStep", "collective_costs", "run_sharded_step", "sharded_step_program", "peak_memory",
           "sharded_lower_bound", "memory_floor", "regathered_bytes", "fewest_units", "running_bytes"]

AG, AG_B, RS = "all-gather", "all-gather (backward)", "reduce-scatter"

#: :func:`sharded_lower_bound` per graph (held weakly), then per cluster, budget and execution
_BOUNDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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


def collective_costs(cluster: Cluster) -> tuple[Callable[[float], float], Callable[[float], float]]:
    """(all-gather, reduce-scatter) time of B unsharded bytes on ``cluster`` (affine in B)."""
    return (lambda b: cluster.shard_collective_s(b, "all-gather"),
            lambda b: cluster.shard_collective_s(b, "reduce-scatter"))


def _blocking(cluster: Cluster, plan: Plan) -> tuple[bool, bool]:
    """(whether an all-gather blocks the host, whether a reduce-scatter does): on gloo the host runs the
    collectives, FSDP2's reduce-scatter blocks it, and so does an all-gather unless issued
    asynchronously; on nccl neither (their own streams)."""
    host = cluster.backend == "gloo"
    return host and not plan.async_unshard, host


def _collective_s(cluster: Cluster, geometry: Geometry, kind: str, unit: int) -> float:
    return cluster.shard_collective_s(geometry.nbytes[unit], "reduce-scatter" if kind == RS else "all-gather")


def _cross_s(cluster: Cluster, geometry: Geometry, kind: str, unit: int) -> float:
    """The part of :func:`_collective_s` that crosses HSDP's replicas (their all-reduce after a reduce-scatter)."""
    return cluster.replica_allreduce_s(geometry.nbytes[unit]) if kind == RS else 0.0


def run_sharded_step(graph: TrainGraph, plan: Plan, cluster: Cluster) -> ShardedStep:
    """Simulate one step of a sharded plan (see the module docstring)."""
    geometry = Geometry(graph, plan.order, plan.units)
    issue, wait, grad_first, reshard, post = _hooks(geometry)
    n = cluster.shard_group
    step = ShardedStep(sharded_bytes=sum(geometry.nbytes) / n)
    machine = Machine(cluster.effective_interference)
    ends: dict[tuple[str, int], float] = {}

    def send(kind: str, i: int, at: float) -> float:
        issued, start, end = machine.send(at, _collective_s(cluster, geometry, kind, i))
        step.collectives.append((kind, i, issued, start, end))
        ends[(kind, i)] = end
        return end

    gather_blocks, host = _blocking(cluster, plan)
    for j, op_id in enumerate(geometry.compute_ops):
        for _, i, kind in issue.get(j, ()):
            i = abs(i)
            issued_at = machine.t
            done = send(kind, i, issued_at)
            step.memory_deltas.append((issued_at, geometry.nbytes[i], f"unit {i} parameters"))
            if gather_blocks and done > machine.t:
                step.waits.append((j, i, kind, machine.t, done))
                machine.t = done
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
            done = send(RS, i, machine.t)
            step.memory_deltas.append((done, -geometry.nbytes[i], f"unit {i} gradients"))
            if host and done > machine.t:
                step.waits.append((j, i, RS, machine.t, done))
                machine.t = done
    step.backward_end_s = machine.t
    t = step.optimizer_start_s = max([machine.t] + [c[4] for c in step.collectives])
    for op_id in plan.order:
        if graph.ops[op_id].phase == "optimizer":
            t += graph.ops[op_id].duration_s
    step.end_s = t
    return step


def sharded_step_program(graph: TrainGraph, plan: Plan, cluster: Cluster) -> StepProgram:
    """The step of :func:`run_sharded_step` as the rank model runs it (:class:`.steady.StepProgram`):
    every collective a bucket of one chunk, issued after the position before its hook (an all-gather)
    or after its post-backward op (a reduce-scatter), in the walker's order; settled (lag 0, no update)
    where the stream waits for it: before the op that needs its unit, right after it where the host
    runs it blocking (gloo), and every one before the optimizer, the last position. With HSDP replicas
    the ranks are the replicas' shard groups, and a reduce-scatter's replica all-reduce crosses them
    (``groups``, ``chunk_cross``). On one rank with no variation the program's step is the walker's (a
    test checks it on random plans)."""
    geometry = Geometry(graph, plan.order, plan.units)
    issue, wait, _, _, post = _hooks(geometry)
    gather_blocks, host = _blocking(cluster, plan)
    ready: list[int] = []
    time: list[float] = []
    cross: list[float] = []
    settle: dict[int, list[int]] = {}
    bucket: dict[tuple[str, int], int] = {}

    def send(kind: str, i: int, after: int, blocks: bool) -> None:
        bucket[(kind, i)] = len(ready)
        ready.append(after)
        time.append(_collective_s(cluster, geometry, kind, i))
        cross.append(_cross_s(cluster, geometry, kind, i))
        if blocks:
            settle.setdefault(after + 1, []).append(bucket[(kind, i)])

    for j in range(len(geometry.compute_ops)):
        for _, i, kind in issue.get(j, ()):
            send(kind, abs(i), j - 1, gather_blocks)
        settle.setdefault(j, []).extend(bucket[key] for key in wait.get(j, ()))
        for i in post.get(j, ()):
            send(RS, i, j, host)
    settle[len(geometry.compute_ops)] = list(range(len(ready)))  # the optimizer after every collective
    work = [graph.ops[o].duration_s for o in geometry.compute_ops] + [graph.totals.optimizer_s]
    return StepProgram(work=work, settle={j: ks for j, ks in settle.items() if ks}, update=[0.0] * len(ready),
                       chunk_ready=ready, chunk_bucket=list(range(len(ready))), chunk_time=time,
                       interference=cluster.effective_interference, lag=[0] * len(ready),
                       groups=cluster.replicas, chunk_cross=cross)


def peak_memory(graph: TrainGraph, plan: Plan) -> tuple[float, float, str]:
    """A sharded plan's peak memory per rank on its own cluster: (bytes, when, what is alive then)."""
    return run_sharded_step(graph, plan, plan.cluster).peak()


def sharded_lower_bound(problem: Problem) -> float:
    """A lower bound on the step of every sharded plan of ``problem`` within its budget (eager: the engine's order).

    ``T_opt + min over N of max(compute, F(N) + B(N), AG(all) + RS(all) + (N-1)(a_AG + a_RS) +
    max(D, AG(again)))``, for a plan of N units, N at least :func:`fewest_units`; facts of every plan:

    - ``F`` bounds the end of forward. Take the units' first forward ops ``m_1 < ... < m_n`` (n <= N
      distinct): before op ``m_g`` starts, the g or more units first read by then are gathered, one
      collective each, one after another, and they hold every parameter first read before
      ``m_{g+1}``; the forward's compute from ``m_g`` on follows. So ``F(N)`` is the least, over
      splits of the first-read order into n <= N runs, of ``max_g g·a_AG + AG bytes(up to the end of
      run g) + compute(start of run g .. end of forward)`` (:func:`.runs.least_runs`), and at least the
      forward's compute;
    - ``B``, the mirror: after the unit whose last gradient op is the g-th latest ends, g or more
      reduce-scatters remain, holding every gradient finished after the (g+1)-th latest. In a mirrored
      step F and B split at the same units, and ``F + B`` is at least :func:`_joint_bounds`;
    - the channel moves every byte gathered and reduce-scattered, with an intercept per collective (an
      affine cost with a non-negative intercept), every forward all-gather ends before the last op
      that first reads a parameter starts, and no reduce-scatter starts before the first op that
      finishes a parameter's last gradient ends: in between (``D``, that span's compute) only the
      all-gathers that fetch parameters a second time can use it. Those move at least ``again``
      bytes (:func:`regathered_bytes`: what the budget cannot hold between a parameter's reads), in
      collectives of their own, no larger than a unit can be (:func:`_regather_s`).

    With interference ``compute`` becomes :func:`.steady.least_span` of it and the channel's busy time.
    Computed once per graph, cluster, budget and execution (a graph is immutable): every simulation of
    a sharded plan reports it, and a solver simulates many plans of one problem.
    """
    key = (repr(problem.cluster), problem.memory_budget_bytes, problem.execution)
    known = _BOUNDS.setdefault(problem.graph, {})
    if key not in known:
        known[key] = _lower_bound(problem)
    return known[key]


def _lower_bound(problem: Problem) -> float:
    """:func:`sharded_lower_bound`, computed."""
    graph, cluster = problem.graph, problem.cluster
    t_opt = graph.totals.optimizer_s
    if not graph.params or cluster.world_size == 1:
        return graph.totals.forward_s + graph.totals.backward_s + t_opt
    held = _held_levels(problem)  # one walk of the step: its ops, the touches below, the budget's two facts
    durations = [graph.ops[o].duration_s for o in held[0]]
    compute, touches, backward = sum(durations), held[1].touches, held[1].backward_start
    first_read = {p: min(t["forward"]) for p, t in touches.items() if t["forward"]}
    last_grad = {p: max(t["grads"]) for p, t in touches.items() if t["grads"]}
    nbytes = {p: graph.params[p].nbytes for p in graph.params}
    gather, scatter = collective_costs(cluster)
    after = list(accumulate(reversed(durations), initial=0.0))[::-1]  # after[j]: compute from op j on
    reads = [(b, after[j] - after[backward]) for j, b in running_bytes(first_read, nbytes)]
    grads = [(b, after[backward] - after[k + 1]) for k, b in running_bytes(last_grad, nbytes, reverse=True)]
    forward, backward_s = least_runs(gather, reads), least_runs(scatter, grads)
    joint = _joint_bounds(first_read, last_grad, nbytes, after, backward, gather, scatter)
    both = first_read and last_grad  # D: from the last first read to the first last gradient
    gap = max(0.0, after[max(first_read.values())] - after[min(last_grad.values()) + 1]) if both else 0.0
    caps = _unit_caps(problem, held)  # one pass: how few units, and how large one can be
    regather, least = _regather_s(problem, held, gather, caps[0]), _fewest(*caps)
    total = graph.total_param_bytes
    best, least_f, least_b = math.inf, math.inf, math.inf
    for n in range(1, max(least, len(reads), len(grads)) + 1):
        least_f, least_b = min(least_f, next(forward, math.inf)), min(least_b, next(backward_s, math.inf))
        same_units = next(joint)
        once = gather(total) + scatter(total) + (n - 1) * (gather(0.0) + scatter(0.0))
        if n < least:
            continue
        if once + regather >= best:
            break  # the channel's term only grows with n; the runs' only shrink
        runs = max(max(after[0] - after[backward], least_f) + max(after[backward], least_b), same_units)
        best = min(best, max(least_span(compute, once + regather, cluster.effective_interference), runs,
                             once + max(gap, regather)))
    return t_opt + best


def _joint_bounds(first_read: dict[str, int], last_grad: dict[str, int], nbytes: dict[str, float], after: list[float],
                  backward: int, gather, scatter) -> Iterator[float]:
    """Per n = 1, 2, ...: :func:`.runs.joint_runs`' bound over the first-read positions (past them, the last),
    where the step is a mirror: every parameter read in the forward has a gradient and a parameter first
    read later has its last gradient no later (a chain's layers). Then each unit's first forward op and
    last gradient op are its earliest parameter's, and F and B split at the same units. Else 0."""
    if not first_read or set(first_read) != set(last_grad):
        yield from repeat(0.0)  # endless: no mirror, no joint bound
    at: dict[int, list[str]] = {}
    for name, j in first_read.items():
        at.setdefault(j, []).append(name)
    positions = sorted(at)
    latest = [max(last_grad[p] for p in at[j]) for j in positions]
    earliest = [min(last_grad[p] for p in at[j]) for j in positions]
    if any(later > early for later, early in zip(latest[1:], earliest)):
        yield from repeat(0.0)  # endless, as above
    cum = np.cumsum([sum(nbytes[p] for p in at[j]) for j in positions])
    sides = Sides.of(gather, scatter, cum, lead_f=[after[j] - after[backward] for j in positions],
                     lead_b=[after[backward] - after[k + 1] for k in earliest], floor_f=after[0] - after[backward],
                     floor_b=after[backward])
    bound = 0.0
    for runs in joint_runs(sides):
        bound = runs.bound
        yield bound
    yield from repeat(bound)


def _held_levels(problem: Problem) -> tuple[list[str], Geometry, list[float]]:
    """(the step's ops, their geometry, per op the unsharded bytes every plan holds while it runs).

    Units only widen what each parameter holds, so per parameter, whatever the plan: its unsharded
    bytes while a forward op reads it, and from its first backward touch to its last (its unit is
    gathered for its backward until the post-backward after its last); its gradient from where it
    comes into being (a tied weight's first backward touch, :class:`~.sharding.Geometry`) to its
    last gradient op (the reduce-scatter ends after it).
    """
    graph = problem.graph
    order = [o for o in engine_order(graph) if graph.ops[o].phase != "optimizer"]
    geometry = Geometry(graph, order, ())
    held = [0.0] * (len(order) + 1)  # a difference array over op positions

    def hold(first: int, last: int, nbytes: float) -> None:
        held[first] += nbytes
        held[last + 1] -= nbytes

    for name, touch in geometry.touches.items():
        nbytes = graph.params[name].nbytes
        for j in touch["forward"]:
            hold(j, j, nbytes)
        if touch["backward"]:
            hold(min(touch["backward"]), max(touch["backward"]), nbytes)
        if (start := Geometry.gradient_start(touch)) is not None:
            hold(start, max(touch["grads"]), nbytes)
    return order, geometry, list(accumulate(held[:-1]))


def memory_floor(problem: Problem) -> tuple[float, str]:
    """The least peak memory per rank of every sharded plan of ``problem`` (eager: the engine's order),
    and where it falls: no budget below it has a plan.

    The shards plus the most that every plan holds unsharded during any one op (:func:`_held_levels`).
    """
    graph = problem.graph
    shards = graph.total_param_bytes / problem.cluster.shard_group
    order, _, levels = _held_levels(problem)
    if not graph.params or not order:
        return shards, "the shards only"
    j = max(range(len(order)), key=levels.__getitem__)
    return shards + levels[j], f"during {order[j]} ({graph.ops[order[j]].phase})"


def fewest_units(problem: Problem, *, held: tuple | None = None) -> int:
    """The fewest units with gradients that any plan within ``problem``'s budget has (1 with no budget).

    At the op ``j`` where a unit's last gradient is finished, the unit holds all its parameters and
    gradients unsharded (its post-backward comes after ``j``). Every plan holds ``held(j)`` then
    (:func:`_held_levels`); a parameter of the unit that this per-parameter count does not hold at
    ``j`` adds its bytes twice. So the units whose last gradient is finished at ``j`` hold at most
    ``(budget - shards - held(j)) / 2`` bytes of such parameters, plus the parameters held at ``j``
    whose last gradient is finished at or before it: ``cap(j)``. Every unit has one such op, so the
    units are at least as many as the fewest ops whose caps add up to every gradient's bytes.
    ``held``: :func:`_held_levels` of ``problem``, where the caller has it.
    """
    if problem.memory_budget_bytes is None or not problem.graph.params:
        return 1
    return _fewest(*_unit_caps(problem, held or _held_levels(problem)))


def _fewest(caps: list[float], total: float) -> int:
    """The fewest of ``caps`` (largest first) that add up to ``total``; 1 with none."""
    covered = list(accumulate(caps))
    return next((k + 1 for k, c in enumerate(covered) if c >= total * (1 - 1e-12)), max(1, len(caps)))


def _unit_caps(problem: Problem, held: tuple) -> tuple[list[float], float]:
    """(``cap(j)`` per op that finishes a last gradient, largest first; every gradient's bytes): see
    :func:`fewest_units`. The largest cap bounds every unit's size. No budget: no caps."""
    graph, budget = problem.graph, problem.memory_budget_bytes
    if budget is None:
        return [], 0.0
    order, geometry, levels = held
    live = [0.0] * (len(order) + 1)  # per position: bytes held there whose last gradient is at or before it
    ends: set[int] = set()
    total = 0.0
    for name, touch in geometry.touches.items():
        if not touch["grads"]:
            continue
        last, nbytes = max(touch["grads"]), graph.params[name].nbytes
        live[last] += nbytes
        live[max([last, *touch["backward"]]) + 1] -= nbytes
        ends.add(last)
        total += nbytes
    live = list(accumulate(live[:-1]))
    spare = budget - graph.total_param_bytes / problem.cluster.shard_group
    return sorted((max(0.0, spare - levels[j]) / 2 + live[j] for j in ends), reverse=True), total


def _regather_s(problem: Problem, held: tuple, gather, caps: list[float]) -> float:
    """The channel time of the second gathers: :func:`regathered_bytes`, in at least as many all-gathers as
    units of the largest size the budget allows (``caps``, :func:`_unit_caps`) would need; one where a
    parameter has no gradient (a unit of such parameters has no cap)."""
    again = regathered_bytes(problem, held=held)
    if again <= 0:
        return 0.0
    every = all(t["grads"] for t in held[1].touches.values()) and len(held[1].touches) == len(problem.graph.params)
    calls = math.ceil(again / caps[0] * (1 - 1e-12)) if every and caps and caps[0] > 0 else 1
    return calls * gather(0.0) + gather(again) - gather(0.0)


def regathered_bytes(problem: Problem, *, held: tuple | None = None) -> float:
    """The least parameter bytes every plan within ``problem``'s budget gathers a second time.

    Between two reads of a parameter (forward reads, then its first backward touch) with ops in
    between that do not touch it, a plan either holds it unsharded through every one of those ops
    or gathers it again after the first read: an all-gather issued earlier would hold it. During
    op j the budget leaves ``budget - shards - held(j)`` for such holds (:func:`_held_levels`), so
    the bytes held across gaps are at most the optimum of a packing of intervals into those
    capacities (each gap an interval, any part of its bytes held); taking the gaps by their last
    op and holding as much as still fits is that optimum (an exchange argument: the earliest-ending
    gap loses nothing by taking capacity from a gap that ends later). With no budget: 0. ``held``: as in
    :func:`fewest_units`.
    """
    budget = problem.memory_budget_bytes
    graph = problem.graph
    if budget is None or not graph.params:
        return 0.0
    order, geometry, levels = held or _held_levels(problem)
    spare = [max(0.0, budget - graph.total_param_bytes / problem.cluster.shard_group - level) for level in levels]
    gaps = []  # (last op of the gap, first op, bytes)
    for name, touch in geometry.touches.items():
        reads = sorted(set(touch["forward"])) + ([min(touch["backward"])] if touch["backward"] else [])
        gaps += [(b - 1, a + 1, graph.params[name].nbytes) for a, b in zip(reads, reads[1:]) if b > a + 1]
    return sum(nbytes for _, _, nbytes in gaps) - _most_held(spare, gaps)


def _most_held(spare: list[float], gaps: list[tuple[int, int, float]]) -> float:
    """The most bytes of ``gaps`` ((last, first, bytes): positions first..last) held within ``spare`` at
    every position, any part of a gap's bytes allowed: the earliest-ending gap first, as much as fits."""
    spare, held = list(spare), 0.0
    for last, first, nbytes in sorted(gaps):
        kept = min(nbytes, min(spare[first:last + 1]))
        for j in range(first, last + 1):
            spare[j] -= kept
        held += kept
    return held


def running_bytes(position: dict[str, int], nbytes: dict[str, float], *, reverse: bool = False):
    """(position, bytes of the parameters at that position or before it; after it with ``reverse``)."""
    at: dict[int, float] = {}
    for name, j in position.items():
        at[j] = at.get(j, 0.0) + nbytes[name]
    total = 0.0
    for j in sorted(at, reverse=reverse):
        total += at[j]
        yield j, total
