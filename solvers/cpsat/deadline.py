"""The clock of one solve: every phase gets a share of the time limit, never more than is left."""

from __future__ import annotations

import time

__all__ = ["Deadline"]

#: The least time a phase is given (a heuristic's own search, a CP-SAT phase): below it, it is skipped.
MIN_PHASE_S = 0.01


class Deadline:
    """``limit_s`` seconds from construction."""

    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self.started = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> float:
        return max(self.limit_s - self.elapsed(), 0.0)

    def share(self, fraction: float) -> float:
        """``fraction`` of the limit, or what is left if less (at least :data:`MIN_PHASE_S`)."""
        return max(min(fraction * self.limit_s, self.left()), MIN_PHASE_S)
