"""Sharded mode: the module tree, units, the simulator by hand, the bound, the baselines, bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedopt import Cluster, Plan, Problem, TrainGraph, simulate
from schedopt.errors import InvalidPlanError, OverBudgetError, SchedoptError, SolverError, UnitError
from schedopt.graph import Op, Param
from schedopt.modules import ModuleTree
from schedopt.plan import SolverInfo, validate
from schedopt.shard_sim import _most_held, fewest_units, memory_floor, regathered_bytes, sharded_lower_bound
from schedopt.sharding import Unit
from schedopt.solvers import get, solvers_for
from schedopt.solvers.fine_units import least_memory_plan, pipelined_plan
from schedopt.synthetic import chain, transformer_like
from schedopt.units import format_size

from .conftest import MS
from .strategies import sharded_cases

ROOT = Path(__file__).resolve().parents[1]


def three_layers() -> TrainGraph:
    """f0 f1 f2 (1 ms each) then b2 b1 b0 (2 ms each), three 4000-byte weights, no optimizer time."""
    ops = [Op(id=f"f{i}", kind="linear", phase="forward", duration_s=MS, reads=(f"l{i}.w",)) for i in range(3)]
    ops += [Op(id=f"b{i}", kind="linear.backward", phase="backward", duration_s=2 * MS, reads=(f"l{i}.w",),
               grads=(f"l{i}.w",)) for i in (2, 1, 0)]
    ops.append(Op(id="opt", kind="sgd", phase="optimizer"))
    edges = [("f0", "f1"), ("f1", "f2"), ("f2", "b2"), ("b2", "b1"), ("b1", "b0"), ("b0", "opt")]
    params = [Param(name=f"l{i}.w", shape=(1000,), grad_op=f"b{i}") for i in range(3)]
    names = [p.name for p in params]
    return TrainGraph(name="three", ops=ops, edges=edges, params=params, grad_order=names[::-1],
                      modules=ModuleTree.from_param_names(names))


#: two ranks, no latency: one all-gather or reduce-scatter of 4000 bytes takes 0.5 * 4000 / 2e6 s = 1 ms
TWO = Cluster(world_size=2, bandwidth_Bps=2e6, latency_s=0.0)


def sharded_plan(problem: Problem, units) -> Plan:
    return Plan.for_problem(problem, order=["f0", "f1", "f2", "b2", "b1", "b0", "opt"], units=units,
                            solver=SolverInfo(name="hand"))


def test_three_unit_chain_by_hand():
    """Units [l0] [l1] [l2]; l0, l1 resharded, l2 kept; no prefetch.

    forward: AG0 0-1, f0 1-2; AG1 2-3, f1 3-4; AG2 4-5, f2 5-6.
    backward: b2 6-8 (l2 kept), RS2 8-9; AG_b1 issued 8, starts 9 (FIFO), ends 10; b1 10-12,
    RS1 12-13; AG_b0 issued 12, 13-14; b0 14-16; RS0 16-17; the optimizer (0 s) at 17.
    memory: shards 6000 B; one unsharded unit (4000) from 0 to 6, then a gradient too: 14000 B
    from 6 ms (the first peak), and again while b1 and b0 run.
    """
    problem = Problem(graph=three_layers(), cluster=TWO, mode="sharded")
    units = [Unit(modules=("l0",), params=("l0.w",), prefetch_forward=0, prefetch_backward=0),
             Unit(modules=("l1",), params=("l1.w",), prefetch_forward=0, prefetch_backward=0),
             Unit(modules=("l2",), params=("l2.w",), reshard_after_forward=False, prefetch_forward=0,
                  prefetch_backward=0)]
    t = simulate(problem, sharded_plan(problem, units))
    assert t.iteration_s == pytest.approx(17 * MS)
    comm = sorted((e.start_s, e.end_s, e.name) for e in t.events if e.track == "comm")
    assert [(round(a / MS, 6), round(b / MS, 6)) for a, b, _ in comm] == [
        (0, 1), (2, 3), (4, 5), (8, 9), (9, 10), (12, 13), (13, 14), (16, 17)]
    assert t.comm_s == pytest.approx(8 * MS) and t.compute_s == pytest.approx(9 * MS)
    assert t.peak_memory_bytes == pytest.approx(14000) and t.peak_memory_s == pytest.approx(6 * MS)
    assert t.lower_bound_s <= t.iteration_s
    assert t.windows["l0.w"].synced_s == pytest.approx(17 * MS)



def test_the_bound_of_the_three_unit_chain_by_hand_is_reached():
    """The bound is max(compute 9, F + B, channel) = 11 ms, and a plan reaches it.

    F (the forward's end): f0 cannot start before 4000 B are gathered (1 ms), f1 before 8000 (2),
    f2 before 12000 (3 ms), each then followed by 3, 2, 1 ms of forward: F = 4 ms. B (after it):
    b2 ends 2 ms in, then 12000 B to reduce-scatter (3 ms); b1 4 ms in, then 8000 B (2); b0 6 ms
    in, then 4000 B (1 ms): B = 7 ms. Channel: 3 + 3 ms, plus f2 and b2 (3 ms) when nothing can
    be sent: 9 ms. Every unit kept and gathered at the start: AG0-2 0-3, f0 1-2, f1 2-3, f2 3-4,
    b2 4-6, b1 6-8, b0 8-10, RS2 6-7, RS1 8-9, RS0 10-11.
    """
    problem = Problem(graph=three_layers(), cluster=TWO, mode="sharded")
    units = [Unit(modules=(f"l{i}",), params=(f"l{i}.w",), reshard_after_forward=False, prefetch_forward=i,
                  prefetch_backward=0) for i in range(3)]
    t = simulate(problem, sharded_plan(problem, units))
    assert t.lower_bound_s == pytest.approx(11 * MS)
    assert t.iteration_s == pytest.approx(11 * MS)


def test_a_budget_too_small_to_keep_weights_for_their_backward_raises_the_bound_by_the_second_gathers():
    """On a link of 10 ms per 4000 B the channel decides: 30 ms of all-gathers, 30 of reduce-scatters.

    Shards 6000 B; every plan holds l2 (and its gradient) during b2, l1 during b1, l0 during b0:
    8000 B. With a budget of 14000 B nothing more fits during b2, through which l0 and l1 would have
    to be kept from their forward: both are gathered again (8000 B, 20 ms) and the bound rises from
    63 ms (no budget) to 80. With 18000 B one of them can stay: 4000 B again, 70 ms. The plan that
    reshards l0 and l1 (the hand-checked chain above, 14000 B at its peak) takes 89 ms.
    """
    slow = Cluster(world_size=2, bandwidth_Bps=2e5, latency_s=0.0)
    bound = {}
    for budget in (None, 14000, 18000):
        problem = Problem(graph=three_layers(), cluster=slow, mode="sharded", memory_budget_bytes=budget)
        bound[budget] = (regathered_bytes(problem), sharded_lower_bound(problem))
    assert bound[None] == (0.0, pytest.approx(63 * MS))
    assert bound[14000] == (8000, pytest.approx(80 * MS))
    assert bound[18000] == (4000, pytest.approx(70 * MS))
    problem = Problem(graph=three_layers(), cluster=slow, mode="sharded", memory_budget_bytes=14000)
    units = [Unit(modules=(f"l{i}",), params=(f"l{i}.w",), reshard_after_forward=i < 2, prefetch_forward=0,
                  prefetch_backward=0) for i in range(3)]
    t = simulate(problem, sharded_plan(problem, units))
    assert (t.iteration_s, t.peak_memory_bytes) == (pytest.approx(89 * MS), pytest.approx(14000))
    assert t.lower_bound_s == pytest.approx(80 * MS)
    # with 1 ms a collective: at least 3 units (no unit holds more than 4000 B where its last gradient is
    # finished), and the 8000 B again in at least two all-gathers: 31 + 31 + 2 (1 + 1) + 2 + 20 = 88 ms
    fixed = replace(problem, cluster=replace(slow, latency_s=1e-3))
    assert fewest_units(fixed) == 3 and sharded_lower_bound(fixed) == pytest.approx(88 * MS)
    assert simulate(fixed, sharded_plan(fixed, units)).iteration_s >= 88 * MS


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=8).flatmap(lambda spare: st.tuples(
    st.just(spare), st.lists(st.tuples(st.integers(0, len(spare) - 1), st.integers(0, len(spare) - 1),
                                       st.integers(1, 40)), max_size=8))))
def test_the_bytes_held_across_gaps_are_the_packing_optimum(case):
    """Earliest end first is the optimum of the interval packing, checked against GLOP's LP."""
    from ortools.linear_solver import pywraplp

    spare, drawn = case
    gaps = [(max(a, b), min(a, b), float(n)) for a, b, n in drawn]
    lp = pywraplp.Solver.CreateSolver("GLOP")
    x = [lp.NumVar(0, n, f"x{k}") for k, (_, _, n) in enumerate(gaps)]
    for j, cap in enumerate(spare):
        lp.Add(sum(v for v, (last, first, _) in zip(x, gaps) if first <= j <= last) <= cap)
    lp.Maximize(sum(x))
    assert lp.Solve() == lp.OPTIMAL
    assert _most_held([float(c) for c in spare], gaps) == pytest.approx(lp.Objective().Value(), abs=1e-6)


def test_on_gloo_the_host_waits_for_reduce_scatters_and_synchronous_all_gathers():
    """The same kept, gathered-ahead plan as above with the host running the collectives (gloo).

    Asynchronous all-gathers (schedopt's runtime): AG0-2 0-3 as before, f0-f2 1-4, b2 4-6, then RS2
    6-7 blocks the backward, b1 7-9, RS1 9-10, b0 10-12, RS0 12-13: 13 ms. FSDP2's default, each
    all-gather blocking the host where it is issued (all three at the step's start): f0 3-4 ... f2
    5-6, b2 6-8, RS2 8-9, b1 9-11, RS1 11-12, b0 12-14, RS0 14-15: 15 ms.
    """
    gloo = replace(TWO, backend="gloo")
    problem = Problem(graph=three_layers(), cluster=gloo, mode="sharded")
    units = [Unit(modules=(f"l{i}",), params=(f"l{i}.w",), reshard_after_forward=False, prefetch_forward=i,
                  prefetch_backward=0) for i in range(3)]
    plan = sharded_plan(problem, units)
    assert simulate(problem, plan).iteration_s == pytest.approx(13 * MS)
    assert simulate(problem, replace(plan, async_unshard=False)).iteration_s == pytest.approx(15 * MS)
    assert simulate(problem, plan).lower_bound_s <= 13 * MS


def test_a_tied_weight_s_gradient_counts_from_the_backward_of_its_last_read():
    """e.w is read first (an embedding) and last (a tied head): the backward of the head makes its
    gradient's first part, which autograd holds until the embedding's backward finishes it, so the
    simulator counts e.w's gradient from b2 (its first backward touch), not from b0."""
    ops = [Op(id="f0", kind="embedding", phase="forward", duration_s=MS, reads=("e.w",)),
           Op(id="f1", kind="linear", phase="forward", duration_s=MS, reads=("l.w",)),
           Op(id="f2", kind="linear", phase="forward", duration_s=MS, reads=("e.w",)),
           Op(id="b2", kind="linear.backward", phase="backward", duration_s=2 * MS, reads=("e.w",)),
           Op(id="b1", kind="linear.backward", phase="backward", duration_s=2 * MS, reads=("l.w",), grads=("l.w",)),
           Op(id="b0", kind="embedding.backward", phase="backward", duration_s=2 * MS, grads=("e.w",)),
           Op(id="opt", kind="sgd", phase="optimizer")]
    edges = [("f0", "f1"), ("f1", "f2"), ("f2", "b2"), ("b2", "b1"), ("b1", "b0"), ("b0", "opt")]
    params = [Param(name="e.w", shape=(1000,), grad_op="b0"), Param(name="l.w", shape=(1000,), grad_op="b1")]
    graph = TrainGraph(name="tied", ops=ops, edges=edges, params=params, grad_order=["l.w", "e.w"],
                       modules=ModuleTree.from_param_names(["e.w", "l.w"]))
    problem = Problem(graph=graph, cluster=TWO, mode="sharded")
    units = [Unit(modules=("",), params=("e.w",), reshard_after_forward=False, prefetch_backward=0),
             Unit(modules=("l",), params=("l.w",), reshard_after_forward=False, prefetch_backward=0)]
    plan = Plan.for_problem(problem, order=["f0", "f1", "f2", "b2", "b1", "b0", "opt"], units=units,
                            solver=SolverInfo(name="hand"))
    from schedopt.shard_sim import run_sharded_step

    step = run_sharded_step(graph, plan, TWO)
    born = [t for t, delta, what in step.memory_deltas if what == "unit 0 gradients" and delta > 0]
    assert born == [step.op_start[3]]  # b2's start
    # while b1 runs: the shards (4000), both units' parameters (8000), e.w's and l.w's gradients (8000)
    assert step.peak()[0] == pytest.approx(20000)
    # and no plan holds less: e.w is read by f0 and again by f2 (tied), so from b2 to b0 its parameters
    # and gradient are held, and while b1 runs l.w's are too
    assert memory_floor(problem) == (pytest.approx(20000), "during b1 (backward)")

def test_one_unit_without_reshard_moves_one_all_reduce_volume():
    graph = chain(4)
    cluster = Cluster(world_size=8, bandwidth_Bps=12.5e9, latency_s=0.0)
    problem = Problem(graph=graph, cluster=cluster, mode="sharded")
    plan = get("fsdp-root")(problem)
    assert len(plan.units) == 1 and not plan.units[0].reshard_after_forward
    assert simulate(problem, plan).comm_s == pytest.approx(cluster.allreduce_s(graph.total_param_bytes))


def test_hsdp_shards_over_a_replica_and_all_reduces_across_the_replicas(tmp_path):
    """HSDP, 8 ranks as 2 replicas of 4: all-gathers and reduce-scatters over 4 ranks, then the reduced
    quarter all-reduced over 2; each rank holds a quarter of every unit. As many replicas as ranks is
    DDP's all-reduce of every byte."""
    c = Cluster(world_size=8, replicas=2, bandwidth_Bps=1e9, latency_s=1e-5)
    b = 4e6
    assert c.shard_group == 4 and c.shard_collective_s(b) == pytest.approx(3e-5 + 0.75 * b / 1e9)
    assert c.shard_collective_s(b, "reduce-scatter") == pytest.approx(3e-5 + 0.75 * b / 1e9 + 2e-5 + (b / 4) / 1e9)
    full = Cluster(world_size=8, replicas=8, bandwidth_Bps=1e9, latency_s=1e-5)
    assert full.shard_collective_s(b) == 0.0
    assert full.shard_collective_s(b, "reduce-scatter") == pytest.approx(Cluster(world_size=8, bandwidth_Bps=1e9,
                                                                                 latency_s=1e-5).allreduce_s(b))
    assert Cluster.from_json({k: v for k, v in c.to_json().items() if k != "replicas"}).replicas == 1
    assert Cluster.from_json(c.to_json()) == c
    with pytest.raises(SchedoptError, match="divides the world size 8, got 3"):
        Cluster(world_size=8, replicas=3, bandwidth_Bps=1e9)
    # a faster link inside each replica (NVLink in a node): the all-gathers and reduce-scatters take it,
    # the all-reduce across the replicas the cluster's own
    node = replace(c, shard_bandwidth_Bps=1e11, shard_latency_s=1e-6)
    assert node.shard_collective_s(b) == pytest.approx(3e-6 + 0.75 * b / 1e11)
    assert node.shard_collective_s(b, "reduce-scatter") == pytest.approx(3e-6 + 0.75 * b / 1e11 + 2e-5 + (b / 4) / 1e9)
    assert Cluster.from_json(node.to_json()) == node and "inside each" in node.describe()
    with pytest.raises(UnitError, match="shard_bandwidth_Bps must be a positive number"):
        replace(c, shard_bandwidth_Bps=-1.0)
    graph = chain(4)
    problem = Problem(graph=graph, cluster=c, mode="sharded")
    t = simulate(problem, get("fsdp-root")(problem))
    assert t.memory[0][1] == pytest.approx(graph.total_param_bytes / 4)  # a quarter of the one unit, at rest
    total = graph.total_param_bytes
    assert t.comm_s == pytest.approx(c.shard_collective_s(total) + c.shard_collective_s(total, "reduce-scatter"))
    with pytest.raises(SchedoptError, match="replicas .HSDP. apply to sharded plans"):
        Problem(graph=graph, cluster=c, mode="barrier")
    from schedopt.cli import main

    graph.save(tmp_path / "g.json")
    assert main(["plan", str(tmp_path / "g.json"), "--mode", "sharded", "--solver", "fsdp-per-block", "--world-size",
                 "8", "--network", "100gbe", "--replicas", "2", "--shard-network", "nvlink",
                 "-o", str(tmp_path / "p.json")]) == 0
    planned = Plan.load(tmp_path / "p.json").cluster
    assert (planned.replicas, planned.shard_bandwidth_Bps, planned.bandwidth_Bps) == (2, 300e9, 12.5e9)


def test_measured_shard_costs_apply_only_to_shard_groups_of_the_size_they_were_measured_on(tmp_path, capsys):
    """A calibrated cluster's all-gather and reduce-scatter costs are of its shard group: planned for more
    replicas of that group, they hold (the link across replicas extrapolates); for another group they are
    refused in one line; for another link (--bandwidth, --shard-network, a sweep's bandwidths) the ring's
    costs replace them."""
    from schedopt.cli import main
    from schedopt.report import sweep

    measured = Cluster(world_size=4, replicas=2, bandwidth_Bps=1e9, latency_s=1e-5,
                       shard_costs={"all-gather": (1e-3, 1e-8), "reduce-scatter": (2e-3, 2e-8)})
    assert measured.with_ranks(64, 32).shard_costs == measured.shard_costs  # still groups of 2
    with pytest.raises(SchedoptError, match="measured over 2 ranks; 64 ranks in 8 replica.s. shard over 8"):
        measured.with_ranks(64, 8)
    graph = chain(4)
    graph.save(tmp_path / "g.json")
    measured.save(tmp_path / "c.json")
    base = ["plan", str(tmp_path / "g.json"), "--mode", "sharded", "--solver", "fsdp-per-block", "--cluster",
            str(tmp_path / "c.json"), "-o", str(tmp_path / "p.json")]
    assert main([*base, "--world-size", "64", "--replicas", "32"]) == 0
    assert Plan.load(tmp_path / "p.json").cluster.shard_costs == measured.shard_costs
    capsys.readouterr()
    assert main([*base, "--world-size", "64"]) == 2  # FSDP over 64: groups of 64
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "calibrate --replicas" in err
    for other_link in (["--bandwidth", "10Gbps"], ["--shard-network", "nvlink"],
                       ["--world-size", "64", "--shard-network", "nvlink"]):  # another group, on a link given
        assert main([*base, *other_link]) == 0
        assert Plan.load(tmp_path / "p.json").cluster.shard_costs is None
    rows = sweep(graph, measured, bandwidths_Bps=[1e8, 1e10], world_sizes=[4], solvers=["fsdp-root"], mode="sharded")
    assert rows[0]["iteration_s"] > rows[1]["iteration_s"]  # each bandwidth's own costs, not the measured ones


@settings(max_examples=300, deadline=None)
@given(sharded_cases())
def test_the_sharded_bounds_of_time_and_memory_never_exceed_a_plan(case):
    problem, units, async_unshard = case
    from schedopt.orders import engine_order

    plan = Plan.for_problem(problem, order=engine_order(problem.graph), units=units, solver=SolverInfo(name="random"),
                            async_unshard=async_unshard)
    t = simulate(problem, plan)
    assert t.lower_bound_s <= t.iteration_s * (1 + 1e-9)
    # a budget of the plan's own peak admits the plan: the bound that prices the budget stays under it
    at_peak = replace(problem, memory_budget_bytes=math.ceil(t.peak_memory_bytes))
    assert sharded_lower_bound(at_peak) <= t.iteration_s * (1 + 1e-9)
    assert fewest_units(at_peak) <= len(plan.units)  # the budget caps each unit's size, so how few fit
    assert t.peak_memory_bytes >= memory_floor(problem)[0] * (1 - 1e-9)
    assert memory_floor(problem)[0] > problem.graph.total_param_bytes / problem.cluster.shard_group


def test_every_sharded_solver_keeps_to_the_budget_or_says_the_least_it_reaches():
    graph = transformer_like(4, hidden=256, num_heads=4, seq_len=128, vocab_size=1000)
    free = Problem(graph=graph, cluster=Cluster.preset("100gbe", world_size=8), mode="sharded")
    peak = get("fsdp-per-block")(free).predicted.peak_memory_bytes
    tight = replace(free, memory_budget_bytes=int(peak))
    for name in solvers_for("sharded"):
        try:
            plan = get(name)(tight, **({"time_limit_s": 1} if name == "cpsat" else {}))
        except OverBudgetError as exc:  # one line naming the least peak its layout reaches
            assert f"{name}: its units peak at {format_size(exc.least_peak_bytes)}" in str(exc)
            assert "at the least" in str(exc) and exc.least_peak_bytes > peak
            continue
        assert plan.predicted.peak_memory_bytes <= peak and plan.memory_budget_bytes == int(peak)
    seen = []
    cp = get("cpsat")(tight, time_limit_s=1, on_progress=seen.append)
    assert cp.predicted.iteration_s <= get("fsdp-per-block")(tight).predicted.iteration_s * (1 + 1e-9)
    # its progress: the warm starts' best, then CP-SAT's plan where it is faster, each beside the bound
    assert len(seen) == (2 if cp.solver.stats["result"] == "model" else 1)
    assert seen[0].objective_s == cp.solver.stats["warm_start_step_s"] and seen[-1].objective_s == cp.solver.objective_s
    assert all(e.bound_s == min(cp.solver.bound_s, e.objective_s) for e in seen)
    with pytest.raises(SolverError, match=r"fsdp-per-block: its units peak at .* at the least"):
        get("fsdp-per-block")(replace(free, memory_budget_bytes=1000))
    with pytest.raises(SolverError, match="does not plan sharded mode"):
        get("horovod")(free)
    with pytest.raises(SolverError, match="does not plan barrier mode"):
        get("fsdp-size")(replace(free, mode="barrier"))


def test_validate_refuses_what_fully_shard_cannot_express():
    problem = Problem(graph=three_layers(), cluster=TWO, mode="sharded")
    ok = [Unit(modules=(f"l{i}",), params=(f"l{i}.w",), prefetch_forward=0, prefetch_backward=0) for i in range(3)]
    validate(sharded_plan(problem, ok), problem.graph)
    cases = {
        "in two units": [ok[0], replace(ok[1], params=("l1.w", "l0.w")), ok[2]],
        "in no unit": ok[:2],
        "does not have": [ok[0], ok[1], replace(ok[2], modules=("l9",))],
        "forward order": [ok[1], ok[0], ok[2]],
        "prefetch_forward": [ok[0], replace(ok[1], prefetch_forward=3), ok[2]],
        "fully_shard would not give it": [ok[0], replace(ok[1], modules=("l2",)), replace(ok[2], modules=("l1",))],
    }
    for expected, units in cases.items():
        with pytest.raises(InvalidPlanError, match=expected):
            validate(sharded_plan(problem, units), problem.graph)
    over = replace(sharded_plan(problem, ok), memory_budget_bytes=9000)
    with pytest.raises(InvalidPlanError, match="over its memory budget"):
        validate(over, problem.graph)


def test_a_tied_embedding_cannot_be_resharded_alone():
    graph = transformer_like(2, hidden=64, num_heads=4, seq_len=16, vocab_size=100)
    problem = Problem(graph=graph, cluster=Cluster.preset("100gbe", world_size=8), mode="sharded")
    plan = get("fsdp-per-block")(problem)
    assert plan.units[0].is_root and "wte.weight" in plan.units[0].params
    from solvers.fsdp import build_units

    units = build_units(graph, [["wte"], ["h.0"], ["h.1"]], reshard=[True, True, False])
    bad = Plan.for_problem(problem, order=plan.order, units=units, solver=SolverInfo(name="hand"))
    with pytest.raises(InvalidPlanError, match="reads it after unit 2's forward began"):
        validate(bad, graph)


def test_plans_round_trip_and_old_graphs_plan_only_the_root(tmp_path):
    graph = transformer_like(2, hidden=64, num_heads=4, seq_len=16, vocab_size=100)
    problem = Problem(graph=graph, cluster=Cluster.preset("ib-hdr", world_size=64), mode="sharded",
                      memory_budget_bytes=10**9)
    plan = get("fsdp-size")(problem)
    plan.save(tmp_path / "p.json")
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["schema"] == "schedopt.plan/4" and data["units"] and data["memory_budget_bytes"] == 10**9
    assert data["predicted"]["peak_memory_bytes"] == plan.predicted.peak_memory_bytes
    again = Plan.load(tmp_path / "p.json")
    assert again.units == plan.units
    old = graph.to_json()
    del old["modules"]
    legacy = TrainGraph.from_json(old)
    assert legacy.modules is None
    problem = replace(problem, graph=legacy)
    assert len(get("fsdp-root")(problem).units) == 1
    with pytest.raises(SolverError, match="no module tree"):
        get("fsdp-per-block")(problem)


@pytest.mark.parametrize("argv, expected", [
    (["--memory-budget=-1GiB"], "--memory-budget"),
    (["--memory-budget", "lots"], "--memory-budget"),
    (["--memory-budget", "1KiB", "--solver", "fsdp-per-block"], "at the least"),
    (["--solver", "tictac"], "does not plan sharded mode"),
    (["--solver", "fsdp-root", "--world-size", "8", "--replicas", "3"], "replicas must be a whole number that divides"),
])
def test_bad_budgets_end_with_one_line_and_status_2(tmp_path, capsys, argv, expected):
    from schedopt.cli import main

    graph = transformer_like(2, hidden=64, num_heads=4, seq_len=16, vocab_size=100)
    graph.save(tmp_path / "g.json")
    try:
        status = main(["plan", str(tmp_path / "g.json"), "--mode", "sharded", "-o", str(tmp_path / "p.json"), *argv])
    except SystemExit as exc:  # argparse refuses a malformed size itself
        status = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "p.json").exists()


