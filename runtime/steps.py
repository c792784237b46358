"""The interface between the buckets' deferred state and the optimizer that steps them.

The bucket side (:class:`~schedopt.runtime.deferred.DeferredUpdates`) is a
:class:`StepQueue`: the optimizer driver (:mod:`~schedopt.runtime.optimizer`)
asks it which bucket holds a parameter, whether a bucket has a new average,
and queues a :class:`StepRequest` on it. The driver is a :class:`StepApplier`:
when a bucket settles it calls back ``apply`` with that bucket's averaged
gradients. Neither side imports the other; both import this module.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

__all__ = ["StepApplier", "StepQueue", "StepRequest", "Settled", "wait_all"]


class StepApplier(Protocol):
    """What a settling bucket calls: run the user's optimizer on these parameters only."""

    def apply(self, grads: list[tuple[Any, Any]], hyper: list[dict[str, Any]] | None, *,
              commit: bool = True) -> None:
        """Step ``(parameter, gradient)`` pairs (a gradient of None: keep ``.grad``) with ``hyper`` per group;
        ``commit=False`` restores the optimizer state afterwards."""


@dataclass(frozen=True, slots=True)
class StepRequest:
    """One ``optimizer.step()`` to apply to a bucket: the optimizer and its hyperparameters at the call."""

    driver: StepApplier
    hyper: list[dict[str, Any]]


class StepQueue(Protocol):
    """What the optimizer driver asks of the buckets' deferred state."""

    def bucket_of(self, param: Any) -> int | None:
        """The index of the bucket holding ``param`` (a live parameter), None when no bucket does."""

    def generation(self, k: int) -> int:
        """How many times bucket ``k``'s collectives were issued (each a new average)."""

    def request(self, k: int, request: StepRequest) -> None:
        """Apply ``request`` to bucket ``k`` when it settles."""

    def flush(self) -> None:
        """Settle every bucket now."""


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
