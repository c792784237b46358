"""What a profiled run exposes: per step and rank, compute, communication, and what the overlap hid.

From each rank's trace (:mod:`schedopt.kineto`), per ``ProfilerStep#N``:

- ``compute_s``: the union of compute (the training thread's ops on CPU; kernels on CUDA);
- ``comm_s``: the union of collectives in the step (the backend's spans on CPU; NCCL kernels on
  CUDA), a collective begun in the step before included (an overlap plan's forward waits for those);
- ``exposed_comm_s``: communication no compute covers; ``overlap_share``: hidden communication over
  communication, as Holistic Trace Analysis defines its comm-comp overlap;
- ``limit_s = max(compute, comm)``, what a perfect overlap would leave, and ``lost_s``, what the step
  spent beyond it;
- per collective, in the step it began in: issue, start, end (s from the step's start), bytes, hidden and exposed time, and
  where it was exposed, why: ``queued`` (it started well after its issue: the link was busy with the
  ones before it), ``late gradient`` (less compute was left after its issue than it took: its last
  gradient came late), ``waited for`` (the op after it started only when it ended: the step waited).

Example (two ranks' traces, ``examples/train.py --profile DIR``):
    >>> report = diagnose(load_traces(["run/"]))  # doctest: +SKIP
    >>> report.to_json()["steps"][0]["overlap_share"]  # doctest: +SKIP
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from .errors import SchedoptError
from .intervals import clip, covered, covered_union, length, uncovered, union
from .kineto import Collective, RankTrace

__all__ = ["DIAGNOSIS_SCHEMA", "HOST_BOUND_SHARE", "CollectiveRow", "StepRow", "Diagnosis", "diagnose", "format_report",
           "plot_step", "collective_kind", "sharded_collectives", "is_sharded"]

DIAGNOSIS_SCHEMA = "schedopt.diagnosis/1"
#: exposure below this (s) is noise, not a finding
EPSILON_S = 1e-4


@dataclass(slots=True)
class CollectiveRow:
    name: str
    issue_s: float
    start_s: float
    end_s: float
    nbytes: int | None
    hidden_s: float
    exposed_s: float
    reasons: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "issue_s": self.issue_s, "start_s": self.start_s, "end_s": self.end_s,
                "bytes": self.nbytes, "hidden_s": self.hidden_s, "exposed_s": self.exposed_s, "reasons": self.reasons}


@dataclass(slots=True)
class StepRow:
    rank: int
    step: int
    step_s: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    collectives: list[CollectiveRow] = field(default_factory=list)

    @property
    def overlap_share(self) -> float | None:
        return None if self.comm_s <= 0 else (self.comm_s - self.exposed_comm_s) / self.comm_s

    @property
    def limit_s(self) -> float:
        return max(self.compute_s, self.comm_s)

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "step": self.step, "step_s": self.step_s, "compute_s": self.compute_s,
                "comm_s": self.comm_s, "exposed_comm_s": self.exposed_comm_s, "overlap_share": self.overlap_share,
                "limit_s": self.limit_s, "lost_s": self.step_s - self.limit_s,
                "collectives": [c.to_json() for c in self.collectives]}


@dataclass(slots=True)
class Diagnosis:
    """Every rank's steps, and the traces they came from."""

    device: str
    world_size: int | None
    files: list[str]
    steps: list[StepRow]
    #: the ranks of the traced DeviceMesh's shard dimension (:func:`.kineto.mesh_shard_size`), if named
    shard_group: int | None = None
    #: the traced mesh's dimensions of other parallelism (:func:`.kineto.model_parallel_dims`)
    model_parallel: tuple[str, ...] = ()

    def check_data_parallel(self) -> None:
        """Raise SchedoptError where the traces name mesh dimensions of other parallelism: the what-ifs
        plan data parallelism only."""
        if self.model_parallel:
            raise SchedoptError(f"the traces are of a run with other parallelism besides data parallelism "
                                f"(mesh dimensions {', '.join(self.model_parallel)}): schedopt plans data "
                                "parallelism only, and predicts no such run")

    @property
    def backend(self) -> str:
        """The traced run's collectives' backend: a CPU trace's ranks ran gloo, a CUDA trace's NCCL."""
        return "gloo" if self.device == "cpu" else "nccl"

    @property
    def replicas(self) -> int:
        """HSDP's replicas: the world over the traced shard group (1 where the trace names none)."""
        n, world = self.shard_group, self.world_size
        return world // n if n and world and n < world and world % n == 0 else 1

    def to_json(self) -> dict[str, Any]:
        median = {k: statistics.median(getattr(s, k) for s in self.steps)
                  for k in ("step_s", "compute_s", "comm_s", "exposed_comm_s", "limit_s")} if self.steps else {}
        return {"schema": DIAGNOSIS_SCHEMA, "device": self.device, "world_size": self.world_size,
                "shard_group": self.shard_group, "replicas": self.replicas,
                "model_parallel": list(self.model_parallel), "files": self.files, "median": median,
                "steps": [s.to_json() for s in self.steps]}


