"""OSP's stage 2: a bucket whose average may arrive during the next step, read meanwhile with LGP.

An ``osp`` plan (OSP, arXiv 2306.16926, adapted from a parameter server to
all-reduce) puts some buckets in stage 2. For such a bucket, with ``w_k``
and ``s_k`` its committed parameters and optimizer state after ``k``
synchronized steps (identical on every rank) and ``U(g, s, h)`` the user's
optimizer step with gradient ``g``, state ``s`` and the hyperparameters ``h``
of its ``optimizer.step()`` call:

1. Step k's backward all-reduces the bucket as in ``overlap`` mode, into one
   of two buffers (:meth:`~schedopt.runtime.buffers.GradientBuffers.flip`), and
   nothing waits for it in step k+1.
2. Step k's ``optimizer.step()`` records ``h_k`` and a copy of this rank's
   local gradient ``l_k`` (what ``.grad`` holds, see
   :mod:`~schedopt.runtime.deferred`).
3. Where step k+1's forward first reads the bucket (its modules' pre-hooks,
   as in ``overlap`` mode) it does two things:

   a. **commit** step k-1: wait for that step's collective, then set the
      parameters to ``w_{k-1}`` and apply ``U(avg g_{k-1}, s_{k-1}, h_{k-1})``,
      giving ``w_k`` and ``s_k`` on every rank alike;
   b. **LGP** (local-gradient parameter correction) for step k: keep
      ``w_k``, apply ``U(l_k, s_k, h_k)`` and restore ``s_k``, so the forward
      reads ``w_k`` corrected by this rank's own gradient instead of ``w_k``,
      one step stale. With ``lgp=False`` (the ablation) it reads ``w_k``.

   Step k+1's gradient of the bucket is therefore taken at the corrected
   (rank-local) weights; that, and the one-step-late average, is OSP's
   approximation. Each step runs the bucket's update twice (the simulator
   charges both).
4. ``flush()`` commits every step in flight: the parameters and optimizer
   state are then the committed ones, identical on every rank.

Beyond the paper (which gives only its abstract here): the stage-2 set is a
plan decision (:mod:`solvers.stages`), the committed state is kept exactly
(restored before each commit, so no LGP correction ever accumulates), and
the correction uses the user's own optimizer with its state, not plain SGD.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .steps import Settled, StepRequest, wait_all

if TYPE_CHECKING:
    from .buffers import GradientBuffers

__all__ = ["StaleBucket"]


@dataclass(eq=False)  # compared by identity
class _Generation:
    """One step's collective of a stage-2 bucket, and what that step's ``optimizer.step()`` asked."""

    works: list[Any] = field(default_factory=list)
    buffer: Any = None  # set when its last chunk is issued
    views: dict[str, Any] = field(default_factory=dict)
    requests: list[StepRequest] = field(default_factory=list)
    local: dict[str, torch.Tensor] = field(default_factory=dict)  # this rank's gradients at the request
    unused: frozenset[str] = frozenset()  # parameters no rank used in that step
    corrected: bool = False  # LGP applied: the parameters hold the corrected weights


class StaleBucket:
    """The stage-2 bucket ``k`` of ``layout`` (see the module docstring).

    Args:
        k: the bucket's index.
        members: its parameters ``(name, parameter)``.
        layout: the plan's buffers, flipped each time the bucket's last chunk is issued.
        lgp: apply the local-gradient correction (False: read the committed weights, one step stale).
    """

    def __init__(self, k: int, members: list[tuple[str, nn.Parameter]], layout: "GradientBuffers", *,
                 lgp: bool = True) -> None:
        self.k = k
        self.members = members
        self.layout = layout
        self.lgp = lgp
        self.generation = 0  # how many times its collectives were all issued
        self._open: _Generation | None = None  # chunks issued, the last not yet
        self._last: _Generation | None = None  # the newest fully issued
        self._flight: deque[_Generation] = deque()  # issued, not committed; oldest first
        self._committed: dict[str, torch.Tensor] | None = None  # w before the correction now applied

    @property
    def pending(self) -> bool:
        return bool(self._flight) or self._open is not None

    def issued(self, work: Any, *, last_chunk: bool) -> None:
        if self._open is None:
            self._open = _Generation()
        self._open.works.append(work)
        if last_chunk:
            self._open.buffer, self._open.views = self.layout.flip(self.k)
            self._flight.append(self._open)
            self._last, self._open = self._open, None
            self.generation += 1

    def request(self, request: StepRequest, unused: frozenset[str]) -> None:
        """``optimizer.step()`` after the newest issued step: its hyperparameters and this rank's gradients."""
        newest = self._last
        assert newest is not None, "a request follows a backward"
        if newest not in self._flight:  # committed already (a flush between backward and step): again
            self._flight.append(newest)
        if not newest.requests:
            newest.local = {name: p.grad.detach().clone() for name, p in self.members if p.grad is not None}
            newest.unused = unused
        newest.requests.append(request)

    # ------------------------------------------------------------ where the wrapper calls

    def before_read(self, where: str) -> list[Settled]:
        """A forward is about to read the bucket: commit all but the newest step, correct by the newest."""
        done = [self._commit(self._flight[0], where) for _ in range(len(self._flight) - 1)]
        if self._correction_due():
            done.append(self._correct(self._flight[-1], where))
        return done

    def due(self) -> bool:
        """Whether a read now would change the parameters."""
        return len(self._flight) > 1 or self._correction_due()

    def _correction_due(self) -> bool:
        """The newest step in flight has been stepped and not yet corrected for (with LGP on)."""
        newest = self._flight[-1] if self._flight else None
        return self.lgp and newest is not None and bool(newest.requests) and not newest.corrected

    def before_write(self) -> list[Settled]:
        """The backward is about to write into the current buffer: commit the step that still reads it."""
        current = self.layout.buffers[self.k]
        done = []
        while any(g.buffer is current for g in self._flight):
            done.append(self._commit(self._flight[0], "backward"))
        return done

    def flush(self) -> list[Settled]:
        return [self._commit(self._flight[0], "flush") for _ in range(len(self._flight))]

    # ------------------------------------------------------------ commit and correction

    def _commit(self, gen: _Generation, where: str) -> Settled:
        assert gen is self._flight[0]
        waited, wait_s = wait_all(gen.works)
        self._flight.popleft()
        if gen.requests:
            if gen.corrected:
                with torch.no_grad():
                    for name, p in self.members:
                        p.copy_(self._committed[name])
                self._committed = None
            grads = [(p, gen.local.get(name) if name in gen.unused else gen.views[name])
                     for name, p in self.members if name not in gen.unused or name in gen.local]
            for request in gen.requests:
                request.driver.apply(grads, request.hyper)
        return Settled(bucket=self.k, where=where, waited=waited, steps=len(gen.requests), wait_s=wait_s,
                       what="commit")

    def _correct(self, gen: _Generation, where: str) -> Settled:
        self._committed = {name: p.detach().clone() for name, p in self.members}
        grads = [(p, gen.local[name]) for name, p in self.members if name in gen.local]
        for request in gen.requests:
            request.driver.apply(grads, request.hyper, commit=False)
        gen.corrected = True
        return Settled(bucket=self.k, where=where, waited=False, steps=len(gen.requests), wait_s=0.0, what="lgp")

    def committed_parameters(self) -> dict[str, torch.Tensor]:
        """The committed weights (equal on every rank once the step before the newest is committed)."""
        if self._committed is not None:
            return dict(self._committed)
        return {name: p.detach() for name, p in self.members}
