"""The one bucket layout (schedopt.layout): its rule, and the runtime issuing exactly what the simulator schedules."""

from __future__ import annotations

import pytest

from schedopt import Cluster, Problem, simulate
from schedopt.errors import InvalidPlanError
from schedopt.layout import bucket_layout, chunk_bounds
from schedopt.plan import Bucket
from schedopt.simulate import chunk_layout
from schedopt.solvers import get, solvers_for

from . import runtime_workers as workers
from .distributed import run_ranks

TINY = ["tiny_cnn", "tiny_branches", "tiny_resnet", "tiny_vgg", "tiny_inception", "tiny_gpt", "tiny_bert"]


def layout_of(buckets, numel, itemsize=4):
    return [(c.bucket, c.chunk, c.start, c.end, c.nbytes, c.params)
            for c in bucket_layout(buckets, numel=numel, itemsize=itemsize).collectives]


def test_chunks_cover_the_parameters_their_slices_intersect():
    assert layout_of([Bucket(params=("a", "b", "c"), chunks=3)], {"a": 2, "b": 5, "c": 2}) == [
        (0, 0, 0, 3, 12, ("a", "b")), (0, 1, 3, 6, 12, ("b",)), (0, 2, 6, 9, 12, ("b", "c"))]


def test_an_empty_parameter_gates_the_slice_its_offset_lies_in():
    # offsets: a [0, 4), e at 4 (empty), b [4, 8), z at 8 (empty, at the end)
    got = layout_of([Bucket(params=("a", "e", "b", "z"), chunks=2)], {"a": 4, "e": 0, "b": 4, "z": 0})
    assert got == [(0, 0, 0, 4, 16, ("a",)), (0, 1, 4, 8, 16, ("e", "b", "z"))]
    assert layout_of([Bucket(params=("e",))], {"e": 0}) == [(0, 0, 0, 0, 0, ("e",))]
    spans = bucket_layout([Bucket(params=("a", "e", "b", "z"), chunks=2)], numel={"a": 4, "e": 0, "b": 4, "z": 0},
                          itemsize=4)
    assert all(spans.gates()[name] for name in "aebz")  # every parameter gates some collective


def test_itemsize_per_parameter_and_buckets_in_order():
    got = layout_of([Bucket(params=("h",)), Bucket(params=("f",), chunks=2)], {"h": 3, "f": 4},
                    itemsize={"h": 2, "f": 4})
    assert got == [(0, 0, 0, 3, 6, ("h",)), (1, 0, 0, 2, 8, ("f",)), (1, 1, 2, 4, 8, ("f",))]


@pytest.mark.parametrize(("buckets", "says"), [
    ([Bucket(params=("a",)), Bucket(params=("a",))], "'a' is in two buckets"),
    ([Bucket(params=("x",))], "'x', which is not a trainable parameter"),
    ([Bucket(params=())], "bucket 0 is empty"),
    ([Bucket(params=("a",), chunks=5)], "chunks = 5; expected 1 to 4"),
])
def test_a_layout_that_cannot_exist_is_refused(buckets, says):
    with pytest.raises(InvalidPlanError, match=says):
        bucket_layout(buckets, numel={"a": 4}, itemsize=4)


def test_chunk_bounds_are_whole_and_nearly_equal():
    for numel in (1, 7, 100, 1001):
        for chunks in range(1, min(numel, 9) + 1):
            bounds = chunk_bounds(numel, chunks)
            assert bounds[0][0] == 0 and bounds[-1][1] == numel
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            assert max(e - s for s, e in bounds) - min(e - s for s, e in bounds) <= 1


def every_plan(graph, mode: str):
    problem = Problem(graph=graph, cluster=Cluster.preset("10gbe", world_size=8), mode=mode)
    options = {"cpsat": {"time_limit_s": 0.5}}  # any plan will do: the check is that the runtime issues its collectives
    return problem, [get(name)(problem, **options.get(name, {})) for name in sorted(solvers_for("barrier"))]


@pytest.mark.slow
def test_the_eager_runtime_issues_exactly_the_collectives_the_simulator_schedules():
    """Every tiny example model, every solver's plan (barrier and overlap): sizes and order."""
    from .test_runtime import graph_of

    cases, expected = [], []
    for name in TINY:
        graph = graph_of(name)
        for mode in ("barrier", "overlap"):
            problem, plans = every_plan(graph, mode)
            for plan in plans:
                layout = chunk_layout(graph, plan)
                comm = [e for e in simulate(problem, plan).events if e.track == "comm" and e.step == 0]
                assert [e.bucket for e in comm] == [c.bucket for c in layout], (name, plan.solver.name)
                assert [e.duration_s for e in comm] == pytest.approx(
                    [problem.cluster.allreduce_s(c.nbytes) for c in layout]), (name, plan.solver.name)
                assert all(c.nbytes == c.numel * 4 for c in layout)  # float32 models
                cases.append((name, plan))
                expected.append([(c.bucket, c.chunk, c.numel) for c in layout])
    issued = run_ranks(workers.issued_collectives, 2, cases, timeout_s=240)
    for rank_logs in issued:
        for (name, plan), want, got in zip(cases, expected, rank_logs):
            assert got == want, (name, plan.mode, plan.solver.name)