def collective_kind(name: str) -> str | None:
    """``all-gather`` or ``reduce-scatter`` for a traced collective of that kind (gloo's
    ``gloo:all_gather``, NCCL's ``ncclDevKernel_AllGather_...``), else None."""
    flat = name.lower().replace("_", "")
    return next((kind for kind, key in (("all-gather", "allgather"), ("reduce-scatter", "reducescatter"))
                 if key in flat), None)


def is_sharded(report: Diagnosis) -> bool:
    """Whether the traces are of a sharded run: all-gathers or reduce-scatters traced
    (:func:`sharded_collectives`), or a mesh of HSDP replicas (whose shard groups of one rank issue
    neither: FSDP2 all-reduces each unit's gradients across the replicas)."""
    return bool(sharded_collectives(report)) or report.replicas > 1


def sharded_collectives(report: Diagnosis) -> list[str]:
    """The names of the traced collectives only sharded runs (FSDP) issue (:func:`collective_kind`);
    none for a replicated run."""
    return sorted({c.name for s in report.steps for c in s.collectives if collective_kind(c.name)})


def _reasons(c: Collective, compute: list[tuple[float, float]], spans: list, window: tuple[float, float]) -> list[str]:
    out = []
    took = c.end - c.start
    if c.start - c.issue > max(0.1 * took, 1e-3):
        out.append(f"queued {1e3 * (c.start - c.issue):.1f} ms after its issue (the link was busy)")
    left = covered(compute, (c.issue, window[1]))
    if left < took:
        out.append(f"late gradient: {1e3 * left:.1f} ms of compute left after its issue, {1e3 * took:.1f} ms to send")
    after = [s for s in spans if c.end - 1e-4 <= s.start <= c.end + 2e-3 and s.start < window[1]]
    idle = covered(compute, (c.end - 1e-3, c.end)) < 0.5e-3  # nothing ran in the millisecond before it ended
    if after and idle:
        first = max(after, key=lambda s: s.end - s.start)  # the outermost op that began then
        out.append(f"waited for: {first.name} started when it ended")
    return out


def _step_row(trace: RankTrace, number: int, compute: list[tuple[float, float]]) -> StepRow:
    window = trace.steps[number]
    busy = union(clip(compute, window))
    # the step's communication is whatever ran in it (an overlap plan's step waits for collectives begun in the
    # step before); each collective is listed in the step it began in (a gloo span ends a little after the
    # work it traces completes: a DDP bucket's span runs past its step's end into the next one's forward)
    mine = [c for c in trace.collectives if window[0] <= c.start < window[1]]
    comm = union(clip([(c.start, c.end) for c in trace.collectives], window))
    hidden = covered_union(busy, comm)
    spans = sorted((s for s in trace.compute if window[0] <= s.start < window[1]), key=lambda s: s.start)
    row = StepRow(rank=trace.rank or 0, step=number, step_s=window[1] - window[0], compute_s=length(busy),
                  comm_s=length(comm), exposed_comm_s=length(comm) - hidden)
    for c in mine:
        shown = covered(busy, (c.start, min(c.end, window[1])))
        exposed = (min(c.end, window[1]) - c.start) - shown
        row.collectives.append(CollectiveRow(
            name=c.name, issue_s=c.issue - window[0], start_s=c.start - window[0], end_s=c.end - window[0],
            nbytes=c.nbytes, hidden_s=shown, exposed_s=exposed,
            reasons=_reasons(c, busy, spans, window) if exposed > EPSILON_S else []))
    return row


def diagnose(traces: list[RankTrace]) -> Diagnosis:
    """Per step (those every rank recorded) and rank: see the module docstring."""
    common = sorted(set.intersection(*(set(t.steps) for t in traces)))
    steps = []
    for t in traces:
        compute = union((s.start, s.end) for s in t.compute)
        steps += [_step_row(t, n, compute) for n in common]
    return Diagnosis(device=traces[0].device, world_size=traces[0].world_size, files=[t.path for t in traces],
                     steps=steps, shard_group=traces[0].shard_group, model_parallel=traces[0].model_parallel)


def format_report(report: Diagnosis) -> str:
    """The table a person reads: a line per step and rank, then every exposed collective and why."""
    head = (f"{'rank':>4} {'step':>5} {'step_ms':>8} {'compute':>8} {'comm':>8} {'exposed':>8} {'overlap':>8} "
            f"{'limit':>8} {'lost':>8}")
    mesh = f", HSDP: {report.replicas} replicas of {report.shard_group}" if report.replicas > 1 else ""
    lines = [f"{len(report.files)} trace(s), {report.device}, world size {report.world_size}{mesh}", head]
    for s in report.steps:
        share = "-" if s.overlap_share is None else f"{s.overlap_share:.1%}"
        lines.append(f"{s.rank:>4} {s.step:>5} {s.step_s * 1e3:8.1f} {s.compute_s * 1e3:8.1f} {s.comm_s * 1e3:8.1f} "
                     f"{s.exposed_comm_s * 1e3:8.1f} {share:>8} {s.limit_s * 1e3:8.1f} "
                     f"{(s.step_s - s.limit_s) * 1e3:8.1f}")
    lines += _exposed_lines(report)
    if (idle := _idle_line(report)) is not None:
        lines.append(idle)
    return "\n".join(lines)


