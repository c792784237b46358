"""The training graph: invariants, JSON round trip, fingerprints."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from schedopt import InvalidGraphError, Param, TrainGraph
from schedopt.errors import GraphImportError
from schedopt.graph import params_fingerprint
from schedopt.synthetic import branches, chain, diamond, transformer_like

from .conftest import op, param


def build(ops, edges, params) -> TrainGraph:
    return TrainGraph(name="t", ops=ops, edges=edges, params=params)


def test_valid_graph_exposes_ops_params_and_dag(chain3):
    assert list(chain3.ops) == ["fwd", "b2", "b1", "opt"]
    assert list(chain3.params) == ["w1", "w2"]
    assert chain3.params["w1"].nbytes == 2_000_000
    assert set(chain3.dag.edges) == {("fwd", "b2"), ("b2", "b1"), ("b1", "opt"), ("b2", "opt")}
    assert chain3.grad_ops == {"b1", "b2"}
    assert chain3.totals.forward_s == pytest.approx(1e-3)


@pytest.mark.parametrize(
    "ops, edges, params, message",
    [
        ([op("a", "forward", 1), op("b", "backward", 1, grads=["w"])], [("a", "b"), ("b", "a")],
         [param("w", 4, "b")], "cycle"),
        ([op("a", "forward", 1), op("b", "backward", 1)], [("a", "b")], [param("w", 4, "zzz")], "not an op"),
        ([op("a", "forward", 1, grads=["w"])], [], [param("w", 4, "a")], "expected backward"),
        ([op("a", "forward", 1), op("b", "backward", 1, grads=["w"]), op("c", "backward", 1, grads=["w"])],
         [("a", "b"), ("b", "c")], [param("w", 4, "b")], "exactly one op"),
        ([op("a", "forward", 1), op("b", "backward", 1)], [("a", "b")], [param("w", 4, "b")], "exactly one op"),
        ([op("a", "forward", 1, reads=["nope"]), op("b", "backward", 1, grads=["w"])], [("a", "b")],
         [param("w", 4, "b")], "not a trainable parameter"),
        ([op("a", "forward", -1), op("b", "backward", 1, grads=["w"])], [("a", "b")], [param("w", 4, "b")],
         "duration_s"),
        ([op("a", "forward", 1), op("b", "backward", 1, grads=["w"])], [("b", "a")], [param("w", 4, "b")],
         "back to forward"),
        ([op("a", "forward", 1), op("b", "sideways", 1, grads=["w"])], [("a", "b")], [param("w", 4, "b")],
         "unknown phase"),
        ([op("a", "forward", 1), op("b", "backward", 1, grads=["w"])], [("a", "b")],
         [Param(name="w", shape=(1,), dtype="float13", grad_op="b")], "unknown dtype"),
        ([op("a", "forward", 1), op("a", "backward", 1)], [], [], "duplicate op"),
        ([op("a", "forward", 1)], [("a", "ghost")], [], "unknown op 'ghost'"),
    ],
)
def test_validate_names_the_broken_invariant(ops, edges, params, message):
    with pytest.raises(InvalidGraphError, match=message):
        build(ops, edges, params)


def test_json_round_trip_keeps_everything(tmp_path):
    graph = transformer_like(2)
    path = tmp_path / "g.json"
    graph.save(path)
    again = TrainGraph.load(path)
    assert again.to_json() == graph.to_json()
    assert again.fingerprint == graph.fingerprint
    assert list(again.params) == list(graph.params)
    assert again.ops == graph.ops


def test_load_reports_missing_and_corrupt_files(tmp_path):
    with pytest.raises(GraphImportError, match="does not exist"):
        TrainGraph.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "schedopt.graph/1", "ops": [')
    with pytest.raises(GraphImportError, match="not valid JSON"):
        TrainGraph.load(bad)
    bad.write_text('{"schema": "schedopt.graph/9"}')
    with pytest.raises(InvalidGraphError, match="unknown graph schema"):
        TrainGraph.load(bad)
    bad.write_text('{"schema": "schedopt.graph/1", "ops": [], "edges": []}')
    with pytest.raises(InvalidGraphError, match="lacks field 'params'"):
        TrainGraph.load(bad)


def test_fingerprint_ignores_costs_but_not_structure(chain3):
    profiled = chain3.with_durations({"fwd": 0.5})
    assert profiled.ops["fwd"].duration_s == 0.5
    assert profiled.fingerprint == chain3.fingerprint
    renamed = TrainGraph(
        name="chain3",
        ops=list(chain3.ops.values()),
        edges=[e for e in chain3.dag.edges if e != ("b2", "opt")],
        params=list(chain3.params.values()),
    )
    assert renamed.fingerprint != chain3.fingerprint
    assert renamed.params_fingerprint == chain3.params_fingerprint


def test_params_fingerprint_matches_the_runtime_form(chain3):
    entries = [("w1", (500_000,), "float32"), ("w2", (250_000,), "float32")]
    assert chain3.params_fingerprint == params_fingerprint(entries)
    assert params_fingerprint(reversed(entries)) != chain3.params_fingerprint


def test_fingerprint_is_stable_across_processes():
    code = (
        "from schedopt.synthetic import transformer_like, diamond;"
        "g = transformer_like(2); print(g.fingerprint, g.params_fingerprint, diamond().fingerprint)"
    )
    outputs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout
        for seed in ("1", "2", "random")
    }
    assert len(outputs) == 1
    fp, pfp, dfp = outputs.pop().split()
    assert (fp, pfp, dfp) == (transformer_like(2).fingerprint, transformer_like(2).params_fingerprint,
                              diamond().fingerprint)


@pytest.mark.parametrize("graph", [chain(1), chain(6), diamond(), branches(1), branches(4), transformer_like(1)],
                         ids=lambda g: g.name)
def test_synthetic_graphs_are_valid_training_graphs(graph):
    phases = {o.phase for o in graph.ops.values()}
    assert phases == {"forward", "backward", "optimizer"}
    assert all(o.duration_s > 0 for o in graph.ops.values())
    json.dumps(graph.to_json())


def test_transformer_like_has_the_gpt2_small_layout():
    graph = transformer_like(12)
    assert sum(p.numel for p in graph.params.values()) == 124_439_808  # GPT-2 124M, tied embedding
    assert graph.params["wte.weight"].grad_op == "wte.weight.accumulate_grad"
    acc = graph.ops["wte.weight.accumulate_grad"]
    assert set(graph.dag.predecessors(acc.id)) == {"wte.grad_weight", "lm_head.grad_weight"}


def test_a_train_graph_is_immutable_so_its_cached_totals_stay_true():
    import pickle

    import networkx as nx

    from schedopt.synthetic import chain

    graph = chain(3)
    totals = graph.totals
    with pytest.raises(TypeError, match="immutable"):
        graph.ops["extra"] = graph.ops[next(iter(graph.ops))]
    with pytest.raises(TypeError, match="immutable"):
        graph.params.pop(next(iter(graph.params)))
    with pytest.raises(TypeError, match="immutable"):
        graph.meta["device"] = "other"
    with pytest.raises(nx.NetworkXError):
        graph.dag.add_edge("a", "b")
    with pytest.raises(AttributeError, match="immutable"):
        graph.name = "other"
    with pytest.raises(Exception):
        totals.forward_s = 0.0
    copy = pickle.loads(pickle.dumps(graph))  # the forked searches receive graphs by pickle
    assert copy.fingerprint == graph.fingerprint and copy.totals == totals


def test_a_gradient_span_holds_the_ops_every_order_runs_between_reader_and_gradient():
    """w is read by ``fwd`` and finished by ``gw``; ``side`` (a branch off the input, joining at the
    loss) runs before or after ``fwd`` as an order likes, so it is not in w's span: fwd 1 + loss 2 +
    gw 4 = 7 ms. v, read by ``side`` and finished by ``gv``: side 8 + loss 2 + gv 16 = 26 ms."""
    graph = TrainGraph(
        name="branch",
        ops=[op("fwd", "forward", 1, reads=["w"]), op("side", "forward", 8, reads=["v"]),
             op("loss", "forward", 2), op("gw", "backward", 4, grads=["w"]), op("gv", "backward", 16, grads=["v"]),
             op("opt", "optimizer", 0.5, reads=["w", "v"])],
        edges=[("fwd", "loss"), ("side", "loss"), ("loss", "gw"), ("loss", "gv"), ("gw", "opt"), ("gv", "opt")],
        params=[param("w", 4, "gw"), param("v", 4, "gv")])
    assert graph.gradient_spans == pytest.approx({"w": 7e-3, "v": 26e-3})
