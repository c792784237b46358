"""Simulate one training iteration under a plan; compute the lower bound.

The machine has one compute stream and one network channel.

- Compute: ops run one at a time in plan order, each for its duration.
- Communication: one FIFO channel. Bucket chunks go in plan order; a chunk is
  issued at max(every gradient overlapping it is ready, previous chunk
  issued), starts when the channel is free, and takes the all-reduce time of
  its bytes.
- ``barrier``: the optimizer ops start once backward and every collective are
  done; the iteration ends with the last optimizer op. With the cluster's
  ``interference`` f > 0 (gloo on CPU shares the cores with the model), an
  op runs 1/(1+f) as fast while the channel is busy: ops and chunks are then
  simulated together, each op walking through the busy intervals of the
  chunks issued before it starts (a chunk issued later starts after it ends).
- ``overlap``: several steps are simulated back to back. The optimizer's work
  is split over buckets by parameter bytes, and a bucket's update runs on the
  compute stream right before the first op of the next step that reads one of
  its parameters, once the bucket's collective has ended (the compute stream
  waits for it). The iteration time is the steady-state period.

Lower bound, valid for every order and bucketing (``Problem`` only):

- ``barrier``: ``T_opt + max(a, b, c)`` with (a) ``T_fwd + T_bwd``;
  (b) ``min_g anc(g) + C_all``, where ``anc(g)`` sums the durations of a
  gradient-finishing op g and all its ancestors (on one stream they all run
  first) and ``C_all`` is one all-reduce of every byte (an affine cost with a
  non-negative intercept makes every split dearer); (c) ``anc_all + min_p
  c(p)``: every ancestor of every gradient runs before the last gradient
  exists, after which at least that parameter's bytes cross the network.
- ``overlap``, per step: ``max(T_fwd + T_bwd + T_opt, C_all)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping

from .cluster import Cluster
from .graph import TrainGraph
from .plan import Plan, Prediction, chunk_bounds, validate
from .problem import Problem

__all__ = [
    "Event",
    "Window",
    "Timeline",
    "Chunk",
    "ChunkTiming",
    "simulate",
    "lower_bound",
    "chunk_layout",
    "comm_schedule",
    "update_costs",
]

Track = Literal["compute", "comm"]

#: Overlap mode simulates until three consecutive periods agree, at most this many steps.
_MAX_STEPS = 32
_TOL = 1e-12


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One interval on a track: an op, a bucket update, or a collective chunk."""

    track: Track
    name: str
    start_s: float
    end_s: float
    step: int = 0
    category: str = ""
    bucket: int | None = None

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Window:
    """A gradient's transfer window: ready, needed by (deadline), and actually synchronized."""

    ready_s: float
    deadline_s: float
    synced_s: float

    @property
    def width_s(self) -> float:
        """How long the gradient may travel: deadline minus ready."""
        return self.deadline_s - self.ready_s

    @property
    def slack_s(self) -> float:
        """How early it arrived: deadline minus synced (negative when it is late)."""
        return self.deadline_s - self.synced_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """The simulated iteration. Times are seconds; ``events`` cover ``num_steps`` steps."""

    mode: str
    iteration_s: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    lower_bound_s: float
    windows: Mapping[str, Window]
    events: tuple[Event, ...]
    num_steps: int = 1

    @property
    def gap(self) -> float:
        """Relative distance from the lower bound: ``(T - LB) / T``."""
        return 0.0 if self.iteration_s <= 0 else (self.iteration_s - self.lower_bound_s) / self.iteration_s

    def prediction(self) -> Prediction:
        return Prediction(
            iteration_s=self.iteration_s,
            compute_s=self.compute_s,
            comm_s=self.comm_s,
            exposed_comm_s=self.exposed_comm_s,
            lower_bound_s=self.lower_bound_s,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Chunk:
    """One collective call: a slice of a bucket's flat buffer and the gradients it overlaps."""

    bucket: int
    chunk: int
    nbytes: int
    params: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkTiming:
    chunk: Chunk
    issue_s: float
    start_s: float
    end_s: float


def chunk_layout(graph: TrainGraph, plan: Plan) -> list[Chunk]:
    """Return the collective calls of ``plan`` in issue order.

    Parameters lie in their bucket's flat buffer in the listed order; a chunk
    overlaps a parameter when their element ranges intersect (an empty
    parameter counts as part of its bucket's first chunk).
    """
    layout: list[Chunk] = []
    for k, bucket in enumerate(plan.buckets):
        params = [graph.params[name] for name in bucket.params]
        spans = []
        offset = 0
        for p in params:
            spans.append((offset, offset + p.numel))
            offset += p.numel
        itemsize = params[0].itemsize
        for j, (lo, hi) in enumerate(chunk_bounds(offset, bucket.chunks)):
            members = tuple(p.name for p, (a, b) in zip(params, spans) if (a < hi and b > lo) or (a == b and j == 0))
            layout.append(Chunk(bucket=k, chunk=j, nbytes=(hi - lo) * itemsize, params=members))
    return layout


def comm_schedule(
    layout: list[Chunk],
    cluster: Cluster,
    ready_s: Mapping[str, float],
    *,
    channel_free_s: float = 0.0,
) -> list[ChunkTiming]:
    """Time every chunk on the FIFO channel, given when each gradient is ready.

    A chunk is issued at max(its gradients ready, previous chunk issued) and
    starts when the channel is free (``channel_free_s`` at first).
    """
    timings: list[ChunkTiming] = []
    prev_issue = 0.0
    prev_end = channel_free_s
    for chunk in layout:
        issue = max(max((ready_s[name] for name in chunk.params), default=0.0), prev_issue)
        start = max(issue, prev_end)
        end = start + cluster.allreduce_s(chunk.nbytes)
        timings.append(ChunkTiming(chunk=chunk, issue_s=issue, start_s=start, end_s=end))
        prev_issue, prev_end = issue, end
    return timings


def lower_bound(problem: Problem) -> float:
    """Return a lower bound on the iteration time valid for every plan (see module docstring)."""
    graph, cluster = problem.graph, problem.cluster
    totals = graph.totals
    compute = totals.forward_s + totals.backward_s
    if not graph.params or cluster.world_size == 1:
        return compute + totals.optimizer_s
    c_all = cluster.allreduce_s(graph.total_param_bytes)
    if problem.mode == "overlap":
        return max(compute + totals.optimizer_s, c_all)
    first, union = graph.gradient_ancestor_s
    c_min = min(cluster.allreduce_s(p.nbytes) for p in graph.params.values())
    return totals.optimizer_s + max(compute, first + c_all, union + c_min)


def simulate(problem: Problem, plan: Plan) -> Timeline:
    """Simulate ``plan`` on ``problem`` (its graph, cluster and mode) and return the timeline.

    Raises:
        PlanMismatchError, InvalidPlanError: the plan does not fit the graph.
    """
    validate(plan, problem.graph)
    if problem.mode == "barrier":
        return _simulate_barrier(problem, plan)
    return _simulate_overlap(problem, plan)


def _compute_total(graph: TrainGraph) -> float:
    t = graph.totals
    return t.forward_s + t.backward_s + t.optimizer_s


def _comm_events(timings: list[ChunkTiming], plan: Plan, step: int) -> list[Event]:
    events = []
    for t in timings:
        k, j = t.chunk.bucket, t.chunk.chunk
        name = f"bucket{k}" + (f".chunk{j}" if plan.buckets[k].chunks > 1 else "")
        events.append(Event(track="comm", name=name, start_s=t.start_s, end_s=t.end_s, step=step,
                            category="allreduce", bucket=k))
    return events


def _synced(timings: list[ChunkTiming]) -> dict[str, float]:
    done: dict[str, float] = {}
    for t in timings:
        for name in t.chunk.params:
            done[name] = max(done.get(name, 0.0), t.end_s)
    return done


def _simulate_barrier(problem: Problem, plan: Plan) -> Timeline:
    graph, cluster = problem.graph, problem.cluster
    events: list[Event] = []
    if cluster.interference > 0 and cluster.world_size > 1 and graph.params:
        end, timings = _interfering_barrier(graph, plan, cluster)
    else:
        end, t = {}, 0.0
        for op_id in plan.order:
            op = graph.ops[op_id]
            if op.phase != "optimizer":
                t += op.duration_s
                end[op_id] = t
        ready = {name: end[p.grad_op] for name, p in graph.params.items()}
        timings = comm_schedule(chunk_layout(graph, plan), cluster, ready)
    t = 0.0
    for op_id in plan.order:  # compute events: each op from the previous one's end to its own
        op = graph.ops[op_id]
        if op.phase != "optimizer":
            events.append(Event(track="compute", name=op_id, start_s=t, end_s=end[op_id], category=op.phase))
            t = end[op_id]
    backward_end = t
    ready = {name: end[p.grad_op] for name, p in graph.params.items()}
    events += _comm_events(timings, plan, 0)
    t = max([backward_end] + [c.end_s for c in timings])
    for op_id in plan.order:
        op = graph.ops[op_id]
        if op.phase == "optimizer":
            events.append(Event(track="compute", name=op_id, start_s=t, end_s=t + op.duration_s, category=op.phase))
            t += op.duration_s
    synced = _synced(timings)
    windows = {name: Window(ready_s=ready[name], deadline_s=backward_end, synced_s=synced[name])
               for name in graph.params}
    compute = _compute_total(graph)
    return Timeline(
        mode="barrier",
        iteration_s=t,
        compute_s=compute,
        comm_s=sum(c.end_s - c.start_s for c in timings),
        exposed_comm_s=max(t - compute, 0.0),
        lower_bound_s=lower_bound(problem),
        windows=windows,
        events=tuple(sorted(events, key=lambda e: (e.start_s, e.track))),
    )


def _interfering_barrier(graph: TrainGraph, plan: Plan, cluster: Cluster) -> tuple[dict[str, float], list[ChunkTiming]]:
    """Op ends and chunk timings when compute runs ``1/(1 + interference)`` as fast during collectives.

    Steps:
        1. Run the ops in order; an op's work advances at full speed in the
           channel's idle gaps and slowed inside the busy intervals of the
           chunks issued so far.
        2. After each op, issue (FIFO) every next chunk whose gradients are
           all ready: issued at max(its gradients ready, previous issue),
           started when the channel is free.
        3. After the last op, the chunks left are all ready: issue them.
    """
    slow = 1.0 + cluster.interference
    layout = chunk_layout(graph, plan)
    ready: dict[str, float] = {}
    timings: list[ChunkTiming] = []
    end: dict[str, float] = {}
    prev_issue = prev_end = t = 0.0
    busy = 0  # index of the first chunk interval that may still overlap t

    def issue_ready() -> None:
        nonlocal prev_issue, prev_end
        while len(timings) < len(layout) and all(n in ready for n in layout[len(timings)].params):
            chunk = layout[len(timings)]
            issue = max(max((ready[n] for n in chunk.params), default=0.0), prev_issue)
            start = max(issue, prev_end)
            timings.append(ChunkTiming(chunk=chunk, issue_s=issue, start_s=start,
                                       end_s=start + cluster.allreduce_s(chunk.nbytes)))
            prev_issue, prev_end = issue, timings[-1].end_s

    finishes: dict[str, list[str]] = {}
    for name, p in graph.params.items():
        finishes.setdefault(p.grad_op, []).append(name)
    issue_ready()  # chunks of empty parameters only
    for op_id in plan.order:
        op = graph.ops[op_id]
        if op.phase == "optimizer":
            continue
        work = op.duration_s  # 1. walk the busy intervals from t
        while busy < len(timings) and timings[busy].end_s <= t:
            busy += 1
        k = busy
        while work > 0:
            if k == len(timings):
                t += work
                break
            a, b = timings[k].start_s, timings[k].end_s
            if t < a:  # idle gap before the next chunk
                if t + work <= a:
                    t += work
                    break
                work -= a - t
                t = a
            if work * slow <= b - t:
                t += work * slow
                break
            work -= (b - t) / slow
            t = b
            k += 1
        end[op_id] = t
        for name in finishes.get(op_id, ()):  # 2.
            ready[name] = t
        issue_ready()
    issue_ready()  # 3.
    assert len(timings) == len(layout), "every gradient is ready after the last op"
    return end, timings


def update_costs(graph: TrainGraph) -> dict[str, float]:
    """Split each optimizer op's duration over the parameters it reads (all, if none), by bytes."""
    costs = dict.fromkeys(graph.params, 0.0)
    for op in graph.ops.values():
        if op.phase != "optimizer" or op.duration_s == 0:
            continue
        reads = op.reads or tuple(graph.params)
        total = sum(graph.params[name].nbytes for name in reads)
        for name in reads:
            share = graph.params[name].nbytes / total if total else 1.0 / len(reads)
            costs[name] += op.duration_s * share
    return costs


def _update_costs(graph: TrainGraph, plan: Plan) -> list[float]:
    """The optimizer time of each bucket's update (overlap mode)."""
    per_param = update_costs(graph)
    return [sum(per_param[name] for name in b.params) for b in plan.buckets]


def _simulate_overlap(problem: Problem, plan: Plan) -> Timeline:
    graph, cluster = problem.graph, problem.cluster
    compute_ops = [op_id for op_id in plan.order if graph.ops[op_id].phase != "optimizer"]
    home = {name: k for k, b in enumerate(plan.buckets) for name in b.params}
    # Buckets each op must see updated before it runs (first reader in the step applies the update).
    needs: dict[str, list[int]] = {}
    claimed: set[int] = set()
    for op_id in compute_ops:
        ks = sorted({home[name] for name in graph.ops[op_id].reads} - claimed)
        if ks:
            needs[op_id] = ks
            claimed.update(ks)
    unread = [k for k in range(len(plan.buckets)) if k not in claimed]
    update_s = _update_costs(graph, plan)
    layout = chunk_layout(graph, plan)

    events: list[Event] = []
    t = 0.0
    channel_free = 0.0
    done_prev: dict[int, float] = {}  # bucket -> end of its collective in the previous step
    step_ends: list[float] = []
    history: list[tuple[dict[str, float], dict[int, float], dict[str, float]]] = []  # (ready, reached, synced)

    def apply(k: int, step: int) -> None:
        nonlocal t
        if done_prev[k] > t:
            events.append(Event(track="compute", name=f"wait[bucket{k}]", start_s=t, end_s=done_prev[k],
                                step=step, category="wait", bucket=k))
            t = done_prev[k]
        if update_s[k] > 0:
            events.append(Event(track="compute", name=f"update[bucket{k}]", start_s=t, end_s=t + update_s[k],
                                step=step, category="optimizer", bucket=k))
        t += update_s[k]

    for step in range(_MAX_STEPS):
        end: dict[str, float] = {}
        reached: dict[int, float] = {}  # bucket -> when the stream reached its first reader
        for op_id in compute_ops:
            if step > 0 and op_id in needs:
                arrived = t
                for k in needs[op_id]:
                    reached[k] = arrived
                    apply(k, step)
            op = graph.ops[op_id]
            events.append(Event(track="compute", name=op_id, start_s=t, end_s=t + op.duration_s,
                                step=step, category=op.phase))
            t += op.duration_s
            end[op_id] = t
        if step > 0:
            arrived = t
            for k in unread:
                reached[k] = arrived
                apply(k, step)
        step_ends.append(t)
        ready = {name: end[p.grad_op] for name, p in graph.params.items()}
        timings = comm_schedule(layout, cluster, ready, channel_free_s=channel_free)
        events += _comm_events(timings, plan, step)
        if timings:
            channel_free = timings[-1].end_s
        done_prev = {k: 0.0 for k in range(len(plan.buckets))}
        for c in timings:
            done_prev[c.chunk.bucket] = max(done_prev[c.chunk.bucket], c.end_s)
        history.append((ready, reached, _synced(timings)))
        if _converged(step_ends):
            break

    periods = [b - a for a, b in zip(step_ends, step_ends[1:])]
    period = periods[-1] if _converged(step_ends) else sum(periods[-4:]) / len(periods[-4:])
    # Windows of the second-to-last step: ready there, needed in the last step.
    ready, _, synced = history[-2]
    _, reached_next, _ = history[-1]
    windows = {
        name: Window(ready_s=ready[name], deadline_s=reached_next[home[name]], synced_s=synced[name])
        for name in graph.params
    }
    compute = _compute_total(graph)
    comm = sum(cluster.allreduce_s(c.nbytes) for c in layout)
    return Timeline(
        mode="overlap",
        iteration_s=period,
        compute_s=compute,
        comm_s=comm,
        exposed_comm_s=max(period - compute, 0.0),
        lower_bound_s=lower_bound(problem),
        windows=windows,
        events=tuple(sorted(events, key=lambda e: (e.start_s, e.track))),
        num_steps=len(step_ends),
    )


def _converged(step_ends: list[float]) -> bool:
    """True once the last three periods agree (the steady state is reached)."""
    if len(step_ends) < 5:
        return False
    periods = [b - a for a, b in zip(step_ends[-4:], step_ends[-3:])]
    scale = max(abs(p) for p in periods) or 1.0
    return max(periods) - min(periods) <= _TOL * scale + 1e-15
