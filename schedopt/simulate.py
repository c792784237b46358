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
  op runs 1/(1+f) as fast while the channel is busy. Ops and chunks are
  simulated together (one walker, :class:`.steady.Machine`, in both modes), each op
  walking through the busy intervals of the chunks issued before it starts
  (a chunk issued later starts after it ends).
- ``overlap``: several steps are simulated back to back. The optimizer's work
  is split over buckets by parameter bytes, and a bucket's update runs on the
  compute stream right before the first op of the next step that reads one of
  its parameters, once the bucket's collective has ended (the compute stream
  waits for it). The iteration time is the steady-state period (:mod:`.steady`,
  the engine the solvers use too; ``Timeline.converged`` says whether it settled). Interference
  slows ops (and updates) as in barrier mode, here also while the previous
  step's chunks are still on the wire.

Lower bound, valid for every order and bucketing (``Problem`` only):

- ``barrier``: ``T_opt + max(a, b, c)`` with (a) ``T_fwd + T_bwd``;
  (b) ``min_g anc(g) + C_all``, where ``anc(g)`` sums the durations of a
  gradient-finishing op g and all its ancestors (on one stream they all run
  first) and ``C_all`` is one all-reduce of every byte (an affine cost with a
  non-negative intercept makes every split dearer); (c) ``anc_all + min_p
  c(p)``: every ancestor of every gradient runs before the last gradient
  exists, after which at least that parameter's bytes cross the network; and
  per gradient-finishing op g, ``anc(g)`` plus one all-reduce of the bytes
  that g and its descendants finish (:attr:`.TrainGraph.gradient_tails`).
- ``overlap``, per step: ``max(T_fwd + T_bwd + T_opt, C_all)``, and each parameter's cycle: its
  bytes cross after its gradient op ends (at least ``c(p)``, in however many chunks), its bucket
  settles before its first forward reader of the next step, and the ops from that reader to its
  gradient op run again before the next crossing (those on a path between the two, in any order:
  :attr:`.TrainGraph.gradient_spans`). ``osp``: half of it (a stage-2 bucket waits two steps).
- With interference f > 0, the compute that can overlap the wire costs more:
  :func:`.steady.least_span` replaces ``max(compute, C_all)`` by
  ``max(C_all, compute + f min(C_all/(1+f), compute))`` (overlap: compute with
  the updates; barrier: forward and backward, the first ``min_g anc(g)`` of it
  before any collective, in place of (a) and (b)). On the testbed's 2 cores
  (f about 0.3) that bound is about 1.2x ``max(compute, comm)`` where the two
  are equal: :func:`schedopt.report.perfect_overlap_s` keeps the latter.
- ``sharded``: :func:`schedopt.shard_sim.sharded_lower_bound` (every plan within the memory budget).

``sharded`` plans run on the same machine (:mod:`.shard_sim`): all-gathers and reduce-scatters on
the FIFO channel at the plan's hooks, ops waiting for their unit's all-gather, and the peak memory
per rank (``Timeline.peak_memory_bytes``, ``Timeline.memory`` its curve).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping, NamedTuple

from .cluster import Cluster
from .graph import TrainGraph
from .layout import Collective, graph_layout
from .errors import InvalidPlanError
from .plan import Plan, Prediction, validate
from .problem import Problem
from .shard_sim import run_sharded_step, sharded_lower_bound
from .steady import Machine, StepProgram, least_span, run_steady_state

__all__ = [
    "step_program",
    "Event",
    "Window",
    "Timeline",
    "Chunk",
    "ChunkTiming",
    "simulate",
    "simulated_period",
    "lower_bound",
    "chunk_layout",
    "comm_schedule",
    "update_costs",
]

Track = Literal["compute", "comm"]


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
    #: Overlap mode: whether three consecutive periods agreed within the engine's steps (else the
    #: period is the mean of the last four; see :mod:`.steady`).
    converged: bool = True
    #: Sharded mode: the peak per rank of parameter and gradient bytes, when it occurs, what is
    #: alive then, and the memory curve ``(time, bytes)`` over the step.
    peak_memory_bytes: float | None = None
    peak_memory_s: float | None = None
    peak_memory_what: str = ""
    memory: tuple[tuple[float, float], ...] = ()

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
            peak_memory_bytes=self.peak_memory_bytes,
        )


#: One collective call of a plan (:class:`schedopt.layout.Collective`): a slice of a bucket's buffer.
Chunk = Collective


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkTiming:
    chunk: Chunk
    issue_s: float
    start_s: float
    end_s: float


