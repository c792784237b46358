"""``wrap_optimizer``: the user's own ``torch.optim`` optimizer, stepped per bucket in overlap and osp modes.

Nothing is rewritten: the optimizer's own ``step`` runs, once per bucket,
with its parameter groups cut down to that bucket's parameters and each
``.grad`` swapped for the averaged gradient, so SGD (momentum, Nesterov),
Adam, AdamW and every other optimizer whose update of a parameter reads only
that parameter's gradient and state give DDP's parameters. What
``optimizer.step()`` does instead of stepping:

1. It snapshots every group's hyperparameters (what an LR scheduler changes
   right after ``step()`` is not seen by this step's deferred updates).
2. For each bucket holding its parameters whose average is new since its
   last ``zero_grad()``, it records a request; the bucket applies it when it
   settles (:mod:`schedopt.runtime.deferred`).
3. Its other parameters (frozen ones, or a bucket with no new average) step
   at once, with their ``.grad`` as it is, as they would under DDP.

``zero_grad`` (either ``set_to_none``) acts on ``.grad`` as usual; ``state_dict``
and ``load_state_dict`` settle every bucket first. Refused: LBFGS and any
``step(closure)`` (the closure needs every averaged gradient at once), with
the advice to plan in ``barrier`` mode. Step hooks registered on the
optimizer run once per bucket.
"""

from __future__ import annotations

import copy
import logging
from types import MethodType
from typing import Any, Callable

import torch
from torch import nn

from schedopt.errors import UnsupportedOptimizerError

from .steps import StepQueue, StepRequest
from .wrapper import ScheduledDataParallel

__all__ = ["wrap_optimizer", "OptimizerDriver"]

log = logging.getLogger("schedopt.runtime")

#: Optimizers whose step needs every gradient at once.
REFUSED: tuple[type, ...] = (torch.optim.LBFGS,)


def wrap_optimizer(optimizer: torch.optim.Optimizer, model: nn.Module) -> torch.optim.Optimizer:
    """Return ``optimizer``, made to step per bucket when ``model`` runs an ``overlap`` or ``osp`` plan.

    With a ``barrier`` plan, or torch's DDP, the optimizer is returned as it is,
    so one training script serves every mode.

    Raises:
        UnsupportedOptimizerError: an overlap or osp plan and an optimizer that needs
            every gradient at once (LBFGS), or that is not a ``torch.optim.Optimizer``.

    Example:
        >>> model = wrap(model, "overlap.plan.json")                  # doctest: +SKIP
        >>> opt = wrap_optimizer(torch.optim.AdamW(model.parameters()), model)  # doctest: +SKIP
    """
    queue = model.step_queue if isinstance(model, ScheduledDataParallel) else None
    if queue is None:
        return optimizer
    if isinstance(optimizer, REFUSED) or not isinstance(optimizer, torch.optim.Optimizer):
        raise UnsupportedOptimizerError(
            f"{type(optimizer).__name__} needs every averaged gradient at once, which overlap mode never has; "
            "plan this model with --mode barrier"
        )
    if isinstance(getattr(optimizer, "_schedopt_driver", None), OptimizerDriver):
        return optimizer
    if not type(optimizer).__module__.startswith("torch.optim"):
        log.warning("schedopt: %s is stepped per bucket; its update of a parameter must read only that "
                    "parameter's gradient and state", type(optimizer).__name__)
    optimizer._schedopt_driver = OptimizerDriver(optimizer, queue)  # type: ignore[attr-defined]
    return optimizer


