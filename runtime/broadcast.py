"""Rank 0's parameters and buffers to every rank: at wrap time, and the buffers before each forward.

DDP broadcasts the buffers (BatchNorm's running statistics) from rank 0 at
the start of every forward. In ``barrier`` mode schedopt does the same
(:func:`broadcast_states`). In ``overlap`` mode a blocking broadcast there
would queue behind the previous step's gradient collectives, which are still
on the wire by design, and the forward would wait for all of them. Buffers
only change in forward, so :class:`BufferBroadcast` copies rank 0's buffers
into a staging tensor when a forward ends, broadcasts it asynchronously
(ahead of that step's gradients), and writes it into the buffers when the
next forward starts: the values DDP's broadcast would give, without a wait
on the gradients. Staging keeps the broadcast off the buffers themselves,
which the backward may have saved (an attention mask, say).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

__all__ = ["BROADCAST_BUCKET_BYTES", "broadcast_states", "BufferBroadcast"]

#: Bytes per broadcast when syncing parameters and buffers (DDP's ``broadcast_bucket_size``).
BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024


def broadcast_states(tensors: list[torch.Tensor], process_group: Any = None) -> None:
    """Overwrite ``tensors`` on every rank with rank 0's values (blocking, coalesced)."""
    if tensors:
        dist._broadcast_coalesced(process_group or dist.group.WORLD, tensors, BROADCAST_BUCKET_BYTES, 0)


class BufferBroadcast:
    """Rank 0's buffers after one forward, in every rank's buffers before the next (asynchronously)."""

    def __init__(self, buffers: list[torch.Tensor], process_group: Any = None) -> None:
        self.process_group = process_group
        self.rank = dist.get_rank(process_group)
        self.groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for b in buffers:
            self.groups.setdefault((b.dtype, b.device), []).append(b)
        self._inflight: list[tuple[list[torch.Tensor], torch.Tensor, Any]] = []

    def start(self) -> None:
        """Issue the broadcast of rank 0's current buffers (at the end of a forward, after :meth:`finish`)."""
        assert not self._inflight, "the previous broadcast is written at the start of each forward"
        for members in self.groups.values():
            staging = _flatten_dense_tensors([m.detach() for m in members])
            work = dist.broadcast(staging, group=self.process_group, async_op=True, group_src=0)
            self._inflight.append((members, staging, work))

    def wait(self) -> None:
        """Wait for the broadcast issued last; its values reach the buffers at the next :meth:`finish`.

        (Until the next forward a rank's buffers are what its own forward left, as under DDP.)
        """
        for _, _, work in self._inflight:
            work.wait()

    def finish(self) -> None:
        """Wait for the broadcast issued last, and write it into the buffers (at the start of a forward)."""
        for members, staging, work in self._inflight:
            work.wait()
            if self.rank != 0:
                with torch.no_grad():
                    for buffer, value in zip(members, _unflatten_dense_tensors(staging, members)):
                        buffer.copy_(value)
        self._inflight = []