def test_every_unit_of_every_solver_builds_with_fully_shard():
    """Each example model on the meta device, fully_shard per unit, children first: FSDP2 gives each
    unit exactly the parameters the plan lists (a one-rank gloo group; tests/fsdp_build.py)."""
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "fsdp_build.py")], capture_output=True, text=True,
                            timeout=240, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "units built" in result.stdout


def test_compare_sweep_and_simulate_rows_carry_peak_memory(tmp_path, capsys):
    from schedopt.cli import main

    graph = transformer_like(2, hidden=64, num_heads=4, seq_len=16, vocab_size=100)
    graph.save(tmp_path / "g.json")
    common = ["--mode", "sharded", "--world-size", "8", "--network", "100gbe", "--time-limit", "1"]
    assert main(["compare", str(tmp_path / "g.json"), "--solvers", "all", "--format", "json", *common]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["solver"] for r in rows] == solvers_for("sharded")
    assert all(r["peak_memory_bytes"] > 0 and r["iteration_s"] > 0 and r["num_units"] >= 1 for r in rows)
    per_block = next(r["iteration_s"] for r in rows if r["solver"] == "fsdp-per-block")
    assert all(r["speedup_vs_fsdp"] == pytest.approx(per_block / r["iteration_s"], rel=1e-12) for r in rows)
    assert main(["compare", str(tmp_path / "g.json"), "--solvers", "fsdp-root,fsdp-size", "--memory-budget", "200KiB",
                 "--format", "json", *common]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows[0]["status"] == "OVER_BUDGET" and "at the least" in rows[0]["error"]
    assert all(r["speedup_vs_fsdp"] is None for r in rows)  # per block does not fit 200 KiB either
    assert main(["compare", str(tmp_path / "g.json"), "--solvers", "fsdp-size", "--format", "json", *common]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]  # per block planned as the baseline, not shown
    assert row["speedup_vs_fsdp"] == pytest.approx(get("fsdp-per-block")(Problem(
        graph=graph, cluster=Cluster.preset("100gbe", world_size=8), mode="sharded")).predicted.iteration_s
        / row["iteration_s"], rel=1e-12)
    assert main(["sweep", str(tmp_path / "g.json"), "--solvers", "fsdp-per-block", "--bandwidths", "10Gbps,100Gbps",
                 "--world-sizes", "8", "--mode", "sharded", "--format", "json"]) == 0
    assert all(r["peak_memory_bytes"] > 0 for r in json.loads(capsys.readouterr().out))
    assert main(["sweep", str(tmp_path / "g.json"), "--solvers", "fsdp-root", "--bandwidths", "10Gbps,100Gbps",
                 "--world-sizes", "8", "--mode", "sharded", "--memory-budget", "200KiB"]) == 0
    why = [line for line in capsys.readouterr().out.splitlines() if "over the memory budget of 200.0KiB" in line]
    assert [line.split(": ")[:2] for line in why] == [["8 ranks at 10Gbps", "fsdp-root"],
                                                       ["8 ranks at 100Gbps", "fsdp-root"]]
    assert main(["plan", str(tmp_path / "g.json"), "--solver", "fsdp-per-block", "-o", str(tmp_path / "p.json"),
                 *common]) == 0
    capsys.readouterr()
    assert main(["simulate", str(tmp_path / "p.json"), str(tmp_path / "g.json"), "--format", "json",
                 "--trace", str(tmp_path / "t.json")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["peak_memory_bytes"] > 0 and summary["num_units"] == 3
    trace = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert any(e["ph"] == "C" for e in trace) and any(e.get("cat") == "all-gather" for e in trace)
    # a plan within a budget is simulated within it: its lower bound is the one its solver reported
    # (a budget of 300 KiB holds the bound at 0.94 ms; with none it would be 0.57 ms)
    assert main(["plan", str(tmp_path / "g.json"), "--solver", "cpsat", "--memory-budget", "300KiB", "-o",
                 str(tmp_path / "b.json"), *common]) == 0
    capsys.readouterr()
    assert main(["simulate", str(tmp_path / "b.json"), str(tmp_path / "g.json"), "--format", "json"]) == 0
    summary, budgeted = json.loads(capsys.readouterr().out), Plan.load(tmp_path / "b.json")
    assert summary["memory_budget_bytes"] == 300 * 1024
    assert summary["lower_bound_s"] == budgeted.predicted.lower_bound_s > sharded_lower_bound(
        replace(budgeted.problem(graph), memory_budget_bytes=None))


def test_simulate_runs_a_sharded_plan_on_varying_ranks(tmp_path, capsys):
    """``simulate --op-spread``: the sharded step on every rank, each collective waiting for the last."""
    from schedopt.cli import main

    graph = transformer_like(2, hidden=64, num_heads=4, seq_len=16, vocab_size=100)
    graph.save(tmp_path / "g.json")
    assert main(["plan", str(tmp_path / "g.json"), "--mode", "sharded", "--solver", "fsdp-per-block",
                 "--world-size", "8", "-o", str(tmp_path / "p.json")]) == 0
    capsys.readouterr()
    assert main(["simulate", str(tmp_path / "p.json"), str(tmp_path / "g.json"), "--format", "json",
                 "--op-spread", "10%", "--ranks", "16"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ranks"]["ranks"] == 16 and summary["ranks"]["period_s"] > summary["iteration_s"]


def test_the_comparison_chart_of_sharded_plans_names_their_collectives(tmp_path, monkeypatch):
    """compare --out's chart: per block above cpsat, its legend the all-gathers and reduce-scatters."""
    from schedopt import plots
    from schedopt.trace import write_gantt_comparison

    shown = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: shown.append(fig))
    problem = Problem(graph=transformer_like(2), cluster=Cluster.preset("100gbe", world_size=8), mode="sharded")
    timelines = [(name, simulate(problem, get(name)(problem, **kw))) for name, kw in
                 (("fsdp-per-block", {}), ("cpsat", {"time_limit_s": 1}))]
    write_gantt_comparison(timelines, tmp_path / "c.png")
    labels = [t.get_text() for ax in shown[0].axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert {"all-gather", "reduce-scatter"} <= set(labels) and not any("all-reduce" in x for x in labels)


def test_cpsat_keeps_units_whole_blocks_when_fine_units_is_off():
    """``tuning={"fine_units": False}``: no unit finer than the block level (a model that changes a
    layer's output in place loses FSDP2's pre-backward hook on it), where the default picks finer ones."""
    from schedopt.solvers.fsdp import atoms

    graph = transformer_like(8, hidden=512, num_heads=8, seq_len=256, vocab_size=8000)
    problem = Problem(graph=graph, cluster=Cluster.preset("ib-hdr", world_size=8), mode="sharded")
    blocks = set(atoms(graph)[0]) | {""}
    fine = get("cpsat")(problem, time_limit_s=2)
    assert any(set(u.modules) - blocks for u in fine.units)  # the pipelined units won: a block's own layers
    whole = get("cpsat")(problem, time_limit_s=2, tuning={"fine_units": False})
    assert all(set(u.modules) <= blocks for u in whole.units), [u.modules for u in whole.units]
    assert whole.predicted.iteration_s > fine.predicted.iteration_s  # 9.71 against 9.30 ms
    with pytest.raises(SolverError, match="fine_units must be true or false"):
        get("cpsat")(problem, time_limit_s=1, tuning={"fine_units": "no"})


def test_inspect_lists_a_sharded_plans_units_with_their_flags_and_the_peak(tmp_path, capsys):
    """What FSDP2 is told per unit, in forward order: gathered bytes, reshard, prefetch distances."""
    from schedopt.cli import main

    graph = transformer_like(2, hidden=64, num_heads=4, seq_len=16, vocab_size=100)
    graph.save(tmp_path / "g.json")
    assert main(["plan", str(tmp_path / "g.json"), "--mode", "sharded", "--solver", "fsdp-per-block",
                 "--memory-budget", "10MiB", "-o", str(tmp_path / "p.json")]) == 0
    plan = Plan.load(tmp_path / "p.json")
    for argv in ([], [str(tmp_path / "g.json")]):  # sizes from the plan's own record, or from the graph
        capsys.readouterr()
        assert main(["inspect", str(tmp_path / "p.json"), *argv]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert f"memory     peak {format_size(plan.predicted.peak_memory_bytes)} per rank (budget 10.0MiB)" in lines
        rows = lines[lines.index(next(x for x in lines if x.strip().startswith("#"))) + 1:]
        assert len(rows) == len(plan.units) == 3 and "buckets" not in "\n".join(lines)
        for row, unit in zip(rows, plan.units):
            k, nparams, size, reshard, prefetch, modules = row.split(maxsplit=5)
            assert int(nparams) == len(unit.params) and prefetch == f"{unit.prefetch_forward}/{unit.prefetch_backward}"
            assert size == format_size(sum(graph.params[n].nbytes for n in unit.params))
            assert reshard == ("yes" if unit.reshard_after_forward else "kept")
            assert modules == ("(the root module)" if unit.is_root else unit.modules[0])
    # under a budget its own knobs exceed (714 KiB), the layout is planned at its least peak, and says so
    assert main(["plan", str(tmp_path / "g.json"), "--mode", "sharded", "--solver", "fsdp-per-block",
                 "--memory-budget", "600KiB", "-o", str(tmp_path / "lean.json")]) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "lean.json")]) == 0
    assert "every unit resharded, no prefetch: the layout's least peak (its own knobs peak over the budget)" in \
        capsys.readouterr().out


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


def test_the_finest_units_reach_the_memory_floor_where_no_block_layout_fits():
    """Every unit a layer, every one resharded, nothing prefetched: the least peak of any plan. A budget at
    that floor has a plan (cpsat's), none of the block layouts; one byte under it, none, said in one line."""
    graph = transformer_like(4, hidden=256, num_heads=4, seq_len=128, vocab_size=1000)
    free = Problem(graph=graph, cluster=Cluster.preset("100gbe", world_size=8), mode="sharded")
    floor = memory_floor(free)[0]
    assert least_memory_plan(free)[1] == floor
    tight = replace(free, memory_budget_bytes=math.ceil(floor))
    with pytest.raises(SolverError, match="per rank at the least"):
        get("fsdp-per-block")(tight)
    plan = get("cpsat")(tight, time_limit_s=1)
    assert plan.predicted.peak_memory_bytes <= tight.memory_budget_bytes and len(plan.units) > 4
    with pytest.raises(OverBudgetError, match=r"finest units .* peak at 5\.6MiB, and no plan can peak under "
                                              r"5\.6MiB; the baselines' least: fsdp-root .*MiB") as below:
        get("cpsat")(replace(free, memory_budget_bytes=math.floor(floor) - 1), time_limit_s=1)
    assert "\n" not in str(below.value) and below.value.least_peak_bytes == floor
