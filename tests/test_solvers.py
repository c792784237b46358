"""The solver registry and the pytorch-ddp baseline."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from schedopt import Cluster, Problem, SolverError, TrainGraph, simulate
from schedopt.orders import engine_order, ready_order
from schedopt.plan import validate
from schedopt.solvers import SOLVERS, get, solvers_for
from schedopt.solvers.ddp import ddp_bucket_assignment
from schedopt.synthetic import branches, chain, diamond, transformer_like

ROOT = Path(__file__).resolve().parents[1]

MiB = 1024 * 1024

SYNTHETIC = {g.name: g for g in (chain(4), diamond(), branches(3), transformer_like(2))}
TINY = ("tiny_cnn", "tiny_gpt", "tiny_branches", "tiny_inception")


@functools.cache
def _graph(name: str) -> TrainGraph:
    """A synthetic graph, or a tiny example model imported at aten level (the dev setup installs torch: no
    silent shrink). Imported when a test first asks, not at collection, which every test process runs."""
    if name in SYNTHETIC:
        return SYNTHETIC[name]
    from schedopt.importers import from_torch

    from .models_path import example_models

    model, inputs, *loss = getattr(example_models(), name)()
    return from_torch(model, inputs, loss_fn=loss[0] if loss else None, name=name)


def test_unknown_solver_lists_the_valid_ones():
    with pytest.raises(SolverError, match=r"unknown solver 'magic'; valid: .*pytorch-ddp"):
        get("magic")


def test_unknown_option_is_a_solver_error(chain3, two_ranks):
    with pytest.raises(SolverError, match="no option 'bucket_size'.*bucket_cap_mb"):
        get("pytorch-ddp")(Problem(graph=chain3, cluster=two_ranks), bucket_size=3)


@pytest.mark.parametrize("name", solvers_for("barrier"))
@pytest.mark.parametrize("graph_name", [*SYNTHETIC, *TINY])
@pytest.mark.parametrize("mode", ["barrier", "overlap"])
def test_every_solver_returns_a_valid_plan_with_a_prediction(name, graph_name, mode):
    graph = _graph(graph_name)
    problem = Problem(graph=graph, cluster=Cluster.preset("10gbe", world_size=8), mode=mode)
    plan = get(name)(problem, time_limit_s=1)  # what it checks holds at any time limit
    validate(plan, graph)
    assert plan.mode == mode and plan.solver.name == name
    assert plan.predicted == simulate(problem, plan).prediction()
    assert plan.predicted.lower_bound_s <= plan.predicted.iteration_s * (1 + 1e-9)
    assert plan.solver.solve_time_s > 0


def test_ddp_bucket_boundaries_for_known_sizes():
    """DDP closes a bucket when it reaches the limit, the crossing tensor included: 1 MiB first, then 25 MiB."""
    sizes = [400_000, 400_000, 400_000, 10 * MiB, 10 * MiB, 10 * MiB, 30 * MiB, MiB, 2 * MiB]
    assert ddp_bucket_assignment(sizes, [MiB, 25 * MiB]) == [[0, 1, 2], [3, 4, 5], [6], [7, 8]]
    # one accumulator per dtype, each with its own limit sequence
    assert ddp_bucket_assignment([MiB, 10, MiB], [MiB, 25 * MiB], ["float32", "float16", "float32"]) == [
        [0], [1], [2]]
    mixed = ddp_bucket_assignment([MiB, 10, 30 * MiB, 20], [MiB, 25 * MiB], ["float32", "float16", "float32", "float16"])
    assert mixed == [[0], [2], [1, 3]]


def test_engine_order_runs_backward_by_highest_sequence_number():
    """diamond: a -> (b, c -> c2) -> join -> d -> loss; the branch recorded last (c) runs first in backward."""
    graph = diamond()
    order = engine_order(graph)
    assert order[:7] == ["a", "b", "c", "c2", "join", "d", "loss"]
    backward = [o for o in order if graph.ops[o].phase == "backward"]
    assert backward.index("c2.grad_input") < backward.index("b.grad_input")
    assert backward.index("c.grad_weight") < backward.index("b.grad_weight")
    assert order[-1] == "optimizer.step"


def test_recorded_engine_order_moves_only_gradient_finishing_ops():
    """Traced: input grad, weight grad, bias grad; hooks: bias, weight. Only the weight's op moves; the
    head-like op that finishes nothing keeps its early place though its gradient is needed last."""
    from .conftest import op, param

    ops = [op("fwd", "forward", 1, reads=["w", "b", "e"]), op("head", "backward", 5),
           op("gin", "backward", 1), op("gw", "backward", 1, grads=["w"]), op("gb", "backward", 1, grads=["b"]),
           op("sum", "backward", 1, grads=["e"]), op("opt", "optimizer", 1, reads=["w", "b", "e"])]
    edges = [("fwd", "head"), ("fwd", "gin"), ("gin", "gw"), ("gin", "gb"), ("gin", "sum"), ("head", "sum"),
             ("gw", "opt"), ("gb", "opt"), ("sum", "opt")]
    params = [param("w", 16, "gw"), param("b", 16, "gb"), param("e", 16, "sum")]
    graph = TrainGraph(name="node", ops=ops, edges=edges, params=params, grad_order=["b", "w", "e"])
    assert engine_order(graph) == ["fwd", "head", "gin", "gb", "gw", "sum", "opt"]
    assert ready_order(graph, engine_order(graph)) == ["b", "w", "e"]
    # w's gradient feeds b's, so no op order fires b's hook first (a hand-edited file): the deadline
    # fallback, still a valid order
    impossible = TrainGraph(name="bad", ops=ops, edges=[*edges, ("gw", "gb")], params=params,
                            grad_order=["b", "w", "e"])
    assert engine_order(impossible) == ["fwd", "gin", "gw", "gb", "head", "sum", "opt"]


def test_ddp_plan_on_gpt_layout_matches_pytorch_rules():
    graph = transformer_like(12)
    plan = get("pytorch-ddp")(Problem(graph=graph, cluster=Cluster.preset("10gbe", world_size=8)))
    names = ready_order(graph, plan.order)
    assert [p for b in plan.buckets for p in b.params] == names  # ready order, contiguous
    sizes = [sum(graph.params[p].nbytes for p in b.params) for b in plan.buckets]
    assert sizes[0] >= MiB and sizes[0] - graph.params[plan.buckets[0].params[-1]].nbytes < MiB
    for size, bucket in zip(sizes[1:-1], plan.buckets[1:-1]):
        assert size >= 25 * MiB and size - graph.params[bucket.params[-1]].nbytes < 25 * MiB
    assert plan.buckets[-1].params[-1] == "wte.weight"  # the tied embedding is finished last


def test_cpsat_warm_starts_are_an_explicit_list_and_a_registered_solver_is_not_run_silently():
    from schedopt.solvers.cpsat.config import CpsatOptions
    from schedopt.solvers.registry import SOLVERS, register

    ran = []

    @register("test-mine")
    def solve_mine(problem, *, time_limit_s=None, seed=0):
        ran.append(problem)
        return SOLVERS["pytorch-ddp"](problem)

    try:
        problem = Problem(graph=transformer_like(2), cluster=Cluster.preset("10gbe", world_size=8))
        get("cpsat")(problem, time_limit_s=2)
        assert not ran  # not in the default warm starts
        plan = get("cpsat")(problem, time_limit_s=2, tuning={"warm_starts": ["test-mine", "caramel"]})
        assert ran and plan.solver.options["warm_starts"] == ("test-mine", "caramel")
        with pytest.raises(SolverError, match="warm_starts must name registered heuristics.*'nope'"):
            CpsatOptions.make({"warm_starts": ["nope"]})
    finally:
        del SOLVERS["test-mine"]


def test_tuning_reaches_the_bounds_and_the_stage_choice():
    from schedopt.solvers.bounds import BoundSettings
    from schedopt.solvers.cpsat.config import CpsatOptions

    options = CpsatOptions.make({"bounds": {"profile_points": 20}, "search_kick_moves": [1, 2]})
    assert options.bounds == BoundSettings(profile_points=20) and options.search_kick_moves == (1, 2)
    with pytest.raises(SolverError, match="tuning bounds"):
        CpsatOptions.make({"bounds": {"no_such": 1}})
    with pytest.raises(SolverError, match="search_kick_moves"):
        CpsatOptions.make({"search_kick_moves": [3, 1]})
    graph = transformer_like(2)
    osp = Problem(graph=graph, cluster=Cluster.preset("10gbe", world_size=8), mode="osp")
    none = get("caramel")(osp, stages={"split_candidates": 0})
    assert none.mode == "osp"
    with pytest.raises(SolverError, match="stages has no option 'nope'"):
        get("caramel")(osp, stages={"nope": 1})
    with pytest.raises(SolverError, match="tunes the osp stage choice"):
        get("caramel")(Problem(graph=graph, cluster=Cluster.preset("10gbe", world_size=8)), stages={})


def test_the_custom_solver_example_registers_a_heuristic_that_compare_runs_beside_the_others():
    """examples/custom_solver.py, in a process of its own (registering is global): each of its buckets
    holds at least twice the bytes of the one before, and compare's table has it beside the others."""
    code = ("import json, sys; sys.path.insert(0, 'examples'); import custom_solver\n"
            "from schedopt import Cluster, Problem\nfrom schedopt.solvers import get\n"
            "from schedopt.synthetic import transformer_like\n"
            "g = transformer_like(4)\n"
            "plan = get('doubling')(Problem(graph=g, cluster=Cluster.preset('100gbe', world_size=8)), first_mb=0.5)\n"
            "print(json.dumps([sum(g.params[n].nbytes for n in b.params) for b in plan.buckets]))\n"
            "custom_solver.main(['--world-size', '8', '--time-limit', '1'])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    first, *table = done.stdout.splitlines()
    sizes = json.loads(first)
    assert len(sizes) > 2 and all(size >= 2**19 * 2**i for i, size in enumerate(sizes[:-1]))
    solvers = [line.split()[0] for line in table[2:]]
    assert solvers == ["pytorch-ddp", "horovod", "caramel", "doubling", "cpsat"]
