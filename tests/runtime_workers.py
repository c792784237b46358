"""What each rank runs in the runtime tests (module level, so spawned processes can import it)."""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from torch import nn

from .models_path import MODELS_FILE, example_models, example_train


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


class TiedFrozenNorm(nn.Module):
    """A tied embedding (read first in forward, ready last in backward), a frozen layer, BatchNorm buffers,
    and a wide layer whose collective takes a while."""

    def __init__(self, vocab: int = 48, dim: int = 32, wide: int = 512) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.frozen = nn.Linear(dim, dim)
        self.frozen.requires_grad_(False)
        self.norm = nn.BatchNorm1d(dim)
        self.up = nn.Linear(dim, wide)
        self.down = nn.Linear(wide, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.frozen(self.embed(tokens))
        h = self.norm(h.transpose(1, 2)).transpose(1, 2)
        h = h + self.down(torch.relu(self.up(h)))
        return self.head(h)


def build(name: str) -> tuple[nn.Module, tuple, Any]:
    """Return ``(model, example_inputs, loss_fn)`` seeded alike on every rank."""
    torch.manual_seed(0)
    if name == "frozen_stem":
        return FrozenStem(), (torch.randn(4, 3, 8, 8),), _mse
    if name in ("tied_frozen_norm", "tied_wide"):
        model = TiedFrozenNorm(wide=16384 if name == "tied_wide" else 512)
        return model, (torch.arange(48).reshape(4, 12),), example_models().next_token_loss
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
    """A short all-reduce sweep on this gloo group. Over localhost there is no link, only memory copies,
    which under a loaded test run bend by up to a factor of 4.6 between 1 and 4 MiB: the fit is kept
    (``force``) where a real link's would be refused (tests/test_calibrate_fit.py)."""
    from schedopt.runtime.calibrate import calibrate_process_group

    result = calibrate_process_group(min_bytes=4 << 10, max_bytes=4 << 20, time_limit_s=20, force=True,
                                     interference_samples=3)  # the samples with a model: the next test's
    return {"cluster": result.cluster, "quality": result.quality,
            "sizes": [m.nbytes for m in result.measurements], "json": result.to_json()}


def calibrate_hsdp(rank: int, world: int, replicas: int) -> dict[str, Any]:
    """A short sweep of HSDP's mesh; which ranks each kind of collective ran among (its groups)."""
    import torch.distributed as dist

    from schedopt.errors import SchedoptError
    from schedopt.runtime.calibrate import calibrate_process_group

    ran: dict[str, set] = {}
    originals = {name: getattr(dist, name) for name in ("all_reduce", "all_gather_single", "reduce_scatter_single")}

    def recording(name):
        def call(*args, group=None, **kwargs):
            ranks = dist.get_process_group_ranks(group) if group is not None else list(range(world))
            ran.setdefault(name, set()).add(tuple(ranks))
            return originals[name](*args, group=group, **kwargs)
        return call

    for name in originals:
        setattr(dist, name, recording(name))
    try:
        result = calibrate_process_group(replicas=replicas, min_bytes=64 << 10, max_bytes=1 << 20, time_limit_s=10,
                                         force=True, interference_samples=1)
    except SchedoptError as exc:  # returned, not raised: the pool's ranks stay for the next task
        return {"error": str(exc), "ran": ran}
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
    return {"cluster": result.cluster, "json": result.to_json(), "ran": ran}


def calibrate_with_model(rank: int, world: int) -> dict[str, Any]:
    """A short sweep whose interference is measured on the tiny CNN's forward and backward."""
    from schedopt.importers import load_factory
    from schedopt.runtime.calibrate import calibrate_process_group

    spec = load_factory(f"{MODELS_FILE}:tiny_cnn")
    calls, phases = [], []
    step = spec.forward_backward()

    def progress(items, what):  # what a progress bar would see: each phase's name and its items
        phases.append([what, 0])
        for item in items:
            phases[-1][1] += 1
            yield item

    result = calibrate_process_group(min_bytes=256 << 10, max_bytes=16 << 20, time_limit_s=10, force=True,
                                     model=(spec.name, lambda: calls.append(step())), progress=progress)
    return {"json": result.to_json(), "interference": result.cluster.interference, "calls": len(calls),
            "grads": all(p.grad is not None for p in spec.model.parameters()), "phases": phases}


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


OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05),
    "sgd-momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4),
    "sgd-nesterov": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-2),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1),
}


