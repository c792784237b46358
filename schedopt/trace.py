"""Export a timeline as a Chrome trace (chrome://tracing, Perfetto) or a Gantt chart."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Sequence

from .io import write_json_atomic
from .simulate import Event, Timeline
from .units import format_duration

__all__ = ["chrome_trace", "write_chrome_trace", "write_gantt", "write_gantt_comparison", "steady_window"]

_TRACKS = {"compute": 1, "comm": 2}
_TRACK_NAMES = {"compute": "compute stream", "comm": "network (all-reduce)"}


def chrome_trace(timeline: Timeline, *, name: str = "schedopt") -> dict[str, Any]:
    """Return the Trace Event Format dict: complete ("X") events in microseconds, one thread per track."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": name}},
    ]
    for track, tid in _TRACKS.items():
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": _TRACK_NAMES[track]}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": tid, "args": {"sort_index": tid}})
    for e in timeline.events:
        args: dict[str, Any] = {"step": e.step}
        if e.bucket is not None:
            args["bucket"] = e.bucket
        events.append({
            "name": e.name,
            "cat": e.category or e.track,
            "ph": "X",
            "pid": 1,
            "tid": _TRACKS[e.track],
            "ts": e.start_s * 1e6,
            "dur": (e.end_s - e.start_s) * 1e6,
            "args": args,
        })
    # sharded timelines: memory per rank as a counter track ("C" events), in MiB
    events += [{"name": "memory per rank (MiB)", "ph": "C", "pid": 1, "ts": t * 1e6,
                "args": {"parameters and gradients": level / 2**20}} for t, level in timeline.memory]
    other = {"mode": timeline.mode, "iteration_s": timeline.iteration_s, "lower_bound_s": timeline.lower_bound_s,
             "exposed_comm_s": timeline.exposed_comm_s}
    if timeline.peak_memory_bytes is not None:
        other.update(peak_memory_bytes=timeline.peak_memory_bytes, peak_memory_s=timeline.peak_memory_s)
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write_chrome_trace(timeline: Timeline, path: str | os.PathLike[str], *, name: str = "schedopt") -> None:
    """Write :func:`chrome_trace` to ``path`` (atomically)."""
    write_json_atomic(path, chrome_trace(timeline, name=name), indent=None)


_COLORS = {"forward": "#4C72B0", "backward": "#DD8452", "optimizer": "#55A868", "wait": "#DDDDDD"}
_COMM_COLORS = ("#8172B3", "#C44E52")
_STAGE2_COLOR = "#CCB974"  # osp: a collective the forward two steps on reads
_SHARD_COLORS = {"all-gather": "#8172B3", "reduce-scatter": "#C44E52"}  # sharded mode's collectives


def steady_window(timeline: Timeline, length_s: float) -> list[Event]:
    """The events of ``length_s`` of steady-state training, shifted to start at 0.

    A barrier timeline is one iteration, repeated back to back; an overlap
    timeline is cut from the start of its third-to-last simulated step.
    """
    if timeline.num_steps == 1:
        period = timeline.iteration_s
        copies = max(1, int(length_s // period) + 1) if period > 0 else 1
        return [replace(e, start_s=e.start_s + k * period, end_s=e.end_s + k * period)
                for k in range(copies) for e in timeline.events if e.start_s + k * period < length_s]
    step = max(timeline.num_steps - 3, 0)
    t0 = min(e.start_s for e in timeline.events if e.step == step and e.track == "compute")
    return [replace(e, start_s=max(e.start_s - t0, 0.0), end_s=e.end_s - t0) for e in timeline.events
            if e.end_s > t0 and e.start_s < t0 + length_s]


def _draw_gantt(ax: Any, timeline: Timeline, title: str, *, events: Sequence[Event] | None = None,
                xmax_s: float | None = None) -> None:
    """Draw one timeline's compute and network tracks on ``ax`` (``events``: a part of them)."""
    scale = 1e3
    rows = {"compute": 1.0, "comm": 0.0}
    for e in timeline.events if events is None else events:
        if e.track == "compute":
            color = _COLORS.get(e.category, "#999999")
        elif e.category in _SHARD_COLORS:
            color = _SHARD_COLORS[e.category]
        else:
            color = _STAGE2_COLOR if e.category == "allreduce-stage2" else _COMM_COLORS[(e.bucket or 0) % 2]
        ax.broken_barh([(e.start_s * scale, max(e.duration_s * scale, 1e-9))], (rows[e.track] - 0.4, 0.8),
                       facecolors=color, edgecolor="none")
    ax.set_yticks([1.0, 0.0], ["compute", "network"])
    ax.set_xlabel("time (ms)")
    if xmax_s is not None:
        ax.set_xlim(0, xmax_s * scale)
    summary = (f"{timeline.mode}: iteration {format_duration(timeline.iteration_s)}, "
               f"lower bound {format_duration(timeline.lower_bound_s)}, "
               f"exposed comm {format_duration(timeline.exposed_comm_s)}")
    ax.set_title(f"{title}  —  {summary}" if title else summary, fontsize=10)


def _legend(ax: Any, *, stage2: bool = False, sharded: bool = False) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(color=c, label=k) for k, c in _COLORS.items()]
    handles.append(Patch(color=_COMM_COLORS[0], label="all-reduce (alternate buckets)"))
    if stage2:
        handles.append(Patch(color=_STAGE2_COLOR, label="all-reduce, stage 2 (read two steps on)"))
    if sharded:
        handles = handles[:-1] + [Patch(color=c, label=k) for k, c in _SHARD_COLORS.items()]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=5, fontsize=8, frameon=False)


