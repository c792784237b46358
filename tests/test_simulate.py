"""Simulator cases computed by hand, the lower bound, and invariants on random plans."""

from __future__ import annotations

from dataclasses import replace

import pytest

from schedopt import Bucket, Cluster, Plan, Problem, TrainGraph, lower_bound, simulate
from schedopt.plan import SolverInfo
from schedopt.report import perfect_overlap_s

from .conftest import MS, op, param


def make_plan(problem: Problem, order, buckets) -> Plan:
    return Plan.for_problem(problem, order=order, buckets=buckets, solver=SolverInfo(name="hand"))


def test_chain3_barrier_two_buckets(chain3, two_ranks):
    """3-op chain, buckets [w2], [w1], barrier mode, t(S) = 1 ms + S/1e9 s.

    compute: fwd 0-1, b2 1-3 (w2 ready 3), b1 3-6 (w1 ready 6)
    network: bucket0 = w2 (1 MB, 2 ms) 3-5; bucket1 = w1 (2 MB, 3 ms) at max(6, 5) = 6, ends 9
    barrier at max(6, 9) = 9; optimizer 9-9.5  ->  iteration 9.5 ms
    compute 1+2+3+0.5 = 6.5 ms; comm 2+3 = 5 ms; exposed 9.5-6.5 = 3 ms
    windows: w2 [3, 6] width 3, synced 5, slack 1; w1 [6, 6] width 0, synced 9, slack -3
    lower bound: T_opt + max(a, b, c, tails) = 0.5 + max(6, 3 + C_all 4, 6 + c(w2) 2, and b1's tail: b1 and
    its ancestors 6, then w1's 2 MB, c = 3) = 9.5 ms: this plan is optimal
    """
    problem = Problem(execution="compiled", graph=chain3, cluster=two_ranks, mode="barrier")
    t = simulate(problem, make_plan(problem, ["fwd", "b2", "b1", "opt"], [["w2"], ["w1"]]))
    assert t.iteration_s == pytest.approx(9.5 * MS)
    assert t.compute_s == pytest.approx(6.5 * MS)
    assert t.comm_s == pytest.approx(5 * MS)
    assert t.exposed_comm_s == pytest.approx(3 * MS)
    assert t.lower_bound_s == pytest.approx(9.5 * MS)
    w1, w2 = t.windows["w1"], t.windows["w2"]
    assert (w2.ready_s, w2.deadline_s, w2.synced_s) == pytest.approx((3 * MS, 6 * MS, 5 * MS))
    assert (w1.ready_s, w1.deadline_s, w1.synced_s) == pytest.approx((6 * MS, 6 * MS, 9 * MS))
    assert w2.width_s == pytest.approx(3 * MS) and w1.width_s == pytest.approx(0)
    assert w2.slack_s == pytest.approx(1 * MS) and w1.slack_s == pytest.approx(-3 * MS)  # w1 arrives 3 ms late
    comm = [(e.name, e.start_s, e.end_s) for e in t.events if e.track == "comm"]
    assert comm == [("bucket0", pytest.approx(3 * MS), pytest.approx(5 * MS)),
                    ("bucket1", pytest.approx(6 * MS), pytest.approx(9 * MS))]
    opt = next(e for e in t.events if e.name == "opt")
    assert (opt.start_s, opt.end_s) == pytest.approx((9 * MS, 9.5 * MS))


