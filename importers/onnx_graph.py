"""ONNX front end: an ``.onnx`` file (forward graph) -> ``TrainGraph``.

Steps:

1. Load the model without its external tensor data (only shapes are needed),
   check that every external-data file exists, run the checker on the file,
   and infer shapes with data propagation.
2. Trainable parameters are the float initializers that feed a weight input
   (Conv/ConvTranspose/Gemm weight and bias, either MatMul operand,
   normalization scale and bias, the Gather table of an embedding, a
   non-scalar Add/Sub/Mul operand), possibly through Transpose, Reshape,
   Identity, Cast, Squeeze or Unsqueeze. ``trainable=`` overrides the rule.
   Running statistics, shape constants and scalars are not parameters.
3. Nodes that only compute shapes, indices or masks (no float output) are
   dropped; layout nodes (Reshape, Transpose, Squeeze, ...) are folded into
   their producer, as they are views in PyTorch.
4. FLOPs per node from the inferred shapes (``FLOP_RULES``), bytes moved from
   the tensor sizes; nodes without a rule cost their bytes, and one warning
   lists their op types.
5. The backward and optimizer are synthesized
   (:func:`schedopt.backward.training_graph`); the loss is the mean square
   of the graph outputs.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

from schedopt.backward import ForwardOp, ParamSpec, training_graph
from schedopt.cost import DeviceSpec
from schedopt.errors import GraphImportError, InvalidGraphError
from schedopt.graph import TrainGraph

__all__ = ["from_onnx", "FLOP_RULES"]

#: Ops whose output is a view of their first input in PyTorch.
_LAYOUT = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "SplitToSequence", "SequenceAt",
           "Split"}
#: Input positions that hold weights, per op type (None: any position).
_WEIGHT_INPUTS: dict[str, set[int] | None] = {
    "Conv": {1, 2}, "ConvTranspose": {1, 2}, "Gemm": {1, 2}, "MatMul": None,
    "BatchNormalization": {1, 2}, "LayerNormalization": {1, 2}, "InstanceNormalization": {1, 2},
    "GroupNormalization": {1, 2}, "RMSNormalization": {1}, "SimplifiedLayerNormalization": {1},
    "Gather": {0}, "Add": None, "Sub": None, "Mul": None, "PRelu": {1},
}
_PASS_THROUGH = {"Transpose", "Reshape", "Identity", "Cast", "CastLike", "Squeeze", "Unsqueeze"}
_FLOAT_TYPES = {1, 10, 11, 16}  # FLOAT, FLOAT16, DOUBLE, BFLOAT16
_ONNX_DTYPES = {1: "float32", 10: "float16", 11: "float64", 16: "bfloat16"}
_ELEMENTWISE = {
    "Add": 1, "Sub": 1, "Mul": 1, "Div": 1, "Relu": 1, "LeakyRelu": 2, "Sigmoid": 4, "Tanh": 4, "Erf": 4,
    "Gelu": 8, "Exp": 1, "Log": 1, "Sqrt": 1, "Pow": 1, "Neg": 1, "Abs": 1, "Clip": 1, "Where": 1, "Max": 1,
    "Min": 1, "Reciprocal": 1, "HardSigmoid": 3, "HardSwish": 4, "Softplus": 3, "Mish": 6, "Elu": 2, "Selu": 2,
    "Dropout": 2,
}
_DATA_MOVEMENT = {"Concat", "Slice", "Gather", "Pad", "Cast", "CastLike", "Expand", "Tile", "GatherElements",
                  "ScatterND", "ScatterElements", "Resize", "DepthToSpace", "SpaceToDepth", "ConstantOfShape"}


def _numel(shape: Iterable[int] | None) -> int:
    return math.prod(shape) if shape is not None else 0


def _conv(i, o, a) -> float:
    w, y = i[1], o[0]
    if w is None or y is None:
        return 0.0
    # 2 FLOPs per multiply-add: every output element sums (C_in/groups)·prod(kernel) products
    return 2.0 * _numel(y) * _numel(w[1:])


def _gemm(i, o, a) -> float:
    a_shape = i[0]
    if a_shape is None or o[0] is None:
        return 0.0
    k = a_shape[0] if a.get("transA", 0) else a_shape[1]
    return 2.0 * _numel(o[0]) * k


def _matmul(i, o, a) -> float:
    if i[0] is None or o[0] is None:
        return 0.0
    return 2.0 * _numel(o[0]) * i[0][-1]


def _pool(i, o, a) -> float:
    return float(_numel(o[0]) * _numel(a.get("kernel_shape", [1])))


def _attention(i, o, a) -> float:
    q, k = i[0], i[1]
    if q is None or k is None or len(q) != 4:
        return 0.0
    b, h, s_q, d = q
    return 4.0 * b * h * s_q * k[-2] * d


#: FLOPs of one node from (input shapes, output shapes, attributes).
FLOP_RULES: dict[str, Callable[[list, list, dict], float]] = {
    "Conv": _conv,
    "ConvTranspose": lambda i, o, a: 2.0 * _numel(i[0]) * _numel(i[1][1:]) if i[0] and i[1] else 0.0,
    "Gemm": _gemm,
    "MatMul": _matmul,
    "BatchNormalization": lambda i, o, a: 5.0 * _numel(i[0]),
    "LayerNormalization": lambda i, o, a: 8.0 * _numel(i[0]),
    "InstanceNormalization": lambda i, o, a: 5.0 * _numel(i[0]),
    "GroupNormalization": lambda i, o, a: 5.0 * _numel(i[0]),
    "Softmax": lambda i, o, a: 5.0 * _numel(i[0]),
    "LogSoftmax": lambda i, o, a: 5.0 * _numel(i[0]),
    "MaxPool": _pool,
    "AveragePool": _pool,
    "GlobalAveragePool": lambda i, o, a: float(_numel(i[0])),
    "GlobalMaxPool": lambda i, o, a: float(_numel(i[0])),
    "ReduceMean": lambda i, o, a: float(_numel(i[0])),
    "ReduceSum": lambda i, o, a: float(_numel(i[0])),
    "ReduceMax": lambda i, o, a: float(_numel(i[0])),
    "Attention": _attention,
    **{op: (lambda f: lambda i, o, a: f * float(_numel(o[0])))(f) for op, f in _ELEMENTWISE.items()},
    **{op: (lambda i, o, a: 0.0) for op in _DATA_MOVEMENT},
}


def from_onnx(
    path: str | os.PathLike[str],
    *,
    trainable: Iterable[str] | None = None,
    device: str | DeviceSpec = "a100",
    optimizer: Literal["sgd", "momentum", "adam"] | None = "sgd",
    name: str | None = None,
) -> TrainGraph:
    """Return the training graph of the forward model in an ONNX file.

    Args:
        path: the ``.onnx`` file (external data is looked up beside it).
        trainable: initializer names to train, replacing the weight-input rule.
        device: device preset name or :class:`DeviceSpec` for durations.
        optimizer: cost model of the optimizer step, or None.
        name: graph name (default: the file's stem).

    Raises:
        GraphImportError: the file is missing, corrupt or truncated, an
            external-data file is missing, the checker rejects the model, or a
            ``trainable`` name is not a float initializer.
    """
    path = Path(path)
    spec = device if isinstance(device, DeviceSpec) else DeviceSpec.preset(device)
    name = name or path.stem
    model = _load(path)
    _drop_weight_data(model)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    info = _tensor_info(model)
    consumers: dict[str, list[tuple[Any, int]]] = {}
    for node in graph.node:
        for pos, tensor in enumerate(node.input):
            consumers.setdefault(tensor, []).append((node, pos))

    chosen = _trainable(name, inits, consumers, trainable)  # 2
    ids: set[str] = set()
    forward, alias, unruled = _forward_ops(graph, info, chosen, ids)  # 3-4
    if unruled:
        warnings.warn(f"{name}: no FLOP rule for {', '.join(sorted(unruled))}; those ops cost their bytes only",
                      stacklevel=2)
    outputs = tuple(dict.fromkeys(alias[o.name][1] for o in graph.output
                                  if o.name in alias and alias[o.name][0] == "op"))
    if not outputs:
        raise GraphImportError(f"{name}: no graph output is computed from float data")
    out_elems = sum(_numel(info.get(o.name, (None, 0))[0]) for o in graph.output)
    forward.append(ForwardOp(id=_unique("loss", ids), kind="loss", inputs=outputs, flops=3.0 * out_elems,
                             bytes_moved=4.0 * out_elems))
    specs = [ParamSpec(name=n, shape=tuple(inits[n].dims), dtype=_ONNX_DTYPES[inits[n].data_type])
             for n in chosen]
    try:
        return training_graph(name, forward, specs, device=spec, optimizer=optimizer,
                              meta={"importer": "onnx", "source": str(path)})
    except InvalidGraphError as exc:
        raise GraphImportError(f"{name}: {exc}") from exc


def _trainable(name: str, inits: dict[str, Any], consumers: dict[str, list[tuple[Any, int]]],
               trainable: Iterable[str] | None) -> list[str]:
    """Step 2: the trainable parameters (``trainable``, or the float initializers that feed weight inputs)."""
    float_inits = [n for n, t in inits.items() if t.data_type in _FLOAT_TYPES]
    if trainable is not None:
        chosen = list(dict.fromkeys(trainable))
        bad = [n for n in chosen if n not in float_inits]
        if bad:
            raise GraphImportError(f"{name}: trainable names are not float initializers: {', '.join(bad[:5])}")
    else:
        chosen = [n for n in float_inits if _feeds_weight_input(n, consumers, inits)]

    return chosen


def _forward_ops(graph: Any, info: dict[str, Any], chosen: list[str], ids: set[str]
                 ) -> tuple[list[ForwardOp], dict[str, tuple[str, str]], set[str]]:
    """Steps 3-4: the forward ops with FLOPs and bytes, layout ops folded into their sources; the tensors'
    sources and the op types without a FLOP rule (``ids``: the op ids taken, added to)."""
    import onnx

    alias: dict[str, tuple[str, str]] = {n: ("param", n) for n in chosen}  # tensor -> ("param"|"op", id)
    forward: list[ForwardOp] = []
    unruled: set[str] = set()
    for index, node in enumerate(graph.node):
        if node.op_type in ("Constant", "Shape", "Size") or not _has_float_output(node, info):
            continue
        sources = [alias[t] for t in node.input if t in alias]
        data_sources = [s for s in sources if s[0] == "op"]
        if node.op_type in _LAYOUT or (node.op_type in _PASS_THROUGH and not data_sources and sources):
            first = alias.get(node.input[0]) if node.input else None
            for out in node.output:
                if first is not None:
                    alias[out] = first
            continue
        op_id = _unique(node.name or f"{node.op_type}_{index}", ids)
        in_shapes = [info.get(t, (None, 0))[0] for t in node.input]
        out_shapes = [info.get(t, (None, 0))[0] for t in node.output]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        rule = FLOP_RULES.get(node.op_type)
        if rule is None:
            unruled.add(node.op_type)
            flops = 0.0
        else:
            flops = float(rule(in_shapes, out_shapes, attrs))
        nbytes = sum(_nbytes(t, info) for t in (*node.input, *node.output) if t)
        reads = tuple(dict.fromkeys(ident for kind, ident in sources if kind == "param"))
        inputs = tuple(dict.fromkeys(ident for kind, ident in data_sources))
        forward.append(ForwardOp(
            id=op_id, kind=f"onnx.{node.op_type}", inputs=inputs, reads=reads, flops=flops, bytes_moved=nbytes,
            grad_input_flops=flops * max(1, len(inputs)) if not reads else flops,
        ))
        for out in node.output:
            alias[out] = ("op", op_id)
    return forward, alias, unruled


def _load(path: Path):
    import onnx
    from google.protobuf.message import DecodeError

    if not path.is_file():
        raise GraphImportError(f"ONNX file {str(path)!r} does not exist")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise GraphImportError(f"{str(path)!r} is not a valid ONNX model (corrupt or truncated): {exc}") from None
    if not model.graph.node:
        raise GraphImportError(f"{str(path)!r} holds no graph (empty or truncated ONNX file)")
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            _check_external_data(tensor, path)
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid model"
        raise GraphImportError(f"{str(path)!r} fails the ONNX checker: {first}") from None
    return model


def _check_external_data(tensor, path: Path) -> None:
    """The external-data file of ``tensor`` exists and holds all of its bytes (``offset + length``, or
    the tensor's size when no length is recorded): a truncated file is refused here, not read short."""
    import numpy as np
    import onnx

    entry = {e.key: e.value for e in tensor.external_data}
    location = entry.get("location")
    data = path.parent / location if location else None
    if data is None or not data.is_file():
        raise GraphImportError(f"external data file {location!r} for initializer {tensor.name!r} is missing "
                               f"(looked beside {str(path)!r})")
    itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    length = int(entry.get("length", int(np.prod(tensor.dims, dtype=np.int64)) * itemsize))
    needed, size = int(entry.get("offset", 0)) + length, data.stat().st_size
    if size < needed:
        raise GraphImportError(f"external data file {location!r} is truncated: initializer {tensor.name!r} needs "
                               f"bytes up to {needed}, the file has {size}")


def _drop_weight_data(model) -> None:
    """Free the values of large float initializers: only their shapes matter from here on.

    Shape inference copies the whole model, weights included; without this a
    500 MB model peaked at 3.5 GiB. Small and integer tensors (shape
    constants that data propagation reads) keep their values.
    """
    for tensor in model.graph.initializer:
        if tensor.data_type in _FLOAT_TYPES and math.prod(tensor.dims) > 1024:
            tensor.ClearField("raw_data")
            tensor.ClearField("float_data")
            tensor.ClearField("double_data")
            tensor.ClearField("int32_data")  # float16/bfloat16 values live here


def _tensor_info(model) -> dict[str, tuple[list[int] | None, int]]:
    """Return tensor name -> (static shape or None, ONNX element type) after shape inference."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - inference is best effort; the checker already passed
        warnings.warn(f"ONNX shape inference failed ({exc}); costs use the shapes stored in the file", stacklevel=3)
        inferred = model
    info: dict[str, tuple[list[int] | None, int]] = {}
    graph = inferred.graph
    for value in (*graph.input, *graph.value_info, *graph.output):
        t = value.type.tensor_type
        shape = None
        if t.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
            shape = None if any(d is None for d in dims) else dims
        info[value.name] = (shape, t.elem_type)
    for init in graph.initializer:
        info[init.name] = (list(init.dims), init.data_type)
    return info


def _has_float_output(node, info) -> bool:
    """True unless every output is known to be a non-float tensor (shapes, indices, masks)."""
    return any(info.get(out, (None, 0))[1] in (0, *_FLOAT_TYPES) for out in node.output)


_ITEM_SIZES = {1: 4, 10: 2, 11: 8, 16: 2, 6: 4, 7: 8, 9: 1, 2: 1, 3: 1, 5: 2, 4: 2, 12: 4, 13: 8}


def _nbytes(tensor: str, info) -> float:
    shape, dtype = info.get(tensor, (None, 0))
    return 0.0 if shape is None else float(_numel(shape) * _ITEM_SIZES.get(dtype, 4))


def _feeds_weight_input(name: str, consumers, inits) -> bool:
    """True when the initializer reaches a weight input, possibly through layout/cast nodes."""
    init = inits[name]
    frontier = [name]
    seen = set()
    while frontier:
        tensor = frontier.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for node, pos in consumers.get(tensor, ()):
            if node.op_type in _PASS_THROUGH and pos == 0:
                frontier.extend(node.output)
                continue
            positions = _WEIGHT_INPUTS.get(node.op_type, set())
            if node.op_type in ("Add", "Sub", "Mul") and _numel(init.dims) <= 1:
                continue
            if positions is None or pos in positions:
                return True
    return False


def _unique(base: str, taken: set[str]) -> str:
    candidate, k = base, 1
    while candidate in taken:
        k += 1
        candidate = f"{base}_{k}"
    taken.add(candidate)
    return candidate
