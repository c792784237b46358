"""Reading torch.profiler traces (Chrome / Kineto JSON): one rank's steps, compute, collectives.

What is read, per trace (one rank's):

- steps: the ``ProfilerStep#N`` spans on the host (``torch.profiler`` with a schedule and
  ``prof.step()``); the thread they are on is the training thread. On CUDA the trace also holds
  each step as a ``gpu_user_annotation`` on the device's timeline, which is not the step's time (on
  an H200 ResNet-18's steps were 28-30 ms on the host, their device annotations 0.25 ms) and is not read;
- on CUDA (the trace has ``kernel`` events): compute is every kernel but NCCL's and the device's
  copies and memsets (``gpu_memcpy``, ``gpu_memset``); communication the ``nccl*`` kernels on
  their streams, each issued by the CPU launch with the same ``correlation``. A step's compute is
  the device's busy time inside the host's step span (at world size 1 NCCL launches no kernel);
- on CPU: compute is the training thread's ``cpu_op`` events but the collectives' own
  (``c10d::*``, ``record_param_comms``), communication the backend's spans on its worker threads
  (``gloo:*``), issued by the training thread's ``c10d::*`` ops, matched in order (schedopt's gloo
  channel issues from a thread of its own: there the issue is where the training thread queued the
  collective, a ``schedopt::queue_all_reduce`` span; the gloo spans need ``profile_all_threads``);
- a collective's bytes from its arguments where the trace has them (``Input Dims`` and type, with
  ``record_shapes``; Kineto's ``In msg nelems`` and ``dtype``).

Times are seconds from the trace's own clock. Anything that is not such a trace is refused with
:class:`~schedopt.errors.TraceError` and one line saying what is wrong.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import TraceError
from .io import read_json

__all__ = ["Span", "Collective", "RankTrace", "host_steps", "load_trace", "load_traces", "span_of", "trace_events",
           "trace_files"]

STEP = re.compile(r"ProfilerStep#(\d+)$")
ISSUE_PREFIXES = ("c10d::", "record_param_comms")
COMM_PREFIXES = ("gloo:", "nccl:")
#: Spans where the training thread queued a collective that another thread runs (schedopt's gloo channel).
QUEUE_PREFIXES = ("schedopt::queue",)
#: Device events on CUDA that are neither kernels nor communication: copies and memsets.
DEVICE_COPIES = ("gpu_memcpy", "gpu_memset")
DTYPE_BYTES = {"float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "c10::half": 2,
               "bfloat16": 2, "c10::bfloat16": 2, "long": 8, "int64": 8, "int": 4, "int32": 4, "byte": 1,
               "uint8": 1, "char": 1, "int8": 1, "bool": 1, "short": 2, "int16": 2, "Float": 4, "Half": 2,
               "BFloat16": 2, "Double": 8, "Long": 8, "Int": 4}


@dataclass(frozen=True, slots=True)
class Span:
    """One event: its name, start and end (s)."""

    name: str
    start: float
    end: float


@dataclass(slots=True)
class Collective:
    """One collective: its kind, when it was issued, when it ran, and its bytes (None where unknown)."""

    name: str
    issue: float
    start: float
    end: float
    nbytes: int | None = None


@dataclass(slots=True)
class RankTrace:
    """One rank's trace: its steps ``{N: (start, end)}``, compute spans and collectives."""

    path: str
    rank: int | None
    world_size: int | None
    device: str  # "cuda" or "cpu"
    steps: dict[int, tuple[float, float]] = field(default_factory=dict)
    #: the ranks of a DeviceMesh's shard dimension (FSDP2's process group named ``mesh_*shard*`` in the
    #: trace's ``pg_config``), or None where the trace names none
    shard_group: int | None = None
    #: the mesh dimensions of other parallelism the trace names (``mesh_tp``, ``mesh_dp_shard_cp``, ...)
    model_parallel: tuple[str, ...] = ()
    compute: list[Span] = field(default_factory=list)
    collectives: list[Collective] = field(default_factory=list)


def trace_events(path: Path) -> dict[str, Any]:
    """A trace file's JSON object, refused with one line where it is not a Chrome/Kineto trace."""
    if path.suffix == ".gz":
        try:
            data = json.loads(gzip.decompress(path.read_bytes()))
        except (OSError, EOFError, ValueError) as exc:
            raise TraceError(f"trace file {str(path)!r} is not a gzipped JSON trace: {exc}") from None
    else:
        data = read_json(path, what="trace", error=TraceError)
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"trace file {str(path)!r} is not a Chrome/Kineto trace (no traceEvents list)")
    return data


