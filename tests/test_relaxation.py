"""The overlap closure relaxation (solvers/cpsat/relaxation.py): a bound and a plan. Its bound against
brute force and random plans is checked beside the other overlap bounds in test_cpsat.py."""

from __future__ import annotations

from schedopt import Cluster, Problem
from schedopt.solvers import get
from schedopt.solvers.bounds import channel_bound
from schedopt.solvers.cpsat.relaxation import max_calls, relax


def test_a_call_waits_for_the_work_of_every_gradient_it_carries():
    """Two independent 10-tick ops each finish a 5-tick parameter; calls cost 1; no tails. Each is
    ready at 10 alone, so the channel bound sees one call at 10 + 1 + 10 = 21. On one stream the
    second is ready at 20: one call ends at 31, two at 16 and 20 + 1 + 5 = 26."""
    items = [(0, 10, 0, 5), (1, 10, 0, 5)]
    assert channel_bound([10, 10], [0, 0], [5, 5], 1) <= 21
    raised: list[int] = []
    result = relax(items, [10, 10], set(), 1, upper=100, seconds=10, num_workers=1, on_step=raised.append)
    assert result.bound == 26 and result.status == "closed"
    assert raised[-1] == 26 and raised == sorted(raised)  # each step that raised it was reported
    assert sorted(map(tuple, result.calls)) == [(0,), (1,)]
    assert sorted(result.level) == [0, 1]  # one op by the first call, the other by the second


def test_no_call_fits_under_the_upper_bound():
    # 2 x 5 bytes + a call of 1 cannot end before 11: nothing beats an upper bound of 11
    assert max_calls([(0, 0, 0, 5), (1, 0, 0, 5)], 1, 11) == 0


def test_the_calls_fit_between_the_earliest_release_and_the_least_tail():
    """Released at 3 and 4, tails 2 and 6, 10 bytes, calls of 1: k calls end no earlier than
    3 + k + 10 and are followed by 2 more: under 20 at most 4 calls fit, and two items make 2 at most."""
    items = [(0, 3, 2, 5), (1, 4, 6, 5)]
    assert max_calls(items, 1, 20) == 2  # min(items, (20 - 3 - 10 - 2 - 1) // 1 = 4)
    assert max_calls(items, 1, 17) == 1
    assert max_calls(items, 1, 16) == 0
    assert relax(items, [3, 1], {(0, 1)}, 1, upper=16, seconds=1).bound == 16
    assert relax([(0, 0, 0, 5), (1, 0, 0, 5)], [1, 1], set(), 1, upper=11, seconds=1).bound == 11


def test_cpsat_runs_it_where_few_calls_can_beat_the_warm_start():
    """64 ranks on 100 GbE: a call costs about 1.3 ms of ring latency, so only a few can beat the
    warm start; the relaxation's bound is cpsat's, at or under its plan, and its plan a candidate."""
    from schedopt.synthetic import transformer_like

    problem = Problem(execution="compiled", graph=transformer_like(2), cluster=Cluster.preset("100gbe", world_size=64),
                      mode="overlap")
    plan = get("cpsat")(problem, time_limit_s=8, num_workers=2)
    stats = plan.solver.stats
    assert not stats["relaxation"].startswith("skipped"), stats["relaxation"]
    # its bound is cpsat's (alone on this machine it raised the constant bounds' 980.8k ticks to 995.2k;
    # the raise itself is checked on the hand example above, where it does not depend on the load)
    assert stats["relaxation_bound_s"] <= plan.solver.bound_s + 1e-12 <= plan.predicted.iteration_s + 1e-9
    assert plan.solver.bound_s == stats["relaxation_bound_s"]
    if "relaxation_plan_s" in stats:  # a solution found: a candidate, never better than what cpsat returns
        assert stats["relaxation_plan_s"] >= plan.predicted.iteration_s * (1 - 1e-9)