def _optimizer(kind: str, model: nn.Module, scheduler: bool):
    """An optimizer with two parameter groups (decay off for 1-D parameters) and, maybe, an LR schedule."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim > 1]},
              {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0}]
    opt = OPTIMIZERS[kind](groups)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5) if scheduler else None
    return opt, sched


def _state_equal(a: Any, b: Any) -> bool:
    """Nested dicts, lists and tensors equal bit for bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_state_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_state_equal(x, y) for x, y in zip(a, b))
    return a == b


def overlap_against_ddp(rank: int, world: int, name: str, plan, kinds: list[str], steps: int = 6, *,
                        scheduler: bool = True, set_to_none: bool = True, checkpoint_at: int = 3) -> dict[str, Any]:
    """For each optimizer kind, train an overlap-mode copy and a DDP copy side by side for ``steps`` steps.

    Per kind: whether, after a mid-training checkpoint (the model's and the optimizer's ``state_dict``
    after step ``checkpoint_at``) and at the end, parameters, buffers and optimizer state equal DDP's
    bit for bit, the largest relative parameter difference, whether anything was pending after
    ``flush()``, and the settles of the last step.
    """
    from schedopt.runtime import wrap, wrap_optimizer

    results = {}
    for kind in kinds:
        model, example, loss_fn = build(name)
        reference = copy.deepcopy(model)
        ours = wrap(model, plan)
        ddp = nn.parallel.DistributedDataParallel(reference)
        opt_ours, sched_ours = _optimizer(kind, ours.module, scheduler)
        opt_ours = wrap_optimizer(opt_ours, ours)
        opt_ddp, sched_ddp = _optimizer(kind, ddp.module, scheduler)
        checkpoint_equal = None
        settles, logs = [], []
        for step in range(steps):
            x = batch(example, seed=1000 * step + rank)
            for wrapped, opt, sched in ((ours, opt_ours, sched_ours), (ddp, opt_ddp, sched_ddp)):
                opt.zero_grad(set_to_none=set_to_none)
                loss_fn(wrapped(*x), *x).backward()
                opt.step()
                if sched is not None:
                    sched.step()
            settles.append(list(ours.deferred.settled))
            logs.append(list(ours.collective_log))
            if step == checkpoint_at:
                checkpoint_equal = (_state_equal(ours.state_dict(), ddp.state_dict())
                                    and _state_equal(opt_ours.state_dict(), opt_ddp.state_dict()))
        ours.flush()
        worst = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
                    for a, b in zip(ours.module.parameters(), ddp.module.parameters()))
        results[kind] = {
            "checkpoint_equal": checkpoint_equal,
            "params_equal": all(torch.equal(a, b) for a, b in zip(ours.module.parameters(), ddp.module.parameters())),
            "buffers_equal": all(torch.equal(a, b) for a, b in zip(ours.module.buffers(), ddp.module.buffers())),
            "state_equal": _state_equal(opt_ours.state_dict(), opt_ddp.state_dict()),
            "worst_rel": worst,
            "pending_after_flush": ours.deferred.pending,
            "settles": [[(s.bucket, s.where, s.waited, s.steps) for s in step_settles] for step_settles in settles],
            "lr_end": [g["lr"] for g in opt_ours.param_groups],
            "lr_ddp_end": [g["lr"] for g in opt_ddp.param_groups],
            "lr_start": [g["initial_lr"] for g in opt_ddp.param_groups] if scheduler else None,
            "logs": logs,
        }
    return results


def overlap_waits(rank: int, world: int, name: str, plan, steps: int = 4) -> dict[str, Any]:
    """Train in overlap mode alone; at each module's forward, which settles had happened (a hook after ours)."""
    from schedopt.runtime import wrap, wrap_optimizer

    model, example, loss_fn = build(name)
    ours = wrap(model, plan)
    opt = wrap_optimizer(torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9), ours)
    seen: list[tuple[str, list[int]]] = []
    for mname, m in model.named_modules():
        m.register_forward_pre_hook(lambda _m, _a, mname=mname: seen.append(
            (mname, [s.bucket for s in ours.deferred.settled])))
    owned = {mname: sorted({ours.deferred.by_param_id[id(p)] for p in m.parameters(recurse=False)
                            if id(p) in ours.deferred.by_param_id}) for mname, m in model.named_modules()}
    steps_seen, settles = [], []
    for step in range(steps):
        x = batch(example, seed=1000 * step + rank)
        seen.clear()
        opt.zero_grad()
        loss_fn(ours(*x), *x).backward()
        opt.step()
        steps_seen.append(list(seen))
        settles.append([(s.bucket, s.where, s.waited, s.steps) for s in ours.deferred.settled])
    ours.flush()
    return {"seen": steps_seen, "owned": owned, "settles": settles}


