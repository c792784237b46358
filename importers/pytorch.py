"""PyTorch front end: a module and example inputs -> ``TrainGraph``.

Two levels:

- ``aten`` (default): trace one whole training step — forward, loss and
  ``torch.autograd.grad`` — with ``make_fx`` under fake tensors, so the graph
  holds the aten ops the autograd engine really runs, in the order it runs
  them, and no activation memory is allocated. Views and ``getitem`` are
  folded into the op that produced their data (they launch no kernel).
  ``convolution_backward`` is split into its input-gradient and
  weight-gradient parts (``<node>.grad_input`` / ``<node>.grad_weight``), as
  ``mm`` already is for linear layers, so a scheduler can move weight
  gradients independently. The op after which a parameter's gradient exists
  is read off the traced gradient outputs (for tied weights: the ``add``
  that sums the partial gradients).
- ``module``: ``torch.fx.symbolic_trace`` of the forward pass, one op per
  module or function call; the backward is synthesized by
  :func:`schedopt.backward.training_graph`. Fast and coarse.

FLOPs come from ``torch.utils.flop_counter`` (its formula registry on the
traced shapes at aten level, ``FlopCounterMode`` per node at module level);
bytes moved are the sizes of the tensors an op reads and writes; durations
are the device roofline.
"""

from __future__ import annotations

import contextlib
import logging
import operator
from dataclasses import replace
from typing import Any, Callable, Iterator, Literal

from schedopt.backward import ForwardOp, ParamSpec, optimizer_step, training_graph
from schedopt.cost import DeviceSpec
from schedopt.errors import GraphImportError, InvalidGraphError, no_trainable_parameters
from schedopt.graph import Op, Param, TrainGraph
from schedopt.modules import ModuleTree, owner_of

__all__ = ["from_torch", "trace_train_step", "AtenGraphBuilder", "trainable_parameters", "torch_dtype_name",
           "record_grad_order"]

Level = Literal["aten", "module"]


def torch_dtype_name(dtype: Any) -> str:
    """``torch.float32`` -> ``float32``, the dtype names graphs and plans use."""
    return str(dtype).removeprefix("torch.")


def module_tree(model: Any) -> ModuleTree:
    """The module tree of ``model``: every module's class name, its children in registration order, and
    the owning module of each trainable parameter (what ``fully_shard`` units are made of)."""
    types, children = {}, {}
    for path, module in model.named_modules(remove_duplicate=False):
        types.setdefault(path, type(module).__name__)
        children.setdefault(path, tuple(name for name, _ in module.named_children()))
    return ModuleTree(types=types, children=children,
                      owners={name: owner_of(name) for name in trainable_parameters(model)})


