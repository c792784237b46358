"""wrap's pace check: one warning when the measured step is far from the plan's prediction."""

from __future__ import annotations

import logging

import pytest

from schedopt.runtime import pace
from schedopt.runtime.pace import MEASURED, WARMUP, PaceCheck


def _run(check, period, steps, monkeypatch):
    clock = iter(k * period for k in range(10 * steps))
    monkeypatch.setattr(pace.time, "perf_counter", lambda: next(clock))
    for _ in range(steps):
        check.step()


def test_a_step_far_from_the_prediction_warns_once_naming_calibrate(monkeypatch, caplog):
    check = PaceCheck(0.5)
    with caplog.at_level(logging.WARNING, logger="schedopt.runtime"):
        _run(check, 0.8, WARMUP + MEASURED + 20, monkeypatch)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "800.0 ms" in lines[0] and "500.0 ms" in lines[0] and "+60%" in lines[0]
    assert "schedopt calibrate" in lines[0] and check.done


@pytest.mark.parametrize("period", [0.4, 0.55, 0.62])
def test_a_step_within_a_quarter_of_the_prediction_is_quiet(monkeypatch, caplog, period):
    check = PaceCheck(0.5)
    with caplog.at_level(logging.WARNING, logger="schedopt.runtime"):
        _run(check, period, WARMUP + MEASURED + 2, monkeypatch)
    assert not caplog.records and check.done and check.warned is None


def test_warm_up_steps_do_not_count_and_other_ranks_stay_quiet(monkeypatch, caplog):
    check = PaceCheck(0.5, report=False)
    with caplog.at_level(logging.WARNING, logger="schedopt.runtime"):
        _run(check, 2.0, WARMUP + MEASURED, monkeypatch)  # one period short of the measured five
        assert not check.done and len(check.periods) == MEASURED - 1
        check.step()
    assert check.done and check.warned and not caplog.records
    assert PaceCheck(None).done  # a plan without a prediction is not judged
