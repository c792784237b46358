"""Bad input through the CLI, one table: exit status 2, one line on stderr, no traceback, no file touched.

Each case names a kind of bad input a user can give (a graph or plan JSON
with a field of the wrong type, NaN, deep nesting; a model file that exits or
parses ``sys.argv``; a corrupt ONNX file; an absurd unit; a bad solver option;
an output that cannot be written) and a fragment of the one line it must get.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path

import pytest

from schedopt.cli import main
from schedopt.synthetic import transformer_like

MODEL_FILE = '''
import sys
import torch

class Relu(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x).sum()

def no_params():
    return Relu(), (torch.randn(4, 8),)

def exits():
    sys.exit(3)

def parses_argv():
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", required=True)
    parser.parse_args()

def wrong_inputs():
    return torch.nn.Linear(8, 4), (torch.randn(4, 5),)

def not_a_tuple():
    return torch.nn.Linear(8, 4)

def raises():
    raise RuntimeError("no GPU here")
'''


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """A graph, a plan of it, model files and broken variants, in one directory."""
    d = tmp_path_factory.mktemp("inputs")
    transformer_like(2).save(d / "g.json")
    assert main(["plan", str(d / "g.json"), "--solver", "caramel", "-o", str(d / "p.json")]) == 0
    (d / "models.py").write_text(MODEL_FILE)
    (d / "exits_on_import.py").write_text("import sys\nsys.exit('not a library')\n")
    (d / "garbage.onnx").write_bytes(b"\x08\x07this is not a model" * 10)
    (d / "empty.onnx").write_bytes(b"")
    (d / "not_json.json").write_text("{ nope")
    (d / "readonly").mkdir()
    os.chmod(d / "readonly", 0o555)
    return d


def variant(d: Path, source: str, change) -> str:
    """A copy of ``source`` (``g.json``, ``p.json``) with ``change`` applied to its JSON."""
    data = json.loads((d / source).read_text())
    change(data)
    path = d / f"{source[0]}_{hashlib.sha1(json.dumps(data).encode()).hexdigest()[:10]}.json"
    path.write_text(json.dumps(data))
    return str(path)


def graph_variant(d: Path, change) -> str:
    return variant(d, "g.json", change)


def plan_variant(d: Path, change) -> str:
    return variant(d, "p.json", change)


def raw(d: Path, name: str, text: str) -> str:
    (d / name).write_text(text)
    return str(d / name)


def first(data, key):
    return data[key][0]


def strip_params(data) -> None:
    data["params"], data["grad_order"] = [], None
    for o in data["ops"]:
        o["reads"], o["grads"] = [], []


def plan(model: str, *extra: str, out: str = "OUT/plan.json") -> list[str]:
    return ["plan", model, "--solver", "caramel", *extra, "-o", out]


def simulate(plan_file: str, d: Path) -> list[str]:
    return ["simulate", plan_file, str(d / "g.json")]


from .models_path import MODELS_FILE as MODELS  # noqa: E402

CASES = {
    # graph JSON: types, numbers, nesting, invariants
    "op id is a list": (lambda d: plan(graph_variant(d, lambda g: first(g, "ops").update(id=["x"]))),
                        "field ops[0].id must be a string"),
    "duration is a string": (lambda d: plan(graph_variant(d, lambda g: first(g, "ops").update(duration_s="fast"))),
                             "ops[0].duration_s must be a finite number"),
    "duration is NaN": (lambda d: plan(raw(d, "nan.json", (d / "g.json").read_text().replace(
        '"duration_s": ', '"duration_s": NaN, "x": ', 1))), "holds NaN"),
    "duration is Infinity": (lambda d: plan(raw(d, "inf.json", (d / "g.json").read_text().replace(
        '"duration_s": ', '"duration_s": Infinity, "x": ', 1))), "holds Infinity"),
    "durations overflow": (lambda d: plan(graph_variant(d, lambda g: [o.update(duration_s=1e308) for o in g["ops"]])),
                           "add up to inf s"),
    "duration is negative": (lambda d: plan(graph_variant(d, lambda g: first(g, "ops").update(duration_s=-1))),
                             "expected a finite number >= 0"),
    "shape is a string": (lambda d: plan(graph_variant(d, lambda g: first(g, "params").update(shape="4x4"))),
                          "params[0].shape must be a list of integers"),
    "shape is negative": (lambda d: plan(graph_variant(d, lambda g: first(g, "params").update(shape=[-1, 4]))),
                          "negative dimension"),
    "ops is an object": (lambda d: plan(graph_variant(d, lambda g: g.update(ops={"a": 1}))), "field ops must be a list"),
    "edges is a string": (lambda d: plan(graph_variant(d, lambda g: g.update(edges="a->b"))), "field edges must be a list"),
    "edge of three": (lambda d: plan(graph_variant(d, lambda g: g["edges"].__setitem__(0, ["a", "b", "c"]))),
                      "edges[0] must be a pair of op ids"),
    "reads is a string": (lambda d: plan(graph_variant(d, lambda g: first(g, "ops").update(reads="w"))),
                          "ops[0].reads must be a list of strings"),
    "meta is a list": (lambda d: plan(graph_variant(d, lambda g: g.update(meta=[1]))), "field meta must be an object"),
    "graph is a list": (lambda d: plan(raw(d, "list.json", "[1, 2]")), "top level must be an object"),
    "graph nests deeply": (lambda d: plan(raw(d, "deep.json", "[" * 100_000 + "]" * 100_000)), "too deeply"),
    "graph is not JSON": (lambda d: plan(str(d / "not_json.json")), "is not valid JSON"),
    "graph schema unknown": (lambda d: plan(graph_variant(d, lambda g: g.update(schema="schedopt.graph/99"))),
                             "unknown graph schema"),
    "graph has a cycle": (lambda d: plan(graph_variant(d, lambda g: g["edges"].append(g["edges"][0][::-1]))), "cycle"),
    "graph has no parameters": (lambda d: plan(graph_variant(d, strip_params)), "has no trainable parameters"),
    "graph file missing": (lambda d: plan(str(d / "absent.json")), "does not exist"),
    # plan JSON
    "bucket params is a string": (lambda d: simulate(plan_variant(d, lambda p: first(p, "buckets").update(params="w")), d),
                                  "buckets[0].params must be a list of strings"),
    "chunks is a string": (lambda d: simulate(plan_variant(d, lambda p: first(p, "buckets").update(chunks="two")), d),
                           "chunks = 'two'"),
    "order is an object": (lambda d: simulate(plan_variant(d, lambda p: p.update(order={"a": 1})), d),
                           "field order must be a list of strings"),
    "cluster bandwidth is a string": (lambda d: simulate(plan_variant(
        d, lambda p: p["cluster"].update(bandwidth_Bps="fast")), d), "bandwidth_Bps must be a positive number"),
    "solver options is a list": (lambda d: simulate(plan_variant(d, lambda p: p["solver"].update(options=[1])), d),
                                 "solver.options must be an object"),
    "bound is NaN": (lambda d: simulate(raw(d, "plan_nan.json", (d / "p.json").read_text().replace(
        '"solve_time_s": ', '"solve_time_s": NaN, "x": ', 1)), d), "holds NaN"),
    "plan nests deeply": (lambda d: simulate(raw(d, "plan_deep.json", '{"a":' * 50_000 + "1" + "}" * 50_000), d),
                          "too deeply"),
    "plan schema unknown": (lambda d: simulate(plan_variant(d, lambda p: p.update(schema="schedopt.plan/99")), d),
                            "unsupported plan schema"),
    "plan for another model": (lambda d: simulate(str(d / "p.json"), d)[:2] + [graph_variant(
        d, lambda g: first(g, "params").update(shape=[3, 3]))], "plan was made for model"),
    # model files
    "factory calls sys.exit": (lambda d: plan(f"{d / 'models.py'}:exits"), "called sys.exit(3)"),
    "factory parses sys.argv": (lambda d: plan(f"{d / 'models.py'}:parses_argv"), "the following arguments are required"),
    "module exits on import": (lambda d: plan(f"{d / 'exits_on_import.py'}:model"), "called sys.exit('not a library')"),
    "factory raises": (lambda d: plan(f"{d / 'models.py'}:raises"), "failed: RuntimeError: no GPU here"),
    "factory returns no tuple": (lambda d: plan(f"{d / 'models.py'}:not_a_tuple"), "must return (model, example_inputs)"),
    "inputs do not fit the model": (lambda d: plan(f"{d / 'models.py'}:wrong_inputs"), "must have same reduction dim"),
    "model has no parameters (aten)": (lambda d: plan(f"{d / 'models.py'}:no_params"), "has no trainable parameters"),
    "model has no parameters (module)": (lambda d: plan(f"{d / 'models.py'}:no_params", "--level", "module"),
                                         "has no trainable parameters"),
    "no such factory": (lambda d: plan(f"{d / 'models.py'}:absent"), "has no factory 'absent'"),
    "onnx is garbage": (lambda d: plan(str(d / "garbage.onnx")), "not a valid ONNX model|holds no graph|checker"),
    "onnx is empty": (lambda d: plan(str(d / "empty.onnx")), "holds no graph|not a valid ONNX"),
    # units and options
    "bandwidth absurd": (lambda d: plan(str(d / "g.json"), "--bandwidth", "1e-300bps"), "a unit error?"),
    "latency absurd": (lambda d: plan(str(d / "g.json"), "--latency", "1e300s"), "latency_s must be a number from 0 to 1 s"),
    "world size absurd": (lambda d: plan(str(d / "g.json"), "--world-size", "100000000000"), "world_size must be an integer"),
    "time limit negative": (lambda d: plan(str(d / "g.json"), "--time-limit=-3"), "must not be negative"),
    "unknown solver": (lambda d: ["plan", str(d / "g.json"), "--solver", "nope", "-o", "OUT/plan.json"], "unknown solver 'nope'"),
    "option is NaN": (lambda d: ["plan", str(d / "g.json"), "--solver", "pytorch-ddp", "--option", "bucket_cap_mb=NaN",
                                 "-o", "OUT/plan.json"], "got nan"),
    "cpsat tuning unknown": (lambda d: ["plan", str(d / "g.json"), "--solver", "cpsat", "--option", 'tuning={"x": 1}',
                                        "-o", "OUT/plan.json"], "cpsat has no tuning 'x'"),
    # outputs
    "output is the input": (lambda d: plan(str(d / "g.json"), out=str(d / "g.json")), "also an input"),
    "output is a directory": (lambda d: plan(str(d / "g.json"), out=str(d)), "is a directory"),
    "output under a file": (lambda d: plan(str(d / "g.json"), out=str(d / "g.json" / "plan.json")), "not a directory|cannot"),
    "output unwritable": (lambda d: plan(str(d / "g.json"), out=str(d / "readonly" / "plan.json")), "cannot write|not writable|ermission"),
    "output empty": (lambda d: plan(str(d / "g.json"), out=""), "empty"),
    # a device this machine lacks (CI and these machines have no GPU)
    "profile on cuda without one": (lambda d: ["profile", f"{MODELS}:tiny_cnn", "--on", "cuda", "-o", "OUT/g.json"],
                                    "no CUDA device"),
}


def snapshot(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def test_the_table_is_large_enough():
    assert len(CASES) >= 40


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gets_one_line_and_status_2(case, inputs, tmp_path, capsys):
    make, expected = CASES[case]
    args = make(inputs)
    if os.geteuid() == 0 and case == "output unwritable":  # root ignores file modes; sysfs refuses even root
        args = plan(str(inputs / "g.json"), out="/sys/schedopt-test-plan.json")
    args = [a.replace("OUT/", f"{tmp_path}/") for a in args]
    before, before_out = snapshot(inputs), snapshot(tmp_path)
    try:
        status = main(args)
    except SystemExit as exc:  # argparse's own refusals
        status = exc.code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert status == 2, (status, captured.err[-2000:])
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err[-2000:]
    assert any(part in lines[0] for part in expected.split("|")), lines[0]
    assert snapshot(inputs) == before and snapshot(tmp_path) == before_out, "a file was created or changed"
