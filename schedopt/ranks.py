"""Every rank: each runs its own compute, and a collective starts when the last rank issues it.

:func:`schedopt.simulate.simulate` runs one rank and takes it for all of them: the same op times
everywhere, so each collective starts as soon as that one rank issues it. Real ranks differ from
step to step (the profiler's traces of two gloo ranks on one machine: a rank's compute from 0.49 to
0.76 s in the same three steps), and an all-reduce waits for the slowest; the more ranks, the slower
the slowest. The rank model runs the same step program (:class:`.steady.StepProgram`, the steady
state's semantics) on ``ranks`` ranks at once:

- each rank's op at position j takes ``work[j] * f_op * f_step * scale[r]``: ``f_op`` is drawn per op,
  rank and step, ``f_step`` per rank and step (contention that slows all of a rank's ops at once); both
  are log-normal with mean 1 (an op's time is its mean) and the given coefficients of variation;
  ``scale[r]`` is rank r's own speed, fixed (``rank_scale``: a rank that is always slower, as traced);
- a chunk is issued when the last rank issues it (its gradients ready there, the chunk before it
  issued) and starts when the channel is free; every rank's settle waits for the same end;
- with interference, a rank's compute is slowed while any collective is on the wire (one channel);
- HSDP (a sharded program with ``groups``): the ranks are the replicas' shard groups of consecutive
  ranks, each with its own channel; a chunk is issued in a group when that group's last rank issues
  it, and the part that crosses the replicas (their all-reduce) starts when every group is done;
- the period is the mean step time (the ranks' mean clock) after a warm-up, over enough steps that
  the 95% interval of the mean is within 1% of it (``stable``), at most ``max_steps``.

Positions run in order across all ranks: a chunk issued after position j starts after every rank has
ended j, so no rank's earlier op can overlap a chunk it has not seen yet. Without variation every rank
is the one rank of :func:`~schedopt.simulate.simulate`, whose figure the caller takes as it is.

In ``barrier`` mode the program settles every bucket at the end of the step with lag 0 (this step's
collectives), and the optimizer runs after: ``simulate``'s barrier semantics. In ``sharded`` mode
every all-gather and reduce-scatter is a bucket of its own, settled with lag 0 where FSDP2's stream
waits for it (:func:`~schedopt.shard_sim.sharded_step_program`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import UnitError
from .graph import TrainGraph
from .plan import Plan, validate
from .problem import Problem
from .shard_sim import sharded_step_program
from .simulate import simulate, simulated_period, step_program
from .steady import Machine, StepProgram

__all__ = ["RankModel", "RankRun", "run_ranks", "simulate_ranks", "period", "WARMUP_STEPS", "MAX_RANK_STEPS", "STABLE",
           "lognormal_sigma"]

#: Steps run before the period is measured; steps at most: MAX_RANK_STEPS, or up to 4000 where a step
#: of every rank has fewer than _CHEAP_STEPS / 4000 positions (one noisy rank needs ~1500 for 1% at 20%).
WARMUP_STEPS, MAX_RANK_STEPS, _CHEAP_STEPS = 5, 400, 4_000_000
_MIN_MEASURED = 30
#: a period is stable when its 95% interval is within this share of it
STABLE = 0.01


@dataclass(frozen=True, slots=True)
class RankModel:
    """``ranks`` ranks whose op times vary (coefficients of variation), drawn with ``seed``."""

    ranks: int = 1
    op_spread: float = 0.0
    step_spread: float = 0.0
    seed: int = 0
    #: each rank's speed, as a factor on every op's time (a rank that is always slower), or () for 1 each
    rank_scale: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not (isinstance(self.ranks, int) and not isinstance(self.ranks, bool) and 1 <= self.ranks <= 100_000):
            raise UnitError(f"ranks must be an integer from 1 to 100000, got {self.ranks!r}")
        scale = tuple(self.rank_scale)
        if scale and (len(scale) != self.ranks or not all(isinstance(x, (int, float)) and math.isfinite(x)
                                                           and 0 < x <= 100 for x in scale)):
            raise UnitError(f"rank_scale must be {self.ranks} factors from 0 to 100, got {scale!r}")
        object.__setattr__(self, "rank_scale", scale)
        for name in ("op_spread", "step_spread"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and 0 <= v <= 5):
                raise UnitError(f"{name} must be a coefficient of variation from 0 to 5, got {v!r}")

    @classmethod
    def measured(cls, graph: TrainGraph, ranks: int, *, seed: int = 0) -> RankModel:
        """``ranks`` ranks varying as ``graph``'s costs were measured to (``op_spread`` and
        ``step_spread`` in its meta: ``schedopt profile`` and trace costs record them); none where
        they were not measured (estimated costs), which :func:`simulate_ranks` runs as one rank."""
        spreads = {k: float(graph.meta.get(k) or 0.0) for k in ("op_spread", "step_spread")}
        return cls(ranks=ranks, seed=seed, **{k: min(v, 5.0) for k, v in spreads.items()})

    @property
    def varies(self) -> bool:
        return self.op_spread > 0 or self.step_spread > 0 or any(x != 1 for x in self.rank_scale)

    def to_json(self) -> dict:
        """The fields, as ``RankModel(**model.to_json())`` reads them back."""
        return {"ranks": self.ranks, "op_spread": self.op_spread, "step_spread": self.step_spread, "seed": self.seed,
                "rank_scale": list(self.rank_scale)}

    def describe(self) -> str:
        speeds = f", ranks at {', '.join(f'{x:.2f}x' for x in self.rank_scale)} the op times" if self.rank_scale else ""
        return (f"{self.ranks} rank(s), op times varying {self.op_spread:.1%} per op and {self.step_spread:.1%} "
                f"per rank and step{speeds} (seed {self.seed})")


@dataclass(frozen=True, slots=True)
class RankRun:
    """The mean ``period`` over ``steps`` measured steps; ``stable``: its 95% interval within 1%."""

    period: float
    steps: int
    stable: bool


def lognormal_sigma(cv: float) -> float:
    """The log-normal's sigma for a coefficient of variation."""
    return math.sqrt(math.log1p(cv * cv))


