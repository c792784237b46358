"""Each heuristic reproduces a case checked by hand from its source; Caramel never loses to DDP."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedopt import Cluster, Plan, Problem, simulate
from schedopt.errors import SolverError
from schedopt.orders import engine_order
from schedopt.plan import SolverInfo
from schedopt.solvers import get
from schedopt.solvers.bucketing import optimal_contiguous_buckets
from schedopt.solvers.bytescheduler import credit_schedule
from schedopt.solvers.common import GradGroup
from schedopt.solvers.horovod import horovod_buckets
from schedopt.solvers.mgwfbp import mgwfbp_buckets
from schedopt.solvers.tictac import dispatch_by_priority, johnson_order
from schedopt.synthetic import branches, chain, diamond, transformer_like

from .strategies import random_buckets, train_graphs

MS = 1e-3


def test_mgwfbp_merges_on_a_four_layer_example():
    """Layers ready at 1.0, 1.2, 3.0, 3.1 ms, 1 MB each; a = 0.5 ms, b = 1 ms/MB.

    L4 opens a bucket starting at 1.0. L3 is ready at 1.2 < 1.0 + 0.5: merge; start 1.2.
    L2 at 3.0 >= 1.2 + 0.5: close [L4, L3], which ends 1.2 + 0.5 + 2 = 3.7; L2 starts at max(3.0, 3.7) = 3.7.
    L1 at 3.1 < 3.7 + 0.5: merge.  ->  [[L4, L3], [L2, L1]]
    """
    groups = [GradGroup(op=f"b{n}", ready_s=t * MS, params=(f"L{n}",), nbytes=1_000_000)
              for n, t in ((4, 1.0), (3, 1.2), (2, 3.0), (1, 3.1))]
    assert mgwfbp_buckets(groups, alpha_s=0.5 * MS, beta_s_per_byte=1e-9) == [["L4", "L3"], ["L2", "L1"]]
    # with no start-up cost nothing is worth merging
    assert mgwfbp_buckets(groups, alpha_s=0.0, beta_s_per_byte=1e-9) == [["L4"], ["L3"], ["L2"], ["L1"]]


def test_tictac_uses_johnsons_rule_among_ready_transfers():
    """Jobs (comm, dependent compute): A (1,3), B (2,1), C (3,4), D (4,2).

    Johnson: c <= d by increasing c -> A, C; then c > d by decreasing d -> D, B.
    All ready at once the network sends A C D B; if C is only ready at 100, the others go first.
    """
    jobs = {"A": (1.0, 3.0), "B": (2.0, 1.0), "C": (3.0, 4.0), "D": (4.0, 2.0)}
    assert johnson_order(jobs) == ["A", "C", "D", "B"]
    rank = {n: i for i, n in enumerate(johnson_order(jobs))}
    comm = {n: c for n, (c, _) in jobs.items()}
    assert dispatch_by_priority(dict.fromkeys(jobs, 0.0), comm, rank) == ["A", "C", "D", "B"]
    assert dispatch_by_priority({"A": 0.0, "B": 0.0, "C": 100.0, "D": 0.0}, comm, rank) == ["A", "D", "B", "C"]


def test_horovod_fuses_per_cycle_up_to_the_threshold():
    """Cycle 1 ms, threshold 25 B: a, b, c ready in the first cycle (a+b = 20 fits, +c = 30 does not);
    d is ready in the second cycle; e (40 B) exceeds the threshold and goes alone."""
    ready = [("a", 0.1e-3, 10, "f"), ("b", 0.2e-3, 10, "f"), ("c", 0.3e-3, 10, "f"), ("d", 1.5e-3, 10, "f"),
             ("e", 1.6e-3, 40, "f")]
    assert horovod_buckets(ready, cycle_s=1e-3, threshold_bytes=25) == [["a", "b"], ["c"], ["d"], ["e"]]


def test_bytescheduler_commits_front_layers_first_within_the_credit():
    """Three tensors ready at 0 (priorities: front layer 0 first); x is ready later and has top priority.

    Credit 1 byte: one commitment at a time, so x (ready at 0.5) preempts the remaining low-priority ones.
    """
    ready = {"back": 0.0, "mid": 0.0, "front": 0.0, "x": 0.5}
    duration = dict.fromkeys(ready, 1.0)
    nbytes = dict.fromkeys(ready, 10)
    priority = {"back": 3, "mid": 2, "front": 1, "x": 0}
    assert credit_schedule(ready, duration, nbytes, priority, credit_bytes=1) == ["front", "x", "mid", "back"]
    # a large credit commits everything ready at once, in priority order
    assert credit_schedule(ready, duration, nbytes, priority, credit_bytes=100) == ["front", "mid", "back", "x"]


GRAPHS = [chain(6), diamond(), branches(4), transformer_like(4)]


@pytest.mark.parametrize("graph", GRAPHS, ids=lambda g: g.name)
@pytest.mark.parametrize("network", ["10gbe", "100gbe", "nvlink"])
@pytest.mark.parametrize("mode", ["barrier", "overlap"])
def test_caramel_is_never_slower_than_ddp(graph, network, mode):
    problem = Problem(graph=graph, cluster=Cluster.preset(network, world_size=8), mode=mode)
    caramel, ddp = get("caramel")(problem), get("pytorch-ddp")(problem)
    assert caramel.predicted.iteration_s <= ddp.predicted.iteration_s * (1 + 1e-9)


def test_caramel_raises_weight_gradients_before_input_gradients():
    graph = transformer_like(2)
    problem = Problem(graph=graph, cluster=Cluster.preset("10gbe", world_size=8))
    order = get("caramel")(problem).order
    position = {o: i for i, o in enumerate(order)}
    # once c_proj's backward input op has run, its weight gradient is ready and goes before the GELU's
    assert position["h.1.mlp.c_proj.grad_weight"] < position["h.1.mlp.gelu.grad_input"]


def brute_force_contiguous(graph, order, cluster) -> float:
    from schedopt.solvers.common import grad_groups

    names = [n for g in grad_groups(graph, order) for n in g.params]
    problem = Problem(graph=graph, cluster=cluster, mode="barrier")
    best = float("inf")
    for mask in itertools.product([False, True], repeat=len(names) - 1):
        buckets, current = [], [names[0]]
        for cut, name in zip(mask, names[1:]):
            if cut:
                buckets.append(current)
                current = []
            current.append(name)
        buckets.append(current)
        plan = Plan.for_problem(problem, order=order, buckets=buckets, solver=SolverInfo(name="bf"))
        best = min(best, simulate(problem, plan).iteration_s)
    return best


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=train_graphs(max_ops=6), data=st.data())
def test_contiguous_dp_beats_every_bucketing_of_its_order(graph, data):
    """The DP is optimal among contiguous bucketings (brute force), and no bucketing at all does better."""
    cluster = Cluster(world_size=data.draw(st.integers(2, 32)), bandwidth_Bps=data.draw(st.floats(1e8, 1e10)),
                      latency_s=data.draw(st.floats(0, 1e-4)), call_s=data.draw(st.floats(0, 1e-4)))
    order = engine_order(graph)
    problem = Problem(graph=graph, cluster=cluster, mode="barrier")
    buckets, _ = optimal_contiguous_buckets(graph, order, cluster)
    dp = simulate(problem, Plan.for_problem(problem, order=order, buckets=buckets,
                                            solver=SolverInfo(name="dp"))).iteration_s
    assert dp == pytest.approx(brute_force_contiguous(graph, order, cluster), rel=1e-9)
    other = [b.params for b in data.draw(random_buckets(graph))]
    rival = simulate(problem, Plan.for_problem(problem, order=order, buckets=other, solver=SolverInfo(name="r")))
    assert dp <= rival.iteration_s * (1 + 1e-9)


def test_caramel_pipeline_stops_at_its_deadline(chain3):
    import time

    from schedopt.solvers.caramel import pipeline

    problem = Problem(graph=chain3, cluster=Cluster(world_size=2, bandwidth_Bps=1e9, latency_s=1e-6))
    plan = Plan.for_problem(problem, order=["fwd", "b2", "b1", "opt"], buckets=[["w2", "w1"]],
                            solver=SolverInfo(name="one-bucket"))
    assert pipeline(problem, plan).buckets[0].chunks > 1  # w2's chunk leaves before w1 is ready
    assert pipeline(problem, plan, deadline=time.perf_counter() - 1) is plan
    with pytest.raises(SolverError, match="time_limit_s"):
        get("caramel")(problem, time_limit_s=0)
