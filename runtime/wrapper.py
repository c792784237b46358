"""``wrap``: train like ``DistributedDataParallel``, with the plan's buckets, chunks and collective order.

What one synchronized step does (``barrier`` mode):

1. ``forward`` broadcasts the buffers from rank 0 (DDP's default) and arms the
   step unless inside :meth:`ScheduledDataParallel.no_sync` or without grad.
2. A post-accumulate-grad hook per parameter copies its ready gradient into
   its bucket's flat buffer, scaled by 1/world size as DDP's reducer does
   (``mul`` into the bucket view), and issues, strictly in plan order, every
   collective whose gradients are all in: ``all_reduce(async_op=True)``,
   summing. On CUDA the copy records an event on the current stream and the
   collective's stream waits for the events of its slice, so the copy is
   ordered before the collective without blocking the host.
3. At the end of backward (an autograd engine callback): parameters that got
   no gradient are named in an error, or, with ``find_unused_parameters``,
   contribute zeros and, when no rank used them, keep their ``.grad``; then
   every collective is waited for and each ``.grad`` receives its average.
   When ``loss.backward()`` returns, every ``.grad`` holds the average, as
   with DDP, and equals DDP's bit for bit on 2 ranks.

In ``overlap`` mode (and ``osp``, whose stage-2 buckets are waited for a
step later, :mod:`~schedopt.runtime.stale`) steps 1 and 2 are the same (the buffers travel
asynchronously, :mod:`~schedopt.runtime.broadcast`; on gloo the collectives
go one at a time, :mod:`~schedopt.runtime.channel`); step 3 checks unused
parameters and returns with the collectives in flight, and each bucket's
wait and optimizer step move to where the next forward first reads it
(:mod:`~schedopt.runtime.deferred`, :func:`~schedopt.runtime.wrap_optimizer`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import weakref
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

from schedopt.errors import InvalidPlanError, UnusedParameterError
from schedopt.plan import Plan

from .buffers import GradientBuffers
from .channel import FifoChannel
from .deferred import DeferredUpdates
from .modes import DeferredSync, SyncMode, sync_mode
from .pace import PaceCheck
from .replica import PLAN_ENV, Replica, resolve_plan
from .steps import StepQueue

__all__ = ["ScheduledDataParallel", "wrap"]

log = logging.getLogger("schedopt.runtime")

#: The modes ``wrap`` runs.
MODES = ("barrier", "overlap", "osp")


def wrap(module: nn.Module, plan: Plan | str | os.PathLike[str] | None = None, *, process_group: Any = None,
         find_unused_parameters: bool = False, lgp: bool = True) -> nn.Module:
    """Return ``module`` trained data-parallel under ``plan`` (or under torch's DDP without one).

    Args:
        module: the model, on its device, identical in structure on every rank.
        plan: a :class:`~schedopt.plan.Plan`, or the path of a plan JSON; with
            None, the plan named by ``$SCHEDOPT_PLAN``; with neither, torch's
            own ``DistributedDataParallel`` (said in one log line).
        process_group: the group to synchronize over (default: the world).
        find_unused_parameters: as DDP's: parameters that get no gradient in a
            step are handled instead of raising :class:`UnusedParameterError`.
        lgp: ``osp`` plans: the forward reads a stage-2 bucket's weights corrected
            by this rank's local gradient (False, the ablation: one step stale).

    Raises:
        InvalidPlanError: the plan cannot be read, is not an eager barrier,
            overlap or osp plan, or its buckets do not fit the model.
        PlanMismatchError: on every rank, when the ranks hold different plans
            or the model differs from the one planned.

    Example:
        >>> model = wrap(model, "plan.json")  # doctest: +SKIP
        >>> loss_fn(model(x), y).backward()  # every .grad holds the average  # doctest: +SKIP

    With an ``overlap`` or ``osp`` plan, pass the optimizer through
    :func:`~schedopt.runtime.wrap_optimizer` and call ``model.flush()`` after the last step.
    """
    plan = resolve_plan(plan)
    if plan is None:
        log.warning("schedopt: no plan (argument or $%s): training with torch DistributedDataParallel", PLAN_ENV)
        return nn.parallel.DistributedDataParallel(module, process_group=process_group,
                                                   find_unused_parameters=find_unused_parameters)
    return ScheduledDataParallel(module, plan, process_group=process_group,
                                 find_unused_parameters=find_unused_parameters, lgp=lgp)


class ScheduledDataParallel(nn.Module):
    """A module that synchronizes gradients as ``plan`` says (see the module docstring).

    ``collective_log`` holds ``(bucket, chunk, numel)`` of every collective of
    the last synchronized step, in the order they were issued.
    """

    def __init__(self, module: nn.Module, plan: Plan, *, process_group: Any = None,
                 find_unused_parameters: bool = False, lgp: bool = True) -> None:
        super().__init__()
        if plan.execution != "eager":
            raise InvalidPlanError(
                f"this plan has {plan.execution} execution (its op order is free), which eager PyTorch cannot "
                "run; plan with --execution eager, or apply it with schedopt.runtime.compile"
            )
        if plan.mode == "sharded":
            raise InvalidPlanError("wrap applies bucketed all-reduce plans; this is a sharded plan (FSDP2 units): "
                                   "apply it with schedopt.runtime.shard")
        if plan.mode not in MODES:
            raise InvalidPlanError(f"wrap applies {' and '.join(MODES)} plans; this plan is in {plan.mode} mode")
        replica = Replica.join(module, plan, process_group, who="wrap")
        self.module = module
        self.plan = plan
        self.process_group = process_group
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        self.world_size = replica.world_size
        self.collective_log: list[tuple[int, int, int]] = []
        self._params = replica.params
        self.gradient_buffers = GradientBuffers(plan, self._params)
        #: the mode's strategy (:mod:`~schedopt.runtime.modes`), chosen once
        self.sync: SyncMode = sync_mode(plan, replica, self.gradient_buffers, lgp=lgp)
        if self.sync.steps is not None:
            module.register_state_dict_pre_hook(lambda *_: self.flush())
            # a pending update applied after a load would move the loaded weights: apply it first
            module.register_load_state_dict_pre_hook(lambda *_: self.flush())
            _flush_at_exit(self)
        self._scale = 1.0 / self.world_size
        #: one warning when the measured step is far from the plan's prediction (:mod:`~schedopt.runtime.pace`)
        self.pace = PaceCheck(plan.predicted.iteration_s if plan.predicted else None,
                              report=dist.get_rank(process_group) == 0)
        self._cuda = any(p.is_cuda for p in self._params.values())
        self._armed = self._spent = False
        self._reset_step()
        self._hooks = [p.register_post_accumulate_grad_hook(self._make_hook(name))
                       for name, p in self._params.items()]

    @property
    def step_queue(self) -> StepQueue | None:
        """The buckets' deferred steps :func:`~schedopt.runtime.wrap_optimizer` drives (None in barrier mode)."""
        return self.sync.steps

    @property
    def deferred(self) -> DeferredUpdates | None:
        """Overlap and osp modes: the in-flight collectives, pending steps and settle records (read-only use)."""
        return self.sync.updates if isinstance(self.sync, DeferredSync) else None

    @property
    def channel(self) -> FifoChannel | None:
        """gloo in overlap and osp modes: the channel the gradient collectives take one at a time (its
        ``history`` holds when each was queued, started and done); None otherwise."""
        return self.sync.channel if isinstance(self.sync, DeferredSync) else None

    # ------------------------------------------------------------ user API

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        def run() -> Any:
            self._arm()
            return self.module(*args, **kwargs)
        return self.sync.forward(run)

    def flush(self) -> None:
        """Overlap mode: finish every collective and apply every pending optimizer step (barrier: nothing to do).

        ``state_dict()``, ``train()``/``eval()`` and the wrapped optimizer's
        ``state_dict()`` flush first; call it before reading parameters
        directly or tearing the process group down after the last step.
        """
        self.sync.flush()

    def train(self, mode: bool = True) -> "ScheduledDataParallel":
        self.flush()
        return super().train(mode)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally in the forward/backward passes inside (as DDP's ``no_sync``)."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    # ------------------------------------------------------------ one step

    def _arm(self) -> None:
        self._armed = torch.is_grad_enabled() and self.require_backward_grad_sync
        if self._armed:
            self.pace.step()
        self._spent = False
        self._reset_step()

    def _reset_step(self) -> None:
        self._ready: set[str] = set()
        self._remaining = [len(c.params) for c in self.gradient_buffers.collectives]
        self._next = 0
        self._events: dict[str, Any] = {}
        self._finalizer_queued = False

    def _make_hook(self, name: str):
        def hook(param: torch.Tensor) -> None:
            if self._armed:
                self._gradient_ready(name, param.grad)
            elif self._spent:
                raise RuntimeError("a second synchronized backward after one forward: run forward again "
                                   "before each backward (as with DDP), or accumulate under no_sync()")
        return hook

    def _gradient_ready(self, name: str, grad: torch.Tensor | None) -> None:
        # step 2: copy (scaled) into the bucket, then issue what became issuable
        if not self._finalizer_queued:
            self._finalizer_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        if name in self._ready:
            raise RuntimeError(f"the gradient of {name} became ready twice in one synchronized backward")
        self.sync.before_write(name)
        view = self.gradient_buffers.views[name]
        if grad is None:
            view.zero_()
        else:
            if grad.is_sparse:
                raise InvalidPlanError(f"{name} has a sparse gradient; schedopt buckets hold dense gradients")
            torch.mul(grad, self._scale, out=view)
        if self._cuda:
            event = torch.cuda.Event()
            event.record()
            self._events[name] = event
        self._ready.add(name)
        for c in self.gradient_buffers.gates[name]:
            self._remaining[c] -= 1
        self._issue_ready()

    def _issue_ready(self) -> None:
        collectives = self.gradient_buffers.collectives
        while self._next < len(collectives) and self._remaining[self._next] == 0:
            c = self._next
            if self._cuda:
                stream = torch.cuda.current_stream()
                for name in collectives[c].params:
                    stream.wait_event(self._events[name])
            work = self.sync.all_reduce(self.gradient_buffers.slice(c))
            last = c + 1 == len(collectives) or collectives[c + 1].bucket != collectives[c].bucket
            self.sync.issued(collectives[c].bucket, work, last_chunk=last)
            self.collective_log.append((collectives[c].bucket, collectives[c].chunk, collectives[c].numel))
            self._next += 1
            if c == 0:
                del self.collective_log[:-1]  # keep the log of this step only

    def _finish_backward(self) -> None:
        # step 3: unused parameters, wait, write the averages back
        self._armed, self._spent = False, True
        missing = [name for name in self._params if name not in self._ready]
        if missing and not self.find_unused_parameters:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise UnusedParameterError(
                f"parameter(s) {', '.join(missing[:5])}{more} got no gradient in this step; pass "
                "find_unused_parameters=True to wrap, or freeze them with requires_grad_(False)"
            )
        unused: set[str] = set()
        if self.find_unused_parameters:
            for name in missing:  # zeros in their slices, so the collectives can go
                self._gradient_ready(name, None)
            used = torch.tensor([name not in missing for name in self._params],
                                dtype=torch.int32, device=next(iter(self._params.values())).device)
            dist.all_reduce(used, group=self.process_group)
            unused = {name for name, count in zip(self._params, used.tolist()) if not count}
        assert self._next == len(self.gradient_buffers.collectives), "every collective is issued once all gradients are in"
        self.sync.finish_backward(unused)


def _flush_at_exit(wrapped: ScheduledDataParallel) -> None:
    """At interpreter exit, apply what is still pending while the process group is up (else say it is lost)."""
    ref = weakref.ref(wrapped)

    def flush() -> None:
        model = ref()
        if model is None or not model.sync.pending:
            return
        if dist.is_initialized():
            model.flush()
        else:
            log.warning("schedopt: the last step's updates were still pending when the process group was "
                        "destroyed; call model.flush() after the last step")
    atexit.register(flush)