def span_of(e: dict[str, Any]) -> Span | None:
    """A complete ("X") event as a span in seconds; None for any other or a malformed one."""
    ts, dur = e.get("ts"), e.get("dur")
    if e.get("ph") != "X" or not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
        return None
    if not (math.isfinite(ts) and math.isfinite(dur)) or dur < 0:
        return None
    return Span(str(e.get("name", "")), ts * 1e-6, (ts + dur) * 1e-6)


def _nbytes(args: dict[str, Any]) -> int | None:
    """A collective's bytes from its event's arguments, where they are there."""
    if isinstance(args.get("In msg nelems"), (int, float)) and str(args.get("dtype", "")) in DTYPE_BYTES:
        return int(args["In msg nelems"]) * DTYPE_BYTES[str(args["dtype"])]
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not dims or not isinstance(types, list) or not types:
        return None
    first = dims[0]
    while isinstance(first, list) and first and isinstance(first[0], list):
        first = first[0]  # a TensorList: its first tensor
    kind = str(types[0])
    size = DTYPE_BYTES.get(kind, 4 if kind == "TensorList" else None)
    if size is None or not isinstance(first, list) or not all(isinstance(d, int) for d in first):
        return None
    return math.prod(first) * size


def host_steps(events: list[dict[str, Any]]) -> list[tuple[int, Span, Any]]:
    """(N, span, thread) of each ``ProfilerStep#N`` on the host (on CUDA the trace also holds each step
    as a ``gpu_user_annotation``, its kernels' extent on the device: not the step)."""
    return [(int(m.group(1)), s, e.get("tid")) for e in events
            if (m := STEP.match(str(e.get("name", "")))) and e.get("cat") != "gpu_user_annotation"
            and (s := span_of(e)) is not None]


def load_trace(path: str | Path) -> RankTrace:
    """Read one rank's trace (see the module docstring).

    Raises:
        TraceError: not JSON, truncated, not a trace, or a trace without ``ProfilerStep#N`` spans.
    """
    path = Path(path)
    data = trace_events(path)
    info = data.get("distributedInfo") if isinstance(data.get("distributedInfo"), dict) else {}
    events = [e for e in data["traceEvents"] if isinstance(e, dict)]
    steps = host_steps(events)
    if not steps:
        raise TraceError(f"trace file {str(path)!r} has no ProfilerStep#N spans: profile with a schedule "
                         "(torch.profiler.schedule) and call prof.step() after every step")
    cuda = any(e.get("cat") == "kernel" for e in events)
    trace = RankTrace(path=str(path), rank=info.get("rank"), world_size=info.get("world_size"),
                      device="cuda" if cuda else "cpu", steps={n: (s.start, s.end) for n, s, _ in steps},
                      shard_group=mesh_shard_size(info), model_parallel=model_parallel_dims(info))
    (_read_cuda if cuda else _read_cpu)(trace, events, main_tid=steps[0][2])
    return trace


#: the words of a mesh dimension's name that mean parallelism other than data parallelism (torchtitan's)
MODEL_PARALLEL = frozenset({"tp", "pp", "cp", "ep", "etp"})


def _mesh_groups(info: dict[str, Any]) -> list[tuple[list[str], int]]:
    """The trace's DeviceMesh process groups: each dimension name's words, and its size. torch names a
    mesh dimension's group ``mesh_<dimension name>`` in ``distributedInfo.pg_config``; a dimension over
    the whole world reuses the default group and is not listed."""
    groups = info.get("pg_config") if isinstance(info.get("pg_config"), list) else []
    return [(g["pg_desc"][len("mesh_"):].split("_"), g["pg_size"]) for g in groups
            if isinstance(g, dict) and isinstance(g.get("pg_desc"), str) and g["pg_desc"].startswith("mesh_")
            and isinstance(g.get("pg_size"), int) and not isinstance(g["pg_size"], bool) and g["pg_size"] >= 1]


def mesh_shard_size(info: dict[str, Any]) -> int | None:
    """The size of a DeviceMesh's shard dimension in a trace's ``distributedInfo`` (``mesh_shard``,
    torchtitan's ``mesh_dp_shard``), or None where it names none (:func:`_mesh_groups`)."""
    sizes = [n for words, n in _mesh_groups(info) if "shard" in words and not MODEL_PARALLEL & set(words)]
    return min(sizes) if sizes else None


def model_parallel_dims(info: dict[str, Any]) -> tuple[str, ...]:
    """The mesh dimensions of other parallelism a trace names (tensor, pipeline, context, expert)."""
    return tuple(sorted("_".join(words) for words, _ in _mesh_groups(info) if MODEL_PARALLEL & set(words)))


