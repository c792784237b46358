"""Sharded plans: units of modules, what FSDP2 can express, and where each unit's hooks fall in a step.

A *unit* is what one ``fully_shard`` call manages: the parameters of a list of modules' subtrees
that no nested unit took (``fully_shard(model)``, the root unit ``[""]``, takes what is left).
Per step, with the units in forward order:

- ``AG_f(i)``, the all-gather of unit i's parameters, is issued at the pre-forward hook of unit
  ``i - prefetch_forward`` (0: its own) and must end before unit i's first forward op;
- after unit i's last forward op it is resharded (``reshard_after_forward``) or kept until its
  post-backward; if resharded, ``AG_b(i)`` is issued at the pre-backward hook of unit
  ``i + prefetch_backward`` and must end before unit i's first backward op;
- ``RS(i)``, the reduce-scatter of its gradients, is issued at its post-backward (after its last
  backward op); the optimizer runs on the shards after every reduce-scatter.

Where a hook falls is read off the graph: unit i's forward begins with the first forward op that
reads one of its parameters and ends with the last; its backward spans the backward ops that read
one of its parameters or finish one of its gradients. The root unit's hooks are the step's: it is
gathered first, before any op, and its forward ends with the forward pass.

Example:
    >>> from schedopt.modules import ModuleTree
    >>> tree = ModuleTree.from_param_names(["h.0.w", "h.1.w", "head.w"])
    >>> assign_params(tree, [["h.0"], ["h.1"], [""]])
    [['h.0.w'], ['h.1.w'], ['head.w']]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .errors import InvalidPlanError
from .graph import TrainGraph
from .modules import ModuleTree

__all__ = ["ROOT", "Unit", "UnitSpan", "Geometry", "assign_params", "check_units", "claim", "forward_sorted"]

ROOT = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Unit:
    """One ``fully_shard`` group: its module paths, its parameters, and its schedule knobs.

    ``prefetch_forward`` d: the all-gather is issued at the pre-forward of the unit d units earlier
    (``set_modules_to_forward_prefetch``); ``prefetch_backward`` d: the backward all-gather at the
    pre-backward of the unit d units later in forward order (``set_modules_to_backward_prefetch``;
    FSDP2's default is 1).
    """

    modules: tuple[str, ...]
    params: tuple[str, ...]
    reshard_after_forward: bool = True
    prefetch_forward: int = 0
    prefetch_backward: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "modules", tuple(self.modules))
        object.__setattr__(self, "params", tuple(self.params))

    @property
    def is_root(self) -> bool:
        return self.modules == (ROOT,)

    def to_json(self) -> dict[str, Any]:
        return {"modules": list(self.modules), "params": list(self.params),
                "reshard_after_forward": self.reshard_after_forward,
                "prefetch_forward": self.prefetch_forward, "prefetch_backward": self.prefetch_backward}


def claim(home: dict[str, int], name: str, k: int, *, group: str, known: Any = None, kind: str = "parameter") -> None:
    """Record that ``name`` is in ``group`` k (a bucket, a unit); refuse one unknown or already in another."""
    if known is not None and name not in known:
        raise InvalidPlanError(f"{group} {k} names unknown {kind} {name!r}")
    if name in home:
        raise InvalidPlanError(f"{kind} {name!r} is in two {group}s ({home[name]} and {k})")
    home[name] = k


def assign_params(tree: ModuleTree, unit_modules: Sequence[Sequence[str]]) -> list[list[str]]:
    """The parameters each unit gets, as FSDP2 assigns them: a parameter goes to the unit holding the
    deepest module on its owner's path (nested ``fully_shard`` calls claim first); none where no
    unit's module holds it."""
    unit_of = {path: k for k, modules in enumerate(unit_modules) for path in modules}
    out: list[list[str]] = [[] for _ in unit_modules]
    for param, owner in tree.owners.items():
        parts = owner.split(".") if owner else []
        for depth in range(len(parts), -1, -1):
            path = ".".join(parts[:depth])
            if path in unit_of:
                out[unit_of[path]].append(param)
                break
    return out


@dataclass(frozen=True, slots=True)
class UnitSpan:
    """Where one unit's hooks fall, as positions in the step's compute ops (forward then backward).

    ``forward_first``: its all-gather must end before this op; ``forward_last``: resharded after
    this op; ``backward_first``: the backward all-gather must end before this op; ``grad_first``:
    its unsharded gradient exists from the start of this op; ``backward_last``: post-backward,
    after this op (the reduce-scatter is issued, the unsharded parameters freed).
    """

    forward_first: int
    forward_last: int
    backward_first: int
    grad_first: int
    backward_last: int


class Geometry:
    """A sharded plan's units laid on a graph's step: their spans, bytes, and collectives' issue points."""

    def __init__(self, graph: TrainGraph, order: Sequence[str], units: Sequence[Unit]) -> None:
        self.graph, self.units = graph, tuple(units)
        self.compute_ops = [o for o in order if graph.ops[o].phase != "optimizer"]
        self.nbytes = [sum(graph.params[p].nbytes for p in u.params) for u in self.units]
        phases = [graph.ops[o].phase for o in self.compute_ops]
        self.backward_start = phases.index("backward") if "backward" in phases else len(phases)
        self.touches = self._param_touches()
        self.spans = [self._span(u) for u in self.units]

    def _param_touches(self) -> dict[str, dict[str, list[int]]]:
        """Per parameter, in one pass over the step: the forward and backward ops that read it or finish
        its gradient, and the ops that finish it (positions in :attr:`compute_ops`)."""
        touches: dict[str, dict[str, list[int]]] = {}
        for j, op_id in enumerate(self.compute_ops):
            op = self.graph.ops[op_id]
            for name in {*op.reads, *op.grads}:
                entry = touches.setdefault(name, {"forward": [], "backward": [], "grads": []})
                entry[op.phase].append(j)
            for name in op.grads:
                touches[name]["grads"].append(j)
        return touches

    def _span(self, unit: Unit) -> UnitSpan:
        empty: dict[str, list[int]] = {"forward": [], "backward": [], "grads": []}
        fwd = [j for p in unit.params for j in self.touches.get(p, empty)["forward"]]
        bwd = [j for p in unit.params for j in self.touches.get(p, empty)["backward"]]
        grads = [self.gradient_start(self.touches.get(p, empty)) for p in unit.params]
        grads = [j for j in grads if j is not None]
        if unit.is_root or not fwd:
            fwd = [0, self.backward_start - 1] if unit.is_root else [0]
        first_bwd = self.backward_start if unit.is_root else min(bwd)
        return UnitSpan(forward_first=min(fwd), forward_last=max(fwd), backward_first=first_bwd,
                        grad_first=min(grads), backward_last=max(bwd))

    @staticmethod
    def gradient_start(touch: dict[str, list[int]]) -> int | None:
        """Where a parameter's unsharded gradient comes into being: the op that finishes it; for one read
        by several forward ops (a tied embedding), the first backward op that touches it, since the
        backward of its last read makes the first part, which autograd holds until the last arrives."""
        if not touch["grads"]:
            return None
        first = min(touch["grads"])
        if len(touch["forward"]) > 1 and touch["backward"]:
            first = min(first, min(touch["backward"]))
        return first

    def forward_issue(self, i: int) -> int:
        """The op before which ``AG_f(i)`` is issued."""
        return self.spans[i - self.units[i].prefetch_forward].forward_first

    def backward_issue(self, i: int) -> int:
        """The op before which ``AG_b(i)`` is issued (a resharded unit's)."""
        j = i + self.units[i].prefetch_backward
        return min(self.spans[j].backward_first, self.spans[i].backward_first)


def forward_sorted(graph: TrainGraph, order: Sequence[str], units: Sequence[Unit]) -> list[Unit]:
    """``units`` in forward order (the root first, then by first forward read); ties keep their order."""
    spans = Geometry(graph, order, units).spans
    return [u for _, u in sorted(enumerate(units), key=lambda e: (spans[e[0]].forward_first, not e[1].is_root,
                                                                   e[0]))]


def check_units(graph: TrainGraph, order: Sequence[str], units: Sequence[Unit]) -> None:
    """Refuse units that ``fully_shard`` cannot express or that the schedule cannot run.

    1. The graph records its module tree; every unit names existing modules, none twice, none nested
       in another of the same unit, the root only alone.
    2. Each unit's parameters are what FSDP2 gives it (:func:`assign_params`); every parameter is
       in exactly one unit; no unit is empty.
    3. The units are in forward order; a unit resharded after its forward has no forward read after
       the next unit's forward began (FSDP2 would hand that op a sharded parameter).
    4. Prefetch distances are whole numbers from 0 to the units before (forward) or after (backward).

    Raises:
        InvalidPlanError: naming the unit and what is wrong.
    """
    tree = graph.modules
    if tree is None and len(units) == 1 and units[0].is_root and set(units[0].params) == set(graph.params):
        return  # one root unit needs no tree
    if tree is None:
        raise InvalidPlanError("this graph records no module tree (it was written by an older schedopt), so only "
                               "a single root unit can be checked; re-import the model or plan it with fsdp-root")
    _check_modules(tree, units)
    _check_params(graph, tree, units)
    _check_schedule(graph, order, units)


def _check_modules(tree: ModuleTree, units: Sequence[Unit]) -> None:
    seen: dict[str, int] = {}
    for k, unit in enumerate(units):
        if not unit.modules:
            raise InvalidPlanError(f"unit {k} names no module")
        for path in unit.modules:
            if path not in tree.types:
                raise InvalidPlanError(f"unit {k} names module {path!r}, which the model does not have")
            claim(seen, path, k, group="unit", kind="module")
        if ROOT in unit.modules and len(unit.modules) > 1:
            raise InvalidPlanError(f"unit {k} lists the root module with others; the root unit is [''] alone")
        for a in unit.modules:
            for b in unit.modules:
                if a != b and tree.is_within(b, a):
                    raise InvalidPlanError(f"unit {k} lists {b!r} inside {a!r}; fully_shard takes a list of "
                                           "modules none of which holds another")


def _check_params(graph: TrainGraph, tree: ModuleTree, units: Sequence[Unit]) -> None:
    expected = assign_params(tree, [u.modules for u in units])
    home: dict[str, int] = {}
    for k, (unit, want) in enumerate(zip(units, expected)):
        for name in unit.params:
            claim(home, name, k, group="unit", known=graph.params)
        if set(unit.params) != set(want):
            wrong = sorted(set(unit.params) ^ set(want))[:3]
            raise InvalidPlanError(f"unit {k} ({', '.join(map(repr, unit.modules))}) lists parameters that "
                                   f"fully_shard would not give it, or lacks some it would: {', '.join(wrong)}")
        if not unit.params:
            raise InvalidPlanError(f"unit {k} ({', '.join(map(repr, unit.modules))}) holds no trainable parameter")
    missing = [name for name in graph.params if name not in home]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise InvalidPlanError(f"parameter(s) {', '.join(map(repr, missing[:3]))}{more} are in no unit "
                               "(add the root unit [''] to take what is left)")


def _check_schedule(graph: TrainGraph, order: Sequence[str], units: Sequence[Unit]) -> None:
    if list(forward_sorted(graph, order, units)) != list(units):
        raise InvalidPlanError("units must be listed in forward order (the root first, then by their first "
                               "forward op)")
    geometry = Geometry(graph, order, units)
    m = len(units)
    for k, (unit, span) in enumerate(zip(units, geometry.spans)):
        for name, value, top in (("prefetch_forward", unit.prefetch_forward, k),
                                 ("prefetch_backward", unit.prefetch_backward, m - 1 - k)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
                raise InvalidPlanError(f"unit {k} has {name} = {value!r}; expected a whole number from 0 to {top}")
        if not isinstance(unit.reshard_after_forward, bool):
            raise InvalidPlanError(f"unit {k} has reshard_after_forward = {unit.reshard_after_forward!r}; "
                                   "expected true or false")
        if unit.reshard_after_forward and not unit.is_root and k + 1 < m:
            later = geometry.spans[k + 1].forward_first
            if span.forward_last > later:
                op = geometry.compute_ops[span.forward_last]
                raise InvalidPlanError(f"unit {k} ({', '.join(map(repr, unit.modules))}) is resharded after its "
                                       f"forward but op {op!r} reads it after unit {k + 1}'s forward began; keep "
                                       "it unsharded (reshard_after_forward false) or in the root unit")