def write_gantt(timeline: Timeline, path: str | os.PathLike[str], *, title: str = "") -> None:
    """Draw the compute and network tracks as a Gantt chart PNG (needs the ``viz`` extra: matplotlib)."""
    from .plots import pyplot, save_figure

    plt = pyplot()  # says how to install matplotlib when it is missing
    if not timeline.memory:
        fig, ax = plt.subplots(figsize=(14, 3.2))
        _draw_gantt(ax, timeline, title)
        _legend(ax, stage2=_has_stage2(timeline))
        save_figure(fig, path)
        return
    fig, (ax, mem) = plt.subplots(2, 1, figsize=(14, 5.0), sharex=True, gridspec_kw={"height_ratios": [1.3, 1]})
    _draw_gantt(ax, timeline, title)
    _draw_memory(mem, timeline)
    _legend(mem, sharded=True)
    save_figure(fig, path)


def _draw_memory(ax: Any, timeline: Timeline) -> None:
    """The memory per rank over the step (a step curve), its peak marked."""
    times = [t * 1e3 for t, _ in timeline.memory] + [timeline.iteration_s * 1e3]
    levels = [b / 2**20 for _, b in timeline.memory]
    ax.step(times, levels + levels[-1:], where="post", color="#333333", linewidth=1.2)
    peak = timeline.peak_memory_bytes / 2**20
    ax.axhline(peak, color="#C44E52", linewidth=0.8, linestyle="--")
    ax.annotate(f"peak {peak:.0f} MiB", (timeline.peak_memory_s * 1e3, peak), textcoords="offset points",
                xytext=(4, -12), fontsize=8, color="#C44E52")
    ax.set_ylabel("MiB per rank")
    ax.set_xlabel("time (ms)")


def write_gantt_comparison(timelines: Sequence[tuple[str, Timeline]], path: str | os.PathLike[str]) -> None:
    """Draw several timelines one above the other on one time axis (e.g. DDP and the best plan):
    two steady-state steps of the slowest (:func:`steady_window`)."""
    from .plots import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(len(timelines), 1, figsize=(14, 2.6 * len(timelines) + 0.6), squeeze=False)
    length = 2 * max(t.iteration_s for _, t in timelines)  # two steady-state steps of the slowest
    for ax, (label, timeline) in zip(axes[:, 0], timelines):
        _draw_gantt(ax, timeline, label, events=steady_window(timeline, length), xmax_s=length)
    _legend(axes[-1, 0], stage2=any(_has_stage2(t) for _, t in timelines),
            sharded=any(t.mode == "sharded" for _, t in timelines))
    save_figure(fig, path)


def _has_stage2(timeline: Timeline) -> bool:
    return any(e.category == "allreduce-stage2" for e in timeline.events)