class _Ranks:
    """The ranks' clocks and channels. The ranks split into ``groups`` groups of consecutive ranks (HSDP's
    shard groups; one group otherwise), each with its own FIFO channel: a chunk is issued in a group when
    its last rank issues it, and the part of it that crosses the groups (``cross``) starts when every
    group has done the rest. With interference, each position's work runs from each rank's clock, slowed
    by its group's busy intervals (one :class:`.steady.Machine` per rank over its group's lists)."""

    def __init__(self, ranks: int, groups: int, interference: float) -> None:
        self.t = np.zeros(ranks)
        self.by_group = self.t.reshape(groups, ranks // groups)  # a view: row g, group g's clocks
        self.issued, self.channel = np.zeros(groups), np.zeros(groups)
        self.busy_start: list[list] = [[] for _ in range(groups)]
        self.busy_end: list[list] = [[] for _ in range(groups)]
        self.machines = [Machine(interference) for _ in range(ranks)] if interference > 0 else []
        for r, m in enumerate(self.machines):
            g = r * groups // ranks
            m.busy_start, m.busy_end = self.busy_start[g], self.busy_end[g]

    def run(self, work: np.ndarray) -> None:
        if not self.machines:
            self.t += work
            return
        for r, m in enumerate(self.machines):
            self.t[r] = m.advance(self.t[r], work[r])

    def wait(self, until: np.ndarray) -> None:
        """Each group's ranks wait until its entry of ``until``."""
        np.maximum(self.by_group, until[:, None], out=self.by_group)

    def send(self, duration: float, cross: float) -> np.ndarray:
        """Send the next chunk, issued now; its end in each group."""
        np.maximum(self.issued, self.by_group.max(axis=1), out=self.issued)
        begin = np.maximum(self.issued, self.channel)
        if cross and len(self.channel) > 1:
            local = begin + (duration - cross)
            start = float(local.max())
            self.channel[:] = start + cross
            for g in range(len(begin)):
                self._busy(g, begin[g], local[g])
                self._busy(g, start, self.channel[g])
        else:
            self.channel = begin + duration
            for g in range(len(begin)):
                self._busy(g, begin[g], self.channel[g])
        return self.channel.copy()

    def _busy(self, g: int, start: float, end: float) -> None:
        if self.machines:
            self.busy_start[g].append(start)
            self.busy_end[g].append(end)

    def nothing(self) -> np.ndarray:
        """A bucket's end in each group before any of its chunks is sent."""
        return np.zeros(len(self.channel))

    later = staticmethod(np.maximum)  # of two such ends, group by group


class _OneChannel(_Ranks):
    """:class:`_Ranks` of one group, its channel's times plain floats: the same arithmetic (IEEE max and
    sums), without an array operation per chunk (a rank model of a traced run sends 10^5 of them)."""

    def __init__(self, ranks: int, interference: float) -> None:
        super().__init__(ranks, 1, interference)
        self.issued, self.channel = 0.0, 0.0

    def wait(self, until: float) -> None:
        np.maximum(self.t, until, out=self.t)

    def send(self, duration: float, cross: float) -> float:
        self.issued = max(self.issued, float(self.t.max()))
        begin = max(self.issued, self.channel)
        self.channel = begin + duration
        self._busy(0, begin, self.channel)
        return self.channel

    def nothing(self) -> float:
        return 0.0

    later = staticmethod(max)


def run_ranks(program: StepProgram, model: RankModel, *, max_steps: int | None = None) -> RankRun:
    """Run ``program`` on ``model.ranks`` ranks (see the module docstring); a lag of 0 settles a bucket
    on this step's collectives (``barrier``).

    Raises:
        UnitError: ranks that do not split into the program's groups (one rank stands for every group).
    """
    work, settle, update = np.asarray(program.work, float), program.settle, np.asarray(program.update, float)
    groups = program.groups if model.ranks > 1 else 1
    if model.ranks % groups:
        raise UnitError(f"{model.ranks} ranks do not split into the plan's {groups} replicas: give the rank model a "
                        f"multiple of {groups} ranks")
    if max_steps is None:
        max_steps = min(4000, max(MAX_RANK_STEPS, _CHEAP_STEPS // max(1, (len(work) + len(update)) * model.ranks)))
    chunk_ready, chunk_bucket, chunk_time = program.chunk_ready, program.chunk_bucket, program.chunk_time
    cross = program.chunk_cross or [0.0] * len(chunk_time)
    n, num_chunks, num_buckets = len(work), len(chunk_time), len(update)
    lag = program.lag or [1] * num_buckets
    rng = np.random.default_rng(model.seed)
    s_op, s_step = lognormal_sigma(model.op_spread), lognormal_sigma(model.step_spread)
    scale = np.asarray(model.rank_scale, float) if model.rank_scale else None
    ranks = _Ranks(model.ranks, groups, program.interference) if groups > 1 else \
        _OneChannel(model.ranks, program.interference)
    never = ranks.nothing()
    history: list[list] = []
    clocks = _Clocks()
    starts = _segments(n, settle, chunk_ready)
    for step in range(max_steps):
        f = np.exp(s_op * rng.standard_normal((n + num_buckets, model.ranks)) + s_step * rng.standard_normal(model.ranks)
                   - (s_op * s_op + s_step * s_step) / 2)  # mean 1
        if scale is not None:
            f *= scale
        w = np.add.reduceat(work[:, None] * f[:n], starts, axis=0) if n else f[:0]
        u = update[:, None] * f[n:]
        done = [ranks.nothing() for _ in range(num_buckets)]
        c = 0
        for s, j in enumerate([-1, *starts, n]):  # the segment starting at j (-1: before the step's work)
            for k in settle.get(j, ()) if j >= 0 else ():
                if lag[k] and not step:
                    continue
                ranks.wait(done[k] if lag[k] == 0 else history[-lag[k]][k] if len(history) >= lag[k] else never)
                ranks.run(u[k])
            if j == n:
                break
            if j >= 0:
                ranks.run(w[s - 1])
            last = starts[s] - 1 if s < len(starts) else n - 1  # the segment's last position
            while c < num_chunks and chunk_ready[c] <= last:  # issued by the last rank, FIFO
                k = chunk_bucket[c]
                done[k] = ranks.later(done[k], ranks.send(chunk_time[c], cross[c]))
                c += 1
        history = [*history[-1:], done]
        if clocks.add(float(ranks.t.mean())):
            break
    periods = _periods(clocks.clocks)
    return RankRun(period=float(periods.mean()), steps=len(periods), stable=clocks.settled)


def _segments(n: int, settle, chunk_ready) -> list[int]:
    """Where the step's runs of positions start: at 0, at every position with a settle before it, and
    after every position that issues a chunk. A run's work is merged into one (exact: the stream's time
    warp is monotone and additive) and run with one call per step."""
    cuts = {0} | {j for j in settle if 0 < j < n} | {r + 1 for r in chunk_ready if 0 <= r + 1 < n}
    return sorted(cuts) if n else []


class _Clocks:
    """The ranks' mean clock at each step's end; :meth:`add` says when the mean period after the warm-up
    has a 95% interval within 1% of it (running sums: one step's check does not rescan the run)."""

    def __init__(self) -> None:
        self.clocks: list[float] = [0.0]
        self.count, self.total, self.squares = 0, 0.0, 0.0
        self.settled = False

    def add(self, clock: float) -> bool:
        self.clocks.append(clock)
        if len(self.clocks) > WARMUP_STEPS + 2:
            period = clock - self.clocks[-2]
            self.count, self.total, self.squares = self.count + 1, self.total + period, self.squares + period * period
        m = self.count
        if m >= _MIN_MEASURED:
            mean = self.total / m
            var = max(self.squares - self.total * mean, 0.0) / (m - 1)
            self.settled = mean > 0 and 1.96 * math.sqrt(var / m) <= STABLE * mean
        return self.settled


def _periods(clocks: list[float]) -> np.ndarray:
    """The step periods after the warm-up (every period, if the run was shorter than that)."""
    return np.diff(clocks[WARMUP_STEPS + 1:]) if len(clocks) > WARMUP_STEPS + 2 else np.diff(clocks)


def simulate_ranks(problem: Problem, plan: Plan, model: RankModel) -> RankRun:
    """``plan``'s period on ``model``'s ranks; without variation, :func:`~schedopt.simulate.simulate`'s
    figure itself. A sharded plan runs its step as :func:`~schedopt.shard_sim.sharded_step_program`
    gives it (FSDP2 has no cross-step overlap: every collective settles within its step).

    Raises:
        InvalidPlanError: a plan that does not fit the graph.
    """
    if not model.varies:
        timeline = simulate(problem, plan)
        return RankRun(period=timeline.iteration_s, steps=timeline.num_steps, stable=timeline.converged is not False)
    validate(plan, problem.graph)
    if problem.mode == "sharded":
        return run_ranks(sharded_step_program(problem.graph, plan, problem.cluster), model)
    return run_ranks(step_program(problem, plan), model)


def period(problem: Problem, plan: Plan) -> float:
    """``plan``'s period on ``problem``'s ranks: :func:`simulate_ranks` on ``problem.rank_model`` (a problem
    without one: :func:`~schedopt.simulate.simulate`'s figure)."""
    if problem.rank_model is None:
        return simulated_period(problem, plan)
    return simulate_ranks(problem, plan, problem.rank_model).period