def test_chain3_overlap_two_buckets(chain3, two_ranks):
    """Same chain and buckets in overlap mode.

    The optimizer (0.5 ms) splits by bytes: bucket0 (w2, 1 MB) 1/6 ms, bucket1 (w1, 2 MB) 1/3 ms.
    step 0: fwd 0-1, b2 1-3, b1 3-6; network w2 3-5, w1 6-9
    step 1 (from 6): fwd reads both: update0 6-6.167; wait for bucket1 until 9; update1 9-9.333;
            fwd 9.333-10.333, b2 -12.333, b1 -15.333
    The cycle: w1 ready -> 3 ms transfer -> 1/3 update -> fwd 1 -> b2 2 -> b1 3 = 9.333 ms per step.
    lower bound (overlap): max(T_fwd + T_bwd + T_opt = 6.5, C_all = 4, and w1's cycle, which every
    plan closes: c(w1) = 3 ms, then fwd to b1, 6 ms) = 9 ms; exposed 2.833 ms.
    """
    problem = Problem(execution="compiled", graph=chain3, cluster=two_ranks, mode="overlap")
    t = simulate(problem, make_plan(problem, ["fwd", "b2", "b1", "opt"], [["w2"], ["w1"]]))
    assert t.iteration_s == pytest.approx((9 + 1 / 3) * MS)
    assert t.lower_bound_s == pytest.approx(9 * MS)
    assert lower_bound(replace(problem, mode="osp")) == pytest.approx(6.5 * MS)  # a stage-2 cycle takes two steps
    assert t.exposed_comm_s == pytest.approx((9 + 1 / 3 - 6.5) * MS)
    step1 = [(e.name, e.start_s, e.end_s) for e in t.events if e.step == 1 and e.track == "compute"]
    assert step1 == [
        ("update[bucket0]", pytest.approx(6 * MS), pytest.approx((6 + 1 / 6) * MS)),
        ("wait[bucket1]", pytest.approx((6 + 1 / 6) * MS), pytest.approx(9 * MS)),
        ("update[bucket1]", pytest.approx(9 * MS), pytest.approx((9 + 1 / 3) * MS)),
        ("fwd", pytest.approx((9 + 1 / 3) * MS), pytest.approx((10 + 1 / 3) * MS)),
        ("b2", pytest.approx((10 + 1 / 3) * MS), pytest.approx((12 + 1 / 3) * MS)),
        ("b1", pytest.approx((12 + 1 / 3) * MS), pytest.approx((15 + 1 / 3) * MS)),
    ]
    # windows: ready at the end of the grad op, needed when the next step reaches fwd
    assert t.windows["w1"].width_s == pytest.approx(0)
    assert t.windows["w2"].width_s == pytest.approx(3 * MS)
    assert all(w.slack_s == pytest.approx(w.deadline_s - w.synced_s) for w in t.windows.values())


def reordered_graph() -> TrainGraph:
    """f1 -> f2 -> b2i -> b1, and f2 -> b2w: the weight gradient of layer 2 is off the critical path."""
    return TrainGraph(
        name="split-backward",
        ops=[
            op("f1", "forward", 1, reads=["w1"]),
            op("f2", "forward", 1, reads=["w2"]),
            op("b2i", "backward", 1, reads=["w2"]),
            op("b2w", "backward", 2, grads=["w2"]),
            op("b1", "backward", 1, grads=["w1"]),
        ],
        edges=[("f1", "f2"), ("f2", "b2i"), ("f2", "b2w"), ("b2i", "b1")],
        params=[param("w1", 1_000_000, "b1"), param("w2", 2_000_000, "b2w")],
    )


def test_overlap_hides_the_first_layer_when_its_gradient_comes_first(two_ranks):
    """Order f1 f2 b2i b1 b2w, buckets [w1] then [w2]; t(w1) = 2 ms, t(w2) = 3 ms.

    barrier: b1 ends 4 (w1 ready), b2w ends 6 (w2 ready); network w1 4-6, w2 6-9 -> 9 ms.
    overlap: step 1 starts at 6; f1 needs w1 (done 6): 6-7; f2 waits for w2 until 9: 9-10;
             b2i 10-11, b1 11-12, b2w 12-14; w1 12-14, w2 14-17.
             step 2: f1 14-15, f2 waits until 17 ... b2w ends 22 -> period 22 - 14 = 8 ms
             (cycle: w2 transfer 3 + f2 1 + b2i 1 + b1 1 + b2w 2).
    """
    graph = reordered_graph()
    order = ["f1", "f2", "b2i", "b1", "b2w"]
    barrier = Problem(execution="compiled", graph=graph, cluster=two_ranks, mode="barrier")
    overlap = Problem(execution="compiled", graph=graph, cluster=two_ranks, mode="overlap")
    assert simulate(barrier, make_plan(barrier, order, [["w1"], ["w2"]])).iteration_s == pytest.approx(9 * MS)
    t = simulate(overlap, make_plan(overlap, order, [["w1"], ["w2"]]))
    assert t.iteration_s == pytest.approx(8 * MS)
    assert t.lower_bound_s == pytest.approx(6 * MS)  # max(compute 6, C_all 4)