#: The exposed collectives the text report lists one by one, the most exposed first (``--json``: all).
LISTED_EXPOSED = 12


def _exposed_lines(report: Diagnosis) -> list[str]:
    """Each kind of collective's exposed time per step, then the most exposed collectives and why."""
    exposed = [(s, c) for s in report.steps for c in s.collectives if c.exposed_s > EPSILON_S]
    if not exposed:
        return []
    kinds: dict[str, list[float]] = {}
    for _, c in exposed:
        kinds.setdefault(c.name, []).append(c.exposed_s)
    per_step = 1e3 / len(report.steps)  # ms per step and rank
    lines = ["exposed per step and rank, by collective: " + ", ".join(
        f"{name} {sum(times) * per_step:.1f} ms ({len(times) / len(report.steps):.1f} exposed)"
        for name, times in sorted(kinds.items(), key=lambda kv: -sum(kv[1])))]
    shown = sorted(exposed, key=lambda sc: -sc[1].exposed_s)[:LISTED_EXPOSED]
    which = f"the {len(shown)} most exposed of {len(exposed)}" if len(exposed) > len(shown) else "exposed collectives"
    lines.append(f"{which} (ms from the step's start):")
    for s, c in shown:
        size = "" if c.nbytes is None else f", {c.nbytes / 2**20:.1f} MiB"
        lines.append(f"  rank {s.rank} step {s.step}: {c.name} issued {c.issue_s * 1e3:.1f}, ran "
                     f"{c.start_s * 1e3:.1f}-{c.end_s * 1e3:.1f}{size}, {c.exposed_s * 1e3:.1f} exposed"
                     + (f": {'; '.join(c.reasons)}" if c.reasons else ""))
    return lines


#: A step whose device (or training thread) was busy for less than this share of it is bound elsewhere.
HOST_BOUND_SHARE = 0.5


def _idle_line(report: Diagnosis) -> str | None:
    """One line where the steps were mostly neither compute nor communication: what bounds the run is
    the host (Python, kernel launches, the data), and no communication schedule can help it."""
    if not report.steps:
        return None
    step, compute, comm = (statistics.median(getattr(s, k) for s in report.steps)
                           for k in ("step_s", "compute_s", "comm_s"))
    if step <= 0 or max(compute, comm) >= HOST_BOUND_SHARE * step:
        return None
    where = "the device" if report.device == "cuda" else "the training thread"
    return (f"{where} computed {compute * 1e3:.1f} ms and communicated {comm * 1e3:.1f} ms of each "
            f"{step * 1e3:.1f} ms step (medians): the host bounds this run (Python, kernel launches, data), "
            "not the network, and no schedule shortens what it does not cover")


def plot_step(report: Diagnosis, traces: list[RankTrace], path: Any) -> None:
    """One step (the median-length one of rank 0) of every rank: compute above, collectives below, the
    exposed part of each collective in red."""
    from .plots import pyplot, save_figure

    plt = pyplot()
    first = [s for s in report.steps if s.rank == report.steps[0].rank]
    chosen = sorted(first, key=lambda s: s.step_s)[len(first) // 2].step
    fig, axes = plt.subplots(len(traces), 1, figsize=(11, 1.6 + 1.1 * len(traces)), squeeze=False)
    for ax, trace in zip(axes[:, 0], traces):
        window = trace.steps[chosen]
        busy = union(clip([(s.start, s.end) for s in trace.compute], window))
        ax.broken_barh([(a - window[0], b - a) for a, b in busy], (10, 8), color="tab:blue")
        for c in trace.collectives:
            if c.start < window[1] and c.end > window[0]:
                ran = (max(c.start, window[0]), min(c.end, window[1]))
                ax.broken_barh([(ran[0] - window[0], ran[1] - ran[0])], (0, 8), color="tab:green")
                gaps = uncovered(busy, ran)
                ax.broken_barh([(a - window[0], b - a) for a, b in gaps], (0, 8), color="tab:red")
        ax.set_yticks([4, 14], ["comm", "compute"])
        ax.set_xlim(0, window[1] - window[0])
        ax.set_title(f"rank {trace.rank}, step {chosen}: exposed communication in red", fontsize=9)
    axes[-1, 0].set_xlabel("seconds from the step's start")
    save_figure(fig, path)

