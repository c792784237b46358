"""What each rank runs in the compiled-runtime tests (module level, so spawned processes can import it)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from .runtime_workers import _max_diffs, batch, build

#: the kernels whose order the tests compare (the ops the compiled runtime inserts are none of these)
ORDERED_KINDS = {"aten.mm", "aten.addmm", "aten.sum", "aten.threshold_backward", "aten.native_batch_norm_backward",
                 "aten.convolution_backward.grad_input", "aten.convolution_backward.grad_weight"}


class ExecutedOps(TorchDispatchMode):
    """Record every aten call that really runs: ``(kind, output shape)``, and the numel of each all-reduce."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[int, ...]]] = []
        self.all_reduces: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        kind = str(func.overloadpacket)
        if func is torch.ops.aten.convolution_backward.default:
            mask = args[10]
            if mask[0] and mask[1]:  # one call for both halves
                self.calls.append((kind, (tuple(out[0].shape), tuple(out[1].shape))))
            elif mask[0]:
                self.calls.append((kind + ".grad_input", tuple(out[0].shape)))
            elif mask[1]:
                self.calls.append((kind + ".grad_weight", tuple(out[1].shape)))
            return out
        if kind in ("_c10d_functional.all_reduce", "_c10d_functional.all_reduce_"):
            self.all_reduces.append(args[0].numel())
        if kind in ORDERED_KINDS:
            self.calls.append((kind, tuple((out if isinstance(out, torch.Tensor) else out[0]).shape)))
        return out


def compiled_against_ddp(rank: int, world: int, name: str, plan, steps: int = 3) -> dict[str, Any]:
    """Train a compiled-runtime copy and a DDP copy side by side (SGD with momentum); the gradient
    differences per step, the backward's executed kernels and all-reduces at the last step."""
    from schedopt.runtime import compile as compile_plan

    model, example, loss_fn = build(name)
    reference = copy.deepcopy(model)
    ours = compile_plan(model, plan)
    ddp = nn.parallel.DistributedDataParallel(reference)
    opt_ours = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt_ddp = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    diffs, recorder = [], ExecutedOps()
    for step in range(steps):
        x = batch(example, seed=1000 * step + 10 * rank)
        for wrapped, opt in ((ours, opt_ours), (ddp, opt_ddp)):
            opt.zero_grad()
            loss = loss_fn(wrapped(*x), *x)
            if wrapped is ours and step == steps - 1:
                with recorder:
                    loss.backward()
            else:
                loss.backward()
        diffs.append(_max_diffs(model, reference))
        opt_ours.step()
        opt_ddp.step()
    return {
        "diffs": diffs,
        "params_equal": all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters())),
        "buffers_equal": all(torch.equal(a, b) for a, b in zip(model.buffers(), reference.buffers())),
        "executed": recorder.calls, "all_reduces": recorder.all_reduces, "outside": ours.outside,
        "unplanned": ours.unplanned,
    }


def compile_step(rank: int, world: int, name: str, plan, strict: bool = False) -> dict[str, Any]:
    """One compiled step of ``name`` under ``plan``: the exception it raised (type name and message), or
    the plan ops outside the graphs and the graph ops outside the plan."""
    from schedopt.runtime import compile as compile_plan

    model, example, loss_fn = {"graph_break": (GraphBreak(), (torch.randn(4, 8),), None),
                               "dropout": (Dropout(), (torch.randn(4, 8),), None)}.get(name) or build(name)
    try:
        ours = compile_plan(model, plan, strict=strict)
        out = ours(*example)
        (out.pow(2).mean() if loss_fn is None else loss_fn(out, *example)).backward()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"error": "", "message": "", "outside": ours.outside, "unplanned": ours.unplanned,
            "grads": all(p.grad is not None for p in model.parameters())}


class Dropout(nn.Module):
    """A dropout between two linear layers: traced as ``bernoulli_``, ``div_``, ``mul`` by the importer on
    CPU and as ``native_dropout`` by AOTAutograd."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)
        self.b = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.drop(self.a(x)))


class GraphBreak(nn.Module):
    """Two linear layers with an explicit graph break between them."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        torch._dynamo.graph_break()
        return self.b(h)
