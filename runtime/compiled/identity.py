"""Which node of a graph ``torch.compile`` traced is which op of the plan.

The plan's ops come from the aten-level importer
(:func:`schedopt.importers.pytorch.trace_train_step`), which traces one whole
step — forward, loss and ``autograd.grad`` — with ``make_fx``. AOTAutograd
traces the compiled module's forward and backward the same way, through the
same autograd engine, but

- without the loss when the loss is computed outside the compiled module
  (the usual ``loss_fn(model(x), y)``): the importer's last forward ops and
  first backward ops have no node;
- functionalized: in-place ops are out-of-place (``add_`` -> ``add``) and
  BatchNorm is ``_native_batch_norm_legit_functional``;
- with views and ``detach`` as nodes, which the importer folds into the op
  that made their data (they launch no kernel);
- with one ``convolution_backward`` where the importer has two ops
  (``.grad_input`` and ``.grad_weight``, so a schedule can move the weight
  gradient): :func:`split_conv_backward` makes it two calls first;
- with node names from its own counters.

- with some composite ops decomposed otherwise (dropout: ``bernoulli_``,
  ``div_`` and ``mul`` in the importer's CPU trace, ``native_dropout`` in
  AOTAutograd's).

Both traces list their ops in the same order (the program's forward, the
engine's backward), so identity is an alignment of the two sequences of
kinds, per phase (:func:`match`), after :func:`canonical_kind` undoes
functionalization: what one trace has and the other lacks falls between the
aligned blocks. The backend then checks that every parameter's gradient
comes out of the node matched to the op the plan says finishes it
(:func:`check_gradients`), which catches an alignment gone wrong; nodes no op
matched run where their data lets them, and the user is told
(:class:`~schedopt.errors.CompileError` instead with ``strict``).
"""

from __future__ import annotations

import difflib
import operator
from typing import Iterable, Mapping

import torch
from torch import fx

from schedopt.errors import CompileError
from schedopt.plan import Plan

__all__ = ["KIND", "canonical_kind", "node_kind", "split_conv_backward", "rejoin_conv_backward", "match", "compute_source",
           "check_gradients", "outside"]

#: ``node.meta`` key of the kind a rewrite gave a node (the halves of a split ``convolution_backward``)
KIND = "schedopt_kind"
#: ``node.meta`` key of the other half of a split ``convolution_backward``
PAIR = "schedopt_pair"

_SAME_KIND = {  # functional or specialized spellings of one op
    "aten._native_batch_norm_legit_functional": "aten.native_batch_norm",
    "aten._native_batch_norm_legit": "aten.native_batch_norm",
    "aten._native_batch_norm_legit_no_training": "aten.native_batch_norm",
}
_ALIASES = {"aten.detach", "aten._unsafe_view", "aten.alias", "aten.lift_fresh"}


def canonical_kind(kind: str) -> str:
    """Return ``kind`` as both traces spell it: in-place ops as their out-of-place form, BatchNorm as one.

    Example:
        >>> canonical_kind("aten.add_"), canonical_kind("aten._native_batch_norm_legit_functional")
        ('aten.add', 'aten.native_batch_norm')
    """
    kind = _SAME_KIND.get(kind, kind)
    namespace, _, rest = kind.partition(".")
    name, dot, part = rest.partition(".")
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]
    return f"{namespace}.{name}{dot}{part}"


def node_kind(node: fx.Node) -> str | None:
    """Return the op kind of ``node`` as the importer names it, or None for a node that launches no kernel."""
    if node.op != "call_function":
        return None
    if KIND in node.meta:
        return node.meta[KIND]
    if node.target is operator.getitem:
        return None
    packet = getattr(node.target, "overloadpacket", None)
    if packet is None:
        return str(getattr(node.target, "__name__", node.target))
    if getattr(node.target, "is_view", False) or str(packet) in _ALIASES:
        return None
    return str(packet)


def compute_source(node: fx.Node) -> fx.Node:
    """Follow views and ``getitem`` back to the node that computed ``node``'s data."""
    while node_kind(node) is None and node.op == "call_function" and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def split_conv_backward(graph: fx.Graph) -> None:
    """Make each ``convolution_backward`` that computes both its input's and its weight's gradient two calls.

    The first call computes the input gradient (output mask ``[True, False, False]``), the second the
    weight and bias gradients, as the importer's ``.grad_input`` and ``.grad_weight`` ops; each is the
    same kernel the joint call runs for its part.
    """
    conv_backward = torch.ops.aten.convolution_backward.default
    for node in list(graph.nodes):
        if node.target is not conv_backward:
            continue
        mask = list(node.args[10])
        if mask[0] and (mask[1] or mask[2]):
            val = node.meta.get("val")
            with graph.inserting_before(node):
                parts = {
                    0: graph.call_function(conv_backward, (*node.args[:10], [True, False, False])),
                    1: graph.call_function(conv_backward, (*node.args[:10], [False, mask[1], mask[2]])),
                }
            parts[0].meta[KIND] = "aten.convolution_backward.grad_input"
            parts[1].meta[KIND] = "aten.convolution_backward.grad_weight"
            parts[0].meta[PAIR], parts[1].meta[PAIR] = parts[1], parts[0]
            if val is not None:
                parts[0].meta["val"] = (val[0], None, None)
                parts[1].meta["val"] = (None, val[1], val[2])
            for user in list(node.users):
                if user.target is not operator.getitem:
                    raise CompileError(f"{node.name} is read other than by index ({user.name}); cannot split it")
                user.replace_input_with(node, parts[0] if user.args[1] == 0 else parts[1])
            graph.erase_node(node)
        else:
            node.meta[KIND] = ("aten.convolution_backward.grad_input" if mask[0]
                               else "aten.convolution_backward.grad_weight")


