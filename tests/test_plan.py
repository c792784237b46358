"""The plan: JSON round trip, schema versions, and every validation error."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from schedopt import Bucket, InvalidPlanError, Plan, PlanMismatchError, Problem
from schedopt.layout import chunk_bounds
from schedopt.plan import SolverInfo, validate
from schedopt.solvers import get
from schedopt.synthetic import chain, diamond


@pytest.fixture
def problem(two_ranks, chain3) -> Problem:
    return Problem(graph=chain3, cluster=two_ranks, mode="barrier")


@pytest.fixture
def plan(problem) -> Plan:
    return Plan.for_problem(problem, order=["fwd", "b2", "b1", "opt"], buckets=[["w2"], ["w1"]],
                            solver=SolverInfo(name="hand", options={"note": "x"}))


def test_round_trip_through_a_file(tmp_path, problem):
    plan = get("pytorch-ddp")(problem)
    path = tmp_path / "sub" / "plan.json"
    plan.save(path)
    again = Plan.load(path)
    assert again == plan
    data = json.loads(path.read_text())
    assert data["schema"] == "schedopt.plan/4" and data["execution"] == "eager"
    assert data["model"]["fingerprint"] == problem.graph.fingerprint
    assert set(data["predicted"]) == {"iteration_s", "compute_s", "comm_s", "exposed_comm_s", "lower_bound_s"}
    assert data["buckets"][0] == {"params": list(plan.buckets[0].params), "chunks": 1, "stage": 1}


def test_unknown_schema_version_is_refused(tmp_path, plan):
    data = plan.to_json()
    data["schema"] = "schedopt.plan/5"
    path = tmp_path / "future.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InvalidPlanError, match="unsupported plan schema 'schedopt.plan/5'"):
        Plan.load(path)


def test_a_graph_given_as_a_plan_says_what_it_is(tmp_path, problem, capsys):
    from schedopt.cli import main

    path = tmp_path / "graph.json"
    problem.graph.save(path)
    with pytest.raises(InvalidPlanError, match=r"training graph \(schedopt.graph/\d+\), not a plan"):
        Plan.load(path)
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a plan" in err[0] and "schedopt plan" in err[0]


def test_a_schema_1_plan_loads_as_compiled_and_saves_as_schema_2(tmp_path, problem, capsys):
    data = get("pytorch-ddp")(problem).to_json()
    data["schema"] = "schedopt.plan/1"
    del data["execution"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    plan = Plan.load(old)
    assert plan.schema == "schedopt.plan/1" and plan.execution == "compiled"  # its order was chosen freely
    validate(plan, problem.graph)
    plan.save(tmp_path / "new.json")
    again = json.loads((tmp_path / "new.json").read_text())
    assert again["schema"] == "schedopt.plan/4" and again["execution"] == "compiled"
    from schedopt.cli import main

    assert main(["inspect", str(old)]) == 0
    assert "execution  compiled (a schedopt.plan/1 plan" in capsys.readouterr().out


def test_an_eager_plan_must_keep_the_engine_order(two_ranks):
    from schedopt.orders import engine_order

    graph = diamond()
    order = engine_order(graph)
    k = order.index("d.grad_weight")
    order[k - 1], order[k] = order[k], order[k - 1]  # weight gradient before input gradient: valid, not eager
    problem = Problem(graph=graph, cluster=two_ranks)
    plan = Plan.for_problem(problem, order=order, buckets=[list(graph.params)], solver=SolverInfo(name="hand"))
    with pytest.raises(InvalidPlanError, match=f"eager plan must keep the autograd engine's order.*position {k - 1}"):
        validate(plan, graph)
    validate(replace(plan, execution="compiled"), graph)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("buckets"), "lacks field 'buckets'"),
    (lambda d: d.update(cluster={"world_size": 0, "bandwidth_Bps": 1}), "world_size"),
    (lambda d: d.update(order=5), "field order must be a list of strings, got 5"),
    (lambda d: d.__setitem__("model", "nope"), "field model must be an object, got 'nope'"),
])
def test_malformed_plan_json_is_refused(tmp_path, plan, mutate, message):
    data = plan.to_json()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InvalidPlanError, match=message):
        Plan.load(path)


def test_load_missing_and_non_json(tmp_path):
    with pytest.raises(InvalidPlanError, match="does not exist"):
        Plan.load(tmp_path / "none.json")
    (tmp_path / "x.json").write_text("not json")
    with pytest.raises(InvalidPlanError, match="not valid JSON"):
        Plan.load(tmp_path / "x.json")


def test_plan_for_another_model_is_a_mismatch(plan):
    with pytest.raises(PlanMismatchError, match="made for model 'chain3'.*graph is 'diamond'"):
        validate(plan, diamond())


@pytest.mark.parametrize("order, buckets, message", [
    (["fwd", "b2", "b1", "opt", "ghost"], [["w2"], ["w1"]], "unknown op 'ghost'"),
    (["fwd", "b2", "b2", "b1", "opt"], [["w2"], ["w1"]], "runs op 'b2' twice"),
    (["fwd", "b2", "b1"], [["w2"], ["w1"]], "lacks op\\(s\\) 'opt'"),
    (["fwd", "b1", "b2", "opt"], [["w2"], ["w1"]], "breaks a dependency: 'b1'"),
    (["fwd", "b2", "b1", "opt"], [["w2"], ["w1", "w3"]], "unknown parameter 'w3'"),
    (["fwd", "b2", "b1", "opt"], [["w2"]], "'w1' are in no bucket"),
    (["fwd", "b2", "b1", "opt"], [["w2", "w1"], ["w1"]], "'w1' is in two buckets"),
    (["fwd", "b2", "b1", "opt"], [["w2"], [], ["w1"]], "bucket 1 is empty"),
    (["fwd", "b2", "b1", "opt"], [["w2"], Bucket(params=("w1",), chunks=0)], "chunks = 0"),
])
def test_validate_names_what_is_wrong(problem, order, buckets, message):
    bad = Plan.for_problem(problem, order=order, buckets=buckets, solver=SolverInfo(name="hand"))
    with pytest.raises(InvalidPlanError, match=message):
        validate(bad, problem.graph)


def test_unknown_mode_and_mixed_dtypes(plan, problem):
    with pytest.raises(InvalidPlanError, match="unknown mode 'async'"):
        validate(replace(plan, mode="async"), problem.graph)
    graph = chain(2)
    half = graph.to_json()
    half["params"][0]["dtype"] = "float16"
    from schedopt import TrainGraph

    mixed = TrainGraph.from_json(half)
    p = Problem(graph=mixed, cluster=problem.cluster)
    bad = Plan.for_problem(p, order=list(mixed.ops), buckets=[list(mixed.params)], solver=SolverInfo(name="h"))
    with pytest.raises(InvalidPlanError, match="mixes dtypes"):
        validate(bad, mixed)


def test_chunk_bounds_cover_the_buffer_exactly():
    for numel in (1, 7, 1000, 12345):
        for chunks in range(1, min(numel, 9) + 1):
            bounds = chunk_bounds(numel, chunks)
            assert bounds[0][0] == 0 and bounds[-1][1] == numel
            assert all(a < b for a, b in bounds)
            assert all(prev[1] == nxt[0] for prev, nxt in zip(bounds, bounds[1:]))


def test_solver_info_gap():
    assert SolverInfo(name="x", objective_s=2.0, bound_s=1.5).gap == pytest.approx(0.25)
    assert SolverInfo(name="x").gap is None