def overlap_contract(rank: int, world: int, plan) -> dict[str, Any]:
    """In overlap mode: what .grad holds after backward, eval() flushing, and the optimizers refused."""
    from schedopt.errors import UnsupportedOptimizerError
    from schedopt.runtime import wrap, wrap_optimizer

    model, example, loss_fn = build("tied_frozen_norm")
    local = copy.deepcopy(model)
    ours = wrap(model, plan)
    opt = wrap_optimizer(torch.optim.SGD(ours.parameters(), lr=0.1), ours)
    x = batch(example, seed=rank)
    loss_fn(ours(*x), *x).backward()
    loss_fn(local(*x), *x).backward()
    grad_is_local = all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), local.parameters())
                        if a.requires_grad)
    opt.step()
    pending_before_eval = ours.deferred.pending
    ours.eval()
    out = {"grad_is_local": grad_is_local, "pending_before_eval": pending_before_eval,
           "pending_after_eval": ours.deferred.pending}
    for label, attempt in (("lbfgs", lambda: wrap_optimizer(torch.optim.LBFGS(ours.parameters()), ours)),
                           ("closure", lambda: opt.step(lambda: 0.0))):
        try:
            attempt()
            out[label] = "no error"
        except UnsupportedOptimizerError as exc:
            out[label] = str(exc)
    return out


def fifo_channel(rank: int, world: int) -> dict[str, Any]:
    """Queue a large all-reduce, then small ones, on a FifoChannel; sample completion order while they run."""
    from schedopt.runtime.channel import FifoChannel

    channel = FifoChannel()
    tensors = [torch.full((4 << 20,), float(rank + 1)), torch.full((8,), float(rank + 1)),
               torch.full((16,), float(rank + 1))]
    transfers = [channel.all_reduce(t) for t in tensors]
    out_of_order = False
    while not all(t.is_completed() for t in transfers):
        done = [t.is_completed() for t in reversed(transfers)][::-1]  # later ones first: no false alarm
        out_of_order |= any(done[j] and not done[i] for i in range(3) for j in range(i + 1, 3))
    for t in transfers:
        t.wait()
    channel.close()
    expected = float(sum(range(1, world + 1)))
    return {"out_of_order": out_of_order, "sums_right": all(bool((t == expected).all()) for t in tensors)}


