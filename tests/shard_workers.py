"""What each rank runs in the sharded runtime tests (module level, so spawned ranks can import it)."""

from __future__ import annotations

import copy
import logging
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from .runtime_workers import _optimizer, batch, build


def _full(t: Any) -> Any:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: _full(p).detach().clone() for n, p in model.named_parameters()}


def _opt_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, dict[str, torch.Tensor]]:
    """The optimizer state by parameter name, every tensor whole (FSDP2's are shards)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: {k: _full(v).detach().clone() for k, v in s.items()} for p, s in opt.state.items()}


def _worst(a: dict, b: dict) -> tuple[float, float]:
    """(max abs, max relative) difference of two name -> tensor (or name -> dict of tensors) maps."""
    worst_abs = worst_rel = 0.0
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))[:4]
    for name in a:
        x, y = (a[name], b[name]) if isinstance(a[name], dict) else ({"": a[name]}, {"": b[name]})
        assert x.keys() == y.keys(), (name, x.keys(), y.keys())
        for k in x:
            d = (x[k].double() - y[k].double()).abs().max().item()
            worst_abs = max(worst_abs, d)
            worst_rel = max(worst_rel, d / max(y[k].double().abs().max().item(), 1e-30))
    return worst_abs, worst_rel


def _norm_relative(a: dict, b: dict) -> float:
    """||a - b|| / ||b|| over every tensor of two name -> tensor maps."""
    num = sum(float(((a[n].double() - b[n].double()) ** 2).sum()) for n in a)
    return (num / sum(float((b[n].double() ** 2).sum()) for n in b)) ** 0.5


def _train(model: nn.Module, example: tuple, loss_fn: Any, rank: int, steps: range, opt: Any, sched: Any,
           grads: list | None = None) -> None:
    for step in steps:
        x = batch(example, 1000 + 10 * step + rank)
        loss_fn(model(*x), *x).backward()
        if grads is not None:  # every gradient whole, each step
            inner = getattr(model, "module", model)
            grads.append({n: _full(p.grad).detach().clone() for n, p in inner.named_parameters() if p.grad is not None})
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()


def against_fsdp2_and_ddp(rank: int, world: int, name: str, plan, steps: int = 5, *,
                          rebucketed_ddp: bool = False, mesh_shape: tuple[int, ...] | None = None) -> dict[str, Any]:
    """The plan through ``shard``, FSDP2 per block (``shard`` with no plan) and DDP, trained side by
    side with AdamW (two groups) and StepLR: the worst differences of parameters and optimizer state.
    With ``rebucketed_ddp``, also DDP with 10 KB buckets against DDP: how far torch's own DDP moves
    when only where each gradient sits in the collectives changes. With ``mesh_shape``, both sharded
    models on that device mesh (two dimensions: HSDP, replicated over the first)."""
    from torch.distributed.device_mesh import init_device_mesh

    from schedopt.runtime import records, shard

    base, example, loss_fn = build(name)
    names = ("replicate", "shard")[-len(mesh_shape):] if mesh_shape else None
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names) if mesh_shape else None
    models = {"plan": shard(copy.deepcopy(base), plan, mesh=mesh),
              "per_block": shard(copy.deepcopy(base), None, mesh=mesh),
              "ddp": nn.parallel.DistributedDataParallel(copy.deepcopy(base))}
    if rebucketed_ddp:
        models["ddp_rebucketed"] = nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=0.01)
    state, grads = {}, {}
    for key, model in models.items():
        opt, sched = _optimizer("adamw", model, scheduler=True)
        grads[key] = []
        _train(model, example, loss_fn, rank, range(steps), opt, sched, grads[key])
        inner = model.module if key.startswith("ddp") else model
        state[key] = (_params(inner), _opt_state(inner, opt))
    rec = records(models["plan"])
    step = rec.steps[-1]
    return {
        "plan_vs_ddp": [_worst(state["plan"][i], state["ddp"][i]) for i in (0, 1)],
        "plan_vs_per_block": [_worst(state["plan"][i], state["per_block"][i]) for i in (0, 1)],
        "grads_vs_ddp": [_worst(a, b) for a, b in zip(grads["plan"], grads["ddp"])],
        "per_block_grads_vs_ddp": [_worst(a, b) for a, b in zip(grads["per_block"], grads["ddp"])],
        "params_vs_ddp_norm": _norm_relative(state["plan"][0], state["ddp"][0]),
        **({"rebucketed_vs_ddp": [_worst(state["ddp_rebucketed"][i], state["ddp"][i]) for i in (0, 1)],
            "rebucketed_vs_ddp_norm": _norm_relative(state["ddp_rebucketed"][0], state["ddp"][0]),
            } if rebucketed_ddp else {}),
        "steps_recorded": len(rec.steps),
        "collectives": [c.to_json() for c in step.collectives],
        "peak_bytes": rec.peak_bytes(step), "shard_bytes": rec.shard_bytes,
    }


def checkpoint_resume(rank: int, world: int, name: str, plan, directory: str, steps: int = 5,
                      at: int = 3) -> dict[str, Any]:
    """Train ``steps`` straight through; and train ``at`` steps, save with torch.distributed.checkpoint,
    load into a freshly sharded model and optimizer, train the rest: the worst parameter difference."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from schedopt.runtime import shard

    base, example, loss_fn = build(name)
    straight = shard(copy.deepcopy(base), plan)
    opt, sched = _optimizer("adamw", straight, scheduler=True)
    _train(straight, example, loss_fn, rank, range(steps), opt, sched)

    first = shard(copy.deepcopy(base), plan)
    opt1, sched1 = _optimizer("adamw", first, scheduler=True)
    _train(first, example, loss_fn, rank, range(at), opt1, sched1)
    model_sd, optim_sd = get_state_dict(first, opt1)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=directory)

    torch.manual_seed(123)  # a fresh model: other weights until the checkpoint is loaded
    fresh, _, _ = build(name)
    for p in fresh.parameters():
        p.data.normal_()
    second = shard(fresh, plan)
    opt2, sched2 = _optimizer("adamw", second, scheduler=True)
    model_sd, optim_sd = get_state_dict(second, opt2)
    loaded = {"model": model_sd, "optim": optim_sd}
    dcp.load(loaded, checkpoint_id=directory)
    set_state_dict(second, opt2, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
    sched2.load_state_dict(sched1.state_dict())
    _train(second, example, loss_fn, rank, range(at, steps), opt2, sched2)
    return {"resumed_vs_straight": _worst(_params(second), _params(straight))}


def mixed_precision(rank: int, world: int, name: str, plan) -> dict[str, Any]:
    """``mp_policy`` reaches FSDP2: the all-gathers move bf16 parameters; the gradients arrive in fp32 shards."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from schedopt.runtime import records, shard

    model, example, loss_fn = build(name)
    total = sum(p.numel() for p in model.parameters())
    model = shard(model, plan, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    x = batch(example, 7 + rank)
    loss_fn(model(*x), *x).backward()
    step = records(model).steps[-1]
    return {"gathered": sum(c.nbytes for c in step.collectives if c.kind == "all-gather"),
            "params": total, "grad_dtypes": sorted({str(p.grad.dtype) for p in model.parameters() if p.grad is not None})}


class _Warnings(logging.Handler):
    """The warnings ``schedopt.runtime`` logs on this rank while attached (``with``)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> "_Warnings":
        logging.getLogger("schedopt.runtime").addHandler(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        logging.getLogger("schedopt.runtime").removeHandler(self)


def hsdp_notes(rank: int, world: int, name: str, plan, mesh_shape: tuple[int, int]) -> list[str]:
    """The warnings ``shard`` logs applying ``plan`` on a mesh of ``mesh_shape`` (replicate, shard)."""
    from torch.distributed.device_mesh import init_device_mesh

    from schedopt.runtime import shard

    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("replicate", "shard"))
    with _Warnings() as seen:
        shard(build(name)[0], plan, mesh=mesh)
    return seen.lines


def paced(rank: int, world: int, name: str, plan, synced: int) -> list[list[str]]:
    """The warnings ``schedopt.runtime`` logs on this rank, read after ``synced`` training steps, then
    after one more; each synced step is followed by an accumulation micro-step and an evaluation
    forward, which the pace check must not time."""
    from schedopt.runtime import shard

    model, example, loss_fn = build(name)
    x = batch(example, 7 + rank)
    seen = []
    with _Warnings() as logged:
        model = shard(model, plan)
        for k in range(synced + 1):
            model.set_requires_gradient_sync(False)
            loss_fn(model(*x), *x).backward()
            model.set_requires_gradient_sync(True)
            loss_fn(model(*x), *x).backward()
            with torch.no_grad():
                model(*x)
            if k >= synced - 1:
                seen.append(list(logged.lines))
    return seen


def refused(rank: int, world: int, name: str, plan, *, other_model_on: int | None = None,
            hsdp: bool = False) -> dict[str, Any]:
    """``shard`` (or the runtime ``plan[0]`` names, for ``plan = ("wrap", plan)``): the error's type and
    message, and how long it took to raise; rank ``other_model_on`` builds another model. ``hsdp``: on a
    mesh that replicates over every rank and shards over none."""
    from torch.distributed.device_mesh import init_device_mesh

    from schedopt.runtime import shard, wrap

    model = build("tiny_bert" if rank == other_model_on else name)[0]
    apply = shard
    if isinstance(plan, tuple):
        apply, plan = {"wrap": wrap, "shard": shard}[plan[0]], plan[1]
    mesh = {"mesh": init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))} if hsdp else {}
    started = time.perf_counter()
    try:
        apply(model, plan, **mesh)
    except Exception as exc:  # noqa: BLE001 - the test reads the type and the text
        return {"type": type(exc).__name__, "message": str(exc), "s": time.perf_counter() - started}
    finally:
        dist.barrier()
    return {"type": None, "message": "", "s": time.perf_counter() - started}
