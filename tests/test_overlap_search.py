"""The overlap-mode bucket search: its fast period equals the simulator's, and it only ever improves."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedopt import Cluster, Plan, Problem, simulate
from schedopt.orders import engine_order
from schedopt.plan import SolverInfo
from schedopt.solvers import get
from schedopt.solvers.overlap_search import SteadyState, improve_buckets
from schedopt.synthetic import chain, transformer_like

from .strategies import train_graphs


def simulated(problem: Problem, order, state: SteadyState, buckets) -> float:
    plan = Plan.for_problem(problem, order=order, buckets=state.names(buckets), solver=SolverInfo(name="test"))
    return simulate(problem, plan).iteration_s


def random_buckets(rng: random.Random, state: SteadyState) -> list[list[int]]:
    """Any partition of the units, in any collective order, one dtype per bucket."""
    units = list(range(len(state.units)))
    rng.shuffle(units)
    k = rng.randint(1, len(units))
    buckets: list[list[int]] = [[] for _ in range(k)]
    for u in units:
        buckets[rng.randrange(k)].append(u)
    return [b for b in buckets if b]


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(graph=train_graphs(max_ops=8), world_size=st.integers(2, 64), bandwidth=st.floats(1e8, 2e10),
       seed=st.integers(0, 1000))
def test_fast_period_equals_the_simulator(graph, world_size, bandwidth, seed):
    problem = Problem(execution="compiled", graph=graph, cluster=Cluster(world_size=world_size, bandwidth_Bps=bandwidth, latency_s=2e-6,
                                                   call_s=5e-6), mode="overlap")
    rng = random.Random(seed)
    order = engine_order(graph)
    state = SteadyState(problem, order)
    for _ in range(3):
        buckets = random_buckets(rng, state)
        assert state.period(buckets) == pytest.approx(simulated(problem, order, state, buckets), rel=1e-9)


@pytest.mark.parametrize("network", ["10gbe", "100gbe"])
def test_fast_period_equals_the_simulator_on_a_transformer(network):
    graph = transformer_like(4)
    problem = Problem(execution="compiled", graph=graph, cluster=Cluster.preset(network, world_size=16), mode="overlap")
    plan = get("caramel")(problem)
    state = SteadyState(problem, plan.order)
    rng = random.Random(0)
    for _ in range(10):
        buckets = random_buckets(rng, state)
        assert state.period(buckets) == pytest.approx(simulated(problem, plan.order, state, buckets), rel=1e-9)


def test_search_holds_back_early_gradients_on_a_busy_network():
    # compute and network about even: sending the last layers' gradients (ready first, needed
    # last) after the first layers' lets the next forward start sooner (DDP's buckets: 8.0 ms,
    # the search: 6.4 ms, lower bound 5.8 ms)
    graph = chain(8, tokens=65536)
    problem = Problem(execution="compiled", graph=graph, cluster=Cluster.preset("100gbe", world_size=8), mode="overlap")
    start = get("pytorch-ddp")(problem)
    state = SteadyState(problem, start.order)
    initial = state.ready_order_buckets([b.params for b in start.buckets])
    buckets, period = improve_buckets(state, initial, max_evaluations=5_000)
    assert period == pytest.approx(simulated(problem, start.order, state, buckets), rel=1e-9)
    assert period < start.predicted.iteration_s * 0.9
    ready_rank = [max(state.grad_pos[u] for u in b) for b in buckets]
    assert ready_rank != sorted(ready_rank)  # some bucket is sent after a later-ready one


def test_search_result_is_a_partition_and_deterministic():
    graph = transformer_like(3)
    problem = Problem(execution="compiled", graph=graph, cluster=Cluster.preset("100gbe", world_size=64), mode="overlap")
    start = get("caramel")(problem)
    state = SteadyState(problem, start.order)
    initial = state.ready_order_buckets([b.params for b in start.buckets])
    first = improve_buckets(state, initial, max_evaluations=3_000, seed=7)
    again = improve_buckets(state, initial, max_evaluations=3_000, seed=7)
    assert first == again
    buckets, period = first
    assert sorted(u for b in buckets for u in b) == list(range(len(state.units)))
    assert period <= state.period(initial)


@pytest.mark.parametrize("network,world_size", [("10gbe", 8), ("100gbe", 64)])
def test_cpsat_window_bound_holds_for_every_bucketing_tried(network, world_size):
    # the overlap model's constant bound is valid for its forward order: no bucketing the search
    # or a random draw visits (backward in the plan's order) has a shorter period
    from schedopt.solvers.cpsat import CpsatOptions
    from schedopt.solvers.cpsat.overlap import OverlapModel

    graph = transformer_like(3)
    problem = Problem(execution="compiled", graph=graph, cluster=Cluster.preset(network, world_size=world_size), mode="overlap")
    plan = get("caramel")(problem)
    tick = plan.predicted.iteration_s / CpsatOptions().horizon_ticks
    forward = [o for o in plan.order if graph.ops[o].phase == "forward"]
    backward = [o for o in plan.order if graph.ops[o].phase == "backward"]
    model = OverlapModel(problem, forward, backward, tick, 4, CpsatOptions())
    bound = model.window_bound * tick
    assert bound > plan.predicted.lower_bound_s * 0.5  # not vacuous
    state = SteadyState(problem, plan.order)
    rng = random.Random(1)
    periods = [state.period(random_buckets(rng, state)) for _ in range(200)]
    periods.append(improve_buckets(state, state.ready_order_buckets([b.params for b in plan.buckets]),
                                   max_evaluations=3_000)[1])
    tolerance = tick * (len(plan.order) + 2 * len(graph.params))
    assert min(periods) >= bound - tolerance


def test_cpsat_warm_starts_are_the_same_searched_in_parallel_processes():
    """With two workers the two starts' searches run in forked processes; the plans they find are the
    ones the in-process search finds (each search ends on its evaluation count, not the clock)."""
    from schedopt.solvers.cpsat import CpsatOptions
    from schedopt.solvers.cpsat.deadline import Deadline
    from schedopt.solvers.cpsat.warm import warm_starts

    problem = Problem(execution="compiled", graph=transformer_like(2), cluster=Cluster.preset("100gbe", world_size=64), mode="overlap")
    sequential = warm_starts(problem, CpsatOptions(num_workers=1), Deadline(60))
    parallel = warm_starts(problem, CpsatOptions(num_workers=2), Deadline(60))
    assert [(t, p.order, p.buckets) for t, p in sequential] == [(t, p.order, p.buckets) for t, p in parallel]
    assert any(p.solver.name == "overlap-search" for _, p in parallel)


def _hang(*args):
    time.sleep(600)


def test_a_search_process_that_hangs_is_killed_and_the_solve_says_so():
    from schedopt.solvers.cpsat import warm

    notes = {}
    started = time.perf_counter()
    lanes = [[(_hang, "problem", "order", "buckets", 0, 0.1, "options")]] * 2
    assert warm.run_searches(lanes, processes=2, grace_s=0.5, notes=notes) == [[[]], [[]]]
    assert time.perf_counter() - started < 30
    assert "stopped" in notes["search"]


def _found(*args):
    return [("order", "buckets", 1.0)]


def test_a_lane_that_overruns_loses_only_its_own_results():
    """Two lanes on two processes: the one that hangs is killed and counts as having found nothing;
    the other's plans are kept, job by job."""
    from schedopt.solvers.cpsat import warm

    notes = {}
    lanes = [[(_hang, "problem", "order", "buckets", 0, 0.1, "options")],
             [(_found, "problem", "order", "buckets", 0, 0.05, "options")] * 2]
    assert warm.run_searches(lanes, processes=2, grace_s=0.5, notes=notes) == [[[]], [_found(), _found()]]
    assert "stopped" in notes["search"]


