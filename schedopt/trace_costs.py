"""Op costs from a profiler trace: the user's own hardware's times, put on an imported aten graph.

A trace's ops are matched to the graph's by kind and order within a step: the k-th ``aten::mm`` of
the backward in the trace is the graph's k-th backward ``aten.mm`` (engine order), for every kind the
graph has (outermost occurrences only: an ``aten::clone`` inside another is part of it; an op the
importer split in parts, a convolution's backward into its input- and weight-gradient halves, is one
traced ``aten::convolution_backward``, shared by the parts' FLOPs; a kind the graph knows by another
name is matched under it: cuDNN's BatchNorm, an in-place gradient sum). A trace op is forward before the
step's first ``autograd::engine`` event, backward after it, until the optimizer's span (on CUDA the
backward's ops are on the engine's device thread, not the training thread). On CUDA an op's time is
the device time of the kernels, copies and memsets it launched (by correlation: on an H200 the host
spans of gpt_tied's ops are launch times, several times its kernels'); on CPU the op's own span. Each matched graph op takes its
mean over the trace's steps, so that the ops add up to a step's mean compute (a median each fell
short where op times spike: gpt_tied's medians summed to 0.467 s, its means to 0.533, the traced
compute to 0.55); unmatched ops keep their estimates. How much the times vary, :func:`op_spread`.

Two things the traced times already hold, so that a prediction on them does not miss or count them twice:

- *Overhead*: the traced compute no matched op accounts for (the autograd engine, DDP's hooks, ops the
  graph lacks: 4-6% of ResNet-18's and gpt_tied's traced steps) runs between the ops, so the matched
  ops are scaled up until the graph's forward and backward add up to the traced compute per step
  (``overhead`` in the graph's meta; never scaled down).
- *Interference*: the ops ran beside the run's own collectives, so whatever slowdown gloo's threads
  (or NCCL's kernels) cause is in their times. On eleven testbed trace sets an op that overlapped a
  collective took about as long as the same op in a step where it did not (pooled ratios 0.4-1.3,
  no consistent excess), so the slowdown is not tied to the overlap and is not added again: the graph's
  meta says ``interference_in_op_times`` and :class:`~schedopt.problem.Problem` simulates such a graph
  with no interference, whatever the cluster's. (Adding the calibrated interference on top predicted
  ResNet-18's DDP step up to +10.8% over the measured; without it, and with the overhead, -7.8% to
  +1.5% over those sets.)

The report says how much was matched: the share of the graph's compute ops, and the share of the
traced steps' compute time the matched ops explain.
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cost import overhead_scale
from .errors import TraceError
from .graph import TrainGraph
from .intervals import length, union
from .kineto import DEVICE_COPIES, Span, host_steps, span_of, trace_events
from .orders import engine_order

__all__ = ["TraceCosts", "trace_costs"]

#: The parts an importer splits one op into (:mod:`schedopt.backward`): one traced op ran them all.
SPLIT_PARTS = ("grad_input", "grad_weight")
#: A traced kind the graph knows by another name: eager BatchNorm on CUDA is cuDNN's (MIOpen's on ROCm),
#: where the importer's trace holds ``native_batch_norm``.
TRACE_ALIASES = {"aten.cudnn_batch_norm": "aten.native_batch_norm",
                 "aten.cudnn_batch_norm_backward": "aten.native_batch_norm_backward",
                 "aten.miopen_batch_norm": "aten.native_batch_norm",
                 "aten.miopen_batch_norm_backward": "aten.native_batch_norm_backward"}


@dataclass(frozen=True, slots=True)
class TraceCosts:
    """The graph with the trace's op times, and how much of it they cover."""

    graph: TrainGraph
    matched_ops: int
    graph_ops: int
    explained_share: float  # of the traced steps' compute time, what the matched ops account for
    steps: int
    op_spread: float = 0.0  # the matched ops' pooled coefficient of variation over the steps (op_spread())
    overhead: float = 0.0  # how much the matched ops were scaled up to add up to the traced compute
    compute_s: float = 0.0  # the traced compute per step (mean), before the optimizer: the training thread's
    # busy time on CPU, the device's on CUDA

    def describe(self) -> str:
        return (f"trace costs: {self.matched_ops} of {self.graph_ops} ops matched ({self.matched_ops / self.graph_ops:.0%}),"
                f" explaining {self.explained_share:.0%} of the traced compute over {self.steps} step(s); "
                f"{self.graph_ops - self.matched_ops} keep their estimates; the matched ops take the rest of the "
                f"traced compute (+{self.overhead:.1%}); op times vary {self.op_spread:.0%} from step to step")


