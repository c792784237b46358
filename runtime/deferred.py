"""Overlap mode: a bucket's collective is waited for, and its optimizer step applied, where the next forward reads it.

When ``loss.backward()`` returns every collective of the step is in flight.
``optimizer.step()`` (an optimizer passed through
:func:`~schedopt.runtime.wrap_optimizer`) records a request with the
hyperparameters in force and returns. Each bucket is *settled* (its
collectives waited for, then every requested step applied to its parameters
with their averaged gradients) at the first of:

1. the forward pre-hook of a module that owns one of its parameters (a
   parameter registered in two modules, such as a tied embedding, settles
   where it is first read): the simulator's "update right before the first
   forward op that reads it" (a module that reads its own parameters at
   several points of its forward waits for all of them at its start);
2. the next backward about to write a gradient into the bucket's buffer;
3. the end of the wrapped forward, for buckets whose modules did not run
   (said once in a warning: a parameter read by another module than its own
   was read before its update);
4. :meth:`DeferredUpdates.flush`: ``state_dict()`` and ``load_state_dict()``
   of the model or of the optimizer, ``train()``/``eval()``, and ``flush()``
   itself (a step left pending across a load would move the loaded weights).

On CPU (gloo) the wait blocks the host until the bytes are in; on CUDA
``work.wait()`` makes the current stream wait on the collective's end event
and the host goes on, so the update's kernels queue behind the transfer.

Between ``backward()`` and the next forward, ``.grad`` holds this rank's own
(accumulated) gradient, untouched: the averaged one lives in the bucket
buffers until the step is applied, when each ``.grad`` is swapped for its
average for the duration of the optimizer call. Keeping the local gradient
costs nothing, keeps ``p.grad is not None`` checks true, and because the
average is linear, gradients accumulated without ``zero_grad`` still
average as DDP's do; code that must see averaged gradients between backward
and step (clipping by the global norm, LBFGS) needs ``barrier`` mode.

In an ``osp`` plan, stage-1 buckets behave as above and each stage-2 bucket
as :mod:`~schedopt.runtime.stale` says (its collective of one step is waited
for a step later; meanwhile the forward reads the weights corrected by the
local gradient).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

from torch import nn

from .steps import Settled, StepRequest, wait_all
from .stale import StaleBucket

if TYPE_CHECKING:
    from .buffers import GradientBuffers

__all__ = ["DeferredUpdates", "StepRequest", "Settled"]

log = logging.getLogger("schedopt.runtime")


class _Bucket:
    """A stage-1 bucket: its collectives in flight and the steps requested of it, applied together."""

    def __init__(self, k: int, members: list[tuple[str, nn.Parameter]], layout: "GradientBuffers") -> None:
        self.k = k
        self.members = members
        self.layout = layout
        self.works: list[Any] = []
        self.requests: list[StepRequest] = []
        self.unused: frozenset[str] = frozenset()
        self.generation = 0  # how many times its collectives were issued (a new average each time)

    @property
    def pending(self) -> bool:
        return bool(self.works or self.requests)

    def issued(self, work: Any, *, last_chunk: bool) -> None:
        self.works.append(work)
        if last_chunk:
            self.generation += 1

    def request(self, request: StepRequest, unused: frozenset[str]) -> None:
        self.requests.append(request)
        self.unused = unused

    def due(self) -> bool:
        return bool(self.requests)

    def before_read(self, where: str) -> list[Settled]:
        return [self._settle(where)] if self.pending else []

    def before_write(self) -> list[Settled]:
        return [self._settle("backward")] if self.pending else []

    def flush(self) -> list[Settled]:
        return [self._settle("flush")] if self.pending else []

    def _settle(self, where: str) -> Settled:
        """Wait for the collectives, then apply the requested steps with the averaged gradients."""
        waited, wait_s = wait_all(self.works)
        self.works = []
        requests, self.requests = self.requests, []
        if requests:
            grads = [(p, None if name in self.unused else self.layout.views[name]) for name, p in self.members]
            for request in requests:
                request.driver.apply(grads, request.hyper)
        return Settled(bucket=self.k, where=where, waited=waited, steps=len(requests), wait_s=wait_s)


class DeferredUpdates:
    """The in-flight collectives and requested optimizer steps of every bucket (see the module docstring).

    It is the :class:`~schedopt.runtime.steps.StepQueue` the optimizer driver steps through.

    Args:
        module: the wrapped model; a forward pre-hook goes on each module owning a planned parameter.
        params: the trainable parameters by name (the plan's names).
        layout: the plan's buckets; bucket ``k`` settles bucket ``k``'s parameters, a stage-2 bucket
            as :class:`~schedopt.runtime.stale.StaleBucket` does.
        lgp: osp's stage 2 reads its weights corrected by the local gradient (False: one step stale).
    """

    def __init__(self, module: nn.Module, params: dict[str, nn.Parameter], layout: "GradientBuffers", *,
                 lgp: bool = True) -> None:
        self.layout = layout
        self._bucket_of_name = layout.bucket_of
        members: list[list[tuple[str, nn.Parameter]]] = [[] for _ in layout.buffers]
        for name, param in params.items():
            members[self._bucket_of_name[name]].append((name, param))
        self.buckets: list[_Bucket | StaleBucket] = [
            StaleBucket(k, m, layout, lgp=lgp) if layout.stages[k] == 2 else _Bucket(k, m, layout)
            for k, m in enumerate(members)]
        self.by_param_id = {id(p): self._bucket_of_name[name] for name, p in params.items()}
        self.unused: set[str] = set()  # parameters no rank used in the last synchronized backward
        #: every settle since the last forward began, in order (tests read it)
        self.settled: list[Settled] = []
        self._warned_unread = False
        self._hooks = []
        for mname, m in module.named_modules():
            ks = sorted({self.by_param_id[id(p)] for p in m.parameters(recurse=False) if id(p) in self.by_param_id})
            if ks:
                self._hooks.append(m.register_forward_pre_hook(self._pre_forward_hook(ks, mname or "<root>")))

    def _pre_forward_hook(self, ks: list[int], where: str) -> Callable[..., None]:
        label = f"forward:{where}"

        def hook(_module: nn.Module, _args: Any) -> None:
            for k in ks:
                self.settled += self.buckets[k].before_read(label)
        return hook

    # ------------------------------------------------------------ what the wrapper reports

    def issued(self, k: int, work: Any, *, last_chunk: bool) -> None:
        """Bucket ``k``'s collective (one chunk) is in flight; with its last chunk, a new average is coming."""
        self.buckets[k].issued(work, last_chunk=last_chunk)

    def before_write(self, name: str) -> None:
        """The backward is about to write ``name``'s gradient into its bucket's buffer: free that buffer."""
        self.settled += self.buckets[self._bucket_of_name[name]].before_write()

    def forward_began(self) -> None:
        self.settled = []

    def forward_ended(self) -> None:
        """Settle the buckets whose modules did not run in this forward (case 3)."""
        unread = [k for k, b in enumerate(self.buckets) if b.due()]
        for k in unread:
            self.settled += self.buckets[k].before_read("forward-end")
        if unread and not self._warned_unread:
            self._warned_unread = True
            names = [name for k in unread for name, _ in self.buckets[k].members][:4]
            log.warning("schedopt: the forward did not run the module(s) owning %s, so their update ran after it; "
                        "a parameter read outside its own module is read before its update (use barrier mode)",
                        ", ".join(names))

    # ------------------------------------------------------------ what the optimizer asks (a StepQueue)

    def bucket_of(self, param: Any) -> int | None:
        return self.by_param_id.get(id(param))

    def generation(self, k: int) -> int:
        return self.buckets[k].generation

    def request(self, k: int, request: StepRequest) -> None:
        self.buckets[k].request(request, frozenset(self.unused))

    def flush(self) -> None:
        """Settle every bucket: no collective in flight, no step pending."""
        for bucket in self.buckets:
            self.settled += bucket.flush()

    @property
    def pending(self) -> bool:
        return any(b.pending for b in self.buckets)