def test_holding_buckets_back_behind_the_tied_embedding_lets_their_ops_wait_too():
    """transformer_like ties wte to the head: finished last, read first. DDP's buckets send it last
    and the forward waits for its whole all-reduce; holding other buckets back behind it, under
    their bucket-first order, moves their weight-gradient ops into its shadow (8 x 100 GbE, 3
    blocks: 49.82 -> 45.79 ms)."""
    from schedopt.solvers.common import bucket_first_order
    from schedopt.solvers.deferral import defer_behind_anchor

    graph = transformer_like(3)
    problem = Problem(execution="compiled", graph=graph, cluster=Cluster.preset("100gbe", world_size=8), mode="overlap")
    start = get("pytorch-ddp")(problem)
    order, buckets, period = defer_behind_anchor(problem, list(start.order), [list(b.params) for b in start.buckets],
                                                 time_limit_s=30)
    assert period < 0.95 * start.predicted.iteration_s
    assert sorted(n for b in buckets for n in b) == sorted(graph.params)
    assert order == bucket_first_order(graph, start.order, buckets)
    plan = Plan.for_problem(problem, order=order, buckets=buckets, solver=SolverInfo(name="test"))
    assert simulate(problem, plan).iteration_s == pytest.approx(period, rel=1e-9)
    # some bucket now goes after wte's, and an op finishing one of its gradients after wte's op
    anchor = next(k for k, b in enumerate(buckets) if "wte.weight" in b)
    position = {o: i for i, o in enumerate(order)}
    later = [graph.params[n].grad_op for b in buckets[anchor + 1:] for n in b]
    assert later and max(map(position.get, later)) > position[graph.params["wte.weight"].grad_op]
