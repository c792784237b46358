"""``compile(model, plan)``: the plan's op order and collectives inside ``torch.compile``.

What happens, once per compiled graph (at the first call, and again if
``torch.compile`` recompiles for new input shapes):

1. Dynamo captures the module's forward as one graph (``fullgraph=True``: a
   graph break is a :class:`~schedopt.errors.CompileError` naming it, never
   a silently split schedule).
2. AOTAutograd (custom forward and backward compilers, the default
   partitioner, so nothing is recomputed) traces the aten-level forward and
   backward graphs.
3. Forward: its nodes are matched to the plan's forward ops
   (:mod:`.identity`) and reordered to the plan's order (:mod:`.order`).
4. Backward: each ``convolution_backward`` is split into its input and
   weight halves, nodes are matched to the plan's backward ops, each
   parameter's gradient is checked to come from the op the plan says, the
   halves the plan runs back to back (every pair, for an ``eager`` plan: the
   engine runs one call) are one call again, the graph is
   reordered to the plan's order, and the collectives go in right after
   their gradients, waited for at the end (:mod:`.collectives`).
5. The reordered graphs run as they are (no Inductor): the order in the graph
   is the order that runs. Ops the plan has that the graphs lack (the loss,
   when it is computed outside the module) run where the program runs them;
   they are listed in :attr:`CompiledDataParallel.outside`. Nodes no plan op
   matched run where their data lets them, listed in ``unplanned`` and in
   a warning (an error with ``strict``).

``barrier`` plans run, ``eager`` ones (the engine's order) and ``compiled``
ones (a free order). ``overlap`` and ``osp`` plans are refused: their waits
belong in the *next* step's forward, after the user's optimizer step, which
runs between the two compiled graphs, outside both; placing them would need
the optimizer inside the graph.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import fx, nn

from schedopt.errors import CompileError, InvalidPlanError
from schedopt.plan import Plan

from ..replica import PLAN_ENV, Replica, resolve_plan
from .collectives import insert_collectives
from .identity import check_gradients, match, node_kind, outside, rejoin_conv_backward, split_conv_backward
from .order import reorder

__all__ = ["compile", "CompiledDataParallel"]

log = logging.getLogger("schedopt.runtime")


def compile(module: nn.Module, plan: Plan | str | os.PathLike[str] | None = None, *,  # noqa: A001
            process_group: Any = None, strict: bool = False) -> "CompiledDataParallel":
    """Return ``module`` compiled with ``torch.compile``, its graphs in ``plan``'s order with its collectives.

    Args:
        module: the model, identical on every rank; the loss may be computed inside it or outside.
        plan: a ``barrier`` plan (or its path) made from this model at aten level; None: the plan
            named by ``$SCHEDOPT_PLAN``.
        process_group: the group to synchronize over (default: the world).
        strict: raise :class:`~schedopt.errors.CompileError` for a graph node that matches no op of
            the plan, instead of running it where its data lets it (and saying so in a warning).

    Raises:
        InvalidPlanError: no plan, the plan is not a barrier plan, or does not record its ops.
        PlanMismatchError: on every rank, when the ranks hold different plans or the model differs.
        CompileError: at the first forward or backward: a graph break, or graphs the plan's ops
            cannot be found in.

    Example:
        >>> model = schedopt.runtime.compile(model, "plan.json")  # doctest: +SKIP
        >>> loss_fn(model(x), y).backward()  # every .grad holds the average  # doctest: +SKIP
    """
    resolved = resolve_plan(plan)
    if resolved is None:
        raise InvalidPlanError(f"compile needs a plan (argument or ${PLAN_ENV}); the baseline without one is "
                               "torch.compile(DistributedDataParallel(model))")
    return CompiledDataParallel(module, resolved, process_group=process_group, strict=strict)


class CompiledDataParallel(nn.Module):
    """A module whose compiled forward and backward follow a plan (see the module docstring).

    ``collective_log`` holds ``(bucket, chunk, numel)`` of the collectives the backward graph issues,
    in order; ``graphs`` the final ``forward`` and ``backward`` graph modules; per phase, ``outside``
    the plan ops no compiled node matched (run by the program, or traced otherwise) and
    ``unplanned`` the compiled nodes no plan op matched (run where their data lets them).
    """

    def __init__(self, module: nn.Module, plan: Plan, *, process_group: Any = None, strict: bool = False) -> None:
        super().__init__()
        if plan.mode != "barrier":
            raise InvalidPlanError(
                f"the compiled runtime applies barrier plans; this plan is in {plan.mode} mode, whose waits "
                "belong in the next step's forward, after the optimizer step that runs between the compiled "
                "graphs (use wrap(model, plan) with an eager plan for that mode)"
            )
        if plan.ops is None:
            raise InvalidPlanError("this plan does not record its ops' kinds (it predates the compiled runtime); "
                                   "plan again from the model at aten level")
        if unknown := [op for op in plan.order if op not in plan.ops]:
            raise InvalidPlanError(f"this plan's ops do not list {len(unknown)} op(s) of its order "
                                   f"({', '.join(unknown[:3])}); the plan file was edited or is corrupt")
        if not any(op.kind.startswith("aten.") for op in plan.ops.values()):
            raise InvalidPlanError("this plan's ops are not aten ops (imported from ONNX or at module level); "
                                   "the compiled runtime needs a plan made from the PyTorch model at aten level")
        self._replica = Replica.join(module, plan, process_group, who="compile")
        self.module = module
        self.plan = plan
        self.process_group = process_group
        self.world_size = self._replica.world_size
        self._group_name = (process_group or dist.group.WORLD).group_name
        self._params = self._replica.params
        self.collective_log: list[tuple[int, int, int]] = []
        self.graphs: dict[str, fx.GraphModule] = {}
        self.outside: dict[str, list[str]] = {}
        self.unplanned: dict[str, list[str]] = {}
        self.strict = strict
        self._position = {op_id: i for i, op_id in enumerate(plan.order)}
        # not a submodule: the compiled wrapper shares the module's parameters (state_dict keys stay module.*)
        object.__setattr__(self, "_compiled", torch.compile(module, backend=self._backend, fullgraph=True,
                                                            dynamic=False))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():
            self._replica.sync_buffers()  # DDP's default: rank 0's buffers
        try:
            return self._compiled(*args, **kwargs)
        except torch._dynamo.exc.BackendCompilerFailed as exc:
            inner = getattr(exc, "inner_exception", None)
            if isinstance(inner, (CompileError, InvalidPlanError)):
                raise inner from None
            raise
        except torch._dynamo.exc.Unsupported as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CompileError(f"torch.compile breaks the graph of {type(self.module).__name__} ({first}); the "
                               "compiled runtime needs one graph per step: remove the break or use wrap()") from None

    # ------------------------------------------------------------ the torch.compile backend

    def _backend(self, gm: fx.GraphModule, example_inputs: list[Any]):
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.partitioners import default_partition

        # AOTAutograd's inputs: the graph module's own parameters and buffers, then the example inputs
        # (each captured graph's own list: its backward is compiled lazily, maybe after another capture)
        name_of = {id(p): name for name, p in self._params.items()}
        flat = [*(t for _, t in gm.named_parameters(remove_duplicate=False)),
                *(t for _, t in gm.named_buffers(remove_duplicate=False)), *example_inputs]
        primals = [name_of.get(id(t)) for t in flat]
        missing = sorted(set(self._params) - set(primals))
        if missing:
            raise CompileError(f"the compiled graph does not take parameter(s) {', '.join(missing[:4])} as inputs; "
                               "cannot find their gradients")

        def inference(graph_module: fx.GraphModule, _inputs: list[Any]):
            return make_boxed_func(graph_module.forward)

        return aot_autograd(fw_compiler=self._compile_forward,
                            bw_compiler=functools.partial(self._compile_backward, primals),
                            inference_compiler=inference, partition_fn=default_partition)(gm, example_inputs)

    def _compile_forward(self, gm: fx.GraphModule, _inputs: list[Any]):
        from functorch.compile import make_boxed_func

        matched = self._match(gm.graph, "forward")
        reorder(gm.graph, matched, self._position)
        gm.recompile()
        self.graphs["forward"] = gm
        return make_boxed_func(gm.forward)

    def _match(self, graph: fx.Graph, phase: str) -> dict[fx.Node, str]:
        matched, unmatched = match(graph, self.plan, phase)
        self.outside[phase] = outside(self.plan, matched.values(), phase)
        self.unplanned[phase] = [f"{node.name} ({node_kind(node)})" for node in unmatched]
        if unmatched:
            listed = ", ".join(self.unplanned[phase][:6]) + (" ..." if len(unmatched) > 6 else "")
            if self.strict:
                raise CompileError(f"the compiled {phase} graph has {len(unmatched)} op(s) the plan does not: "
                                   f"{listed}; plan again from this model at aten level")
            if dist.get_rank(self.process_group) == 0:
                log.warning("schedopt: %d op(s) of the compiled %s graph match no op of the plan and run where "
                            "their inputs are ready: %s", len(unmatched), phase, listed)
        return matched

    def _compile_backward(self, primals: list[str | None], gm: fx.GraphModule, _inputs: list[Any]):
        from functorch.compile import make_boxed_func

        graph = gm.graph
        output = next(n for n in graph.nodes if n.op == "output")
        results = list(output.args[0])
        if len(results) != len(primals):
            raise CompileError(f"the compiled backward returns {len(results)} gradients for "
                               f"{len(primals)} inputs; cannot tell which is whose")
        grads = {name: node for name, node in zip(primals, results) if name is not None}
        if none := [name for name, node in grads.items() if node is None]:
            raise CompileError(f"the compiled backward gives no gradient to {', '.join(none[:4])}")
        split_conv_backward(graph)
        matched = self._match(graph, "backward")
        check_gradients(grads, matched, self.plan)
        rejoin_conv_backward(graph, matched, self._position, every_pair=self.plan.execution == "eager")
        reorder(graph, matched, self._position)
        averaged, self.collective_log = insert_collectives(graph, grads, self.plan, self._params,
                                                           group_name=self._group_name, world_size=self.world_size)
        output.args = (tuple(averaged.get(name, node) if name is not None else node
                             for name, node in zip(primals, results)),)
        graph.lint()
        gm.recompile()
        self.graphs["backward"] = gm
        if dist.get_rank(self.process_group) == 0:
            log.info("schedopt: compiled %s in the plan's order; plan ops outside the graphs (run by the program): "
                     "%s", type(self.module).__name__,
                     ", ".join(self.outside["forward"] + self.outside["backward"]) or "none")
        return make_boxed_func(gm.forward)
