"""The flat gradient buffers of a plan, in torch tensors, laid out by :mod:`schedopt.layout`.

Each bucket of a plan owns one flat buffer (its parameters' dtype and
device) holding its gradients where :func:`schedopt.layout.bucket_layout`
puts them; each collective of that layout all-reduces one slice of it. The
layout is the simulator's own, so the runtime issues exactly the calls the
simulator scheduled. Deciding this layout is separate from issuing anything
(:mod:`~schedopt.runtime.wrapper`).

A stage-2 bucket of an ``osp`` plan has two buffers: its collective of one
step may still be running, or its average still unread, while the next
backward writes new gradients, so each step :meth:`GradientBuffers.flip`
hands the buffer just issued to its reader and installs the other one.
"""

from __future__ import annotations

from typing import Mapping

import torch

from schedopt.errors import InvalidPlanError
from schedopt.layout import Collective, bucket_layout
from schedopt.plan import Plan

__all__ = ["GradientBuffers"]


class GradientBuffers:
    """Flat buffers, one gradient-shaped view per parameter, and the collectives in plan order.

    Args:
        plan: the plan whose buckets to lay out.
        params: the live trainable parameters by name.

    Raises:
        InvalidPlanError: the buckets do not hold every live parameter exactly
            once, or a bucket mixes dtypes or devices, or has a bad chunk count.
    """

    def __init__(self, plan: Plan, params: Mapping[str, torch.Tensor]) -> None:
        self.layout = bucket_layout(plan.buckets, numel={name: p.numel() for name, p in params.items()},
                                    itemsize={name: p.element_size() for name, p in params.items()})
        unplanned = [name for name in params if name not in self.layout.spans]
        if unplanned:
            raise InvalidPlanError(f"parameter(s) {', '.join(unplanned[:4])} are in no bucket of the plan")
        #: the collectives in issue order (the simulator's, :class:`schedopt.layout.Collective`)
        self.collectives: tuple[Collective, ...] = self.layout.collectives
        #: per bucket, its stage (2: double-buffered, see :meth:`flip`)
        self.stages = [bucket.stage for bucket in plan.buckets]
        #: per bucket, its parameters in buffer order
        self.names: list[tuple[str, ...]] = [tuple(bucket.params) for bucket in plan.buckets]
        #: parameter -> index of its bucket
        self.bucket_of: dict[str, int] = {name: span.bucket for name, span in self.layout.spans.items()}
        #: parameter -> indices of the collectives its gradient gates
        self.gates: dict[str, list[int]] = self.layout.gates()
        self._shapes = {name: p.shape for name, p in params.items()}
        self.buffers: list[torch.Tensor] = []
        self._spares: dict[int, torch.Tensor] = {}
        self.views: dict[str, torch.Tensor] = {}
        for k, names in enumerate(self.names):
            kinds = {(params[name].dtype, params[name].device) for name in names}
            if len(kinds) > 1:
                raise InvalidPlanError(f"bucket {k} mixes dtypes or devices {sorted(map(str, kinds))}")
            dtype, device = next(iter(kinds))
            self.buffers.append(torch.zeros(self.layout.bucket_numel[k], dtype=dtype, device=device))
            if self.stages[k] == 2:
                self._spares[k] = torch.zeros_like(self.buffers[k])
            self.views.update(self._views_of(self.buffers[k], names))

    def _views_of(self, buffer: torch.Tensor, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
        spans = self.layout.spans
        return {name: buffer[spans[name].start:spans[name].end].view(self._shapes[name]) for name in names}

    def flip(self, k: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Stage-2 bucket ``k``, all of its chunks issued: return that buffer and its per-parameter views,
        and make the other buffer the one the next backward writes."""
        buffer, names = self.buffers[k], self.names[k]
        views = {name: self.views[name] for name in names}
        self.buffers[k], self._spares[k] = self._spares[k], buffer
        self.views.update(self._views_of(self.buffers[k], names))
        return buffer, views

    def slice(self, c: int) -> torch.Tensor:
        """Return the 1-D buffer slice collective ``c`` all-reduces."""
        collective = self.collectives[c]
        return self.buffers[collective.bucket][collective.start:collective.end]
