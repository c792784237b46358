"""The compiled runtime on real gloo ranks: gradients equal DDP's, the executed order is the plan's,
collectives in plan order with plan sizes, clear errors."""

from __future__ import annotations

from dataclasses import replace

import pytest

import torch
from torch import fx

from schedopt import Cluster, InvalidPlanError, Plan, Problem
from schedopt.errors import CompileError
from schedopt.importers import from_torch
from schedopt.importers.pytorch import trace_train_step
from schedopt.orders import engine_order
from schedopt.plan import validate
from schedopt.solvers import get

from . import compiled_workers as workers
from .distributed import run_ranks
from .runtime_workers import build
from .test_runtime import expected_log, graph_of, scrambled_plan


def reordered_plan(name: str) -> Plan:
    """Caramel's compiled plan: its backward order is not the engine's."""
    graph = graph_of(name)
    plan = get("caramel")(Problem(graph=graph, cluster=Cluster.preset("10gbe", world_size=8), execution="compiled"))
    assert list(plan.order) != engine_order(graph)
    return plan


def engine_plan_like(plan: Plan, name: str) -> Plan:
    """``plan``'s buckets in the engine's order (an eager plan)."""
    graph = graph_of(name)
    eager = replace(plan, order=tuple(engine_order(graph)), execution="eager")
    validate(eager, graph)
    return eager


def planned_kernels(plan: Plan, name: str) -> list[tuple[str, tuple[int, ...]]]:
    """``(kind, output shape)`` of the plan's backward kernels of :data:`workers.ORDERED_KINDS`, in plan order
    (shapes from the importer's own trace, whose node names are the op ids)."""
    model, example, loss_fn = build(name)
    traced, _, _ = trace_train_step(model, example, loss_fn, name=name)
    shapes = {}
    for node in traced.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            shapes[node.name] = tuple(val.shape)
        elif node.target is torch.ops.aten.convolution_backward.default:  # the importer's two ops
            shapes[f"{node.name}.grad_input"] = tuple(val[0].shape) if val[0] is not None else None
            shapes[f"{node.name}.grad_weight"] = tuple(val[1].shape) if val[1] is not None else None
        elif isinstance(val, (tuple, list)):
            shapes[node.name] = tuple(val[0].shape)
    backward = [op for op in plan.order if plan.ops[op].phase == "backward"]
    kernels = []
    for k, op in enumerate(backward):
        node, _, half = op.partition(".")
        beside = {backward[i].partition(".")[0] for i in (k - 1, k + 1) if 0 <= i < len(backward)}
        paired = f"{node}.grad_input" in plan.ops and f"{node}.grad_weight" in plan.ops
        if paired and (node in beside or plan.execution == "eager"):  # the runtime makes the halves one call,
            if not any(b.startswith(f"{node}.") for b in backward[:k]):  # where the plan runs the first
                kernels.append(("aten.convolution_backward",
                                (shapes[f"{node}.grad_input"], shapes[f"{node}.grad_weight"])))
        elif plan.ops[op].kind in workers.ORDERED_KINDS:
            kernels.append((plan.ops[op].kind, shapes[op]))
    return kernels


@pytest.mark.parametrize("name, make_plan", [
    ("tiny_cnn", scrambled_plan),        # convolutions, BatchNorm, a bucket in 3 chunks
    ("tiny_gpt", scrambled_plan),        # tied embedding
    ("frozen_stem", scrambled_plan),     # frozen parameters and BatchNorm buffers
    ("tiny_branches", reordered_plan),   # a backward order that is not the engine's
    ("tiny_inception", reordered_plan),  # branches of convolutions, reordered
])
def test_compiled_gradients_equal_ddp_bit_for_bit(name, make_plan):
    plan = make_plan(name)
    for result in run_ranks(workers.compiled_against_ddp, 2, name, plan, 3, timeout_s=240):
        assert [d[0] for d in result["diffs"]] == [0.0, 0.0, 0.0]
        assert result["params_equal"] and result["buffers_equal"]
        assert result["unplanned"] == {"forward": [], "backward": []}  # every graph op found in the plan
        # recorded while the backward ran: the plan's collectives, in its order, with its sizes
        assert result["all_reduces"] == [numel for _, _, numel in expected_log(plan, graph_of(name))]


@pytest.mark.parametrize("name", ["tiny_branches", "tiny_inception"])
def test_the_executed_backward_order_is_the_plans_and_a_reordered_plan_changes_it(name):
    reordered = reordered_plan(name)
    engine = engine_plan_like(reordered, name)
    planned = {"engine": planned_kernels(engine, name), "reordered": planned_kernels(reordered, name)}
    assert planned["engine"] != planned["reordered"]
    for label, plan in (("engine", engine), ("reordered", reordered)):
        result = run_ranks(workers.compiled_against_ddp, 2, name, plan, 1, timeout_s=240)[0]
        assert result["diffs"][0][0] == 0.0
        assert result["executed"] == planned[label], label


