"""The training graph: one training iteration as a DAG of ops, plus its parameters.

A :class:`TrainGraph` holds

- ``ops``: op id -> :class:`Op`, in source order (a topological order),
- ``params``: parameter name -> :class:`Param`, in ``named_parameters()`` order,
- ``dag``: the networkx ``DiGraph`` of data dependencies between op ids.

Example:
    >>> g = TrainGraph(
    ...     name="one-layer",
    ...     ops=[Op(id="fc", kind="linear", phase="forward", duration_s=1e-3, reads=("w",)),
    ...          Op(id="fc.grad_weight", kind="linear.backward_weight", phase="backward",
    ...             duration_s=1e-3, grads=("w",))],
    ...     edges=[("fc", "fc.grad_weight")],
    ...     params=[Param(name="w", shape=(4, 4), grad_op="fc.grad_weight")],
    ... )
    >>> g.params["w"].nbytes
    64
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Iterable, Literal, Mapping, Sequence

if TYPE_CHECKING:  # networkx is imported where used: a process that only trains (a rank) never loads it
    import networkx as nx

from .errors import GraphImportError, InvalidGraphError
from .fields import Fields
from .io import read_json, write_json_atomic
from .modules import ModuleTree

__all__ = [
    "Op",
    "Param",
    "TrainGraph",
    "PHASES",
    "DTYPE_SIZES",
    "GRAPH_SCHEMA",
    "params_fingerprint",
    "validate",
]

GRAPH_SCHEMA = "schedopt.graph/1"
#: The longest step a graph may describe: a day. Beyond it a duration is a unit error, and sums of
#: many such durations would overflow the simulator's arithmetic.
MAX_STEP_S = 86_400.0

Phase = Literal["forward", "backward", "optimizer"]
PHASES: tuple[str, ...] = ("forward", "backward", "optimizer")
_PHASE_RANK = {phase: rank for rank, phase in enumerate(PHASES)}

#: Bytes per element, keyed by the dtype name torch prints without ``torch.``.
DTYPE_SIZES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "complex64": 8,
    "complex128": 16,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    """One op of the training iteration.

    ``reads`` names the parameters the op reads; ``grads`` the parameters whose
    full gradient exists once the op ends.
    """

    id: str
    kind: str
    phase: Phase
    flops: float = 0.0
    bytes_moved: float = 0.0
    duration_s: float = 0.0
    reads: tuple[str, ...] = ()
    grads: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "reads", tuple(self.reads))
        object.__setattr__(self, "grads", tuple(self.grads))

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind,
            "phase": self.phase,
            "flops": self.flops,
            "bytes_moved": self.bytes_moved,
            "duration_s": self.duration_s,
        }
        if self.reads:
            data["reads"] = list(self.reads)
        if self.grads:
            data["grads"] = list(self.grads)
        return data


@dataclass(frozen=True, slots=True, kw_only=True)
class Param:
    """One trainable parameter; ``grad_op`` is the op after which its full gradient exists."""

    name: str
    shape: tuple[int, ...]
    grad_op: str
    dtype: str = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return DTYPE_SIZES[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "nbytes": self.nbytes,
            "grad_op": self.grad_op,
        }


def _sha256(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def params_fingerprint(entries: Iterable[tuple[str, Sequence[int], str]]) -> str:
    """Hash ``(name, shape, dtype)`` triples in order; the runtime computes it from a live model.

    Example:
        >>> params_fingerprint([("w", (4, 4), "float32")]).startswith("sha256:")
        True
    """
    return _sha256([[name, [int(d) for d in shape], str(dtype)] for name, shape, dtype in entries])


@dataclass(frozen=True, slots=True, kw_only=True)
class _Totals:
    forward_s: float = 0.0
    backward_s: float = 0.0
    optimizer_s: float = 0.0


class FrozenDict(dict):
    """A dict that refuses every change after construction (it still pickles and serializes as one)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a TrainGraph is immutable: build a new one (for example with with_durations)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse

    def __reduce__(self):
        return (FrozenDict, (dict(self),))


