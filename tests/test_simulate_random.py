"""Properties of the simulator on random DAGs with random plans (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedopt import simulate
from schedopt.simulate import simulated_period, update_costs
from schedopt.solvers.common import bucket_first_order, split_chunks

from .strategies import problems_and_plans

EPS = 1e-12


def assert_no_overlap(events) -> None:
    for a, b in zip(events, events[1:]):
        assert a.end_s <= b.start_s + EPS * max(1.0, b.start_s), (a, b)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems_and_plans(interference=True))
def test_lower_bound_never_exceeds_the_simulated_iteration(case):
    """Also with interference, where the bound counts the compute slowed beside the wire."""
    problem, plan = case
    t = simulate(problem, plan)
    assert simulated_period(problem, plan) == t.iteration_s  # the searches' cheap figure is the same one
    assert t.lower_bound_s <= t.iteration_s * (1 + 1e-9) + 1e-15
    assert t.iteration_s >= t.compute_s * (1 - 1e-9) - 1e-15
    assert t.exposed_comm_s >= 0


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems_and_plans())
def test_timeline_is_physical(case):
    """One op at a time on the compute stream, one chunk at a time on the channel, every op once per step."""
    problem, plan = case
    t = simulate(problem, plan)
    for track in ("compute", "comm"):
        assert_no_overlap(sorted((e for e in t.events if e.track == track), key=lambda e: e.start_s))
    ops_per_step: dict[int, list[str]] = {}
    for e in t.events:
        if e.track == "compute" and e.category in ("forward", "backward"):
            ops_per_step.setdefault(e.step, []).append(e.name)
    compute_ops = sorted(o for o, op in problem.graph.ops.items() if op.phase != "optimizer")
    for names in ops_per_step.values():
        assert sorted(names) == compute_ops
    for name, w in t.windows.items():
        assert w.synced_s >= w.ready_s - EPS
    assert t == simulate(problem, plan)  # deterministic


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems_and_plans())
def test_splitting_chunks_into_buckets_is_never_slower(case):
    """Why cpsat need not search chunk counts: one-chunk buckets cut at parameter boundaries do as well
    (in overlap mode up to the moved updates: see split_chunks)."""
    problem, plan = case
    split = split_chunks(problem.graph, plan.buckets)
    assert all(b.chunks == 1 for b in split)
    assert sorted(n for b in split for n in b.params) == sorted(problem.graph.params)
    assert len(split) <= sum(b.chunks for b in plan.buckets)
    before = simulate(problem, plan).iteration_s
    after = simulate(problem, replace(plan, buckets=tuple(split), predicted=None)).iteration_s
    moved = 0.0
    if problem.mode == "overlap":
        cost = update_costs(problem.graph)
        moved = sum(cost[n] for b in plan.buckets if b.chunks > 1 for n in b.params)
    assert after <= before * (1 + 1e-9) + 1e-15 + moved


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems_and_plans())
def test_bucket_first_order_is_never_slower(case):
    """For a fixed collective order, running each bucket's backward ancestors bucket by bucket readies
    every prefix of buckets at the earliest: no order does better, in either mode."""
    problem, plan = case
    plan = replace(plan, buckets=tuple(split_chunks(problem.graph, plan.buckets)), predicted=None)
    order = bucket_first_order(problem.graph, plan.order, [b.params for b in plan.buckets])
    assert sorted(order) == sorted(plan.order)
    position = {o: i for i, o in enumerate(order)}
    assert all(position[u] < position[v] for u, v in problem.graph.dag.edges)
    before = simulate(problem, plan).iteration_s
    after = simulate(problem, replace(plan, order=tuple(order), predicted=None)).iteration_s
    moved = 0.0
    if problem.mode == "overlap":
        cost = update_costs(problem.graph)
        moved = sum(cost[n] for b in plan.buckets if b.chunks > 1 for n in b.params)
    assert after <= before * (1 + 1e-9) + 1e-15 + moved


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems_and_plans(interference=True), st.lists(st.sampled_from([1, 2]), min_size=64, max_size=64))
def test_the_osp_lower_bound_never_exceeds_a_plan_with_stage_2_buckets(case, stages):
    """osp: each gradient's cycle counts half (a stage-2 bucket waits two steps), whichever buckets are."""
    problem, plan = case
    osp = replace(problem, mode="osp", max_stale_fraction=1.0)
    staged = replace(plan, mode="osp", predicted=None,
                     buckets=tuple(replace(b, stage=s) for b, s in zip(plan.buckets, stages)))
    t = simulate(osp, staged)
    assert t.lower_bound_s <= t.iteration_s * (1 + 1e-9) + 1e-15
