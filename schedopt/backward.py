"""Synthesize the backward pass and optimizer of a forward DAG.

The module-level and ONNX importers and the synthetic graphs describe only
the forward pass; this module mirrors it into a whole training iteration the
way reverse-mode autodiff runs it:

1. Keep the forward ops that lead to the loss (the last forward op unless
   named); an op *requires grad* when it reads a parameter or consumes an op
   that requires grad.
2. Walk the forward ops in reverse. Op ``f`` gets
   ``f.grad_input`` when one of its inputs requires grad (the gradient that
   flows on), and ``f.grad_weight`` when it reads parameters. Both wait for
   ``f`` (saved activations) and for the ``grad_input`` of every consumer of
   ``f`` (the gradient of ``f``'s output).
3. A parameter read by one op is finished by that op's ``grad_weight``. A tied
   parameter read by k ops gets ``<name>.accumulate_grad``, which sums the k
   partial gradients and is its ``grad_op``.
4. One ``optimizer.step`` op reads every parameter after every gradient exists.
5. Durations come from the device roofline.

Example:
    >>> from schedopt.cost import DeviceSpec
    >>> g = training_graph(
    ...     "mlp",
    ...     [ForwardOp(id="fc1", kind="linear", reads=("fc1.w",), flops=2e9, bytes_moved=1e6),
    ...      ForwardOp(id="fc2", kind="linear", inputs=("fc1",), reads=("fc2.w",), flops=2e9, bytes_moved=1e6),
    ...      ForwardOp(id="loss", kind="mse_loss", inputs=("fc2",), flops=1e6, bytes_moved=1e5)],
    ...     [ParamSpec(name="fc1.w", shape=(1000, 1000)), ParamSpec(name="fc2.w", shape=(1000, 1000))],
    ...     device=DeviceSpec.preset("a100"),
    ... )
    >>> g.params["fc1.w"].grad_op
    'fc1.grad_weight'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence

if TYPE_CHECKING:  # networkx is imported where used: a process that only trains (a rank) never loads it
    import networkx as nx

from .cost import DeviceSpec
from .errors import InvalidGraphError
from .modules import ModuleTree
from .graph import DTYPE_SIZES, Op, Param, TrainGraph

__all__ = ["ForwardOp", "ParamSpec", "training_graph", "optimizer_step", "OPTIMIZER_COSTS"]

#: Per-element (FLOPs, bytes per parameter byte) of one optimizer update:
#: SGD reads p and g and writes p; momentum adds a buffer read and write;
#: Adam reads p, g, m, v and writes p, m, v.
OPTIMIZER_COSTS: dict[str, tuple[float, float]] = {
    "sgd": (2.0, 3.0),
    "momentum": (3.0, 5.0),
    "adam": (12.0, 7.0),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardOp:
    """A forward op before its backward is synthesized.

    ``inputs`` are the ids of the forward ops whose outputs it consumes.
    ``grad_input_flops`` and ``grad_weight_flops`` default to ``flops``
    (true for matmul and convolution, close for element-wise ops).
    """

    id: str
    kind: str
    inputs: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    flops: float = 0.0
    bytes_moved: float = 0.0
    grad_input_flops: float | None = None
    grad_weight_flops: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "reads", tuple(self.reads))


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamSpec:
    """A trainable parameter before its grad op is known."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"


def training_graph(
    name: str,
    forward: Sequence[ForwardOp],
    params: Sequence[ParamSpec],
    *,
    device: DeviceSpec,
    loss: str | None = None,
    optimizer: Literal["sgd", "momentum", "adam"] | None = "sgd",
    meta: Mapping[str, Any] | None = None,
) -> TrainGraph:
    """Return the training graph of a forward DAG (see the module docstring for the steps).

    Raises:
        InvalidGraphError: an input names an unknown or later op, a parameter
            is unknown, or a parameter does not reach the loss.
    """
    import networkx as nx
    specs = {p.name: p for p in params}
    loss = _check_forward(forward, specs, loss)
    dag = nx.DiGraph()
    dag.add_nodes_from(f.id for f in forward)
    dag.add_edges_from((src, f.id) for f in forward for src in f.inputs)
    live, readers = _readers_reaching_loss(forward, specs, dag, loss)

    def cost(flops: float, nbytes: float) -> dict[str, float]:
        return {"flops": flops, "bytes_moved": nbytes, "duration_s": device.op_time_s(flops=flops, nbytes=nbytes)}

    ops: list[Op] = [Op(id=f.id, kind=f.kind, phase="forward", reads=f.reads, **cost(f.flops, f.bytes_moved))
                     for f in forward]
    edges: list[tuple[str, str]] = [(src, f.id) for f in forward for src in f.inputs]
    grad_op = _add_backward(forward, specs, dag, live, readers, cost, ops, edges)
    # 4. the optimizer step
    if optimizer is not None:
        step = optimizer_step(params, optimizer, device)
        ops.append(step)
        edges += [(g, step.id) for g in dict.fromkeys(grad_op.values())]

    return TrainGraph(
        name=name,
        ops=ops,
        edges=edges,
        params=[Param(name=s.name, shape=s.shape, dtype=s.dtype, grad_op=grad_op[s.name]) for s in params],
        meta={"device": device.name, "backward": "synthesized", **(meta or {})},
        modules=ModuleTree.from_param_names(s.name for s in params),  # the names' prefixes; torch gives types
    )