def chunk_layout(graph: TrainGraph, plan: Plan) -> list[Chunk]:
    """Return the collective calls of ``plan`` in issue order (the one layout, :mod:`schedopt.layout`)."""
    return list(graph_layout(graph, plan.buckets).collectives)


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
    machine = Machine(cluster.effective_interference, channel_free=channel_free_s)
    return [_send(machine, chunk, ready_s, cluster) for chunk in layout]


def lower_bound(problem: Problem) -> float:
    """Return a lower bound on the iteration time valid for every plan (see module docstring)."""
    if problem.mode == "sharded":
        return sharded_lower_bound(problem)
    graph, cluster = problem.graph, problem.cluster
    totals = graph.totals
    compute = totals.forward_s + totals.backward_s
    if not graph.params or cluster.world_size == 1:
        return compute + totals.optimizer_s
    c_all, f = cluster.allreduce_s(graph.total_param_bytes), cluster.effective_interference
    if problem.deferred:  # overlap and osp: every byte crosses the channel once per period; and the cycles
        cycles = [cluster.allreduce_s(graph.params[name].nbytes) + span for name, span in graph.gradient_spans.items()]
        lag = 2 if problem.mode == "osp" else 1
        return max(least_span(compute + totals.optimizer_s, c_all, f), max(cycles, default=0.0) / lag)
    first, union = graph.gradient_ancestor_s
    c_min = min(cluster.allreduce_s(p.nbytes) for p in graph.params.values())
    tail = max(work + cluster.allreduce_s(nbytes) for work, nbytes in graph.gradient_tails.values())
    return totals.optimizer_s + max(least_span(compute, c_all, f, idle=first), union + c_min, tail)


def simulate(problem: Problem, plan: Plan) -> Timeline:
    """Simulate ``plan`` on ``problem`` (its graph, cluster and mode) and return the timeline.

    Raises:
        PlanMismatchError, InvalidPlanError: the plan does not fit the graph.
    """
    if plan.mode != problem.mode and "sharded" in (plan.mode, problem.mode):
        raise InvalidPlanError(f"a {plan.mode} plan cannot be simulated in {problem.mode} mode"
                               + ("; sharded plans have units, not buckets" if problem.mode == "sharded" else ""))
    validate(plan, problem.graph)
    if problem.mode == "barrier":
        return _simulate_barrier(problem, plan)
    if problem.mode == "sharded":
        return _simulate_sharded(problem, plan)
    return _simulate_overlap(problem, plan)


def simulated_period(problem: Problem, plan: Plan) -> float:
    """:func:`simulate`'s ``iteration_s`` alone, the same figure: in ``overlap`` and ``osp`` modes the
    steady state without the events, windows and bound (a search that compares many plans).

    Raises:
        PlanMismatchError, InvalidPlanError: the plan does not fit the graph.
    """
    if problem.mode not in ("overlap", "osp") or plan.mode == "sharded":
        return simulate(problem, plan).iteration_s
    validate(plan, problem.graph)
    return run_steady_state(step_program(problem, plan)).period


def _simulate_sharded(problem: Problem, plan: Plan) -> Timeline:
    """One step of :mod:`.shard_sim` as a timeline: ops, waits, collectives, memory."""
    graph = problem.graph
    step = run_sharded_step(graph, plan, problem.cluster)
    compute_ops = [o for o in plan.order if graph.ops[o].phase != "optimizer"]
    events = [Event(track="compute", name=o, start_s=a, end_s=b, category=graph.ops[o].phase)
              for o, a, b in zip(compute_ops, step.op_start, step.op_end)]
    events += [Event(track="compute", name=f"wait[{kind} unit{i}]", start_s=a, end_s=b, category="wait")
               for _, i, kind, a, b in step.waits]
    events += [Event(track="comm", name=f"{kind} unit{i}", start_s=a, end_s=b, category=kind.split(" ")[0])
               for kind, i, _, a, b in step.collectives]
    t = step.optimizer_start_s
    for op_id in plan.order:
        op = graph.ops[op_id]
        if op.phase == "optimizer":
            events.append(Event(track="compute", name=op_id, start_s=t, end_s=t + op.duration_s, category=op.phase))
            t += op.duration_s
    unit_of = {name: i for i, u in enumerate(plan.units) for name in u.params}
    scattered = {i: end for kind, i, _, _, end in step.collectives if kind == "reduce-scatter"}
    end_of = dict(zip(compute_ops, step.op_end))
    windows = {name: Window(ready_s=end_of[p.grad_op], deadline_s=step.optimizer_start_s, synced_s=scattered[unit_of[name]])
               for name, p in graph.params.items()}
    peak, when, what = step.peak()
    compute = _compute_total(graph)
    return Timeline(
        mode="sharded", iteration_s=step.end_s, compute_s=compute,
        comm_s=sum(c[4] - c[3] for c in step.collectives), exposed_comm_s=max(step.end_s - compute, 0.0),
        lower_bound_s=lower_bound(problem), windows=windows,
        events=tuple(sorted(events, key=lambda e: (e.start_s, e.track))),
        peak_memory_bytes=peak, peak_memory_s=when, peak_memory_what=what, memory=tuple(step.memory_curve()))


