"""The anchor search: its DP period bounds the simulator's (above, by at most the updates), its
bucketing is the best for its sequence, and cpsat keeps what it finds."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedopt import Cluster, Plan, Problem, simulate
from schedopt.orders import engine_order
from schedopt.plan import SolverInfo
from schedopt.solvers.anchor_search import AnchorSequences, anchor_search
from schedopt.solvers.cpsat import CpsatOptions
from schedopt.solvers.cpsat.deadline import Deadline
from schedopt.solvers.cpsat.warm import warm_starts
from schedopt.synthetic import transformer_like

from .strategies import train_graphs


def tied(world_size: int = 64, network: str = "100gbe", layers: int = 2) -> Problem:
    return Problem(graph=transformer_like(layers), cluster=Cluster.preset(network, world_size=world_size),
                   mode="overlap", execution="compiled")


def assert_within_updates(model: AnchorSequences, period: float, simulated_s: float) -> None:
    """The DP's period is the simulated one's or more, by at most the updates (module docstring of
    :mod:`schedopt.solvers.anchor_search`)."""
    assert period * (1 - 1e-6) - model.update_s <= simulated_s <= period * (1 + 1e-9)


def simulated(problem: Problem, model: AnchorSequences, seq: list[int], period: float) -> float:
    order, buckets = model.plan(seq, period)
    return simulate(problem, Plan.for_problem(problem, order=order, buckets=buckets,
                                              solver=SolverInfo(name="test"))).iteration_s


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(graph=train_graphs(max_ops=8), world_size=st.integers(2, 64), bandwidth=st.floats(1e8, 2e10),
       seed=st.integers(0, 1000))
def test_the_dp_period_bounds_the_simulated_period_of_its_plan_by_at_most_the_updates(graph, world_size,
                                                                                      bandwidth, seed):
    """The DP counts every update read at or after a bucket's first reader in its forward tail; one
    that runs earlier, with a bucket read earlier, makes the simulated period shorter, never longer."""
    problem = Problem(graph=graph, cluster=Cluster(world_size=world_size, bandwidth_Bps=bandwidth, latency_s=2e-6),
                      mode="overlap", execution="compiled")
    model = AnchorSequences(problem, engine_order(graph))
    rng = random.Random(seed)
    seq = model.canonical(model.anchor(), {u for u in range(model.n) if rng.random() < 0.5})
    period = model.period(seq)
    assert_within_updates(model, period, simulated(problem, model, seq, period))


def test_on_a_tied_transformer_the_dp_period_is_within_the_updates_of_the_simulated_one():
    problem = tied()
    model = AnchorSequences(problem, engine_order(problem.graph))
    anchor = model.anchor()
    assert "wte" in model.state.units[anchor][0]  # finished last, read first
    rng = random.Random(0)
    for _ in range(20):
        seq = model.canonical(anchor, {u for u in range(model.n) if rng.random() < 0.4})
        period = model.period(seq)
        assert_within_updates(model, period, simulated(problem, model, seq, period))


def test_the_dp_bucketing_is_the_best_contiguous_one_for_its_sequence():
    """Every contiguous bucketing of a 7-unit sequence, scored by the same recurrence: none beats the DP."""
    problem = tied(layers=1)
    model = AnchorSequences(problem, engine_order(problem.graph))
    rng = random.Random(3)
    for _ in range(5):
        seq = model.canonical(model.anchor(), {u for u in range(model.n) if rng.random() < 0.5})[:7]
        ready = model.ready(seq)
        best = min(_period(model, seq, ready, cuts) for k in range(len(seq))
                   for cuts in itertools.combinations(range(1, len(seq)), k))
        assert model.period(seq) == pytest.approx(best, rel=1e-6)


def _period(model: AnchorSequences, seq: list[int], ready, cuts: tuple[int, ...]) -> float:
    end, period = 0.0, model.compute_s
    for a, b in zip((0, *cuts), (*cuts, len(seq))):
        end = max(end, ready[b - 1]) + model.call_s + model.bytes_s[seq[a:b]].sum()
        period = max(period, end + model.tail[seq[a:b]].max())
    return period


def test_the_search_only_improves_and_depends_on_its_seed_only():
    problem = tied()
    order = engine_order(problem.graph)
    model = AnchorSequences(problem, order)
    anchor = model.anchor()
    start = min(model.period(model.canonical(anchor, s)) for s in (set(), set(range(model.n))))
    first = anchor_search(problem, order, max_evaluations=3000, time_limit_s=60, seed=1)
    again = anchor_search(problem, order, max_evaluations=3000, time_limit_s=60, seed=1)
    assert first == again
    found_order, buckets, period = first
    assert period <= start
    plan = Plan.for_problem(problem, order=found_order, buckets=buckets, solver=SolverInfo(name="test"))
    assert_within_updates(model, period, simulate(problem, plan).iteration_s)


def test_cpsat_warm_starts_hold_the_anchor_search_and_an_eager_one_keeps_the_engine_order():
    problem = tied()
    options = CpsatOptions(num_workers=1, time_limit_s=20)
    compiled = warm_starts(problem, options, Deadline(20))
    assert any(p.solver.name == "anchor-search" for _, p in compiled)
    eager = Problem(graph=problem.graph, cluster=problem.cluster, mode="overlap", execution="eager")
    found = [p for _, p in warm_starts(eager, options, Deadline(20)) if p.solver.name == "anchor-search"]
    assert found and all(list(p.order) == engine_order(problem.graph) for p in found)
    off = CpsatOptions.make({"anchor_search": False}, num_workers=1, time_limit_s=20)
    assert not any(p.solver.name == "anchor-search" for _, p in warm_starts(problem, off, Deadline(20)))


def test_in_eager_mode_the_dp_period_bounds_the_simulated_one_too():
    problem = Problem(graph=transformer_like(2), cluster=Cluster.preset("100gbe", world_size=64), mode="overlap",
                      execution="eager")
    model = AnchorSequences(problem, engine_order(problem.graph))
    rng = random.Random(1)
    for _ in range(10):
        seq = model.canonical(model.anchor(), {u for u in range(model.n) if rng.random() < 0.5})
        period = model.period(seq)
        assert_within_updates(model, period, simulated(problem, model, seq, period))


def test_a_bucket_holds_one_dtype():
    """Half the parameters in bfloat16: every plan the search returns validates (one dtype per
    bucket), and its period is the simulated one's bound."""
    from schedopt.backward import ForwardOp, ParamSpec, training_graph
    from schedopt.cost import DeviceSpec

    ops, prev = [], ()
    for i in range(6):
        ops.append(ForwardOp(id=f"l{i}", kind="linear", inputs=prev, reads=(f"w{i}",), flops=2e9))
        prev = (f"l{i}",)
    ops.append(ForwardOp(id="loss", kind="loss", inputs=prev, flops=1e6))
    params = [ParamSpec(name=f"w{i}", shape=(2_000_000,), dtype="bfloat16" if i % 2 else "float32") for i in range(6)]
    graph = training_graph("mixed", ops, params, device=DeviceSpec.preset("a100"), optimizer="sgd")
    problem = Problem(graph=graph, cluster=Cluster.preset("100gbe", world_size=64), mode="overlap",
                      execution="compiled")
    order, buckets, period = anchor_search(problem, engine_order(graph), max_evaluations=2000, time_limit_s=60)
    assert all(len({graph.params[n].dtype for n in b}) == 1 for b in buckets)
    plan = Plan.for_problem(problem, order=order, buckets=buckets, solver=SolverInfo(name="test"))
    assert simulate(problem, plan).iteration_s <= period * (1 + 1e-9)