def _digest(tensors: Any) -> str:
    """One hash of nested tensors (and plain values), for comparing ranks bit for bit."""
    import hashlib

    h = hashlib.sha256()

    def feed(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            h.update(x.detach().contiguous().cpu().numpy().tobytes())
        elif isinstance(x, dict):
            for key in sorted(x, key=str):
                h.update(str(key).encode())
                feed(x[key])
        elif isinstance(x, (list, tuple)):
            for item in x:
                feed(item)
        else:
            h.update(repr(x).encode())
    feed(tensors)
    return h.hexdigest()


def osp_training(rank: int, world: int, name: str, plan, kind: str, steps: int = 6, *,
                 lgp: bool = True) -> dict[str, Any]:
    """Train ``name`` under an osp plan; per step the committed state's and the live stage-2 weights' hashes.

    The committed state is every stage-1 parameter, every stage-2 bucket's committed weights and the
    optimizer's state; the live stage-2 weights are what the next forward reads (corrected by this
    rank's own gradient with LGP). Also the final parameters after ``flush()`` and the settles.
    """
    from schedopt.runtime import wrap, wrap_optimizer
    from schedopt.runtime.stale import StaleBucket

    model, example, loss_fn = build(name)
    ours = wrap(model, plan, lgp=lgp)
    opt, _ = _optimizer(kind, ours.module, scheduler=False)
    opt = wrap_optimizer(opt, ours)
    stale = [b for b in ours.deferred.buckets if isinstance(b, StaleBucket)]
    stale_ids = {id(p) for b in stale for _, p in b.members}
    committed, live, settles, losses = [], [], [], []
    for step in range(steps):
        x = batch(example, seed=1000 * step + rank)
        opt.zero_grad()
        loss = loss_fn(ours(*x), *x)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        settles.append([(s.bucket, s.where, s.what, s.steps) for s in ours.deferred.settled])
        state = [p for p in ours.module.parameters() if p.requires_grad and id(p) not in stale_ids]
        committed.append(_digest([state, [b.committed_parameters() for b in stale],
                                  [opt.state[p] for p in opt.state]]))
        live.append(_digest([p for b in stale for _, p in b.members]))
    ours.flush()
    return {"committed": committed, "live": live, "settles": settles, "losses": losses,
            "params": {n: p.detach().numpy().copy() for n, p in ours.module.named_parameters()},  # not shared fds
            "state": _digest(opt.state_dict()), "pending_after_flush": ours.deferred.pending,
            "logs": list(ours.collective_log)}


def osp_reference(name: str, stale: set[str], steps: int, lr: float, *, lgp: bool, world: int = 2) -> dict:
    """OSP's trajectory with plain SGD computed in one process for ``world`` virtual ranks.

    Stage-1 parameters at step k: ``w0 - lr * sum(avg g_j, j < k)``; stage-2 ones, committed:
    the same sum to ``k - 1``, and read by rank r as that minus ``lr * g_{k-1}^r`` (LGP) or as it
    is. ``g_k^r`` is rank r's gradient at the weights it read. Returns the parameters after the
    last step's average is committed.
    """
    model, example, loss_fn = build(name)
    committed = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    copies = [copy.deepcopy(model) for _ in range(world)]
    local: list[dict[str, torch.Tensor]] = [{} for _ in range(world)]
    late: dict[str, torch.Tensor] = {}  # stage 2: the average of the step before, not yet applied
    for step in range(steps):
        grads = []
        for r, replica in enumerate(copies):
            with torch.no_grad():
                for n, p in replica.named_parameters():
                    if n in committed:
                        p.copy_(committed[n])
                        if n in stale and lgp and n in local[r]:
                            p.add_(local[r][n], alpha=-lr)
            replica.zero_grad()
            x = batch(example, seed=1000 * step + r)
            loss_fn(replica(*x), *x).backward()
            grads.append({n: p.grad.clone() for n, p in replica.named_parameters() if n in committed})
            local[r] = grads[-1]
        for n in committed:
            average = sum(torch.mul(g[n], 1.0 / world) for g in grads)
            if n in stale:
                if n in late:
                    committed[n].add_(late[n], alpha=-lr)
                late[n] = average
            else:
                committed[n].add_(average, alpha=-lr)
    for n, average in late.items():
        committed[n].add_(average, alpha=-lr)
    return committed


def load_mid_training(rank: int, world: int, name: str, plan) -> dict[str, Any]:
    """Train 3 steps, checkpoint, train 2 more (updates pending), load the checkpoint: what the model holds."""
    from schedopt.runtime import wrap, wrap_optimizer

    model, example, loss_fn = build(name)
    ours = wrap(model, plan)
    opt = wrap_optimizer(torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9), ours)

    def step(k: int) -> None:
        x = batch(example, seed=1000 * k + rank)
        opt.zero_grad()
        loss_fn(ours(*x), *x).backward()
        opt.step()

    for k in range(3):
        step(k)
    checkpoint = copy.deepcopy(model.state_dict())
    for k in range(3, 5):
        step(k)
    pending_before_load = ours.deferred.pending
    model.load_state_dict(checkpoint)
    return {"pending_before_load": pending_before_load, "pending_after_load": ours.deferred.pending,
            "equal": all(torch.equal(v, checkpoint[k]) for k, v in model.state_dict().items())}


def issued_collectives(rank: int, world: int, cases: list[tuple[str, Any]]) -> list[list[tuple[int, int, int]]]:
    """Per ``(model name, plan)``: ``(bucket, chunk, numel)`` of every collective ``wrap`` issued in one step."""
    from schedopt.runtime import wrap

    logs = []
    for name, plan in cases:
        model, example, loss_fn = build(name)
        ours = wrap(model, plan)
        loss_fn(ours(*example), *example).backward()
        ours.flush()
        logs.append(list(ours.collective_log))
    return logs