def _pair(issues: list[tuple[Span, dict]], comms: list[tuple[Span, dict]]) -> list[Collective]:
    """Each communication span with the issue it ran for, in order (a process group runs its collectives
    in issue order); an issue left over where there are more issues than spans (a collective the backend
    did not trace) is skipped when the next one also came before the span."""
    issues = sorted(issues, key=lambda i: i[0].start)
    comms = sorted(comms, key=lambda c: c[0].start)
    out, k = [], 0
    for j, (span, args) in enumerate(comms):
        spare = (len(issues) - k) - (len(comms) - j)
        while spare > 0 and k + 1 < len(issues) and issues[k + 1][0].start <= span.start:
            k, spare = k + 1, spare - 1
        issue, issue_args = issues[k] if k < len(issues) and issues[k][0].start <= span.start else (span, {})
        if issue is not span:
            k += 1
        nbytes = _nbytes(args)
        out.append(Collective(name=span.name, issue=issue.start, start=span.start, end=span.end,
                              nbytes=nbytes if nbytes is not None else _nbytes(issue_args)))
    return out


def _read_cpu(trace: RankTrace, events: list[dict[str, Any]], main_tid: Any) -> None:
    issues, comms = [], []
    for e in events:
        span = span_of(e)
        if span is None:
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        on_main = e.get("tid") == main_tid
        if on_main and e.get("cat") == "cpu_op":
            if span.name.startswith(ISSUE_PREFIXES):
                if span.name.startswith("c10d::"):
                    issues.append((span, args))
            else:
                trace.compute.append(span)
        elif on_main and span.name.startswith(QUEUE_PREFIXES):
            issues.append((span, args))
        elif not on_main and span.name.startswith(COMM_PREFIXES):
            comms.append((span, args))
    trace.collectives = _pair(issues, comms)


def _read_cuda(trace: RankTrace, events: list[dict[str, Any]], main_tid: Any) -> None:
    launches: dict[Any, Span] = {}
    comm_ops: list[tuple[Span, dict]] = []
    kernels = []
    for e in events:
        span = span_of(e)
        if span is None:
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            launches[args["correlation"]] = span
        elif e.get("cat") == "cpu_op" and span.name.startswith(ISSUE_PREFIXES):
            comm_ops.append((span, args))
        elif e.get("cat") == "kernel":
            kernels.append((span, args))
        elif e.get("cat") in DEVICE_COPIES:  # the device's own work too (DDP's bucket copies, say)
            trace.compute.append(span)
    for span, args in kernels:
        if not span.name.lower().startswith("nccl"):
            trace.compute.append(span)
            continue
        launch = launches.get(args.get("correlation"), span)
        nbytes = _nbytes(args)
        if nbytes is None:  # the collective's op around its launch
            around = [a for s, a in comm_ops if s.start <= launch.start <= s.end]
            nbytes = next((n for a in around if (n := _nbytes(a)) is not None), None)
        trace.collectives.append(Collective(name=span.name, issue=launch.start, start=span.start, end=span.end,
                                            nbytes=nbytes))
    trace.collectives.sort(key=lambda c: c.start)


def trace_files(paths: list[str]) -> list[Path]:
    """The trace files named: files as given, directories' ``*.json`` and ``*.json.gz``, in name order."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted([*p.glob("*.json"), *p.glob("*.json.gz")])
            if not found:
                raise TraceError(f"{str(p)!r} holds no trace files (*.json, *.json.gz)")
            out += found
        else:
            out.append(p)
    return out


def load_traces(paths: list[str]) -> list[RankTrace]:
    """Every rank's trace of one run, by rank.

    Raises:
        TraceError: a file is not a trace; two traces of one rank; traces of different runs (other
            world sizes, or no step in common).
    """
    traces = [load_trace(p) for p in trace_files(paths)]
    for k, t in enumerate(traces):
        if t.rank is None:
            t.rank = k
    ranks: dict[int, str] = {}
    for t in traces:
        if t.rank in ranks:
            raise TraceError(f"two traces of rank {t.rank} ({ranks[t.rank]} and {t.path}): pass one run's traces")
        ranks[t.rank] = t.path
    if len({t.world_size for t in traces}) > 1:
        raise TraceError("the traces are of different runs (world sizes "
                         f"{sorted({str(t.world_size) for t in traces})}): pass one run's traces")
    if len({t.shard_group for t in traces}) > 1:
        raise TraceError("the traces are of different runs (shard groups of "
                         f"{sorted({str(t.shard_group) for t in traces})} ranks): pass one run's traces")
    if not set.intersection(*(set(t.steps) for t in traces)):
        raise TraceError("the traces are of different runs (no ProfilerStep number in common): pass one run's traces")
    return sorted(traces, key=lambda t: t.rank)