class TrainGraph:
    """One training iteration: ops, their dependencies and the trainable parameters.

    Args:
        name: model name, shown in plans and reports.
        ops: the ops in source order (the order the framework would run them).
        edges: ``(before, after)`` data dependencies between op ids.
        params: the trainable parameters in ``named_parameters()`` order.
        meta: free-form provenance (importer, device, batch size, ...).
        grad_order: the parameter names in the order the real autograd engine
            fires their post-accumulate-grad hooks, when the importer recorded
            it (torch models); :func:`schedopt.orders.engine_order` then
            reproduces it exactly. None where it is unknown (ONNX, synthetic).
        modules: the module tree and each parameter's owning module
            (:class:`schedopt.modules.ModuleTree`), which sharded plans are
            made of; None in graphs written before it was recorded.
        check: run :func:`validate` (default). Turn off only in code that
            validates itself later.

    Raises:
        InvalidGraphError: an invariant does not hold (see :func:`validate`).
    """

    def __init__(
        self,
        *,
        name: str,
        ops: Iterable[Op],
        edges: Iterable[tuple[str, str]],
        params: Iterable[Param],
        meta: Mapping[str, Any] | None = None,
        grad_order: Sequence[str] | None = None,
        modules: ModuleTree | None = None,
        check: bool = True,
    ) -> None:
        import networkx as nx
        self.name = name
        self.meta: dict[str, Any] = dict(meta or {})
        self.grad_order: tuple[str, ...] | None = None if grad_order is None else tuple(grad_order)
        self.ops: dict[str, Op] = {}
        for op in ops:
            if op.id in self.ops:
                raise InvalidGraphError(f"duplicate op id {op.id!r}")
            self.ops[op.id] = op
        self.params: dict[str, Param] = {}
        for param in params:
            if param.name in self.params:
                raise InvalidGraphError(f"duplicate parameter {param.name!r}")
            self.params[param.name] = param
        self.dag = nx.DiGraph()
        self.dag.add_nodes_from(self.ops)
        for before, after in edges:
            for end in (before, after):
                if end not in self.ops:
                    raise InvalidGraphError(f"edge ({before!r}, {after!r}) names unknown op {end!r}")
            self.dag.add_edge(before, after)
        if self.grad_order is not None and (
            len(self.grad_order) != len(self.params) or set(self.grad_order) != set(self.params)
        ):
            extra = sorted(set(self.grad_order) - set(self.params))[:3]
            lacking = sorted(set(self.params) - set(self.grad_order))[:3]
            raise InvalidGraphError(
                f"grad_order must list every trainable parameter once ({len(self.grad_order)} names for "
                f"{len(self.params)} parameters; unknown: {extra or 'none'}, missing: {lacking or 'none'})"
            )
        if modules is not None and set(modules.owners) - set(self.params):  # frozen or removed parameters
            modules = replace(modules, owners={p: m for p, m in modules.owners.items() if p in self.params})
        self.modules = modules
        # frozen: the cached fingerprints and totals below stay true
        self.ops, self.params, self.meta = FrozenDict(self.ops), FrozenDict(self.params), FrozenDict(self.meta)
        self.dag = nx.freeze(self.dag)
        self._frozen = True
        if check:
            validate(self)

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_frozen", False):
            raise AttributeError(f"a TrainGraph is immutable; cannot set {name!r}")
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return f"TrainGraph({self.name!r}, {len(self.ops)} ops, {len(self.params)} params)"

    # ----------------------------------------------------------------- queries

    @cached_property
    def index(self) -> dict[str, int]:
        """Op id -> position in source order."""
        return {op_id: i for i, op_id in enumerate(self.ops)}

    @cached_property
    def totals(self) -> _Totals:
        """Summed op durations per phase."""
        sums = {"forward_s": 0.0, "backward_s": 0.0, "optimizer_s": 0.0}
        for op in self.ops.values():
            sums[f"{op.phase}_s"] += op.duration_s
        return _Totals(**sums)

    @cached_property
    def grad_ops(self) -> frozenset[str]:
        """The ids of the ops that finish at least one gradient."""
        return frozenset(p.grad_op for p in self.params.values())

    @cached_property
    def gradient_ancestor_s(self) -> tuple[float, float]:
        """(min over grad ops g of the summed durations of g and its ancestors, same over their union).

        On one stream every ancestor of a gradient runs before it; the lower
        bound of :mod:`schedopt.simulate` uses both sums. The union is one
        reverse search; the minimum visits grad ops in source order and drops
        a search once its sum reaches the best so far.
        """
        duration = {op_id: op.duration_s for op_id, op in self.ops.items()}
        union = set(self.grad_ops)
        stack = list(self.grad_ops)
        while stack:
            for u in self.dag.predecessors(stack.pop()):
                if u not in union:
                    union.add(u)
                    stack.append(u)
        best = float("inf")
        for g in sorted(self.grad_ops, key=self.index.__getitem__):
            seen, stack, total = {g}, [g], duration[g]
            while stack and total < best:
                for u in self.dag.predecessors(stack.pop()):
                    if u not in seen:
                        seen.add(u)
                        stack.append(u)
                        total += duration[u]
            if not stack:
                best = min(best, total)
        return best, sum(duration[o] for o in union)

    @cached_property
    def gradient_spans(self) -> dict[str, float]:
        """Per parameter read in the forward, the summed durations of the ops that every op order runs
        from its first forward reader (in source order) to the op that finishes its gradient: both, and
        every op on a path between them. :mod:`schedopt.simulate`'s overlap bound closes a cycle through
        each."""
        import networkx as nx

        reader: dict[str, str] = {}
        for op_id, op in self.ops.items():
            if op.phase == "forward":
                for name in op.reads:
                    reader.setdefault(name, op_id)
        after = {r: nx.descendants(self.dag, r) for r in set(reader.values())}
        before = {g: nx.ancestors(self.dag, g) for g in {self.params[n].grad_op for n in reader}}
        spans = {}
        for name, r in reader.items():
            g = self.params[name].grad_op
            if g in after[r]:
                spans[name] = sum(self.ops[o].duration_s for o in (after[r] & before[g]) | {r, g})
        return spans

    @cached_property
    def gradient_tails(self) -> dict[str, tuple[float, int]]:
        """Per op that finishes a gradient: (the summed durations of it and its ancestors, which every op
        order runs before it; the bytes of every gradient it or one of its descendants finishes, which
        every order finishes after it). :mod:`schedopt.simulate`'s barrier bound closes a cycle through
        each."""
        import networkx as nx

        finished: dict[str, int] = {}
        for p in self.params.values():
            finished[p.grad_op] = finished.get(p.grad_op, 0) + p.nbytes
        tails = {}
        for g in finished:
            before, after = nx.ancestors(self.dag, g), nx.descendants(self.dag, g)
            tails[g] = (sum(self.ops[o].duration_s for o in before | {g}),
                        sum(n for o, n in finished.items() if o == g or o in after))
        return tails

    def ops_in(self, phase: Phase) -> list[str]:
        """Return the ids of the ops of one phase, in source order."""
        return [op_id for op_id, op in self.ops.items() if op.phase == phase]

    @property
    def total_param_bytes(self) -> int:
        return sum(p.nbytes for p in self.params.values())

    # -------------------------------------------------------------- identity

    @cached_property
    def fingerprint(self) -> str:
        """Hash of the parameters (names, shapes, dtypes) and the op structure.

        Durations, FLOPs and bytes are left out, so profiling a graph keeps
        its plans valid; op ids, kinds, phases, reads, grads and edges are in.
        """
        return _sha256(
            {
                "params": [[p.name, list(p.shape), p.dtype, p.grad_op] for p in self.params.values()],
                "ops": sorted(
                    [op.id, op.kind, op.phase, sorted(op.reads), sorted(op.grads)]
                    for op in self.ops.values()
                ),
                "edges": sorted([u, v] for u, v in self.dag.edges),
            }
        )

    @cached_property
    def params_fingerprint(self) -> str:
        """Hash of parameter names, shapes and dtypes only (what a live model can show)."""
        return params_fingerprint((p.name, p.shape, p.dtype) for p in self.params.values())

    # ------------------------------------------------------------- rewriting

    def with_durations(self, durations_s: Mapping[str, float], *, meta: Mapping[str, Any] | None = None) -> TrainGraph:
        """Return a copy whose ops listed in ``durations_s`` take those times (profiled costs)."""
        unknown = sorted(set(durations_s) - set(self.ops))
        if unknown:
            raise InvalidGraphError(f"durations given for unknown ops: {', '.join(unknown[:5])}")
        ops = [
            replace(op, duration_s=float(durations_s[op.id])) if op.id in durations_s else op
            for op in self.ops.values()
        ]
        return TrainGraph(
            name=self.name,
            ops=ops,
            edges=self.dag.edges,
            params=self.params.values(),
            meta={**self.meta, **(meta or {})},
            grad_order=self.grad_order,
            modules=self.modules,
        )

    def with_grad_order(self, grad_order: Sequence[str]) -> TrainGraph:
        """Return a copy that records the real gradient-ready order (see ``grad_order`` in the class docs)."""
        return TrainGraph(name=self.name, ops=self.ops.values(), edges=self.dag.edges, params=self.params.values(),
                          meta=self.meta, grad_order=grad_order, modules=self.modules, check=False)

    def with_modules(self, modules: ModuleTree) -> TrainGraph:
        """Return a copy that records the module tree (see ``modules`` in the class docs)."""
        return TrainGraph(name=self.name, ops=self.ops.values(), edges=self.dag.edges, params=self.params.values(),
                          meta=self.meta, grad_order=self.grad_order, modules=modules, check=False)

    # ------------------------------------------------------------------ JSON

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": GRAPH_SCHEMA,
            "name": self.name,
            "fingerprint": self.fingerprint,
            "meta": self.meta,
            "params": [p.to_json() for p in self.params.values()],
            "ops": [op.to_json() for op in self.ops.values()],
            "edges": [[u, v] for u, v in self.dag.edges],
            **({"grad_order": list(self.grad_order)} if self.grad_order is not None else {}),
            **({"modules": self.modules.to_json()} if self.modules is not None else {}),
        }

    @classmethod
    def from_json(cls, data: Any) -> TrainGraph:
        """Rebuild a graph from :meth:`to_json` output.

        Raises:
            InvalidGraphError: the schema is unknown, a field is missing or
                has the wrong type, or an invariant does not hold.
        """
        root = Fields(data, InvalidGraphError, "graph")
        schema = data.get("schema")
        if schema != GRAPH_SCHEMA:
            raise InvalidGraphError(f"unknown graph schema {schema!r}; expected {GRAPH_SCHEMA!r}")
        params = [Param(name=p.string("name"), shape=p.integers("shape"), dtype=p.string("dtype", "float32"),
                        grad_op=p.string("grad_op")) for p in root.items("params")]
        ops = [Op(id=o.string("id"), kind=o.string("kind"), phase=o.string("phase"),  # type: ignore[arg-type]
                  flops=o.number("flops", 0.0), bytes_moved=o.number("bytes_moved", 0.0),
                  duration_s=o.number("duration_s", 0.0), reads=o.strings("reads", ()), grads=o.strings("grads", ()))
               for o in root.items("ops")]
        edges = []
        for k, edge in enumerate(root.array("edges")):
            if not (isinstance(edge, list) and len(edge) == 2 and all(isinstance(e, str) for e in edge)):
                raise root.fail(f"edges[{k}]", "a pair of op ids", edge)
            edges.append((edge[0], edge[1]))
        grad_order = None if root.get("grad_order", None) is None else root.strings("grad_order")
        modules = None if root.get("modules", None) is None else ModuleTree.from_json(data["modules"])
        return cls(name=root.string("name", "model"), ops=ops, edges=edges, params=params,
                   meta=root.mapping("meta", None), grad_order=grad_order, modules=modules)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the graph as JSON (atomically)."""
        write_json_atomic(path, self.to_json(), indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TrainGraph:
        """Read a graph written by :meth:`save`.

        Raises:
            GraphImportError: the file is missing or is not JSON.
            InvalidGraphError: the JSON is not a valid graph.
        """
        return cls.from_json(read_json(path, what="graph", error=GraphImportError))


def validate(graph: TrainGraph) -> None:
    """Check the invariants of a training graph.

    1. The dependency graph is acyclic and never runs back in phase
       (no backward -> forward or optimizer -> backward edge).
    2. Phases are known; durations, FLOPs and bytes are finite and >= 0, and a step's durations
       add up to at most :data:`MAX_STEP_S` (so no simulated time overflows to infinity).
    3. Every ``reads``/``grads`` name is a parameter.
    4. Every parameter has exactly one grad op: ``grad_op`` exists, is a
       backward op, lists the parameter in its ``grads``, and no other op does.
    5. Shapes are non-negative and dtypes known.
    6. A module tree, where the graph has one, names every parameter's owner.

    Raises:
        InvalidGraphError: naming the first violated invariant.
    """
    _check_dag(graph)
    _check_ops(graph)
    _check_params(graph)
    _check_module_owners(graph)


def _check_module_owners(graph: TrainGraph) -> None:
    """Step 6: a module tree, where recorded, names the owner of every parameter."""
    tree = graph.modules
    if tree is not None and set(tree.owners) != set(graph.params):
        lacking = sorted(set(graph.params) - set(tree.owners))[:3]
        raise InvalidGraphError(f"the module tree must name the owner of every trainable parameter (missing: "
                                f"{', '.join(lacking)})")


def _check_dag(graph: TrainGraph) -> None:
    """Step 1: acyclic, phases forward-only."""
    import networkx as nx
    if not nx.is_directed_acyclic_graph(graph.dag):
        cycle = nx.find_cycle(graph.dag)
        path = " -> ".join([u for u, _ in cycle] + [cycle[-1][1]])
        raise InvalidGraphError(f"the graph has a cycle: {path}")
    for op in graph.ops.values():
        if op.phase not in _PHASE_RANK:
            raise InvalidGraphError(f"op {op.id!r} has unknown phase {op.phase!r}; valid: {', '.join(PHASES)}")
    for before, after in graph.dag.edges:
        if _PHASE_RANK[graph.ops[before].phase] > _PHASE_RANK[graph.ops[after].phase]:
            raise InvalidGraphError(
                f"edge {before!r} -> {after!r} runs from phase {graph.ops[before].phase} "
                f"back to {graph.ops[after].phase}"
            )


def _check_ops(graph: TrainGraph) -> None:
    """Steps 2 and 3: numbers finite and >= 0, a bounded step, names that are parameters."""
    for op in graph.ops.values():
        for name in ("duration_s", "flops", "bytes_moved"):
            value = getattr(op, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise InvalidGraphError(f"op {op.id!r} has {name} = {value!r}; expected a finite number >= 0")
        for name in (*op.reads, *op.grads):
            if name not in graph.params:
                raise InvalidGraphError(f"op {op.id!r} names {name!r}, which is not a trainable parameter")
    total_s = sum(op.duration_s for op in graph.ops.values())  # inf on overflow, never an exception
    if not math.isfinite(total_s) or total_s > MAX_STEP_S:
        raise InvalidGraphError(f"the ops' durations add up to {total_s:g} s per step; expected at most "
                                f"{MAX_STEP_S:g} s (a unit error?)")


def _check_params(graph: TrainGraph) -> None:
    """Steps 4 and 5: exactly one backward grad op per parameter; shapes and dtypes."""
    finishers: dict[str, list[str]] = {}
    for op in graph.ops.values():
        for name in op.grads:
            finishers.setdefault(name, []).append(op.id)
    for param in graph.params.values():
        grad_op = graph.ops.get(param.grad_op)
        if grad_op is None:
            raise InvalidGraphError(f"parameter {param.name!r} has grad_op {param.grad_op!r}, which is not an op")
        if grad_op.phase != "backward":
            raise InvalidGraphError(
                f"parameter {param.name!r} has grad_op {param.grad_op!r} in phase {grad_op.phase}; expected backward"
            )
        ops_listing = finishers.get(param.name, [])
        if ops_listing != [param.grad_op]:
            raise InvalidGraphError(
                f"parameter {param.name!r} must be finished by exactly one op ({param.grad_op!r}); "
                f"ops listing it in grads: {ops_listing or 'none'}"
            )
        if any(d < 0 for d in param.shape):
            raise InvalidGraphError(f"parameter {param.name!r} has a negative dimension in shape {param.shape}")
        if param.dtype not in DTYPE_SIZES:
            raise InvalidGraphError(
                f"parameter {param.name!r} has unknown dtype {param.dtype!r}; valid: {', '.join(DTYPE_SIZES)}"
            )

