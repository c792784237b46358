"""OSP planning: the stage-2 set, its bound, the simulator's two-step deadline, the plan format."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from schedopt import Cluster, InvalidPlanError, Plan, Problem, simulate
from schedopt.cli import main
from schedopt.report import perfect_overlap_s
from schedopt.solvers import get, solvers_for
from schedopt.solvers.stages import stale_fraction
from schedopt.synthetic import chain, transformer_like

from schedopt import TrainGraph

from .conftest import op, param


def tied(world_size: int = 64, layers: int = 4) -> Problem:
    return Problem(graph=transformer_like(layers), cluster=Cluster.preset("100gbe", world_size=world_size),
                   mode="osp")


@pytest.mark.parametrize("solver", ["caramel", "pytorch-ddp", "cpsat"])
def test_max_stale_fraction_zero_gives_the_overlap_plan_and_timeline(solver):
    problem = replace(tied(), max_stale_fraction=0.0)
    options = {"time_limit_s": 2, "num_workers": 1, "seed": 1} if solver == "cpsat" else {}
    overlap = get(solver)(replace(problem, mode="overlap"), **options)
    if solver == "cpsat":  # two time-limited solves need not agree (a loaded host cuts a search sooner):
        from schedopt.solvers.stages import choose_stages  # the stage choice of the one overlap plan

        osp = choose_stages(problem, overlap)
    else:
        osp = get(solver)(problem, **options)
    assert all(b.stage == 1 for b in osp.buckets)
    assert [b.params for b in osp.buckets] == [b.params for b in overlap.buckets] and osp.order == overlap.order
    a, b = simulate(problem, osp), simulate(replace(problem, mode="overlap"), overlap)
    assert a.iteration_s == b.iteration_s and a.windows == b.windows


@pytest.mark.parametrize("fraction", [0.05, 0.2, 0.5, 1.0])
def test_the_stage_2_set_respects_the_bound_and_never_slows_the_plan(fraction):
    problem = replace(tied(), max_stale_fraction=fraction)
    plan = get("caramel")(problem)
    assert stale_fraction(problem, plan.buckets) <= fraction + 1e-12
    assert plan.solver.stats["stale_fraction"] == pytest.approx(stale_fraction(problem, plan.buckets))
    overlap = get("caramel")(replace(problem, mode="overlap"))
    assert plan.predicted.iteration_s <= overlap.predicted.iteration_s * (1 + 1e-12)


def test_osp_reaches_most_of_the_headroom_where_overlap_cannot():
    """transformer_like ties its embedding to the head: finished last, read first. In overlap mode the
    next forward waits for it; as stage 2 it is read corrected and may arrive a step later (12 blocks
    on 64 x 100 GbE: overlap 26% of the headroom, osp 86%)."""
    problem = tied(64, layers=12)
    ddp = get("pytorch-ddp")(replace(problem, mode="barrier")).predicted.iteration_s
    bound = perfect_overlap_s(problem)
    overlap = get("caramel")(replace(problem, mode="overlap")).predicted.iteration_s
    osp = get("caramel")(problem)
    assert any(b.stage == 2 and "wte.weight" in b.params for b in osp.buckets)
    assert (ddp - osp.predicted.iteration_s) / (ddp - bound) >= 0.8 > (ddp - overlap) / (ddp - bound)


def test_a_stage_2_collective_may_end_until_its_first_reader_two_steps_later(two_ranks):
    """fwd (1 ms) reads w; backward (1 ms) finishes it; w takes 6 ms on the wire (1 ms of latency).
    overlap: each step's forward waits for the last step's collective: compute + transfer + update.
    osp, w in stage 2: the collective may take until the step after next, so the period is the
    channel's or the compute's with the doubled update (commit and correction), whichever is longer."""
    graph = TrainGraph(name="one", ops=[op("fwd", "forward", 1, reads=["w"]), op("b", "backward", 1, grads=["w"]),
                                        op("opt", "optimizer", 0.2, reads=["w"])],
                       edges=[("fwd", "b"), ("b", "opt")], params=[param("w", 5_000_000, "b")])
    problem = Problem(graph=graph, cluster=two_ranks, mode="osp", max_stale_fraction=1.0)
    plan = get("pytorch-ddp")(replace(problem, max_stale_fraction=0.0))
    comm = two_ranks.allreduce_s(5_000_000)
    overlap_s = simulate(replace(problem, mode="overlap"), replace(plan, mode="overlap")).iteration_s
    staged = replace(plan, buckets=(replace(plan.buckets[0], stage=2),))
    osp_s = simulate(problem, staged).iteration_s
    assert overlap_s == pytest.approx(1e-3 + 1e-3 + comm + 0.2e-3)  # compute, then the wait, then the update
    assert osp_s == pytest.approx(max(comm, 2e-3 + 2 * 0.2e-3))
    assert osp_s < overlap_s
    window = simulate(problem, staged).windows["w"]
    # ready at the end of step k, needed at the start of step k + 2: one whole period (in overlap mode:
    # at once), and the channel-bound collective arrives after it (the stream waits, as it must)
    assert window.deadline_s - window.ready_s == pytest.approx(osp_s) and window.slack_s < 0


def test_plan_format_carries_stages_and_refuses_stage_2_outside_osp(tmp_path):
    problem = tied(8)
    plan = get("caramel")(replace(problem, max_stale_fraction=1.0))
    path = tmp_path / "osp.json"
    plan.save(path)
    data = json.loads(path.read_text())
    assert data["schema"] == "schedopt.plan/4" and {b["stage"] for b in data["buckets"]} <= {1, 2}
    assert Plan.load(path).buckets == plan.buckets
    data["schema"] = "schedopt.plan/2"
    for b in data["buckets"]:
        del b["stage"]
    path.write_text(json.dumps(data))
    assert all(b.stage == 1 for b in Plan.load(path).buckets)  # older plans: every bucket stage 1
    staged = replace(plan, mode="overlap", buckets=(replace(plan.buckets[0], stage=2), *plan.buckets[1:]))
    with pytest.raises(InvalidPlanError, match="stage 2 needs an osp plan"):
        simulate(replace(problem, mode="overlap"), staged)


def test_every_solver_plans_osp(tmp_path):
    problem = tied(8, layers=2)
    for name in solvers_for("osp"):
        options = {"time_limit_s": 3, "num_workers": 1} if name == "cpsat" else {}
        plan = get(name)(problem, **options)
        assert plan.mode == "osp" and plan.solver.bound_s is None and "osp" in plan.solver.stats


def test_cli_plans_osp_and_refuses_a_bad_fraction(tmp_path, capsys):
    graph = tmp_path / "g.json"
    chain(4).save(graph)
    out = tmp_path / "plan.json"
    assert main(["plan", str(graph), "--solver", "caramel", "--mode", "osp", "--max-stale-fraction", "0.3",
                 "--network", "100gbe", "--world-size", "64", "-o", str(out)]) == 0
    assert Plan.load(out).mode == "osp"
    capsys.readouterr()
    assert main(["plan", str(graph), "--solver", "caramel", "--mode", "osp", "--max-stale-fraction", "1.5",
                 "-o", str(tmp_path / "no.json")]) == 2
    assert "max_stale_fraction must be a number from 0 to 1" in capsys.readouterr().err


def test_traces_and_gantt_charts_mark_the_stage_2_collectives(tmp_path):
    from schedopt.trace import chrome_trace, write_gantt

    problem = tied(world_size=8)
    plan = get("caramel")(problem)
    timeline = simulate(problem, plan)
    stage2 = {k for k, b in enumerate(plan.buckets) if b.stage == 2}
    assert stage2
    comm = [e for e in chrome_trace(timeline)["traceEvents"] if e["ph"] == "X" and e["cat"].startswith("allreduce")]
    marked = {e["args"]["bucket"] for e in comm if e.get("cat") == "allreduce-stage2"}
    assert marked == stage2 and all(e["name"].endswith("(stage 2)") for e in comm if e.get("cat") == "allreduce-stage2")
    assert {e["args"]["bucket"] for e in comm if e.get("cat") == "allreduce"} == set(range(len(plan.buckets))) - stage2
    write_gantt(timeline, tmp_path / "osp.png", title="osp")
    assert (tmp_path / "osp.png").stat().st_size > 0
