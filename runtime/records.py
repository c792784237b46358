"""What the deferred updates record: a requested optimizer step, and one settle of a bucket."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .optimizer import OptimizerDriver

__all__ = ["StepRequest", "Settled"]


@dataclass(frozen=True, slots=True)
class StepRequest:
    """One ``optimizer.step()`` to apply to a bucket: the optimizer and its hyperparameters at the call."""

    driver: "OptimizerDriver"
    hyper: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Settled:
    """A record of one settle: which bucket, where, and whether it had to wait for the network."""

    bucket: int
    where: str  # "forward:<module>", "backward", "forward-end" or "flush"
    waited: bool  # some collective of the bucket was still running when the settle began
    steps: int  # optimizer steps applied
    wait_s: float  # host time spent waiting for the collectives (on CUDA: enqueueing the wait)
    what: str = "step"  # "step" (stage 1); osp's stage 2: "commit" or "lgp" (:mod:`~schedopt.runtime.stale`)
