"""The runtime on real gloo ranks: gradients equal DDP's, plan order, agreement, no_sync, unused parameters."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest

import torch  # noqa: F401  (make setup installs it: a missing torch fails the suite)

from schedopt import Bucket, Cluster, InvalidPlanError, Plan, Problem  # noqa: E402
from schedopt.importers import from_torch  # noqa: E402
from schedopt.orders import engine_order, ready_order  # noqa: E402
from schedopt.layout import chunk_bounds
from schedopt.plan import SolverInfo, validate  # noqa: E402
from schedopt.solvers import get  # noqa: E402

from . import runtime_workers as workers  # noqa: E402
from .distributed import RankError, run_ranks  # noqa: E402


@functools.cache
def graph_of(name: str):
    """The aten-level graph of a test model, imported once per test process (graphs are not changed)."""
    model, example, loss_fn = workers.build(name)
    return from_torch(model, example, loss_fn=loss_fn, name=name)


def ddp_plan(name: str, world_size: int = 2, **options) -> Plan:
    problem = Problem(graph=graph_of(name), cluster=Cluster.preset("10gbe", world_size=world_size))
    return get("pytorch-ddp")(problem, **options)


def scrambled_plan(name: str, world_size: int = 2) -> Plan:
    """Buckets of two parameters in reverse ready order, the largest bucket in 3 chunks: out of
    order, chunked, and crossing parameter boundaries."""
    graph = graph_of(name)
    problem = Problem(graph=graph, cluster=Cluster.preset("10gbe", world_size=world_size))
    names = ready_order(graph, engine_order(graph))[::-1]
    groups = [names[i:i + 2] for i in range(0, len(names), 2)]
    largest = max(range(len(groups)), key=lambda k: sum(graph.params[n].numel for n in groups[k]))
    buckets = [Bucket(params=tuple(g), chunks=3 if k == largest else 1) for k, g in enumerate(groups)]
    plan = Plan.for_problem(problem, order=engine_order(graph), buckets=buckets, solver=SolverInfo(name="scrambled"))
    validate(plan, graph)
    return plan


def expected_log(plan: Plan, graph) -> list[tuple[int, int, int]]:
    """(bucket, chunk, elements) of every collective the plan issues, in its order."""
    log = []
    for k, bucket in enumerate(plan.buckets):
        numel = sum(graph.params[n].numel for n in bucket.params)
        log += [(k, j, end - start) for j, (start, end) in enumerate(chunk_bounds(numel, bucket.chunks))]
    return log


@pytest.mark.parametrize("name, make_plan", [
    ("tiny_cnn", scrambled_plan),
    ("tiny_gpt", scrambled_plan),          # tied embedding
    ("tiny_gpt", lambda n: ddp_plan(n, first_bucket_mb=0.01, bucket_cap_mb=0.02)),
    ("tiny_branches", scrambled_plan),
    ("frozen_stem", scrambled_plan),       # frozen parameters and BatchNorm buffers
])
def test_gradients_equal_ddp_bit_for_bit_on_two_ranks(name, make_plan):
    plan = make_plan(name)
    results = run_ranks(workers.train_against_ddp, 2, name, plan, 3)
    graph = graph_of(name)
    for result in results:
        assert [d[0] for d in result["diffs"]] == [0.0, 0.0, 0.0]
        assert result["params_equal"] and result["buffers_equal"]
        assert all(log == expected_log(plan, graph) for log in result["logs"])  # the plan's order, chunks included


def test_three_ranks_exact_with_ddp_buckets_and_within_1e6_with_others():
    # a 3-way sum's rounding depends on where gloo cuts the buffer: exact once DDP has its rebuilt buckets
    exact = run_ranks(workers.train_against_ddp, 3, "tiny_gpt", ddp_plan("tiny_gpt", 3), 3, warmup=True)
    assert all(d[0] == 0.0 for r in exact for d in r["diffs"])
    other = run_ranks(workers.train_against_ddp, 3, "tiny_gpt", scrambled_plan("tiny_gpt", 3), 3)
    assert all(d[1] <= 1e-6 for r in other for d in r["diffs"])


def test_no_sync_accumulation_equals_ddp():
    results = run_ranks(workers.train_against_ddp, 2, "tiny_cnn", scrambled_plan("tiny_cnn"), 2, accumulate=3)
    assert all(d[0] == 0.0 for r in results for d in r["diffs"])


def test_a_parameter_without_gradient_is_named_on_every_rank():
    with pytest.raises(RankError) as info:
        run_ranks(workers.train_against_ddp, 2, "with_unused", ddp_plan("with_unused_planned"), 1)
    assert set(info.value.errors) == {0, 1}
    for kind, message in info.value.errors.values():
        assert kind == "UnusedParameterError" and "extra.weight" in message and "find_unused_parameters" in message


def test_find_unused_parameters_equals_ddp():
    results = run_ranks(workers.train_against_ddp, 2, "with_unused", ddp_plan("with_unused_planned"), 4,
                        find_unused=True)
    for result in results:
        assert [d[0] for d in result["diffs"]] == [0.0] * 4 and result["params_equal"]


def test_ranks_with_different_plans_fail_alike_and_fast():
    plans = [ddp_plan("tiny_cnn"), ddp_plan("tiny_cnn", first_bucket_mb=0.001)]
    results = run_ranks(workers.wrap_and_time, 2, "tiny_cnn", plans)
    for result in results:
        assert result["error"] == "PlanMismatchError" and result["wall_s"] < 10
        assert "ranks [0] hold plan" in result["message"] and "ranks [1] hold plan" in result["message"]


def test_a_plan_for_another_model_fails_on_every_rank():
    plan = ddp_plan("tiny_branches")
    results = run_ranks(workers.wrap_and_time, 2, "tiny_cnn", [plan, plan])
    for result in results:
        assert result["error"] == "PlanMismatchError" and result["wall_s"] < 10
        assert "'tiny_branches'" in result["message"] and "missing stem.weight" in result["message"]


def test_a_model_changed_after_planning_fails_on_every_rank_naming_the_parameter():
    results = run_ranks(workers.wrap_changed_model, 2, ddp_plan("tiny_cnn"))
    for result in results:
        assert result["error"] == "PlanMismatchError" and result["wall_s"] < 10
        assert "rank 1" in result["message"] and "fc.weight [12, 16] float32 (planned [10, 16] float32)" in result["message"]


def test_a_plan_for_another_world_size_runs():
    results = run_ranks(workers.train_against_ddp, 2, "tiny_cnn", ddp_plan("tiny_cnn", world_size=8), 1)
    assert all(r["diffs"][0][0] == 0.0 for r in results)


def test_compiled_plans_are_refused_with_what_to_do():
    from schedopt.runtime import ScheduledDataParallel

    plan = ddp_plan("tiny_cnn")
    model = workers.build("tiny_cnn")[0]
    with pytest.raises(InvalidPlanError, match="--execution eager") as info:
        ScheduledDataParallel(model, replace(plan, execution="compiled"))
    assert "schedopt.runtime.compile" in str(info.value)  # where it does run
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())  # refused before any hook


def test_without_a_plan_wrap_is_torch_ddp_and_schedopt_plan_is_read(tmp_path):
    plan = ddp_plan("tiny_cnn")
    path = tmp_path / "plan.json"
    plan.save(path)
    kinds = run_ranks(workers.wrap_kind, 1, str(path))
    assert kinds == [{"none": "DistributedDataParallel", "env": "ScheduledDataParallel"}]


def test_pytorch_ddp_plans_have_the_buckets_real_ddp_builds():
    # the tiny models fit one default bucket: 1 KiB buckets give them several (DDP then caps its first
    # bucket at the same size); the larger ones keep DDP's defaults (1 MiB first, then 25 MiB), ResNet-18
    # and gpt_deep (its embedding tied to its head)
    cases = [(name, {}, 0.001) for name in ("tiny_cnn", "tiny_resnet", "tiny_vgg", "tiny_inception", "tiny_gpt",
                                           "tiny_bert", "tiny_branches")]
    cases += [("resnet18", {"batch_size": 1}, None), ("gpt_deep", {"batch_size": 1, "seq_len": 16}, None)]
    real = run_ranks(workers.ddp_buckets, 1, cases, timeout_s=240)[0]
    models = workers.example_models()
    for name, kwargs, cap_mb in cases:
        made = models.FACTORIES[name](**kwargs)
        example = made[1] if isinstance(made[1], tuple) else (made[1],)
        graph = from_torch(made[0], example, loss_fn=made[2] if len(made) == 3 else None, name=name)
        caps = {} if cap_mb is None else {"first_bucket_mb": cap_mb, "bucket_cap_mb": cap_mb}
        plan = get("pytorch-ddp")(Problem(graph=graph, cluster=Cluster.preset("10gbe", world_size=8)), **caps)
        buckets = [list(b.params) for b in plan.buckets]
        assert len(buckets) > 1 and buckets == real[name], name


def test_a_second_backward_after_one_forward_is_refused():
    messages = run_ranks(workers.backward_twice, 2, ddp_plan("tiny_cnn"))
    assert all("second synchronized backward after one forward" in m for m in messages)