def _compute_total(graph: TrainGraph) -> float:
    t = graph.totals
    return t.forward_s + t.backward_s + t.optimizer_s


def _comm_events(timings: list[ChunkTiming], plan: Plan, step: int) -> list[Event]:
    events = []
    for t in timings:
        k, j = t.chunk.bucket, t.chunk.chunk
        name = f"bucket{k}" + (f".chunk{j}" if plan.buckets[k].chunks > 1 else "")
        stage2 = plan.buckets[k].stage == 2  # osp: read two steps on
        events.append(Event(track="comm", name=name + (" (stage 2)" if stage2 else ""), start_s=t.start_s,
                            end_s=t.end_s, step=step, category="allreduce-stage2" if stage2 else "allreduce",
                            bucket=k))
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
    end, timings = _barrier_step(graph, plan, cluster)
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


class _StepIssuer:
    """Issues one step's chunks in plan order as soon as every gradient each one overlaps is ready."""

    def __init__(self, machine: Machine, layout: list[Chunk], cluster: Cluster) -> None:
        self.machine, self.layout, self.cluster = machine, layout, cluster
        self.ready: dict[str, float] = {}
        self.timings: list[ChunkTiming] = []

    def gradients_ready(self, names: list[str] | tuple[str, ...], at: float) -> None:
        for name in names:
            self.ready[name] = at
        while len(self.timings) < len(self.layout) and all(n in self.ready for n in self.layout[len(self.timings)].params):
            self.timings.append(_send(self.machine, self.layout[len(self.timings)], self.ready, self.cluster))


def _send(machine: Machine, chunk: Chunk, ready_s: Mapping[str, float], cluster: Cluster) -> ChunkTiming:
    """Send ``chunk`` once its gradients are ready (FIFO)."""
    ready = max((ready_s[n] for n in chunk.params), default=0.0)
    issue, start, end = machine.send(ready, cluster.allreduce_s(chunk.nbytes))
    return ChunkTiming(chunk=chunk, issue_s=issue, start_s=start, end_s=end)


def _finishes(graph: TrainGraph) -> dict[str, list[str]]:
    """op id -> the parameters whose gradient it finishes."""
    finishes: dict[str, list[str]] = {}
    for name, p in graph.params.items():
        finishes.setdefault(p.grad_op, []).append(name)
    return finishes


def _barrier_step(graph: TrainGraph, plan: Plan, cluster: Cluster) -> tuple[dict[str, float], list[ChunkTiming]]:
    """Op ends and chunk timings of one step (compute ``1/(1 + interference)`` as fast during collectives).

    The ops run in order on a :class:`.steady.Machine`; after each, every next chunk
    whose gradients are all ready is issued (FIFO).
    """
    machine = Machine(cluster.effective_interference)
    issuer = _StepIssuer(machine, chunk_layout(graph, plan), cluster)
    finishes = _finishes(graph)
    end: dict[str, float] = {}
    issuer.gradients_ready((), 0.0)  # chunks of empty parameters only
    for op_id in plan.order:
        op = graph.ops[op_id]
        if op.phase == "optimizer":
            continue
        _, end[op_id] = machine.run(op.duration_s)
        if op_id in finishes:
            issuer.gradients_ready(finishes[op_id], end[op_id])
    assert len(issuer.timings) == len(issuer.layout), "every gradient is ready after the last op"
    return end, issuer.timings


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
    """The optimizer time of each bucket's update per step (overlap and osp modes): a stage-2 bucket
    runs it twice, the committed update with the average of two steps before and the local-gradient
    correction (LGP) of the last step."""
    per_param = update_costs(graph)
    return [b.stage * sum(per_param[name] for name in b.params) for b in plan.buckets]


def _first_readers_of_buckets(graph: TrainGraph, compute_ops: list[str], home: Mapping[str, int],
                              num_buckets: int) -> tuple[dict[str, list[int]], list[int]]:
    """The buckets each op must see updated before it runs (the first reader of a bucket in a step
    applies its update), and the buckets no op reads."""
    needs: dict[str, list[int]] = {}
    claimed: set[int] = set()
    for op_id in compute_ops:
        ks = sorted({home[name] for name in graph.ops[op_id].reads} - claimed)
        if ks:
            needs[op_id] = ks
            claimed.update(ks)
    return needs, [k for k in range(num_buckets) if k not in claimed]