def test_chunks_start_when_their_own_gradients_are_ready(chain3, two_ranks):
    """One bucket [w2, w1] (750k elements) in 3 chunks of 250k elements (1 MB, 2 ms each).

    chunk0 = w2 only: ready 3, runs 3-5; chunk1 and chunk2 are w1: ready 6, run 6-8 and 8-10.
    barrier at 10, optimizer 10-10.5. One chunk instead: issue at 6, 1 ms + 3 ms -> 10 + 0.5.
    """
    problem = Problem(execution="compiled", graph=chain3, cluster=two_ranks, mode="barrier")
    order = ["fwd", "b2", "b1", "opt"]
    chunked = simulate(problem, make_plan(problem, order, [Bucket(params=("w2", "w1"), chunks=3)]))
    comm = [(e.name, e.start_s, e.end_s) for e in chunked.events if e.track == "comm"]
    assert comm == [
        ("bucket0.chunk0", pytest.approx(3 * MS), pytest.approx(5 * MS)),
        ("bucket0.chunk1", pytest.approx(6 * MS), pytest.approx(8 * MS)),
        ("bucket0.chunk2", pytest.approx(8 * MS), pytest.approx(10 * MS)),
    ]
    assert chunked.iteration_s == pytest.approx(10.5 * MS)
    whole = simulate(problem, make_plan(problem, order, [["w2", "w1"]]))
    assert whole.iteration_s == pytest.approx(10.5 * MS)
    assert chunked.windows["w2"].synced_s == pytest.approx(5 * MS)


def test_one_rank_does_not_communicate(chain3):
    problem = Problem(execution="compiled", graph=chain3, cluster=Cluster(world_size=1, bandwidth_Bps=1e9, latency_s=1.0), mode="barrier")
    t = simulate(problem, make_plan(problem, ["fwd", "b2", "b1", "opt"], [["w1", "w2"]]))
    assert t.iteration_s == pytest.approx(6.5 * MS)
    assert t.comm_s == 0 and t.exposed_comm_s == pytest.approx(0)
    assert lower_bound(problem) == pytest.approx(6.5 * MS)


def test_simulation_is_deterministic(chain3, two_ranks):
    problem = Problem(execution="compiled", graph=chain3, cluster=two_ranks, mode="overlap")
    plan = make_plan(problem, ["fwd", "b2", "b1", "opt"], [["w2"], ["w1"]])
    assert simulate(problem, plan) == simulate(problem, plan)


def test_interference_slows_the_ops_that_overlap_a_collective(chain3, two_ranks):
    # b1 starts at 3 ms while w2's all-reduce (2 ms) runs until 5 ms: at half speed it does 1 ms of its
    # 3 ms by then and ends at 7; w1's all-reduce takes 3 ms, the optimizer 0.5: 10.5 ms (9.5 without)
    slowed = replace(two_ranks, interference=1.0)
    plan = Plan.for_problem(Problem(graph=chain3, cluster=slowed), order=["fwd", "b2", "b1", "opt"],
                            buckets=[["w2"], ["w1"]], solver=SolverInfo(name="hand"))
    free = simulate(Problem(graph=chain3, cluster=two_ranks), plan)
    timeline = simulate(Problem(graph=chain3, cluster=slowed), plan)
    assert free.iteration_s == pytest.approx(9.5e-3)
    assert timeline.iteration_s == pytest.approx(10.5e-3)
    b1 = next(e for e in timeline.events if e.name == "b1")
    assert (b1.start_s, b1.end_s) == (pytest.approx(3e-3), pytest.approx(7e-3))
    one_bucket = replace(plan, buckets=(Bucket(params=("w2", "w1")),))  # the collective starts after backward
    assert simulate(Problem(graph=chain3, cluster=slowed), one_bucket).iteration_s == pytest.approx(
        simulate(Problem(graph=chain3, cluster=two_ranks), one_bucket).iteration_s)


def test_interference_in_overlap_mode_slows_the_next_steps_updates_too(chain3, two_ranks):
    # per step: fwd, b2 (w2's 2 ms all-reduce starts), b1 at half speed while it runs (ends 2 ms late
    # minus the 1 ms it overlaps: +1 ms), then w1's 3 ms all-reduce; the next step's update of w2's
    # bucket (1/6 ms) runs at half speed under w1's transfer, then waits for it: 10 1/3 ms (9 1/3 free)
    slowed = replace(two_ranks, interference=1.0)
    problem = Problem(execution="compiled", graph=chain3, cluster=slowed, mode="overlap")
    plan = make_plan(problem, ["fwd", "b2", "b1", "opt"], [["w2"], ["w1"]])
    free = simulate(replace(problem, cluster=two_ranks), plan)
    timeline = simulate(problem, plan)
    assert free.iteration_s == pytest.approx(28e-3 / 3)
    assert timeline.iteration_s == pytest.approx(31e-3 / 3)
    update = next(e for e in timeline.events if e.name == "update[bucket0]" and e.step == 1)
    assert update.duration_s == pytest.approx(1e-3 / 3)
    b1 = next(e for e in timeline.events if e.name == "b1" and e.step == 0)
    assert (b1.start_s, b1.end_s) == (pytest.approx(3e-3), pytest.approx(7e-3))