def _check_forward(forward: Sequence[ForwardOp], specs: Mapping[str, ParamSpec], loss: str | None) -> str:
    """Raise :class:`InvalidGraphError` for a malformed forward DAG; return the loss op's id."""
    by_id = {f.id: f for f in forward}
    if len(by_id) != len(forward):
        raise InvalidGraphError("forward op ids are not unique")
    for spec in specs.values():
        if spec.dtype not in DTYPE_SIZES:
            raise InvalidGraphError(f"parameter {spec.name!r} has unknown dtype {spec.dtype!r}")
    position = {f.id: i for i, f in enumerate(forward)}
    for f in forward:
        for src in f.inputs:
            if src not in position or position[src] >= position[f.id]:
                raise InvalidGraphError(f"forward op {f.id!r} consumes {src!r}, which is not an earlier forward op")
        for p in f.reads:
            if p not in specs:
                raise InvalidGraphError(f"forward op {f.id!r} reads unknown parameter {p!r}")
    loss = loss if loss is not None else forward[-1].id
    if loss not in by_id:
        raise InvalidGraphError(f"loss op {loss!r} is not a forward op")
    return loss


def _readers_reaching_loss(forward: Sequence[ForwardOp], specs: Mapping[str, ParamSpec], dag: nx.DiGraph,
                           loss: str) -> tuple[set[str], dict[str, list[str]]]:
    """1. The ops that lead to the loss, and each parameter's readers among them (every parameter
    must have one)."""
    import networkx as nx
    live = nx.ancestors(dag, loss) | {loss}
    readers: dict[str, list[str]] = {p: [] for p in specs}
    for f in forward:
        if f.id in live:
            for p in dict.fromkeys(f.reads):
                readers[p].append(f.id)
    orphans = [p for p, rs in readers.items() if not rs]
    if orphans:
        raise InvalidGraphError(f"parameters that do not reach the loss: {', '.join(orphans[:5])}")
    return live, readers


def _add_backward(forward: Sequence[ForwardOp], specs: Mapping[str, ParamSpec], dag: nx.DiGraph, live: set[str],
                  readers: Mapping[str, list[str]], cost, ops: list[Op], edges: list[tuple[str, str]]) -> dict[str, str]:
    """2.-3. The reverse walk: input and weight gradients, and a tied parameter's partials summed once
    the earliest reader's part exists; appends to ``ops`` and ``edges``, returns each parameter's
    gradient op."""
    requires_grad: dict[str, bool] = {}
    for f in forward:
        requires_grad[f.id] = bool(f.reads) or any(requires_grad[s] for s in f.inputs)
    grad_op: dict[str, str] = {}
    grad_input: dict[str, str] = {}
    partials: dict[str, list[str]] = {p: [] for p in specs}
    for f in reversed(forward):
        if f.id not in live or not requires_grad[f.id]:
            continue
        upstream = [grad_input[c] for c in dag.successors(f.id) if c in grad_input]
        if any(requires_grad[s] for s in f.inputs):
            gi = f"{f.id}.grad_input"
            ops.append(Op(id=gi, kind=f"{f.kind}.backward_input", phase="backward",
                          reads=f.reads, **cost(_or(f.grad_input_flops, f.flops), f.bytes_moved)))
            edges += [(f.id, gi)] + [(u, gi) for u in upstream]
            grad_input[f.id] = gi
        if not f.reads:
            continue
        gw = f"{f.id}.grad_weight"
        finished = tuple(p for p in dict.fromkeys(f.reads) if len(readers[p]) == 1)
        ops.append(Op(id=gw, kind=f"{f.kind}.backward_weight", phase="backward", grads=finished,
                      **cost(_or(f.grad_weight_flops, f.flops), f.bytes_moved)))
        edges += [(f.id, gw)] + [(u, gw) for u in upstream]
        for p in dict.fromkeys(f.reads):
            partials[p].append(gw)
            if len(readers[p]) == 1:
                grad_op[p] = gw
            elif len(partials[p]) == len(readers[p]):  # 3. tied: sum the partials
                acc = f"{p}.accumulate_grad"
                nbytes, k = _nbytes(specs[p]), len(readers[p])
                ops.append(Op(id=acc, kind="accumulate_grad", phase="backward", grads=(p,),
                              **cost((k - 1) * nbytes / DTYPE_SIZES[specs[p].dtype], 3 * (k - 1) * nbytes)))
                edges += [(src, acc) for src in partials[p]]
                grad_op[p] = acc
    return grad_op


def optimizer_step(params: Sequence[ParamSpec], optimizer: str, device: DeviceSpec) -> Op:
    """Return one fused ``optimizer.step`` op that updates every parameter (costs: :data:`OPTIMIZER_COSTS`)."""
    if optimizer not in OPTIMIZER_COSTS:
        raise InvalidGraphError(f"unknown optimizer {optimizer!r}; valid: {', '.join(OPTIMIZER_COSTS)}")
    flops_per_elem, bytes_factor = OPTIMIZER_COSTS[optimizer]
    numel = sum(math.prod(s.shape) for s in params)
    flops, nbytes = flops_per_elem * numel, bytes_factor * sum(_nbytes(s) for s in params)
    return Op(id="optimizer.step", kind=f"optimizer.{optimizer}", phase="optimizer",
              reads=tuple(s.name for s in params), flops=flops, bytes_moved=nbytes,
              duration_s=device.op_time_s(flops=flops, nbytes=nbytes))


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _nbytes(spec: ParamSpec) -> int:
    return math.prod(spec.shape) * DTYPE_SIZES[spec.dtype]
