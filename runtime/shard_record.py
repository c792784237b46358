"""What a sharded run did, step by step: each all-gather and reduce-scatter (and HSDP's all-reduce),
and the memory it held.

:func:`~schedopt.runtime.shard` gives every unit FSDP2's own collectives wrapped in a recording
shell (``set_custom_all_gather`` / ``set_custom_reduce_scatter``, FSDP2's documented way to supply
them): the shell calls ``all_gather_single`` / ``reduce_scatter_single`` exactly as FSDP2's
defaults do, and notes, by the host's clock from the step's start,

- when the collective was issued and when it ended. On CPU by the host's clock: a blocking call
  ended when it returned, an asynchronous one (FSDP2's all-gathers with ``async_unshard``) when its
  future completed. On CUDA a call returns as soon as its kernel is queued, so the host's clock says
  nothing: CUDA events are recorded on the stream FSDP2 issues on (its all-gather and
  reduce-scatter streams), before and after the call, and a step's times are the events' distances
  from an event recorded at the step's start, read without a synchronization once they have
  completed (:attr:`ShardRecorder.steps` waits for the last ones);
- the unsharded parameter and gradient bytes the model held, sampled before and after every
  unit's forward, at every all-gather and at every reduce-scatter: a parameter FSDP2 has
  unsharded is a plain tensor registered on its module (sharded ones are DTensors) and its
  gradient lives on it until its unit's post-backward. An all-gather's output buffer is counted
  while it lives (a prefetched unit's parameters are registered only when the forward or backward
  first waits for it, and FSDP2 then drops the buffer). At a reduce-scatter, whose post-backward hook
  has just taken the unit's gradients off its parameters and resharded them, the unit's
  gradients (the reduce-scatter's input) and its parameters (the all-gather's output size, held
  until that instant) are added to what is seen. The peak is reported as the simulator reports
  it: this rank's shards plus the largest sample. A parameter read by several ops (a tied
  embedding) gets its gradient's first part from the first backward op that reaches it, and the
  autograd engine holds the parts in its own buffer until the last arrives: after each forward
  the recorder walks the autograd graph from the root's output, finds the parameters with more
  than one consumer, and hooks those consumers, so that such a gradient counts from its first
  part, as the simulator counts it, until it lands on ``.grad`` (without this, gpt_tied under
  FSDP2 per block measured 26.7 MiB against 35.7 predicted: its 8.3 MiB embedding gradient, held
  through the backward, was out of sight).

On an HSDP mesh, each unit's all-reduce across the replicas (FSDP2's own call, after the
reduce-scatter) is recorded through FSDP2's ``set_all_reduce_hook``, which runs right after it
(:meth:`ShardRecorder.all_reduce_hook`).

A step begins at the root module's forward. :attr:`ShardRecorder.steps` holds them.

``all_gather_single`` / ``reduce_scatter_single`` are torch's newer names for
``all_gather_into_tensor`` / ``reduce_scatter_tensor``; the recorder calls whichever the installed
torch has.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter  # FSDP2's comm interface
from torch.distributed.tensor import DTensor

__all__ = ["ShardCollective", "ShardStepRecord", "ShardRecorder"]

AG, RS, AR = "all-gather", "reduce-scatter", "all-reduce"
_all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
_reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


@dataclass(slots=True)
class ShardCollective:
    """One collective of a step: its kind, unit, bytes, and issue and end times (s from the step's start)."""

    kind: str
    unit: int
    nbytes: int
    issue_s: float
    end_s: float | None = None
    #: on CUDA: the events recorded on the issuing stream before and after the call, until resolved
    events: tuple[Any, Any] | None = None

    def to_json(self) -> list[Any]:
        return [self.kind, self.unit, self.nbytes, round(self.issue_s, 6),
                None if self.end_s is None else round(self.end_s, 6)]


@dataclass(slots=True)
class ShardStepRecord:
    """One step: when it began (the host's clock), its collectives, and the largest unsharded bytes seen."""

    start: float
    collectives: list[ShardCollective] = field(default_factory=list)
    unsharded_peak_bytes: int = 0
    #: on CUDA: an event recorded on the current stream as the step began
    start_event: Any = None

    def resolve(self, wait: bool) -> bool:
        """On CUDA, turn the collectives' completed events into seconds from the step's start (all of
        them, synchronizing, with ``wait``); True when none is left unresolved."""
        left = False
        for c in self.collectives:
            if c.events is None:
                continue
            before, after = c.events
            if after is None:  # the call raised
                c.events = None
                continue
            if not wait and not after.query():
                left = True
                continue
            after.synchronize()
            c.issue_s = self.start_event.elapsed_time(before) / 1e3
            c.end_s = self.start_event.elapsed_time(after) / 1e3
            c.events = None
        return not left


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _event() -> Any:
    """A timing CUDA event, recorded now on the current stream."""
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


class ShardRecorder:
    """Records one sharded model's steps (see the module docstring)."""

    def __init__(self, root: nn.Module, unit_modules: Sequence[Sequence[nn.Module]]) -> None:
        self.root = root
        self.unit_modules = [list(ms) for ms in unit_modules]
        self._steps: list[ShardStepRecord] = []
        self._unresolved = 0  # steps from here on may hold unresolved CUDA events
        self.cuda = any(p.is_cuda for p in root.parameters())
        self._lock = threading.Lock()  # futures complete on the backend's threads
        self._managed = self._managed_names()
        #: ids of parameters whose gradient has begun in the autograd engine but is not on ``.grad`` yet
        self._pending: set[int] = set()
        #: all-gather outputs not yet copied out into their unit's parameters (a prefetched unit's)
        self._gathered: list[weakref.ref] = []
        #: the bytes of this rank's shards of every parameter (constant)
        self.shard_bytes = sum(_nbytes(p.to_local()) for p in root.parameters() if isinstance(p, DTensor))

    def _managed_names(self) -> list[tuple[nn.Module, str]]:
        """(module, attribute) of every trainable parameter, each once: where FSDP2 swaps it."""
        seen, out = set(), []
        for module in self.root.modules():
            for name, p in module.named_parameters(recurse=False):
                if id(p) not in seen and p.requires_grad:
                    seen.add(id(p))
                    out.append((module, name))
        return out

    # ----------------------------------------------------------------- steps and memory

    @property
    def steps(self) -> list[ShardStepRecord]:
        """Every step so far, its collectives' times resolved (on CUDA this waits for the last ones)."""
        self._resolve(wait=True)
        return self._steps

    def _resolve(self, wait: bool) -> None:
        """Resolve the steps from the first with unresolved events on; the last step stays open (its
        collectives may not all be issued yet)."""
        while self._unresolved < len(self._steps):
            if not self._steps[self._unresolved].resolve(wait) or self._unresolved == len(self._steps) - 1:
                return
            self._unresolved += 1

    def begin_step(self, *_: Any) -> None:
        step = ShardStepRecord(start=time.perf_counter())
        if self.cuda:
            self._resolve(wait=False)  # what has completed, without stalling the host
            step.start_event = _event()
        self._steps.append(step)

    def sample(self, extra: int = 0) -> None:
        """Note the unsharded parameter and gradient bytes held now, plus ``extra`` held out of sight."""
        if not self._steps:
            return
        held = extra
        for module, name in self._managed:
            p = module._parameters.get(name)
            if p is None or isinstance(p, DTensor):
                continue
            held += _nbytes(p)
            if p.grad is not None and not isinstance(p.grad, DTensor):
                held += _nbytes(p.grad)
            elif id(p) in self._pending:  # its gradient's first parts, in the autograd engine's buffer
                held += _nbytes(p)
        alive = [ref() for ref in self._gathered]
        self._gathered = [ref for ref, t in zip(self._gathered, alive) if t is not None]
        held += sum(_nbytes(t) for t in alive if t is not None)
        step = self._steps[-1]
        step.unsharded_peak_bytes = max(step.unsharded_peak_bytes, held)

    def peak_bytes(self, step: ShardStepRecord) -> int:
        """A step's peak as the simulator counts it: this rank's shards plus the most unsharded bytes held."""
        return self.shard_bytes + step.unsharded_peak_bytes

    # ----------------------------------------------------------------- collectives

    def _note(self, kind: str, unit: int, nbytes: int) -> ShardCollective | None:
        if not self._steps:
            return None
        step = self._steps[-1]
        entry = ShardCollective(kind=kind, unit=unit, nbytes=nbytes, issue_s=time.perf_counter() - step.start)
        if step.start_event is not None:
            entry.events = (_event(), None)
        with self._lock:
            step.collectives.append(entry)
        return entry

    def _ended(self, entry: ShardCollective | None, work: Any, start: float) -> None:
        if entry is None:
            return
        if entry.events is not None:
            if work is None:  # CUDA, blocking: the current stream now waits for the collective
                entry.events = (entry.events[0], _event())
                return
            entry.events = None  # CUDA, asynchronous: NCCL's future, by the host's clock
        if work is None:  # blocking: it has ended
            entry.end_s = time.perf_counter() - start
            return

        def done(_: Any) -> None:
            entry.end_s = time.perf_counter() - start

        work.get_future().add_done_callback(done)

    def comms(self, unit: int) -> tuple[AllGather, ReduceScatter]:
        """The recording all-gather and reduce-scatter for unit ``unit``."""
        gather, scatter = _RecordedAllGather(self, unit), _RecordedReduceScatter(self, unit)
        gather.twin = scatter
        return gather, scatter

    def all_reduce_hook(self, scatter: ReduceScatter) -> Any:
        """HSDP: the hook FSDP2 calls after the all-reduce of a unit's reduced shard across the replicas
        (``set_all_reduce_hook``, on its all-reduce stream), recording that all-reduce: issued when the
        unit's reduce-scatter ended (with shard groups of one rank there is none: when its output was
        allocated, just before FSDP2 copies the gradients into it), ended now."""
        assert isinstance(scatter, _RecordedReduceScatter)
        scatter.tracks_reduced = True

        def hook(reduce_output: torch.Tensor) -> None:
            if not self._steps:
                return
            step = self._steps[-1]
            issued, event = scatter.reduced
            entry = ShardCollective(kind=AR, unit=scatter.unit, nbytes=_nbytes(reduce_output),
                                    issue_s=issued - step.start, end_s=time.perf_counter() - step.start)
            if step.start_event is not None:
                entry.events, entry.end_s = (event, _event()), None
            with self._lock:
                step.collectives.append(entry)

        return hook

    def watch_shared_gradients(self, _module: Any, _args: Any, output: Any) -> None:
        """After the root's forward: hook the consumers of every parameter that more than one op reads,
        so that its gradient counts from its first part (see the module docstring)."""
        self._pending.clear()
        roots = [t.grad_fn for t in torch.utils._pytree.tree_leaves(output)
                 if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        consumers: dict[Any, list[Any]] = {}  # AccumulateGrad node -> the nodes that feed it
        seen, stack = set(roots), list(roots)
        while stack:
            node = stack.pop()
            for child, _ in node.next_functions:
                if child is None:
                    continue
                if hasattr(child, "variable"):
                    consumers.setdefault(child, []).append(node)
                elif child not in seen:
                    seen.add(child)
                    stack.append(child)
        for leaf, feeding in consumers.items():
            if len(feeding) > 1 and leaf.variable.requires_grad:
                key = id(leaf.variable)
                for node in feeding:
                    node.register_hook(lambda *_, key=key: self._pending.add(key))
                leaf.register_prehook(lambda *_, key=key: self._pending.discard(key))  # summed: onto .grad

    def attach(self) -> None:
        """Hook the root's forward (a step begins; shared parameters' consumers) and every unit's
        forward and backward edges (samples)."""
        self.root.register_forward_pre_hook(self.begin_step, prepend=True)
        self.root.register_forward_hook(self.watch_shared_gradients)
        for modules in self.unit_modules:
            for m in modules:
                m.register_forward_pre_hook(lambda *_: self.sample())
                m.register_forward_hook(lambda *_: self.sample(), prepend=True)  # before FSDP2 reshards


class _Recorded:
    def __init__(self, recorder: ShardRecorder, unit: int) -> None:
        self.recorder, self.unit = recorder, unit
        self.gathered_bytes = 0  # the unit's unsharded parameters: its all-gather's output

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class _RecordedAllGather(_Recorded, AllGather):
    """FSDP2's default all-gather (``all_gather_single``), recorded."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> dist.Work | None:
        rec = self.recorder
        entry = rec._note(AG, self.unit, _nbytes(output_tensor))
        start = rec._steps[-1].start if rec._steps else 0.0
        work = _all_gather(output_tensor, input_tensor, group=group, async_op=async_op)
        rec._ended(entry, work if async_op else None, start)
        rec._gathered.append(weakref.ref(output_tensor))  # held until FSDP2 copies it out and drops it
        rec.sample()
        self.twin.gathered_bytes = _nbytes(output_tensor)
        return work


class _RecordedReduceScatter(_Recorded, ReduceScatter):
    """FSDP2's default reduce-scatter (``reduce_scatter_single``), recorded."""

    #: when the unit's gradients were last reduced in its shard group (the host's clock, and on CUDA an
    #: event on the reduce-scatter stream): the end of its reduce-scatter, or where a shard group of one
    #: rank has none, the allocation of its output; HSDP's all-reduce across the replicas follows it
    reduced: tuple[float, Any] = (0.0, None)
    tracks_reduced = False  # only HSDP's all-reduce hook reads it: no CUDA events for it elsewhere

    def _reduced_now(self) -> None:
        if self.tracks_reduced:
            self.reduced = (time.perf_counter(), _event() if self.recorder.cuda else None)

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        buffer = super().allocate(size, dtype=dtype, device=device)
        # the post-backward hook has just taken the unit's gradients off its parameters and resharded them
        self.recorder.sample(extra=_nbytes(buffer) + self.gathered_bytes)
        self._reduced_now()
        return buffer

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: Any, async_op: bool = False) -> dist.Work | None:
        rec = self.recorder
        entry = rec._note(RS, self.unit, _nbytes(input_tensor))
        start = rec._steps[-1].start if rec._steps else 0.0
        work = _reduce_scatter(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
        rec._ended(entry, work if async_op else None, start)
        self._reduced_now()
        return work