def test_the_loss_outside_the_module_is_reported_not_lost():
    result = run_ranks(workers.compiled_against_ddp, 2, "tiny_cnn", scrambled_plan("tiny_cnn"), 1)[0]
    assert "nll_loss_forward" in result["outside"]["forward"]
    assert "nll_loss_backward" in result["outside"]["backward"]
    assert not any(op.startswith("convolution") for ops in result["outside"].values() for op in ops)


def ddp_plan_of(model, name: str) -> Plan:
    graph = from_torch(model, (torch.randn(4, 8),), name=name)
    return get("pytorch-ddp")(Problem(graph=graph, cluster=Cluster.preset("10gbe", world_size=2)))


def test_a_graph_break_is_a_clear_error_on_every_rank():
    plan = ddp_plan_of(workers.GraphBreak(), "graph_break")
    for result in run_ranks(workers.compile_step, 2, "graph_break", plan):
        assert result["error"] == "CompileError" and "breaks the graph of GraphBreak" in result["message"]


def test_a_graph_op_the_plan_lacks_is_named_and_runs_or_with_strict_fails():
    plan = scrambled_plan("tiny_cnn")
    fewer = replace(plan, ops={k: v for k, v in plan.ops.items() if k != "convolution_1"},
                    order=tuple(op for op in plan.order if op != "convolution_1"))
    for result in run_ranks(workers.compile_step, 2, "tiny_cnn", fewer):
        assert result["error"] == "" and result["grads"]
        assert result["unplanned"]["forward"] == ["convolution_1 (aten.convolution)"]
    for result in run_ranks(workers.compile_step, 2, "tiny_cnn", fewer, strict=True):
        assert result["error"] == "CompileError"
        assert "1 op(s) the plan does not: convolution_1 (aten.convolution)" in result["message"]


def test_a_dropout_traced_two_ways_is_aligned_around():
    plan = ddp_plan_of(workers.Dropout(), "dropout")
    for result in run_ranks(workers.compile_step, 2, "dropout", plan):
        assert result["error"] == "" and result["grads"]
        assert [u.split(" ")[1] for u in result["unplanned"]["forward"]] == ["(aten.native_dropout)"]
        assert {"bernoulli_", "addmm_1"} & set(result["outside"]["forward"]) == {"bernoulli_"}  # the layers matched


def test_overlap_plans_and_plans_without_ops_are_refused_before_anything_runs():
    from schedopt.runtime import compile as compile_plan

    plan = scrambled_plan("tiny_cnn")
    model = build("tiny_cnn")[0]
    with pytest.raises(InvalidPlanError, match="barrier plans; this plan is in overlap mode"):
        compile_plan(model, replace(plan, mode="overlap"))
    with pytest.raises(InvalidPlanError, match="does not record its ops"):
        compile_plan(model, replace(plan, ops=None))
    with pytest.raises(InvalidPlanError, match="do not list 1 op"):
        compile_plan(model, replace(plan, ops={k: v for k, v in plan.ops.items() if k != "convolution_1"}))
    onnx_like = replace(plan, ops={k: replace(v, kind="Conv") for k, v in plan.ops.items()})
    with pytest.raises(InvalidPlanError, match="not aten ops"):
        compile_plan(model, onnx_like)


def test_plan_ops_round_trip_through_json(tmp_path):
    plan = scrambled_plan("tiny_cnn")
    plan.save(tmp_path / "plan.json")
    again = Plan.load(tmp_path / "plan.json")
    assert again.ops == plan.ops and again.ops["convolution_1"].kind == "aten.convolution"
    finisher = graph_of("tiny_cnn").params["conv1.weight"].grad_op
    assert finisher.endswith(".grad_weight") and "conv1.weight" in again.ops[finisher].grads


def test_reorder_follows_the_plan_and_refuses_an_order_against_a_dependency():
    from schedopt.runtime.compiled.order import reorder

    def diamond():
        graph = fx.Graph()
        x = graph.placeholder("x")
        a = graph.call_function(torch.relu, (x,))
        b = graph.call_function(torch.neg, (x,))
        view = graph.call_function(torch.flatten, (b,))  # unmatched: runs just before its user
        c = graph.call_function(torch.add, (a, view))
        graph.output(c)
        return graph, a, b, view, c

    graph, a, b, view, c = diamond()
    reorder(graph, {a: "a", b: "b", c: "c"}, {"b": 0, "a": 1, "c": 2})
    assert [n.name for n in graph.nodes if n.op == "call_function"] == [b.name, a.name, view.name, c.name]
    graph, a, b, view, c = diamond()
    with pytest.raises(CompileError, match="the plan runs 'c' .* before 'b'"):
        reorder(graph, {a: "a", b: "b", c: "c"}, {"a": 0, "c": 1, "b": 2})


def test_canonical_kinds_undo_functionalization():
    from schedopt.runtime.compiled.identity import canonical_kind

    assert canonical_kind("aten.add_") == canonical_kind("aten.add") == "aten.add"
    assert canonical_kind("aten._native_batch_norm_legit_functional") == canonical_kind("aten.native_batch_norm")
    assert canonical_kind("aten._log_softmax") == "aten._log_softmax"
    assert canonical_kind("aten.convolution_backward.grad_weight") == "aten.convolution_backward.grad_weight"
