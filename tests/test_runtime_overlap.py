"""Overlap mode on real gloo ranks: DDP's parameters and optimizer state bit for bit, waits where the forward reads."""

from __future__ import annotations

from dataclasses import replace

import pytest

import torch  # make setup installs it: a missing torch fails the suite, it does not shrink it
from torch import nn  # noqa: E402

from schedopt import Bucket, Cluster, Plan, Problem  # noqa: E402
from schedopt.orders import engine_order, ready_order  # noqa: E402
from schedopt.plan import SolverInfo  # noqa: E402
from schedopt.runtime import wrap_optimizer  # noqa: E402
from schedopt.solvers import get  # noqa: E402

from . import runtime_workers as workers  # noqa: E402
from .distributed import run_ranks  # noqa: E402
from .test_runtime import expected_log, graph_of, scrambled_plan  # noqa: E402

ALL_OPTIMIZERS = ["sgd", "sgd-momentum", "sgd-nesterov", "adam", "adamw"]


def overlap_plan(name: str, solver: str = "scrambled", **options) -> Plan:
    if solver == "scrambled":
        return replace(scrambled_plan(name), mode="overlap")
    problem = Problem(graph=graph_of(name), cluster=Cluster.preset("10gbe", world_size=2), mode="overlap")
    return get(solver)(problem, **options)


def single_bucket_plan(name: str) -> Plan:
    graph = graph_of(name)
    problem = Problem(graph=graph, cluster=Cluster.preset("10gbe", world_size=2), mode="overlap")
    names = tuple(ready_order(graph, engine_order(graph)))
    return Plan.for_problem(problem, order=engine_order(graph), buckets=[Bucket(params=names)],
                            solver=SolverInfo(name="one-bucket"))


@pytest.mark.parametrize("name, make_plan, set_to_none", [
    ("tied_frozen_norm", overlap_plan, True),   # tied embedding, frozen layer, BatchNorm; chunked, out of order
    ("tiny_gpt", lambda n: overlap_plan(n, "pytorch-ddp", first_bucket_mb=0.01, bucket_cap_mb=0.02), False),
])
def test_overlap_training_equals_ddp_bit_for_bit_for_every_optimizer(name, make_plan, set_to_none):
    plan = make_plan(name)
    results = run_ranks(workers.overlap_against_ddp, 2, name, plan, ALL_OPTIMIZERS, 6, set_to_none=set_to_none,
                        timeout_s=120)
    graph = graph_of(name)
    for rank_result in results:
        for kind, r in rank_result.items():
            assert r["checkpoint_equal"], (kind, "state_dicts after step 3")
            assert r["params_equal"] and r["buffers_equal"] and r["state_equal"], kind
            assert r["worst_rel"] == 0.0 and not r["pending_after_flush"], kind
            assert r["lr_end"] == r["lr_ddp_end"] == [lr * 0.5 ** 3 for lr in r["lr_start"]], kind  # StepLR ran
            assert all(log == expected_log(plan, graph) for log in r["logs"]), kind  # the plan's order
            for step, step_settles in enumerate(r["settles"]):  # every bucket, once, in the forward, one step
                if step in (0, 4):
                    continue  # nothing pending yet; the checkpoint after step 3 applied everything

                assert sorted(b for b, *_ in step_settles) == list(range(len(plan.buckets)))
                assert all(where.startswith("forward:") and steps == 1 for _, where, _, steps in step_settles)


def test_a_forward_that_reads_an_unfinished_bucket_waits_for_it_first():
    plan = single_bucket_plan("tied_wide")  # one 8 MiB bucket, issued last, read by the first module
    results = run_ranks(workers.overlap_waits, 2, "tied_wide", plan, 4)
    for r in results:
        for step, seen in enumerate(r["seen"][1:], start=1):
            for module, settled_before in seen:
                assert all(k in settled_before for k in r["owned"][module]), (step, module)
            assert r["settles"][step][0][:2] == (0, "forward:embed")
        assert any(r["settles"][step][0][2] for step in (1, 2, 3))  # the network was still busy at least once


def test_grad_holds_the_local_gradient_eval_flushes_and_closures_are_refused():
    results = run_ranks(workers.overlap_contract, 2, overlap_plan("tied_frozen_norm"))
    for r in results:
        assert r["grad_is_local"]
        assert r["pending_before_eval"] and not r["pending_after_eval"]
        assert "LBFGS" in r["lbfgs"] and "--mode barrier" in r["lbfgs"]
        assert "closure" in r["closure"] and "--mode barrier" in r["closure"]


def test_ranks_with_barrier_and_overlap_plans_fail_alike():
    plan = replace(scrambled_plan("tiny_cnn"), mode="barrier")
    results = run_ranks(workers.wrap_and_time, 2, "tiny_cnn", [plan, replace(plan, mode="overlap")])
    for result in results:
        assert result["error"] == "PlanMismatchError" and result["wall_s"] < 10


def test_wrap_optimizer_leaves_optimizers_of_other_models_alone():
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = opt.step
    assert wrap_optimizer(opt, model) is opt and opt.step == step


def test_the_gloo_fifo_channel_completes_in_issue_order_with_the_right_sums():
    for r in run_ranks(workers.fifo_channel, 2):
        assert r["sums_right"] and not r["out_of_order"]
