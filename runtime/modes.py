"""How ``wrap`` synchronizes in each mode: a strategy chosen once, when the model is wrapped.

The wrapper (:mod:`~schedopt.runtime.wrapper`) owns what every mode shares:
the gradient hooks, the buffers and the plan-ordered issue of collectives. A
:class:`SyncMode` owns what differs:

- :class:`BarrierSync` (``barrier``): buffers broadcast before each forward,
  collectives waited for at the end of backward, every ``.grad`` then holding
  the average, as with DDP.
- :class:`DeferredSync` (``overlap`` and ``osp``): buffers travel
  asynchronously (:mod:`~schedopt.runtime.broadcast`), collectives go one at a
  time on gloo (:mod:`~schedopt.runtime.channel`), backward returns with them
  in flight, and each bucket's wait and optimizer step move to where the next
  forward first reads it (:mod:`~schedopt.runtime.deferred`); its
  :attr:`~SyncMode.steps` is the queue :func:`~schedopt.runtime.wrap_optimizer`
  steps through.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from schedopt.plan import Plan

from .broadcast import BufferBroadcast
from .buffers import GradientBuffers
from .channel import FifoChannel
from .deferred import DeferredUpdates
from .replica import Replica
from .steps import StepQueue

__all__ = ["SyncMode", "BarrierSync", "DeferredSync", "sync_mode"]


class SyncMode:
    """What a mode does around the shared steps of :class:`~schedopt.runtime.ScheduledDataParallel`."""

    #: the buckets' deferred steps, for the optimizer driver (None: the optimizer steps as usual)
    steps: StepQueue | None = None

    def __init__(self, replica: Replica, buffers: GradientBuffers) -> None:
        self.replica = replica
        self.buffers = buffers

    def forward(self, run: Callable[[], Any]) -> Any:
        """Run the wrapped forward (``run``) with what the mode does around it."""
        raise NotImplementedError

    def all_reduce(self, tensor: torch.Tensor) -> Any:
        """Start summing ``tensor`` over the ranks; return its work handle."""
        return dist.all_reduce(tensor, group=self.replica.process_group, async_op=True)

    def issued(self, bucket: int, work: Any, *, last_chunk: bool) -> None:
        """A collective of ``bucket`` is in flight (``last_chunk``: the bucket's last)."""
        raise NotImplementedError

    def before_write(self, name: str) -> None:
        """The backward is about to write ``name``'s gradient into its bucket's buffer."""

    def finish_backward(self, unused: set[str]) -> None:
        """Every collective is issued; ``unused``: the parameters no rank used (find_unused_parameters)."""
        raise NotImplementedError

    def flush(self) -> None:
        """Finish everything in flight and apply every pending step."""

    @property
    def pending(self) -> bool:
        return False


class BarrierSync(SyncMode):
    """``barrier``: wait at the end of backward and write the averages into ``.grad``."""

    def __init__(self, replica: Replica, buffers: GradientBuffers) -> None:
        super().__init__(replica, buffers)
        self._works: list[Any] = []

    def forward(self, run: Callable[[], Any]) -> Any:
        self.replica.sync_buffers()
        return run()

    def issued(self, bucket: int, work: Any, *, last_chunk: bool) -> None:
        self._works.append(work)

    def finish_backward(self, unused: set[str]) -> None:
        works, self._works = self._works, []
        for work in works:
            work.wait()
        for name, param in self.replica.params.items():
            if name in unused:
                continue  # nobody used it: DDP leaves its .grad alone
            view = self.buffers.views[name]
            if param.grad is None:
                param.grad = view.clone()
            else:
                param.grad.copy_(view)


class DeferredSync(SyncMode):
    """``overlap`` and ``osp``: return from backward with the collectives in flight (see the module docstring)."""

    def __init__(self, replica: Replica, buffers: GradientBuffers, *, lgp: bool) -> None:
        super().__init__(replica, buffers)
        self.updates = DeferredUpdates(replica.module, replica.params, buffers, lgp=lgp)
        self.steps = self.updates
        group = replica.process_group
        #: gloo runs collectives side by side; the channel sends them one at a time, as the simulator does
        self.channel = FifoChannel(group) if dist.get_backend(group) == "gloo" and replica.world_size > 1 else None
        self.broadcast = BufferBroadcast(replica.buffers, group) if replica.syncs_buffers else None

    def forward(self, run: Callable[[], Any]) -> Any:
        self.updates.forward_began()
        if self.broadcast is not None:
            self.broadcast.finish()  # rank 0's buffers as the last forward left them
        out = run()  # each module's pre-hook settles its buckets
        self.updates.forward_ended()
        if self.broadcast is not None:
            self.broadcast.start()
        return out

    def all_reduce(self, tensor: torch.Tensor) -> Any:
        return self.channel.all_reduce(tensor) if self.channel is not None else super().all_reduce(tensor)

    def issued(self, bucket: int, work: Any, *, last_chunk: bool) -> None:
        self.updates.issued(bucket, work, last_chunk=last_chunk)

    def before_write(self, name: str) -> None:
        self.updates.before_write(name)

    def finish_backward(self, unused: set[str]) -> None:
        self.updates.unused = set(unused)

    def flush(self) -> None:
        self.updates.flush()
        if self.broadcast is not None:
            self.broadcast.wait()

    @property
    def pending(self) -> bool:
        return self.updates.pending


def sync_mode(plan: Plan, replica: Replica, buffers: GradientBuffers, *, lgp: bool) -> SyncMode:
    """Return the strategy for ``plan``'s mode."""
    return BarrierSync(replica, buffers) if plan.mode == "barrier" else DeferredSync(replica, buffers, lgp=lgp)