def _outermost(spans: list[tuple[str, float, float, Any]]) -> list[tuple[str, float, float, Any]]:
    """Spans not inside another span of the same name (a nested same-kind op is part of its parent)."""
    out, open_until = [], {}
    for name, start, end, extra in sorted(spans, key=lambda s: (s[1], -s[2])):
        if open_until.get(name, float("-inf")) >= end:
            continue
        open_until[name] = end
        out.append((name, start, end, extra))
    return out


def _when(launch: tuple[float, Any]) -> float:
    return launch[0]


class _Clock:
    """How long a traced op took: on CPU its own span; on CUDA the device time of the kernels, copies
    and memsets it launched (``cudaLaunchKernel`` and the like, paired with the device's events by
    ``correlation``; NCCL's kernels are communication, not the op's)."""

    def __init__(self, events: list[dict]) -> None:
        device: dict[Any, list[tuple[float, float]]] = {}
        for e in events:
            if e.get("cat") in ("kernel", *DEVICE_COPIES) and not str(e.get("name", "")).lower().startswith("nccl"):
                corr, span = (e.get("args") or {}).get("correlation"), span_of(e)
                if corr is not None and span is not None:
                    device.setdefault(corr, []).append((span.start, span.end))
        self.cuda = bool(device)
        self.launches: dict[Any, list[tuple[float, list[tuple[float, float]]]]] = {}  # tid -> [(when, spans)]
        for e in events:
            if e.get("cat") in ("cuda_runtime", "cuda_driver"):
                corr, span = (e.get("args") or {}).get("correlation"), span_of(e)
                if corr in device and span is not None:
                    self.launches.setdefault(e.get("tid"), []).append((span.start, device[corr]))
        for launches in self.launches.values():
            launches.sort(key=_when)

    def device_spans(self, tid: Any, start: float, end: float) -> list[tuple[float, float]]:
        """The device's spans of what thread ``tid`` launched between ``start`` and ``end``."""
        launches = self.launches.get(tid, [])
        lo, hi = bisect.bisect_left(launches, start, key=_when), bisect.bisect_right(launches, end, key=_when)
        return [s for _, spans in launches[lo:hi] for s in spans]

    def took(self, tid: Any, span: Span) -> float:
        if not self.cuda:
            return span.end - span.start
        return sum(b - a for a, b in self.device_spans(tid, span.start, span.end))


def _step_ops(events: list[dict], window: tuple[float, float], tid: Any, clock: _Clock) -> tuple[dict, float]:
    """{(kind, phase): [duration, ...] in order} of one step's aten ops, and its compute time.

    The forward's ops are the training thread's; the backward's run where the autograd engine runs
    them: the training thread on CPU, the engine's device thread on CUDA (the threads with
    ``autograd::engine`` spans). Compute: on CPU the training thread's busy time before the
    optimizer, on CUDA the device's busy time for what those threads launched before it."""
    inside = [(s, e.get("tid")) for e in events if e.get("cat") == "cpu_op"
              and (s := span_of(e)) is not None and window[0] <= s.start < window[1]]
    engine = [(s, t) for s, t in inside if s.name.startswith("autograd::engine")]
    backward = min((s.start for s, _ in engine), default=window[1])
    threads = {tid} | {t for _, t in engine}
    optimizer = min((s.start for s, t in inside if t == tid and s.name.startswith("Optimizer.")), default=window[1])
    out: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for thread in threads:
        aten = [(s.name.replace("::", ".", 1), s.start, s.end, s) for s, t in inside
                if t == thread and s.name.startswith("aten::") and s.start < optimizer]
        for kind, start, _, span in _outermost(aten):
            phase = "backward" if start >= backward else "forward" if thread == tid else None
            if phase is not None:
                out.setdefault((kind, phase), []).append((start, clock.took(thread, span)))
    ordered = {key: [took for _, took in sorted(v)] for key, v in out.items()}
    if clock.cuda:
        busy = [d for t in threads for d in clock.device_spans(t, window[0], optimizer)]
    else:
        busy = [(s.start, s.end) for s, t in inside if t == tid and s.start < optimizer]
    return ordered, length(union(busy))


