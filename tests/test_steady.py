"""The steady-state engine: hand-checked periods, FIFO issue, merged work, and a flag when it does not settle."""

from __future__ import annotations

import pytest

from schedopt.steady import StepProgram, run_steady_state


def two_layers(**overrides) -> StepProgram:
    """Forward f1 (1), f2 (1); backward b2 (1, finishes bucket 1), b1 (1, finishes bucket 0).
    Bucket 0 (first read by f1) takes 3 on the wire, bucket 1 (read by f2) 1; updates take 0.5."""
    fields = dict(work=[1, 1, 1, 1], settle={0: [0], 1: [1]}, update=[0.5, 0.5], chunk_ready=[3, 2],
                  chunk_bucket=[0, 1], chunk_time=[3, 1])
    fields.update(overrides)
    return StepProgram(**fields)


def test_a_hand_checked_period():
    """Step 0: b2 ends at 3, b1 at 4; FIFO: bucket 0 (ready at 4) goes first, 4-7, then bucket 1, 7-8.
    Step 1 starts at 4: f1 waits for bucket 0 until 7, updates to 7.5, runs to 8.5; f2's bucket ended at
    8: update 8.5-9, f2 to 10, backward to 12 (bucket 0 on the wire 12-15, bucket 1 15-16). Every step
    repeats that: 3 waiting, 1 of updates, 4 of compute, period 8."""
    run = run_steady_state(two_layers())
    assert run.converged
    assert run.step_ends[:2] == (4, 12)
    assert run.period == pytest.approx(8)


def test_merged_work_gives_the_same_period_with_interference():
    split = two_layers(work=[0.5, 0.5, 1, 0.4, 0.6, 1], settle={0: [0], 2: [1]}, chunk_ready=[5, 4],
                       interference=0.3)
    merged = two_layers(work=[1, 1, 1, 1], interference=0.3)
    assert run_steady_state(split).period == pytest.approx(run_steady_state(merged).period, rel=1e-12)
    assert run_steady_state(merged).period > run_steady_state(two_layers()).period


def test_integer_ticks_stay_integers():
    run = run_steady_state(two_layers(update=[1, 1]))
    assert all(isinstance(t, int) for t in run.step_ends) and isinstance(run.period, int)


def test_a_plan_that_has_not_settled_is_flagged_not_hidden():
    run = run_steady_state(two_layers(), max_steps=3)
    assert not run.converged and run.num_steps == 3


def test_a_chunk_ready_at_the_start_still_waits_for_the_one_before_it():
    """FIFO: chunk 1 has no gradient (ready at the start) but is issued after chunk 0."""
    starts = []
    run_steady_state(two_layers(chunk_ready=[3, -1]), max_steps=1,
                     on_step=lambda step, s, e, settled, chunks: starts.extend(c[1] for c in chunks))
    assert starts == [4, 7]
