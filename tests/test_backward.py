"""Backward synthesis from a forward DAG."""

from __future__ import annotations

import pytest

from schedopt import InvalidGraphError
from schedopt.backward import ForwardOp, ParamSpec, training_graph
from schedopt.cost import DeviceSpec

DEVICE = DeviceSpec(name="unit", peak_flops=1e12, mem_bandwidth_Bps=1e12)


def fwd(op_id, inputs=(), reads=(), flops=1e9):
    return ForwardOp(id=op_id, kind="linear", inputs=inputs, reads=reads, flops=flops)


def test_two_branch_model_mirrors_dependencies():
    """a -> (b, c) -> d -> loss: a's gradient needs both branches' input gradients."""
    g = training_graph(
        "two-branch",
        [fwd("a", reads=("a.w",)), fwd("b", ("a",), ("b.w",)), fwd("c", ("a",), ("c.w",)),
         fwd("d", ("b", "c"), ("d.w",)), fwd("loss", ("d",))],
        [ParamSpec(name=n, shape=(10, 10)) for n in ("a.w", "b.w", "c.w", "d.w")],
        device=DEVICE,
    )
    preds = lambda op_id: set(g.dag.predecessors(op_id))  # noqa: E731
    assert preds("a.grad_weight") == {"a", "b.grad_input", "c.grad_input"}
    assert "a.grad_input" not in g.ops  # a's input is data: no gradient flows there
    assert preds("d.grad_input") == {"d", "loss.grad_input"}
    assert g.params["c.w"].grad_op == "c.grad_weight"
    assert g.ops["c.grad_weight"].grads == ("c.w",)
    assert g.ops["optimizer.step"].phase == "optimizer"
    assert g.ops["a"].duration_s == pytest.approx(1e9 / 1e12)


def test_tied_weight_gets_one_accumulating_grad_op():
    g = training_graph(
        "tied",
        [fwd("embed", reads=("emb",)), fwd("mid", ("embed",), ("w",)), fwd("head", ("mid",), ("emb",)),
         fwd("loss", ("head",))],
        [ParamSpec(name="emb", shape=(100, 8)), ParamSpec(name="w", shape=(8, 8))],
        device=DEVICE,
    )
    acc = g.ops["emb.accumulate_grad"]
    assert acc.grads == ("emb",) and g.params["emb"].grad_op == acc.id
    assert set(g.dag.predecessors(acc.id)) == {"embed.grad_weight", "head.grad_weight"}
    assert g.ops["head.grad_weight"].grads == () and g.ops["embed.grad_weight"].grads == ()


def test_frozen_or_dead_parameters_are_refused():
    with pytest.raises(InvalidGraphError, match="do not reach the loss: dead.w"):
        training_graph(
            "dead",
            [fwd("a", reads=("a.w",)), fwd("dead", ("a",), ("dead.w",)), fwd("loss", ("a",))],
            [ParamSpec(name="a.w", shape=(2,)), ParamSpec(name="dead.w", shape=(2,))],
            device=DEVICE,
        )


def test_inputs_must_be_earlier_ops():
    with pytest.raises(InvalidGraphError, match="not an earlier forward op"):
        training_graph("bad", [fwd("a", ("b",)), fwd("b")], [], device=DEVICE)
