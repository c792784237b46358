"""What each rank runs in the runtime tests (module level, so spawned processes can import it)."""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from torch import nn

from .models_path import example_models, example_train


class FrozenStem(nn.Module):
    """A frozen conv-BN stem (BatchNorm buffers that change), then a trainable conv-BN-linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.stem.requires_grad_(False)
        self.body = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.stem(x))


class WithUnused(nn.Module):
    """``extra`` takes part only when the input's first element is positive (rank-dependent use)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 2)
        self.extra = nn.Linear(8, 8)
        self.use_extra = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if self.use_extra:
            h = h + self.extra(h)
        return self.b(h)


def build(name: str) -> tuple[nn.Module, tuple, Any]:
    """Return ``(model, example_inputs, loss_fn)`` seeded alike on every rank."""
    torch.manual_seed(0)
    if name == "frozen_stem":
        return FrozenStem(), (torch.randn(4, 3, 8, 8),), _mse
    if name in ("with_unused", "with_unused_planned"):
        model = WithUnused()
        model.use_extra = name == "with_unused_planned"  # planned with every parameter in use
        return model, (torch.randn(4, 8),), _mse
    made = example_models().FACTORIES[name]()
    inputs = made[1] if isinstance(made[1], tuple) else (made[1],)
    return made[0], inputs, made[2] if len(made) == 3 else _mse


def _mse(output: torch.Tensor, *_inputs: Any) -> torch.Tensor:
    return output.float().pow(2).mean()


def batch(example: tuple, seed: int) -> tuple:
    """New inputs shaped like ``example``, drawn as ``examples/train.py`` draws them."""
    return example_train().batch(example, torch.Generator().manual_seed(seed), torch.device("cpu"))


def _max_diffs(ours: nn.Module, ref: nn.Module) -> tuple[float, float]:
    """(max abs difference, max relative difference) of the gradients of two copies of one model."""
    worst_abs, worst_rel = 0.0, 0.0
    for (name, a), (_, b) in zip(ours.named_parameters(), ref.named_parameters()):
        if (a.grad is None) != (b.grad is None):
            return float("inf"), float("inf")
        if a.grad is None:
            continue
        diff = (a.grad - b.grad).abs().max().item()
        worst_abs = max(worst_abs, diff)
        worst_rel = max(worst_rel, diff / max(b.grad.abs().max().item(), 1e-30))
    return worst_abs, worst_rel


def train_against_ddp(rank: int, world: int, name: str, plan, steps: int = 3, *, accumulate: int = 1,
                      find_unused: bool = False, warmup: bool = False) -> dict[str, Any]:
    """Train a schedopt copy and a DDP copy of one model side by side; the gradient differences per step.

    With ``accumulate = k`` every step runs k - 1 micro-batches under ``no_sync`` first. In the
    ``with_unused`` model, rank 1 uses ``extra`` on odd steps and rank 0 never does. With ``warmup``
    both copies first run one forward and backward without a step, after which DDP has rebuilt its
    buckets in gradient-ready order (its first iteration uses buckets in reverse parameter order).
    """
    from schedopt.runtime import wrap

    model, example, loss_fn = build(name)
    reference = copy.deepcopy(model)
    ours = wrap(model, plan, find_unused_parameters=find_unused)
    ddp = nn.parallel.DistributedDataParallel(reference, find_unused_parameters=find_unused)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9)
    opt_ddp = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    diffs, logs = [], []
    if warmup:
        x = batch(example, seed=-1 - rank)
        for wrapped in (ours, ddp):
            loss_fn(wrapped(*x), *x).backward()
            wrapped.zero_grad(set_to_none=True)
    for step in range(steps):
        if isinstance(model, WithUnused):
            model.use_extra = reference.use_extra = rank == 1 and step % 2 == 1
        for wrapped, opt in ((ours, opt_ours), (ddp, opt_ddp)):
            opt.zero_grad()
            for micro in range(accumulate):
                x = batch(example, seed=1000 * step + 10 * rank + micro)
                context = wrapped.no_sync() if micro < accumulate - 1 else _nothing()
                with context:
                    loss_fn(wrapped(*x), *x).backward()
        diffs.append(_max_diffs(ours.module, ddp.module))
        logs.append(list(ours.collective_log))
        opt_ours.step()
        opt_ddp.step()
    params_equal = all(torch.equal(a, b) for a, b in zip(ours.module.parameters(), ddp.module.parameters()))
    buffers_equal = all(torch.equal(a, b) for a, b in zip(ours.module.buffers(), ddp.module.buffers()))
    return {"diffs": diffs, "logs": logs, "params_equal": params_equal, "buffers_equal": buffers_equal}


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def wrap_and_time(rank: int, world: int, name: str, plans: list) -> dict[str, Any]:
    """Wrap ``name`` with ``plans[rank]`` (a plan per rank); how long it took, or what was raised."""
    return _timed_wrap(build(name)[0], plans[rank])


