"""The run DPs under the sharded bound and the pipelined units, against brute force over every split."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedopt import Cluster, Problem, simulate
from schedopt.runs import STEPS, Sides, joint_runs, least_runs
from schedopt.shard_sim import sharded_lower_bound
from schedopt.solvers import get
from schedopt.solvers.pipeline import pipelined_plan
from schedopt.synthetic import transformer_like


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
        assert runs.value == pytest.approx(s.value(list(runs.starts))) and best - 1e-9 <= runs.value <= best + step + 1e-9


def test_least_runs_is_the_best_split_of_one_side():
    running = [(3.0, 9.0), (5.0, 6.0), (6.0, 2.0), (10.0, 1.0)]  # (bytes up to here, compute from here)
    cost = lambda b: 1.0 + 0.5 * b  # noqa: E731
    for n, got in enumerate(least_runs(cost, running), 1):
        want = min(max(g + 0.5 * running[e][0] + running[s][1]
                       for g, (s, e) in enumerate(zip(split, [*(c - 1 for c in split[1:]), 3]), 1))
                   for split in _splits(4, n))
        assert got == pytest.approx(want)


def test_the_pipelined_units_step_is_the_simulators_and_within_1_percent_of_the_bound():
    """No budget: every unit kept, every all-gather issued at once. The joint DP's objective is the
    simulated step exactly, and finer units than blocks let the first and last be small."""
    graph = transformer_like(8, hidden=512, num_heads=8, seq_len=256, vocab_size=8000)
    for net, n in (("100gbe", 64), ("ib-hdr", 8)):
        problem = Problem(graph=graph, cluster=Cluster.preset(net, world_size=n), mode="sharded")
        plan = pipelined_plan(problem)
        assert plan is not None and all(not u.reshard_after_forward for u in plan.units)
        t = simulate(problem, plan).iteration_s
        assert t == pytest.approx(plan.solver.stats["model_s"], rel=1e-9)
        assert t <= sharded_lower_bound(problem) * 1.01
        per_block = simulate(problem, get("fsdp-per-block")(problem)).iteration_s
        assert t < per_block
    # a budget under its peak: none
    tight = Problem(graph=graph, cluster=problem.cluster, mode="sharded",
                    memory_budget_bytes=int(plan.predicted.peak_memory_bytes) - 1)
    assert pipelined_plan(tight) is None

