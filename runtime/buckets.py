"""The flat gradient buffers of a plan and the collectives that read them.

Each bucket of a plan owns one flat buffer (its parameters' dtype and
device) holding its gradients in the order the plan lists them; with
``chunks = c`` the buffer is cut into c slices of whole elements
(:func:`schedopt.plan.chunk_bounds`), one collective each. A collective may
be issued once every gradient that overlaps its slice is in the buffer.
Deciding this layout is separate from issuing anything (``wrapper``).

A stage-2 bucket of an ``osp`` plan has two buffers: its collective of one
step may still be running, or its average still unread, while the next
backward writes new gradients, so each step :meth:`BucketLayout.flip` hands
the buffer just issued to its reader and installs the other one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from schedopt.errors import InvalidPlanError
from schedopt.plan import Plan, chunk_bounds

__all__ = ["Collective", "BucketLayout"]


@dataclass(frozen=True, slots=True)
class Collective:
    """One all-reduce: elements ``[start, end)`` of bucket ``bucket``'s buffer (chunk ``chunk``)."""

    bucket: int
    chunk: int
    start: int
    end: int
    params: tuple[str, ...]  # the gradients overlapping the slice

    @property
    def numel(self) -> int:
        return self.end - self.start


class BucketLayout:
    """Flat buffers, one gradient-shaped view per parameter, and the collectives in plan order.

    Args:
        plan: the plan whose buckets to lay out.
        params: the live trainable parameters by name.

    Raises:
        InvalidPlanError: the buckets do not hold every live parameter exactly
            once, or a bucket mixes dtypes or devices, or has a bad chunk count.
    """

    def __init__(self, plan: Plan, params: Mapping[str, Any]) -> None:
        import torch

        self.buffers: list[Any] = []
        self.views: dict[str, Any] = {}
        #: per bucket, its stage (2: double-buffered, see :meth:`flip`)
        self.stages = [bucket.stage for bucket in plan.buckets]
        self._spares: dict[int, Any] = {}
        self._spans: dict[str, tuple[int, int]] = {}
        self._shapes: dict[str, Any] = {}
        #: per bucket, its parameters in buffer order
        self.names: list[tuple[str, ...]] = [tuple(bucket.params) for bucket in plan.buckets]
        self.collectives: list[Collective] = []
        seen: dict[str, int] = {}
        for k, bucket in enumerate(plan.buckets):
            for name in bucket.params:
                if name not in params:
                    raise InvalidPlanError(f"bucket {k} names {name!r}, which the model has no trainable parameter of")
                if name in seen:
                    raise InvalidPlanError(f"parameter {name!r} is in two buckets ({seen[name]} and {k})")
                seen[name] = k
            members = [params[name] for name in bucket.params]
            if not members:
                raise InvalidPlanError(f"bucket {k} is empty")
            kinds = {(p.dtype, p.device) for p in members}
            if len(kinds) > 1:
                raise InvalidPlanError(f"bucket {k} mixes dtypes or devices {sorted(map(str, kinds))}")
            numel = sum(p.numel() for p in members)
            if not 1 <= bucket.chunks <= max(numel, 1):
                raise InvalidPlanError(f"bucket {k} has chunks = {bucket.chunks}; expected 1 to {max(numel, 1)}")
            buffer = torch.zeros(numel, dtype=members[0].dtype, device=members[0].device)
            self.buffers.append(buffer)
            if bucket.stage == 2:
                self._spares[k] = torch.zeros_like(buffer)
            spans: dict[str, tuple[int, int]] = {}
            offset = 0
            for name, p in zip(bucket.params, members):
                spans[name] = (offset, offset + p.numel())
                offset += p.numel()
            self._spans.update(spans)
            self._shapes.update({name: p.shape for name, p in zip(bucket.params, members)})
            self.views.update(self._views_of(buffer, bucket.params))
            for j, (start, end) in enumerate(chunk_bounds(numel, bucket.chunks)):
                overlapping = tuple(n for n, (a, b) in spans.items() if a < end and start < b)
                self.collectives.append(Collective(bucket=k, chunk=j, start=start, end=end, params=overlapping))
        #: parameter -> index of its bucket
        self.bucket_of: dict[str, int] = seen
        unplanned = [name for name in params if name not in seen]
        if unplanned:
            raise InvalidPlanError(f"parameter(s) {', '.join(unplanned[:4])} are in no bucket of the plan")
        #: parameter -> indices of the collectives its gradient gates
        self.gates: dict[str, list[int]] = {name: [] for name in params}
        for c, collective in enumerate(self.collectives):
            for name in collective.params:
                self.gates[name].append(c)

    def _views_of(self, buffer: Any, names: tuple[str, ...]) -> dict[str, Any]:
        return {name: buffer[self._spans[name][0]:self._spans[name][1]].view(self._shapes[name]) for name in names}

    def flip(self, k: int) -> tuple[Any, dict[str, Any]]:
        """Stage-2 bucket ``k``, all of its chunks issued: return that buffer and its per-parameter views,
        and make the other buffer the one the next backward writes."""
        buffer, names = self.buffers[k], self.names[k]
        views = {name: self.views[name] for name in names}
        self.buffers[k], self._spares[k] = self._spares[k], buffer
        self.views.update(self._views_of(self.buffers[k], names))
        return buffer, views

    def slice(self, c: int) -> Any:
        """Return the 1-D buffer slice collective ``c`` all-reduces."""
        collective = self.collectives[c]
        return self.buffers[collective.bucket][collective.start:collective.end]