def _timed_wrap(model: nn.Module, plan) -> dict[str, Any]:
    """How long ``wrap`` took, and the exception it raised (type name and message), if any."""
    from schedopt.runtime import wrap

    started = time.perf_counter()
    try:
        wrap(model, plan)
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return {"error": type(exc).__name__, "message": str(exc), "wall_s": time.perf_counter() - started}
    return {"error": None, "wall_s": time.perf_counter() - started}


def wrap_changed_model(rank: int, world: int, plan) -> dict[str, Any]:
    """Wrap tiny_cnn after rank 1 widened its head: the model no longer is the planned one."""
    model, _, _ = build("tiny_cnn")
    if rank == 1:
        model.fc = nn.Linear(16, 12)
    return _timed_wrap(model, plan)


def ddp_buckets(rank: int, world: int, cases: list[tuple[str, dict, float | None]]) -> dict[str, list[list[str]]]:
    """For each example model, the buckets (names, in collective order) real DDP all-reduces after its
    rebuild, with DDP's default caps or ``bucket_cap_mb`` (then torch 2.13 caps the first bucket alike)."""
    return {name: _ddp_buckets(name, kwargs, cap_mb) for name, kwargs, cap_mb in cases}


def _ddp_buckets(name: str, kwargs: dict, cap_mb: float | None) -> list[list[str]]:
    make = example_models().FACTORIES[name]
    torch.manual_seed(0)
    made = make(**kwargs)
    model, example = made[0], made[1] if isinstance(made[1], tuple) else (made[1],)
    loss_fn = made[2] if len(made) == 3 else _mse
    names = {id(p): n for n, p in model.named_parameters()}
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap_mb)
    seen: list[list[str]] = []

    def record(state: Any, bucket: Any):
        seen.append([names[id(p)] for p in bucket.parameters()])
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    import torch.distributed as dist

    record.__annotations__ = {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
    ddp.register_comm_hook(None, record)
    for _ in range(2):  # DDP rebuilds its buckets from the first iteration's ready order
        seen.clear()
        loss_fn(ddp(*example), *example).backward()
    return seen


def wrap_kind(rank: int, world: int, plan_path: str) -> dict[str, str]:
    """What ``wrap`` returns with no plan at all, and with ``$SCHEDOPT_PLAN`` set."""
    import os

    from schedopt.runtime import wrap

    kinds = {"none": type(wrap(build("tiny_cnn")[0])).__name__}
    os.environ["SCHEDOPT_PLAN"] = plan_path
    kinds["env"] = type(wrap(build("tiny_cnn")[0])).__name__
    return kinds


def calibrate_small(rank: int, world: int) -> dict[str, Any]:
    """A short all-reduce sweep on this gloo group."""
    from schedopt.runtime.calibrate import calibrate_process_group

    result = calibrate_process_group(min_bytes=4 << 10, max_bytes=4 << 20, time_limit_s=20)
    return {"cluster": result.cluster, "quality": result.quality,
            "sizes": [m.nbytes for m in result.measurements], "json": result.to_json()}


def backward_twice(rank: int, world: int, plan) -> str:
    """Two backward passes after one forward (retain_graph): the second must not pass unsynchronized."""
    from schedopt.runtime import wrap

    model, example, loss_fn = build("tiny_cnn")
    wrapped = wrap(model, plan)
    loss = loss_fn(wrapped(*example), *example)
    loss.backward(retain_graph=True)
    try:
        loss.backward()
    except RuntimeError as exc:
        return str(exc)
    return "no error"
