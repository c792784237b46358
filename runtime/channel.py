"""One collective on the wire at a time, in issue order: the simulator's FIFO channel, for gloo.

Gloo runs asynchronous collectives on a pool of worker threads (two by
default), so two buckets issued together share the link and finish
together. In ``overlap`` mode that undoes the plan: the bucket the next
forward needs first (the first layers', ready last in backward) travels
beside a bucket that is needed only at the end of the forward, and the
forward waits for both (measured on the testbed, ResNet-18 at 450 Mbit/s:
the first bucket's wait went from the ~230 ms its bytes take alone to
~430 ms). NCCL needs none of this: the collectives of one communicator run
in order on its stream.

:class:`FifoChannel` sends the gradient collectives through a process group
of their own (so their order cannot interleave with other collectives the
program issues on its group), from one thread that issues each only once the
previous one has completed. The calling thread gets a handle to wait on;
the collective's blocking wait releases the GIL, so the model keeps
computing.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Any

import torch.distributed as dist
from torch.autograd.profiler import record_function

#: The name of the span a profiler trace holds where the calling thread queued a collective (what
#: ``schedopt diagnose`` takes for its issue; the collective itself is the channel thread's ``c10d::`` op).
QUEUE_MARK = "schedopt::queue_all_reduce"

__all__ = ["FifoChannel", "Transfer"]


class Transfer:
    """A collective queued on a :class:`FifoChannel`: ``is_completed()`` and ``wait()``, like a ``Work``.

    ``queued_s``, ``started_s`` and ``done_s`` are ``time.perf_counter()`` readings: when it was
    queued, when the channel's thread began it and when it ended (None until then).
    """

    __slots__ = ("_done", "_error", "numel", "queued_s", "started_s", "done_s")

    def __init__(self, numel: int = 0) -> None:
        self._done = threading.Event()
        self._error: BaseException | None = None
        self.numel = numel
        self.queued_s = time.perf_counter()
        self.started_s: float | None = None
        self.done_s: float | None = None

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self) -> bool:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return True


class FifoChannel:
    """All-reduces (sum) in issue order, one at a time, over a new group of the ranks of ``process_group``."""

    def __init__(self, process_group: Any = None) -> None:
        ranks = dist.get_process_group_ranks(process_group or dist.group.WORLD)
        self.group = dist.new_group(ranks=ranks, backend="gloo")
        self._queue: queue.SimpleQueue[tuple[Any, Transfer] | None] = queue.SimpleQueue()
        #: the last 512 transfers, oldest first (their timestamps say how the link was used)
        self.history: deque[Transfer] = deque(maxlen=512)
        self._thread = threading.Thread(target=self._run, name="schedopt-fifo-channel", daemon=True)
        self._thread.start()

    def all_reduce(self, tensor: Any) -> Transfer:
        """Queue an in-place sum of ``tensor`` across the ranks; returns at once."""
        with record_function(QUEUE_MARK):
            transfer = Transfer(tensor.numel())
            self.history.append(transfer)
            self._queue.put((tensor, transfer))
        return transfer

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            tensor, transfer = item
            transfer.started_s = time.perf_counter()
            try:
                dist.all_reduce(tensor, group=self.group)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                transfer._error = exc
            transfer.done_s = time.perf_counter()
            transfer._done.set()

    def close(self) -> None:
        """Stop the thread after what is queued (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