def rejoin_conv_backward(graph: fx.Graph, matched: dict[fx.Node, str], position: Mapping[str, int], *,
                         every_pair: bool = False) -> None:
    """Make the halves of a split ``convolution_backward`` one call again where the plan runs them back to back.

    Where nothing the plan orders runs between the two halves, one call does what the two would, for
    less (1-5% of the kernel's time on ResNet-18's convolutions on this CPU). With ``every_pair`` (an
    ``eager`` plan, whose order is the engine's: the engine runs one call where the importer lists two
    ops) every pair is joined, where the plan runs its first half. ``matched`` is updated: the joint
    call takes the op id of the half the plan runs first.
    """
    ranked = sorted(matched, key=lambda n: position[matched[n]])
    place = {node: i for i, node in enumerate(ranked)}
    for node in [n for n in ranked if n.meta.get(KIND) == "aten.convolution_backward.grad_input"]:
        other = node.meta.get(PAIR)
        if other is None or other not in place or (abs(place[other] - place[node]) != 1 and not every_pair):
            continue
        mask = other.args[10]
        with graph.inserting_before(node):  # the input half is the first in the graph (split order)
            joint = graph.call_function(node.target, (*node.args[:10], [True, mask[1], mask[2]]))
        for half in (node, other):
            for user in list(half.users):
                user.replace_input_with(half, joint)
        matched[joint] = matched[min(node, other, key=place.__getitem__)]
        for half in (node, other):
            del matched[half]
            graph.erase_node(half)


def match(graph: fx.Graph, plan: Plan, phase: str) -> tuple[dict[fx.Node, str], list[fx.Node]]:
    """Return the plan op id of each kernel-launching node of ``graph`` (the ``phase`` half of a step),
    and the nodes no op matched.

    Steps:
        1. The plan's ``phase`` ops in the order the importer traced them and the graph's nodes in
           graph order: two sequences of canonical kinds, in the same engine order.
        2. Align them (``difflib.SequenceMatcher``, no junk heuristic): the matching blocks pair a
           node with an op of its kind, in order; what one trace has and the other lacks (the loss,
           a dropout the importer saw as ``bernoulli_``, ``div_``, ``mul`` and AOTAutograd as
           ``native_dropout``) falls between the blocks.
    """
    assert plan.ops is not None, "the backend checks that the plan records its ops"
    ops = [op_id for op_id, op in plan.ops.items() if op.phase == phase]
    nodes = [node for node in graph.nodes if node_kind(node) is not None]
    aligner = difflib.SequenceMatcher(None, [canonical_kind(plan.ops[op].kind) for op in ops],
                                      [canonical_kind(node_kind(node)) for node in nodes], autojunk=False)
    matched = {nodes[block.b + k]: ops[block.a + k]
               for block in aligner.get_matching_blocks() for k in range(block.size)}
    return matched, [node for node in nodes if node not in matched]


def check_gradients(grads: Mapping[str, fx.Node], matched: Mapping[fx.Node, str], plan: Plan) -> None:
    """Check that each parameter's gradient comes out of the node matched to the op the plan says finishes it.

    Raises:
        CompileError: naming the first parameter whose gradient comes from elsewhere.
    """
    assert plan.ops is not None
    finisher = {name: op_id for op_id, op in plan.ops.items() for name in op.grads}
    for name, node in grads.items():
        source = compute_source(node)
        op_id = matched.get(source)
        if finisher.get(name) != op_id:
            raise CompileError(
                f"the compiled backward computes the gradient of {name} in {source.name}, which matches plan op "
                f"{op_id!r}, but the plan finishes it in {finisher.get(name)!r}: the plan was made from another "
                "trace of this model (plan again from this model at aten level)"
            )


def outside(plan: Plan, matched: Iterable[str], phase: str) -> list[str]:
    """Return the plan's ``phase`` ops that no compiled node matched (the loss, allocations), in plan order."""
    assert plan.ops is not None
    seen = set(matched)
    return [op_id for op_id in plan.order if plan.ops[op_id].phase == phase and op_id not in seen]
