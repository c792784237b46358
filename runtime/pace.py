"""Does the run keep the plan's pace? One warning when the measured step is far from the predicted one.

A plan is only as right as its cluster and op costs. ``wrap`` times each synchronized step (forward to
forward, what the user's loop takes, data loading included) and, after ``WARMUP`` steps, compares the
median of the next ``MEASURED`` with the plan's predicted iteration; more than ``TOLERANCE`` apart, rank 0
logs one warning naming ``schedopt calibrate`` (a cluster measured on this network) and ``schedopt
profile`` (op times measured on this device). It never warns twice, and costs one clock read a step.
"""

from __future__ import annotations

import logging
import statistics
import time

__all__ = ["PaceCheck", "WARMUP", "MEASURED", "TOLERANCE"]

log = logging.getLogger("schedopt.runtime")

WARMUP, MEASURED, TOLERANCE = 3, 5, 0.25


class PaceCheck:
    """Call :meth:`step` at the start of every synchronized step."""

    def __init__(self, predicted_s: float | None, *, report: bool = True) -> None:
        self.predicted_s = predicted_s
        self.report = report  # rank 0 reports; the others only time
        self.periods: list[float] = []
        self._last: float | None = None
        self._seen = 0
        self.done = predicted_s is None or predicted_s <= 0
        self.warned: str | None = None

    def step(self) -> None:
        if self.done:
            return
        now = time.perf_counter()
        if self._last is not None:
            self._seen += 1
            if self._seen > WARMUP:
                self.periods.append(now - self._last)
        self._last = now
        if len(self.periods) == MEASURED:
            self.done = True
            self._judge(statistics.median(self.periods))

    def _judge(self, measured: float) -> None:
        off = measured / self.predicted_s - 1
        if abs(off) <= TOLERANCE:
            return
        self.warned = (f"schedopt: steps take {measured * 1e3:.1f} ms, the plan predicted {self.predicted_s * 1e3:.1f} ms "
                       f"({off:+.0%}): its cluster or op times are not this run's; measure them (torchrun ... -m "
                       "schedopt calibrate, schedopt profile) and plan again")
        if self.report:
            log.warning("%s", self.warned)