class _StepLayout(NamedTuple):
    """A plan's step as positions: its compute ops in order, each op's position, each parameter's bucket,
    and the collectives in issue order."""

    compute_ops: list[str]
    position: dict[str, int]
    home: dict[str, int]
    layout: list[Chunk]


def _step_layout(graph: TrainGraph, plan: Plan) -> _StepLayout:
    compute_ops = [op_id for op_id in plan.order if graph.ops[op_id].phase != "optimizer"]
    return _StepLayout(compute_ops=compute_ops, position={op_id: j for j, op_id in enumerate(compute_ops)},
                       home={name: k for k, b in enumerate(plan.buckets) for name in b.params},
                       layout=chunk_layout(graph, plan))


def step_program(problem: Problem, plan: Plan, step: _StepLayout | None = None) -> StepProgram:
    """``plan``'s step as the engines run it (:mod:`.steady`, :mod:`.ranks`): every compute op a position.

    ``overlap`` and ``osp``: each bucket settles before its first reader of the next step (lag 1, or
    2 for osp's stage 2). ``barrier``: every bucket settles at the end of the step on this step's
    collectives (lag 0), then the optimizer runs (the last position).
    """
    graph, cluster = problem.graph, problem.cluster
    compute_ops, position, home, layout = step or _step_layout(graph, plan)
    work = [graph.ops[o].duration_s for o in compute_ops]
    if problem.mode == "barrier":
        settle, update, lag = {len(work): list(range(len(plan.buckets)))}, [0.0] * len(plan.buckets), [0] * len(plan.buckets)
        work.append(graph.totals.optimizer_s)
    else:
        needs, unread = _first_readers_of_buckets(graph, compute_ops, home, len(plan.buckets))
        settle = {position[op_id]: ks for op_id, ks in needs.items()}
        if unread:
            settle[len(compute_ops)] = unread
        update, lag = _update_costs(graph, plan), [b.stage for b in plan.buckets]
    return StepProgram(
        work=work, settle=settle, update=update,
        chunk_ready=[max((position[graph.params[n].grad_op] for n in c.params), default=-1) for c in layout],
        chunk_bucket=[c.bucket for c in layout], chunk_time=[cluster.allreduce_s(c.nbytes) for c in layout],
        interference=cluster.effective_interference, lag=lag)


def _simulate_overlap(problem: Problem, plan: Plan) -> Timeline:
    """The steady state of :mod:`.steady` with every op, and its events and windows."""
    graph = problem.graph
    step = _step_layout(graph, plan)
    compute_ops, position, home, layout = step
    program = step_program(problem, plan, step)
    update_s = program.update
    events: list[Event] = []
    # per step: when each gradient was ready, when the stream reached each bucket's first reader, synced
    history: list[tuple[dict[str, float], dict[int, float], dict[str, float]]] = []

    def record(step: int, starts: list, ends: list, settled: list, chunks: list) -> None:
        for j, op_id in enumerate(compute_ops):
            events.append(Event(track="compute", name=op_id, start_s=starts[j], end_s=ends[j], step=step,
                                category=graph.ops[op_id].phase))
        for k, _, before, start, end in settled:
            if start > before:
                events.append(Event(track="compute", name=f"wait[bucket{k}]", start_s=before, end_s=start,
                                    step=step, category="wait", bucket=k))
            if update_s[k] > 0:
                events.append(Event(track="compute", name=f"update[bucket{k}]", start_s=start, end_s=end,
                                    step=step, category="optimizer", bucket=k))
        timings = [ChunkTiming(chunk=c, issue_s=i, start_s=a, end_s=b) for c, (i, a, b) in zip(layout, chunks)]
        events.extend(_comm_events(timings, plan, step))
        ready = {name: ends[position[p.grad_op]] for name, p in graph.params.items()}
        history.append((ready, {k: reached for k, reached, *_ in settled}, _synced(timings)))

    run = run_steady_state(program, on_step=record)
    # Windows: ready in the step ``stage`` steps before the last, needed in the last step.
    _, reached_next, _ = history[-1]
    windows = {}
    for name in graph.params:
        ready, _, synced = history[-1 - plan.buckets[home[name]].stage]
        windows[name] = Window(ready_s=ready[name], deadline_s=reached_next[home[name]], synced_s=synced[name])
    compute = _compute_total(graph)
    return Timeline(
        mode=problem.mode,
        iteration_s=run.period,
        compute_s=compute,
        comm_s=sum(program.chunk_time),
        exposed_comm_s=max(run.period - compute, 0.0),
        lower_bound_s=lower_bound(problem),
        windows=windows,
        events=tuple(sorted(events, key=lambda e: (e.start_s, e.track))),
        num_steps=run.num_steps,
        converged=run.converged,
    )