def trainable_parameters(model: Any) -> dict[str, Any]:
    """Return ``named_parameters()`` that require grad; tied parameters appear once, under their first name."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def from_torch(
    model: Any,
    example_inputs: Any,
    *,
    loss_fn: Callable[..., Any] | None = None,
    level: Level = "aten",
    device: str | DeviceSpec = "a100",
    optimizer: Literal["sgd", "momentum", "adam"] | None = "sgd",
    name: str | None = None,
) -> TrainGraph:
    """Return the training graph of one step of ``model`` on ``example_inputs``.

    Args:
        model: an ``nn.Module``; it is put in training mode.
        example_inputs: a tensor or a tuple of positional inputs.
        loss_fn: ``loss_fn(output, *example_inputs)`` -> scalar; default: mean
            of the squared output.
        level: ``aten`` (exact training step) or ``module`` (forward trace,
            synthesized backward).
        device: device preset name or :class:`DeviceSpec` for op durations.
        optimizer: cost model of the optimizer step, or None for none.
        name: model name in the graph (default: the class name).

    Raises:
        GraphImportError: the model cannot be traced at this level, or a
            trainable parameter gets no gradient.
    """
    import torch

    from .factory import default_loss

    spec = device if isinstance(device, DeviceSpec) else DeviceSpec.preset(device)
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    loss_fn = loss_fn or default_loss
    name = name or type(model).__name__
    if not isinstance(model, torch.nn.Module):
        raise GraphImportError(f"from_torch needs an nn.Module, got {type(model).__name__}")
    if not trainable_parameters(model):
        raise GraphImportError(no_trainable_parameters(name))
    model.train()
    if level not in ("aten", "module"):
        raise GraphImportError(f"unknown import level {level!r}; valid: aten, module")
    with _quiet_torch_logs():  # a failed trace is reported as one GraphImportError, not torch's logged traceback
        if level == "aten":
            graph = _aten_graph(model, inputs, loss_fn, spec, optimizer, name)
        else:
            graph = _module_graph(model, inputs, loss_fn, spec, optimizer, name)
        graph = graph.with_grad_order(record_grad_order(model, inputs, loss_fn, name=name))
        return graph.with_modules(module_tree(model))


@contextlib.contextmanager
def _quiet_torch_logs() -> Iterator[None]:
    """Silence the loggers through which torch prints tracebacks of errors schedopt reports itself."""
    loggers = [logging.getLogger(name) for name in ("torch._subclasses", "torch.fx", "torch._dynamo")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def record_grad_order(model: Any, example_inputs: tuple, loss_fn: Callable[..., Any], *, name: str) -> list[str]:
    """Return the trainable parameters in the order the real ``backward()`` fires their gradient hooks.

    Steps:
        1. Stand in a fake tensor for every parameter, buffer and input (no
           memory is allocated, buffers are not updated).
        2. Register a post-accumulate-grad hook on each fake parameter (what
           the runtime and DDP's reducer hook), run forward, the loss and
           ``loss.backward()`` through the real autograd engine.
        3. The hooks' firing order is the gradient-ready order of eager
           training; the engine's order depends on the graph, not on values.

    Raises:
        GraphImportError: the step cannot run, or a parameter got no gradient.
    """
    import torch
    from torch.func import functional_call

    params = trainable_parameters(model)
    fired: list[str] = []
    fake_mode = _fake_mode()
    try:
        with fake_mode:
            fake_params = {n: fake_mode.from_tensor(p.detach()).requires_grad_(True) for n, p in params.items()}
            for n, p in fake_params.items():
                p.register_post_accumulate_grad_hook(lambda _p, n=n: fired.append(n))
            fake_buffers = {n: fake_mode.from_tensor(b) for n, b in model.named_buffers()}
            fake_inputs = tuple(fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) else x
                                for x in example_inputs)
            output = functional_call(model, {**fake_params, **fake_buffers}, fake_inputs)
            loss_fn(output, *fake_inputs).backward()
    except Exception as exc:  # noqa: BLE001 - any failure of user code becomes one clear error
        raise GraphImportError(f"cannot run the backward of {name} under fake tensors ({_first_line(exc)})") from exc
    unused = [n for n in params if n not in fired]
    if unused:
        raise GraphImportError(f"{name}: parameters get no gradient: {', '.join(unused[:5])}")
    return fired


# ------------------------------------------------------------------ aten level


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(value))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def trace_train_step(model, inputs, loss_fn, *, name: str, fake: bool = True):
    """Trace forward, loss and ``autograd.grad`` into one aten-level ``GraphModule``.

    Returns ``(graph_module, params, buffers)``; the module's placeholders are
    the parameters, then the buffers, then the inputs. With ``fake`` no
    tensor memory is used; without it the step really runs (for profiling).
    """
    import torch
    from torch.func import functional_call
    from torch.fx.experimental.proxy_tensor import make_fx

    params = trainable_parameters(model)
    if not params:
        raise GraphImportError(no_trainable_parameters(name))
    buffers = dict(model.named_buffers())

    def train_step(params, buffers, inputs):
        output = functional_call(model, {**params, **buffers}, inputs)
        loss = loss_fn(output, *inputs)
        return loss, torch.autograd.grad(loss, list(params.values()), allow_unused=True)

    try:
        if fake:
            traced = make_fx(train_step, tracing_mode="fake", _allow_non_fake_inputs=True)(params, buffers, inputs)
        else:
            traced = make_fx(train_step, tracing_mode="real")(params, buffers, inputs)
    except Exception as exc:  # noqa: BLE001 - any tracing failure becomes one clear error
        raise GraphImportError(
            f"cannot trace {name} at aten level ({_first_line(exc)}); try level='module'"
        ) from exc
    return traced, params, buffers


def _aten_graph(model, inputs, loss_fn, device: DeviceSpec, optimizer, name: str) -> TrainGraph:
    traced, params, _ = trace_train_step(model, inputs, loss_fn, name=name)
    return AtenGraphBuilder(traced.graph, params, device, name).build(optimizer)


class AtenGraphBuilder:
    """Turn a traced training step into ops, folding views into their producers.

    ``node_ops`` maps each fx node that became op(s) to ``[(op id, share)]``:
    a profiler spreads the node's measured time over its ops by those shares.
    """

    def __init__(self, fx_graph, params: dict[str, Any], device: DeviceSpec, name: str):
        import torch
        from torch.utils.flop_counter import flop_registry

        aten = torch.ops.aten
        self.conv_backward = aten.convolution_backward
        self.aliases = {aten.detach, aten._unsafe_view, aten.alias, aten.lift_fresh}
        self.graph = fx_graph
        self.param_names = list(params)
        self.node_ops: dict[str, list[tuple[str, float]]] = {}
        self.params = params
        self.device = device
        self.name = name
        self.flop_registry = flop_registry
        self.source: dict[Any, tuple[str, str]] = {}  # fx node -> ("param", name) | ("op", id) | ("const", "")
        self.ops: list[Op] = []
        self.edges: list[tuple[str, str]] = []

    # A node's data comes from: a parameter, a constant/input, or an op.
    def _resolve(self, node, index: int | None = None) -> tuple[str, str]:
        kind, ident = self.source[node]
        if kind == "multi":  # a split op: pick the part that produced output `index`
            return ("op", f"{ident}.grad_input") if index == 0 else ("op", f"{ident}.grad_weight")
        return kind, ident

    def _input_sources(self, node) -> list[tuple[str, str]]:
        return [self.source[n] if self.source[n][0] != "multi" else ("op", self.source[n][1] + ".grad_weight")
                for n in node.all_input_nodes]

    def build(self, optimizer) -> TrainGraph:
        nodes = list(self.graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        for node, pname in zip(placeholders, self.param_names):
            if tuple(node.meta["val"].shape) != tuple(self.params[pname].shape):
                raise AssertionError(f"placeholder {node.name} does not line up with parameter {pname}")
            self.source[node] = ("param", pname)
        output = next(n for n in nodes if n.op == "output")
        loss_node, *grad_nodes = output.args[0]  # the step returns (loss, *grads), flattened
        loss_index = nodes.index(loss_node)

        for position, node in enumerate(nodes):
            if node in self.source or node.op == "output":
                continue
            if node.op in ("placeholder", "get_attr"):
                self.source[node] = ("const", "")
                continue
            phase = "forward" if position <= loss_index else "backward"
            self._add(node, phase)

        loss_kind, loss_op = self.source[loss_node] if self.source[loss_node][0] != "multi" else ("op", "")
        if loss_kind != "op":
            raise GraphImportError(f"{self.name}: the loss is not computed by any op")

        grads = self._gradient_ops(grad_nodes)
        finished: dict[str, list[str]] = {}
        for pname, op_id in grads.items():
            finished.setdefault(op_id, []).append(pname)
        ops = [replace(o, grads=tuple(finished.get(o.id, ()))) for o in self.ops]
        specs = [ParamSpec(name=n, shape=tuple(p.shape), dtype=torch_dtype_name(p.dtype))
                 for n, p in self.params.items()]
        edges = list(dict.fromkeys(self.edges))
        if optimizer is not None:
            step = optimizer_step(specs, optimizer, self.device)
            ops.append(step)
            edges += [(g, step.id) for g in dict.fromkeys(grads.values())]
        flops = sum(o.flops for o in ops if o.phase != "optimizer")
        try:
            return TrainGraph(
                name=self.name,
                ops=ops,
                edges=edges,
                params=[Param(name=s.name, shape=s.shape, dtype=s.dtype, grad_op=grads[s.name]) for s in specs],
                meta={"importer": "torch.aten", "device": self.device.name, "step_flops": flops,
                      "loss_op": loss_op},
            )
        except InvalidGraphError as exc:
            raise GraphImportError(f"{self.name}: traced graph is not a valid training graph: {exc}") from exc

    def _gradient_ops(self, grad_nodes: list[Any]) -> dict[str, str]:
        """Each parameter's gradient op id, from the step's gradient outputs; an unused parameter is an error."""
        grads: dict[str, str] = {}
        unused = []
        for pname, grad in zip(self.param_names, grad_nodes):
            if grad is None:
                unused.append(pname)
                continue
            index = grad.args[1] if grad.target is operator.getitem else None
            src = grad.args[0] if grad.target is operator.getitem else grad
            kind, ident = self._resolve(src, index) if src in self.source else ("const", "")
            if kind != "op":
                raise GraphImportError(f"{self.name}: the gradient of {pname} is not computed by an op")
            grads[pname] = ident
        if unused:
            raise GraphImportError(
                f"{self.name}: parameters unused by the loss get no gradient: {', '.join(unused[:5])}"
                + (f" and {len(unused) - 5} more" if len(unused) > 5 else "")
                + " (freeze them with requires_grad_(False))"
            )
        return grads

    def _add(self, node, phase: str) -> None:
        target = node.target
        packet = getattr(target, "overloadpacket", None)
        tensor_inputs = [n for n in node.all_input_nodes]
        # getitem and views alias the data of their (first) input: no kernel, no op.
        if target is operator.getitem:
            src = node.args[0]
            self.source[node] = self._resolve(src, node.args[1])
            return
        if getattr(target, "is_view", False) or packet in self.aliases:
            first = tensor_inputs[0] if tensor_inputs else None
            self.source[node] = self.source[first] if first is not None else ("const", "")
            if self.source[node][0] == "multi":
                self.source[node] = ("op", self.source[first][1] + ".grad_weight")
            return
        sources = self._input_sources(node)
        reads = tuple(dict.fromkeys(ident for kind, ident in sources if kind == "param"))
        producers = list(dict.fromkeys(ident for kind, ident in sources if kind == "op"))
        kind = str(packet) if packet is not None else str(target)
        args_val, kwargs_val = _meta_args(node)
        out_val = node.meta.get("val")
        if packet is self.conv_backward:
            self._add_conv_backward(node, kind, phase, args_val, kwargs_val, out_val, reads, producers)
            return
        flops = self._flops(packet, args_val, kwargs_val, out_val)
        nbytes = _nbytes(args_val) + _nbytes(kwargs_val) + _nbytes(out_val)
        self._op(node.name, kind, phase, flops, nbytes, reads, producers)
        self.node_ops[node.name] = [(node.name, 1.0)]
        self.source[node] = ("op", node.name)

    def _add_conv_backward(self, node, kind, phase, args, kwargs, out, reads, producers) -> None:
        grad_out, x, weight = args[0], args[1], args[2]
        mask = list(args[10])
        parts = []
        if mask[0]:
            flops = self._flops(self.conv_backward, (*args[:10], [True, False, False]), kwargs, out)
            nbytes = _nbytes(grad_out) + _nbytes(weight) + _nbytes(out[0])
            parts.append((f"{node.name}.grad_input", flops, nbytes, reads))
        if mask[1] or mask[2]:
            flops = self._flops(self.conv_backward, (*args[:10], [False, mask[1], mask[2]]), kwargs, out)
            nbytes = _nbytes(grad_out) + _nbytes(x) + _nbytes(out[1]) + _nbytes(out[2])
            parts.append((f"{node.name}.grad_weight", flops, nbytes, ()))
        total = sum(flops for _, flops, _, _ in parts) or 1.0
        for op_id, flops, nbytes, part_reads in parts:
            self._op(op_id, f"{kind}.{op_id.rsplit('.', 1)[1]}", phase, flops, nbytes, part_reads, producers)
        self.node_ops[node.name] = [(op_id, flops / total) for op_id, flops, _, _ in parts]
        self.source[node] = ("multi", node.name)

    def _flops(self, packet, args, kwargs, out) -> float:
        formula = self.flop_registry.get(packet)
        if formula is None:
            return 0.0
        return float(formula(*args, out_val=out, **kwargs))

    def _op(self, op_id, kind, phase, flops, nbytes, reads, producers) -> None:
        self.ops.append(Op(id=op_id, kind=kind, phase=phase, flops=flops, bytes_moved=float(nbytes),
                           duration_s=self.device.op_time_s(flops=flops, nbytes=nbytes), reads=reads))
        self.edges += [(p, op_id) for p in producers if p != op_id]


def _meta_args(node) -> tuple[tuple, dict]:
    from torch.fx.node import map_arg

    def value(n):
        return n.meta.get("val")

    return map_arg(node.args, value), map_arg(node.kwargs, value)


# ------------------------------------------------------------------ module level


_VIEW_METHODS = {
    "view", "reshape", "transpose", "permute", "unsqueeze", "squeeze", "flatten", "expand", "expand_as",
    "split", "chunk", "unbind", "t", "view_as", "narrow", "select", "contiguous", "size", "dim",
}


def _module_graph(model, inputs, loss_fn, device: DeviceSpec, optimizer, name: str) -> TrainGraph:
    from torch.fx import symbolic_trace

    try:
        gm = symbolic_trace(model)
    except Exception as exc:  # noqa: BLE001 - any tracing failure becomes one clear error
        raise GraphImportError(f"cannot trace {name} with torch.fx ({_first_line(exc)})") from exc
    params = trainable_parameters(model)
    canonical = {id(p): n for n, p in params.items()}
    flops, values, output, loss_flops = _probe_module(gm, inputs, loss_fn, name)
    forward, source = _module_forward_ops(gm, canonical, flops, values)
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    loss_inputs = tuple(dict.fromkeys(source[n.name][1] for n in out_node.all_input_nodes
                                      if source[n.name][0] == "op"))
    forward.append(ForwardOp(id="loss", kind="loss", inputs=loss_inputs, flops=loss_flops,
                             bytes_moved=float(_nbytes(output))))
    specs = [ParamSpec(name=n, shape=tuple(p.shape), dtype=torch_dtype_name(p.dtype)) for n, p in params.items()]
    try:
        return training_graph(name, forward, specs, device=device, optimizer=optimizer,
                              meta={"importer": "torch.module"})
    except InvalidGraphError as exc:
        raise GraphImportError(f"{name}: {exc}") from exc


def _probe_module(gm, inputs, loss_fn, name: str) -> tuple[dict[str, float], dict[str, Any], Any, float]:
    """Run ``gm`` and the loss under fake tensors: each node's FLOPs and value, the output, the loss's FLOPs."""
    import torch
    from torch.fx import Interpreter
    from torch.utils.flop_counter import FlopCounterMode

    flops: dict[str, float] = {}
    values: dict[str, Any] = {}

    class Probe(Interpreter):
        def run_node(self, n):
            before = counter.get_total_flops()
            out = super().run_node(n)
            flops[n.name] = float(counter.get_total_flops() - before)
            values[n.name] = out
            return out

    fake_mode = _fake_mode()
    try:
        with fake_mode:
            fake_inputs = tuple(fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in inputs)
        with fake_mode, FlopCounterMode(display=False) as counter:
            output = Probe(gm).run(*fake_inputs)
            before = counter.get_total_flops()
            loss_fn(output, *fake_inputs)
            loss_flops = float(counter.get_total_flops() - before)
    except Exception as exc:  # noqa: BLE001
        raise GraphImportError(f"cannot run {name} on its example inputs ({_first_line(exc)})") from exc
    return flops, values, output, loss_flops


def _module_forward_ops(gm, canonical: dict[int, str], flops: dict[str, float],
                        values: dict[str, Any]) -> tuple[list[ForwardOp], dict[str, tuple[str, Any]]]:
    """The forward ops of a module-level trace, views and constants folded into their sources."""
    view_functions = _view_functions()
    source: dict[str, tuple[str, Any]] = {}  # node name -> ("param", names) | ("op", id) | ("const", None)
    forward: list[ForwardOp] = []
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            if node.op == "placeholder":
                source[node.name] = ("const", None)
            continue
        if node.op == "get_attr":
            pname = canonical.get(id(_get_attr(gm, node.target)))
            source[node.name] = ("param", (pname,)) if pname else ("const", None)
            continue
        out = values.get(node.name)
        ins = [source[n.name] for n in node.all_input_nodes]
        if ((node.op == "call_method" and node.target in _VIEW_METHODS)
                or (node.op == "call_function" and node.target in view_functions) or not _tensors(out)):
            source[node.name] = next((s for s in ins if s[0] != "const"), ("const", None))  # an alias
            continue
        reads = [p for kind, names in ins if kind == "param" for p in names]
        if node.op == "call_module":
            module = gm.get_submodule(node.target)
            reads += [canonical[id(p)] for p in module.parameters() if id(p) in canonical]
            kind = f"nn.{type(module).__name__}"
        else:
            kind = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
        producers = tuple(dict.fromkeys(ident for k, ident in ins if k == "op"))
        in_bytes = sum(_nbytes(values.get(n.name)) for n in node.all_input_nodes)
        f = flops[node.name]
        forward.append(ForwardOp(
            id=node.name, kind=str(kind), inputs=producers, reads=tuple(dict.fromkeys(reads)),
            flops=f, bytes_moved=float(in_bytes + _nbytes(out)),
            # d(out)/d(each activation input) costs one forward's worth for matmul-like ops
            grad_input_flops=f * max(1, len(producers)) if not reads else f,
        ))
        source[node.name] = ("op", node.name)
    return forward, source

def _fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def _get_attr(gm, target: str) -> Any:
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _view_functions() -> set:
    """Functions whose result is a view of (or metadata about) their input: no kernel of their own."""
    import torch

    return {operator.getitem, getattr, torch.flatten, torch.reshape, torch.transpose, torch.permute, torch.split,
            torch.chunk, torch.unsqueeze, torch.squeeze, torch.t, torch.unbind, torch.narrow}
