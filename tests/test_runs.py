"""The run DPs under the sharded bound and the pipelined units, against brute force over every split."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedopt.runs import STEPS, Sides, joint_runs, least_runs


def _splits(size: int, n: int):
    return ([0, *cuts] for cuts in itertools.combinations(range(1, size), n - 1))


@st.composite
def sides(draw):
    size = draw(st.integers(1, 7))
    floats = lambda hi: st.floats(0, hi, allow_nan=False)  # noqa: E731
    cum = np.cumsum(draw(st.lists(floats(5), min_size=size, max_size=size)))
    leads = [np.array(sorted(draw(st.lists(floats(10), min_size=size, max_size=size)), reverse=True)) for _ in "fb"]
    return Sides(intercept_f=draw(floats(2)), moved_f=cum * draw(st.floats(0.5, 2)), lead_f=leads[0],
                 floor_f=draw(floats(12)), intercept_b=draw(floats(2)), moved_b=cum * draw(st.floats(0.5, 2)),
                 lead_b=leads[1], floor_b=draw(floats(12)))


@settings(max_examples=200, deadline=None)
@given(sides())
def test_joint_runs_bound_every_split_and_find_one_within_a_step_of_the_best(s):
    size = len(s.lead_f)
    step = (s.intercept_b * size + s.lead_b.max() - s.lead_b.min()) / (STEPS - 1)
    best = np.inf
    for n, runs in enumerate(joint_runs(s, splits=True), 1):
        best = min(best, min(s.value(split) for split in _splits(size, n)))  # at most n runs
        assert runs.bound <= best + 1e-9 and best - step - 1e-9 <= runs.bound
        assert runs.value == pytest.approx(s.value(list(runs.starts)))
        assert best - 1e-9 <= runs.value <= best + step + 1e-9


def test_least_runs_is_the_best_split_of_one_side():
    running = [(3.0, 9.0), (5.0, 6.0), (6.0, 2.0), (10.0, 1.0)]  # (bytes up to here, compute from here)
    cost = lambda b: 1.0 + 0.5 * b  # noqa: E731
    for n, got in enumerate(least_runs(cost, running), 1):
        want = min(max(g + 0.5 * running[e][0] + running[s][1]
                       for g, (s, e) in enumerate(zip(split, [*(c - 1 for c in split[1:]), 3]), 1))
                   for split in _splits(4, n))
        assert got == pytest.approx(want)
