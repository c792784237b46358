"""What the deferred updates record: a requested optimizer step, one settle of a bucket, and its wait."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from .optimizer import OptimizerDriver

__all__ = ["StepRequest", "Settled", "wait_all"]


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


def wait_all(works: Sequence[Any]) -> tuple[bool, float]:
    """Wait for ``works``; return whether any was still running and the host time the waits took."""
    started = time.perf_counter()
    waited = any(not w.is_completed() for w in works)
    for work in works:
        work.wait()
    return waited, time.perf_counter() - started