class OptimizerDriver:
    """Installs the deferring ``step``, ``zero_grad``, ``state_dict`` and ``load_state_dict`` on one optimizer.

    It talks to the buckets only through ``queue`` (:class:`~schedopt.runtime.steps.StepQueue`) and is the
    :class:`~schedopt.runtime.steps.StepApplier` their settles call back.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, queue: StepQueue) -> None:
        self.optimizer = optimizer
        self.queue = queue
        self._step = optimizer.step  # bound; an LR scheduler's wrapper when one was made before
        self._zero_grad = optimizer.zero_grad
        self._state_dict = optimizer.state_dict
        self._load_state_dict = optimizer.load_state_dict
        self._zeroed: dict[int, int] = {}  # bucket -> its generation at this optimizer's last zero_grad

        def step(opt: torch.optim.Optimizer, closure: Callable[[], Any] | None = None) -> None:
            self.request_step(closure)

        if hasattr(self._step, "_wrapped_by_lr_sched"):
            step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]  # the scheduler's own mark, kept

        def zero_grad(opt: torch.optim.Optimizer, set_to_none: bool = True) -> None:
            self._zero_grad(set_to_none=set_to_none)
            for k in self._buckets():
                self._zeroed[k] = queue.generation(k)

        def state_dict(opt: torch.optim.Optimizer) -> dict[str, Any]:
            queue.flush()
            return self._state_dict()

        def load_state_dict(opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
            queue.flush()
            self._load_state_dict(state)

        for fn in (step, zero_grad, state_dict, load_state_dict):
            setattr(optimizer, fn.__name__, MethodType(fn, optimizer))

    def _buckets(self) -> set[int]:
        ks = {self.queue.bucket_of(p) for group in self.optimizer.param_groups for p in group["params"]}
        return {k for k in ks if k is not None}

    def request_step(self, closure: Callable[[], Any] | None) -> None:
        """``optimizer.step()``: a request per bucket with a new average, the other parameters at once."""
        if closure is not None:
            raise UnsupportedOptimizerError("optimizer.step(closure) re-evaluates the model with every averaged "
                                            "gradient at once, which overlap mode never has; plan with --mode barrier")
        self.optimizer._opt_called = True  # type: ignore[attr-defined]  # what an LR scheduler checks
        hyper = [{key: value.clone() if isinstance(value, torch.Tensor) else value
                  for key, value in group.items() if key != "params"} for group in self.optimizer.param_groups]
        request = StepRequest(driver=self, hyper=hyper)
        fresh = set()
        for k in self._buckets():
            if self.queue.generation(k) > self._zeroed.get(k, 0):
                self.queue.request(k, request)
                fresh.add(k)
        now = [(p, None) for group in self.optimizer.param_groups for p in group["params"]
               if self.queue.bucket_of(p) not in fresh and p.grad is not None]
        if now:
            self.apply(now, None)

    def apply(self, grads: list[tuple[nn.Parameter, torch.Tensor | None]], hyper: list[dict[str, Any]] | None, *,
              commit: bool = True) -> None:
        """Run the optimizer's own step on these parameters only, with these gradients and hyperparameters.

        Args:
            grads: ``(parameter, gradient)``; a gradient of None keeps the parameter's ``.grad``.
            hyper: per group, the hyperparameters to step with (None: the current ones).
            commit: keep the optimizer state the step leaves (False: only the parameters move, as osp's
                local-gradient correction needs; the state is restored as it was).
        """
        state = self.optimizer.state
        kept = None if commit else {p: _copy_state(state[p]) if p in state else None for p, _ in grads}
        ids = {id(p) for p, _ in grads}
        swapped = []
        for p, g in grads:
            if g is not None:
                swapped.append((p, p.grad))
                p.grad = g
        saved = []
        for i, group in enumerate(self.optimizer.param_groups):
            values = hyper[i] if hyper is not None and i < len(hyper) else {}
            saved.append((group, group["params"], {key: group[key] for key in values}))
            group["params"] = [p for p in group["params"] if id(p) in ids]
            group.update(values)
        try:
            self._step()
        finally:
            for group, params, values in saved:
                group["params"] = params
                group.update(values)
            for p, g in swapped:
                p.grad = g
            for p, saved_state in (kept or {}).items():
                if saved_state is None:
                    state.pop(p, None)
                else:
                    state[p] = saved_state


def _copy_state(state: dict[str, Any]) -> dict[str, Any]:
    """A copy of one parameter's optimizer state that the next step cannot change (tensors cloned)."""
    return {key: value.clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)
            for key, value in state.items()}