def test_steady_window_repeats_a_barrier_step_and_cuts_an_overlap_run_at_a_late_step(chain3, two_ranks):
    from schedopt.trace import steady_window

    barrier_problem = Problem(execution="compiled", graph=chain3, cluster=two_ranks)
    barrier = simulate(barrier_problem, make_plan(barrier_problem, ["fwd", "b2", "b1", "opt"], [["w2"], ["w1"]]))
    window = steady_window(barrier, 2 * barrier.iteration_s)
    assert len(window) == 2 * len(barrier.events)  # two back-to-back copies of the one simulated step
    second = [e for e in window if e.start_s >= barrier.iteration_s - 1e-15]
    assert [e.name for e in second] == [e.name for e in barrier.events]
    assert second[0].start_s == pytest.approx(barrier.events[0].start_s + barrier.iteration_s)

    overlap_problem = replace(barrier_problem, mode="overlap")
    overlap = simulate(overlap_problem, make_plan(overlap_problem, ["fwd", "b2", "b1", "opt"], [["w2"], ["w1"]]))
    window = steady_window(overlap, 2 * overlap.iteration_s)
    first = min(window, key=lambda e: e.start_s)
    assert first.start_s == 0.0 and all(e.start_s < 2 * overlap.iteration_s for e in window)
    assert {e.step for e in window if e.track == "compute"} <= {overlap.num_steps - 3, overlap.num_steps - 2,
                                                                 overlap.num_steps - 1}


def test_the_lower_bound_counts_the_compute_slowed_beside_the_wire(chain3, two_ranks):
    """With interference f, compute beside a collective runs 1/(1+f) as fast, so the bound's
    max(compute, C_all) becomes max(idle + C_all, compute + f min(C_all/(1+f), compute - idle)).

    barrier, f = 9 (idle: b2's ancestors, 3 ms, run before any collective; C_all 4 ms):
    0.5 + max(3 + 4, 6 + 9 min(0.4, 3), union 6 + c(w2) 2, b1's tail 6 + 3) = 10.1 ms (9.5 without: the
    tail); the plans take 11.3 and 10.5.
    overlap, f = 3: max(4, 6.5 + 3 min(1, 6.5)) = 9.5 ms, above w1's cycle (9 ms, the bound without
    interference); the plan takes 32.5/3. ``perfect_overlap_s`` stays max(compute, comm) = 6.5 ms.
    """
    barrier = Problem(execution="compiled", graph=chain3, cluster=replace(two_ranks, interference=9.0), mode="barrier")
    assert lower_bound(barrier) == pytest.approx(10.1 * MS)
    assert lower_bound(replace(barrier, cluster=two_ranks)) == pytest.approx(9.5 * MS)
    order = ["fwd", "b2", "b1", "opt"]
    two = simulate(barrier, make_plan(barrier, order, [["w2"], ["w1"]]))
    one = simulate(barrier, make_plan(barrier, order, [["w2", "w1"]]))
    assert (two.iteration_s, one.iteration_s) == (pytest.approx(11.3 * MS), pytest.approx(10.5 * MS))
    assert two.lower_bound_s == pytest.approx(10.1 * MS)
    overlap = Problem(execution="compiled", graph=chain3, cluster=replace(two_ranks, interference=3.0), mode="overlap")
    assert lower_bound(overlap) == pytest.approx(9.5 * MS)
    assert lower_bound(replace(overlap, cluster=two_ranks)) == pytest.approx(9 * MS)
    assert simulate(overlap, make_plan(overlap, order, [["w2"], ["w1"]])).iteration_s == pytest.approx(32.5 * MS / 3)
    assert perfect_overlap_s(overlap) == pytest.approx(6.5 * MS)