def _aligned(ops: dict[tuple[str, str], list[float]], graph_keys: Any) -> dict[tuple[str, str], list[float]]:
    """The traced ops under the graph's names where the graph lacks the traced kind: an alias
    (:data:`TRACE_ALIASES`), or the out-of-place kind of an in-place op (the engine's gradient sums
    are ``add_`` on CUDA, ``add`` in the importer's trace), where the trace has no op of that name."""
    out: dict[tuple[str, str], list[float]] = {}
    for (kind, phase), times in ops.items():
        if (kind, phase) not in graph_keys:
            alias = TRACE_ALIASES.get(kind) or (kind[:-1] if kind.endswith("_") else None)
            if alias is not None and (alias, phase) in graph_keys and (alias, phase) not in ops:
                kind = alias
        out.setdefault((kind, phase), times)
    return out


def _graph_ops_by_kind(graph: TrainGraph) -> dict[tuple[str, str], list[list[tuple[str, float]]]]:
    """{(kind, phase): [unit, ...] in engine order}: a unit is the graph's ops one traced op ran, each with
    its share of the op's time: one op, or the parts of one the importer split (a convolution's backward
    into ``.grad_input`` and ``.grad_weight``, of kind ``aten.convolution_backward``), shared by FLOPs."""
    by_kind: dict[tuple[str, str], list[list[tuple[str, float]]]] = {}
    last: dict[tuple[str, str], str] = {}  # the node of each kind's last unit
    for op_id in engine_order(graph):
        op = graph.ops[op_id]
        if op.phase not in ("forward", "backward"):
            continue
        base, _, part = op.kind.rpartition(".")
        split = part in SPLIT_PARTS and op_id.endswith("." + part)
        key, node = ((base, op.phase), op_id.rpartition(".")[0]) if split else ((op.kind, op.phase), op_id)
        units = by_kind.setdefault(key, [])
        if split and units and last.get(key) == node:
            units[-1].append((op_id, 0.0))
        else:
            units.append([(op_id, 0.0)])
        last[key] = node
    for units in by_kind.values():
        for k, unit in enumerate(units):
            weights = [graph.ops[o].flops for o, _ in unit]
            weights = weights if sum(weights) > 0 else [1.0] * len(unit)
            units[k] = [(o, w / sum(weights)) for (o, _), w in zip(unit, weights)]
    return by_kind


def trace_costs(graph: TrainGraph, path: str | Path) -> TraceCosts:
    """``graph`` with the op times of the trace at ``path`` (a CPU trace of the same model's training).

    Raises:
        TraceError: not a trace, no steps, or no op of the graph's kinds in it.
    """
    data = trace_events(Path(path))
    events = [e for e in data["traceEvents"] if isinstance(e, dict)]
    steps = host_steps(events)
    if not steps:
        raise TraceError(f"trace file {str(path)!r} has no ProfilerStep#N spans to take op times from")
    by_kind = _graph_ops_by_kind(graph)
    clock = _Clock(events)
    samples: dict[str, list[float]] = {}
    compute, explained = 0.0, 0.0
    for _, span, tid in steps:
        ops, busy = _step_ops(events, (span.start, span.end), tid, clock)
        ops = _aligned(ops, by_kind)
        compute += busy
        for key, units in by_kind.items():
            for unit, took in zip(units, ops.get(key, [])):
                for op_id, share in unit:
                    samples.setdefault(op_id, []).append(took * share)
                explained += took
    if not samples:
        raise TraceError(f"trace file {str(path)!r} has no op of the graph's kinds (aten ops of {graph.name!r}); "
                         "is it a trace of this model's training?")
    durations = {op_id: statistics.fmean(v) for op_id, v in samples.items()}
    compute_s = compute / len(steps)
    scale = overhead_scale(graph, durations, compute_s)
    durations = {op_id: d * scale for op_id, d in durations.items()}
    spread = op_spread(samples)
    traced = graph.with_durations(durations, meta={"costs": f"trace {Path(path).name}", "op_spread": spread,
                                                   "overhead": scale - 1, "interference_in_op_times": True})
    return TraceCosts(graph=traced, matched_ops=len(durations), graph_ops=sum(len(u) for units in by_kind.values()
                                                                              for u in units),
                      explained_share=explained / compute if compute > 0 else 0.0, steps=len(steps),
                      op_spread=spread, overhead=scale - 1, compute_s=compute_s)


def op_spread(samples: dict[str, list[float]]) -> float:
    """The ops' coefficient of variation over the traced steps, pooled by time: the root of the
    time-weighted mean of each op's squared CV (ops seen in one step only do not count)."""
    weighted = [(m, statistics.stdev(v) / m) for v in samples.values()
                if len(v) > 1 and (m := statistics.fmean(v)) > 0]
    total = sum(m for m, _ in weighted)
    return math.sqrt(sum(m * cv * cv for m, cv in weighted) / total) if total > 0 else 0.0
