"""Hypothesis strategies: random training graphs, clusters and plans."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from schedopt import Bucket, Cluster, Plan, Problem, TrainGraph
from schedopt.backward import ForwardOp, ParamSpec, training_graph
from schedopt.cost import DeviceSpec
from schedopt.plan import SolverInfo
from schedopt.synthetic import chain


@st.composite
def train_graphs(draw, max_ops: int = 8) -> TrainGraph:
    """A random forward DAG (each op consumes random earlier ops) with a synthesized backward."""
    n = draw(st.integers(2, max_ops))
    num_params = draw(st.integers(1, 6))
    params = [ParamSpec(name=f"p{i}", shape=(draw(st.integers(1, 2_000_000)),)) for i in range(num_params)]
    ops = []
    for i in range(n - 1):
        inputs = tuple(f"op{j}" for j in range(i) if draw(st.booleans()))
        if i > 0 and not inputs:
            inputs = (f"op{i - 1}",)
        reads = tuple(p.name for p in params if draw(st.integers(0, 3)) == 0)
        ops.append(ForwardOp(id=f"op{i}", kind="test", inputs=inputs, reads=reads,
                             flops=draw(st.floats(0, 5e11)), bytes_moved=draw(st.floats(0, 5e8))))
    # every parameter must reach the loss: unread ones go to the last op before it
    unread = tuple(p.name for p in params if not any(p.name in o.reads for o in ops))
    last = ops[-1]
    ops[-1] = ForwardOp(id=last.id, kind=last.kind, inputs=last.inputs, reads=last.reads + unread,
                        flops=last.flops, bytes_moved=last.bytes_moved)
    sinks = tuple(o.id for o in ops)  # the loss consumes every op so all of them are live
    ops.append(ForwardOp(id="loss", kind="loss", inputs=sinks, flops=1e6, bytes_moved=1e5))
    optimizer = draw(st.sampled_from([None, "sgd", "adam"]))
    device = DeviceSpec.preset(draw(st.sampled_from(["a100", "v100", "cpu"])))
    return training_graph("random", ops, params, device=device, optimizer=optimizer)


@st.composite
def clusters(draw, interference: bool = False) -> Cluster:
    """Random clusters; with ``interference``, half of them slow compute beside collectives (0.05 to 3)."""
    return Cluster(
        world_size=draw(st.integers(1, 64)),
        bandwidth_Bps=draw(st.floats(1e8, 1e11)),
        latency_s=draw(st.floats(0, 1e-4)),
        call_s=draw(st.floats(0, 5e-5)),
        algorithm=draw(st.sampled_from(["ring", "tree"])),
        interference=draw(st.one_of(st.just(0.0), st.floats(0.05, 3.0))) if interference else 0.0,
    )


@st.composite
def random_orders(draw, graph: TrainGraph) -> list[str]:
    """A random linear extension of the graph's DAG."""
    indegree = {v: graph.dag.in_degree(v) for v in graph.dag}
    ready = sorted(v for v, d in indegree.items() if d == 0)
    order = []
    while ready:
        v = ready.pop(draw(st.integers(0, len(ready) - 1)))
        order.append(v)
        for w in sorted(graph.dag.successors(v)):
            indegree[w] -= 1
            if indegree[w] == 0:
                ready.append(w)
    return order


@st.composite
def random_buckets(draw, graph: TrainGraph) -> list[Bucket]:
    """A random partition of the parameters into buckets in random order, with random chunk counts."""
    names = draw(st.permutations(list(graph.params)))
    cuts = sorted(draw(st.sets(st.integers(1, max(len(names) - 1, 1)), max_size=len(names) - 1)))
    groups = [names[a:b] for a, b in zip([0, *cuts], [*cuts, len(names)]) if names[a:b]]
    buckets = []
    for group in groups:
        numel = sum(graph.params[n].numel for n in group)
        buckets.append(Bucket(params=tuple(group), chunks=draw(st.integers(1, min(4, numel)))))
    return buckets


@st.composite
def problems_and_plans(draw, max_ops: int = 8, interference: bool = False) -> tuple[Problem, Plan]:
    graph = draw(train_graphs(max_ops=max_ops))
    problem = Problem(execution="compiled", graph=graph, cluster=draw(clusters(interference)),
                      mode=draw(st.sampled_from(["barrier", "overlap"])))
    plan = Plan.for_problem(problem, order=draw(random_orders(graph)), buckets=draw(random_buckets(graph)),
                            solver=SolverInfo(name="random"))
    return problem, plan


@st.composite
def sharded_cases(draw) -> tuple[Problem, list, bool]:
    """A sharded problem on a random chain and cluster (HSDP, measured collectives, gloo or NCCL), and a
    plan's units and ``async_unshard``: layers cut into units, random reshards and prefetches."""
    graph = chain(draw(st.integers(2, 5)), width=draw(st.sampled_from([64, 256, 1024])))
    layers = [f"layer{i}" for i in range(len(graph.params) // 2)]
    cuts = sorted(draw(st.sets(st.integers(1, len(layers) - 1), max_size=len(layers) - 1)))
    groups = [layers[a:b] for a, b in zip([0, *cuts], [*cuts, len(layers)])]
    from schedopt.solvers.fsdp import build_units

    units = build_units(graph, groups, reshard=[draw(st.booleans()) for _ in groups],
                        prefetch_forward=draw(st.integers(0, 3)), prefetch_backward=draw(st.integers(0, 3)))
    units = [replace(u, reshard_after_forward=False) if u is units[-1] else u for u in units]
    world = draw(st.sampled_from([2, 8, 64]))
    cluster = Cluster(world_size=world, replicas=draw(st.sampled_from([r for r in (1, 1, 2, 8, 64) if world % r == 0])),
                      shard_bandwidth_Bps=draw(st.sampled_from([None, 3e11])),
                      bandwidth_Bps=draw(st.sampled_from([1e9, 12.5e9, 100e9])),
                      latency_s=draw(st.sampled_from([0.0, 5e-6, 50e-6])), call_s=draw(st.sampled_from([0.0, 1e-5])),
                      interference=draw(st.sampled_from([0.0, 0.3])), backend=draw(st.sampled_from(["nccl", "gloo"])),
                      shard_costs=draw(st.sampled_from([None, {"all-gather": [1e-4, 2e-8], "reduce-scatter": [5e-4, 4e-8]},
                                                        {"reduce-scatter": [0.0, 1e-7]}])))
    return Problem(graph=graph, cluster=cluster, mode="sharded"), units, draw(st.booleans())
