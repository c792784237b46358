"""Every CUDA path one GPU can exercise, against torch's own DDP, in one run: writes one JSON.

Run by ``bash bench/gpu_check.sh`` (under ``torchrun --nproc-per-node 1``, NCCL). Each check:

1. ``schedopt profile`` on the device (ResNet-18's ops timed there; ``--profile-model``).
2. ``wrap`` in ``barrier``, ``overlap`` and ``osp`` mode (Caramel's plans: chunked buckets, and in
   ``osp`` a stage-2 bucket), 5 SGD-momentum steps on tiny GPT (tied embedding) and tiny ResNet
   (BatchNorm buffers), against DDP from the same seed on the same batches: parameters must be
   equal (at world size 1 every mode's mathematics is DDP's, OSP's correction included, so any
   difference is the runtime's); in ``overlap`` and ``osp`` mode the host's time waiting in the
   forward's settles is recorded, and must stay under 1 ms a step: on CUDA ``work.wait()`` makes
   the compute stream wait for the collective, never the host.
3. The compiled runtime (``schedopt.runtime.compile``, a barrier plan) on the same models: the
   gradients of three steps against DDP's, beside ``torch.compile``'s own (see ``check_compiled``).
4. ``shard`` (FSDP2 configured by a sharded plan) on tiny GPT: the ``fsdp-per-block`` plan with
   deeper prefetches and its last block kept unsharded, the ``fsdp-size`` plan (units of
   several modules), the pipelined units (layers of several blocks in one unit, every all-gather
   issued at the root's forward) and the least-memory plan (a layer each, every one resharded),
   5 AdamW steps against torch's own ``fully_shard`` per block: parameters
   equal and a peak of held bytes recorded. At world size 1 FSDP2 skips its all-gathers and
   reduce-scatters, so the recorder then sees none (checked); its CUDA path is checked on its own:
5. the shard recorder's collectives called directly on the NCCL group, inside a step: each one's
   issue and end resolved from its CUDA events, in order, after the step's start.

A check that raises is recorded as failed, with the error, and the others still run.

``--backend gloo`` on CUDA runs the same checks with real collectives between ranks that share one
GPU (``--nproc-per-node 2``; NCCL refuses two ranks on one device): gloo moves CUDA tensors through
the host on the issuing stream, and ``work.wait()`` makes the current stream wait, NCCL's contract,
so ``wrap``'s events and waits and FSDP2's collectives run with the transfers really in flight. Each
rank trains on its own batches (the reference is DDP over the same ones); rank 0 writes the JSON, a
check passing only where it passed on every rank.

``--device cpu`` runs the same checks on gloo (a dry run of the script itself; the CUDA paths are
then not exercised, and the JSON says so).
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import replace
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parent.parent
MODELS_FILE = ROOT / "examples" / "models.py"  # the example models, wherever the script runs from
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "bench"))
MODELS = ("tiny_gpt", "tiny_resnet")
STEPS = 5
#: The host may spend at most this long per step waiting in the forward's settles (overlap, osp) on CUDA.
HOST_WAIT_LIMIT_S = 1e-3
#: ``--seed``: the models' initialization and the batches.
SEED = 0


def plans_for(name: str, example: tuple, loss_fn: Any, model: torch.nn.Module) -> dict[str, Any]:
    """Caramel's eager plan per mode, made from a CPU copy of the model."""
    from schedopt import Cluster, Problem
    from schedopt.importers import from_torch
    from schedopt.solvers import get

    cpu = copy.deepcopy(model).cpu()
    graph = from_torch(cpu, tuple(x.cpu() for x in example), loss_fn=loss_fn, name=name)
    cluster = Cluster.preset("100gbe", world_size=8)
    plans = {mode: get("caramel")(Problem(graph=graph, cluster=cluster, mode=mode, max_stale_fraction=0.9))
             for mode in ("barrier", "overlap", "osp")}
    for mode, plan in plans.items():  # exercise chunks (an event per chunk), whatever caramel chose
        if not any(b.chunks > 1 for b in plan.buckets):
            k = max(range(len(plan.buckets)), key=lambda i: sum(graph.params[n].numel for n in plan.buckets[i].params))
            buckets = list(plan.buckets)
            buckets[k] = replace(buckets[k], chunks=min(3, sum(graph.params[n].numel for n in buckets[k].params)))
            plans[mode] = replace(plan, buckets=tuple(buckets), predicted=None)
    osp = plans["osp"]
    if not any(b.stage == 2 for b in osp.buckets):  # exercise stage 2 whatever the stage choice found
        first = replace(osp.buckets[0], stage=2)
        plans["osp"] = replace(osp, buckets=(first, *osp.buckets[1:]), predicted=None)
    return plans


def train(model: torch.nn.Module, batches: list[tuple], loss_fn: Any) -> tuple[list, float]:
    """``STEPS`` SGD-momentum steps; the final parameters and the host's wait per step in settles."""
    from schedopt.runtime import wrap_optimizer

    optimizer = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model)
    waited = 0.0
    for inputs in batches[:STEPS]:
        optimizer.zero_grad()
        loss_fn(model(*inputs), *inputs).backward()
        optimizer.step()
        deferred = getattr(model, "deferred", None)
        if deferred is not None:
            waited += sum(s.wait_s for s in deferred.settled)
    if hasattr(model, "flush"):
        model.flush()
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    return [p.detach().clone() for p in model.parameters()], waited / STEPS


def max_diff(ours: list, ref: list) -> float:
    return max(float((a - b).abs().max()) for a, b in zip(ours, ref))


def spread_across_ranks(params: list) -> float:
    """The largest difference between this rank's parameters and rank 0's (0.0 at world size 1)."""
    flat = torch.cat([p.reshape(-1) for p in params])
    first = flat.clone()
    dist.broadcast(first, src=0)
    return float((flat - first).abs().max())


def check_profile(name: str, device: torch.device) -> dict:
    """``schedopt profile`` on the device: the model's ops timed there, and how well they sum to its step."""
    from schedopt.importers.profile import profile_torch
    from train import load

    torch.manual_seed(SEED)
    model, example, loss_fn = load(f"{MODELS_FILE}:{name}", None)
    started = time.perf_counter()
    graph, report = profile_torch(model.to(device), tuple(x.to(device) for x in example), loss_fn=loss_fn,
                                  name=name, iterations=5)
    return {"check": "profile", "model": name, "ok": report.device == device.type and report.num_ops_timed > 0,
            "measured_step_s": report.measured_step_s, "predicted_step_s": report.predicted_step_s,
            "num_ops": len(graph.ops), "seconds": time.perf_counter() - started}


def on_device(name: str, device: torch.device, *, batches: int, seed: int) -> tuple:
    """(model, example, loss_fn, batches): the example model from ``SEED`` on ``device``, and
    ``batches`` new batches drawn from ``SEED + seed``."""
    from train import batch, load

    torch.manual_seed(SEED)
    model, example, loss_fn = load(f"{MODELS_FILE}:{name}", None)
    model.to(device)
    example = tuple(x.to(device) for x in example)
    generator = torch.Generator().manual_seed(SEED + seed + 1000 * dist.get_rank())  # each rank its own batches
    return model, example, loss_fn, [batch(example, generator, device) for _ in range(batches)]


def check_wrap(name: str, device: torch.device) -> list[dict]:
    from schedopt.runtime import wrap

    model, example, loss_fn, batches = on_device(name, device, batches=STEPS, seed=1)
    plans = plans_for(name, example, loss_fn, model)
    reference, _ = train(torch.nn.parallel.DistributedDataParallel(copy.deepcopy(model)), batches, loss_fn)
    out = []
    for mode, plan in plans.items():
        started = time.perf_counter()
        params, wait_s = train(wrap(copy.deepcopy(model), plan), batches, loss_fn)
        diff, spread = max_diff(params, reference), spread_across_ranks(params)
        # OSP's stage 2 reads last step's average: DDP's mathematics only at world size 1; at more
        # ranks the check is that every rank commits the same parameters.
        exact = spread == 0.0 and (diff == 0.0 or (mode == "osp" and dist.get_world_size() > 1))
        ok = exact and (mode == "barrier" or device.type != "cuda" or wait_s < HOST_WAIT_LIMIT_S)
        out.append({"check": f"wrap-{mode}", "model": name, "ok": ok, "max_param_diff": diff,
                    "rank_spread": spread,
                    "host_wait_per_step_s": wait_s if mode != "barrier" else None,
                    "stage2_params": sum(len(b.params) for b in plan.buckets if b.stage == 2),
                    "chunked_buckets": sum(b.chunks > 1 for b in plan.buckets),
                    "seconds": time.perf_counter() - started})
    return out


def check_compiled(name: str, device: torch.device) -> dict:
    """The compiled runtime's gradients against DDP's, beside torch.compile's own (the control).

    On CUDA, cuDNN's convolutions run in TF32 by default and may pick other algorithms for other
    call shapes, and a compiled graph's BatchNorm is not eager's cuDNN kernel: torch.compile alone
    moves gradients there. So the check runs with TF32 off and deterministic cuDNN, and passes when
    the plan's compiled step is exact to 1e-6 of the largest gradient, or no further from DDP than
    ``torch.compile(DDP(model), backend="aot_eager")`` is (``control_rel_diff``).
    """
    from schedopt.runtime import compile as compile_plan

    model, example, loss_fn, batches = on_device(name, device, batches=3, seed=2)
    plan = plans_for(name, example, loss_fn, model)["barrier"]
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(model))
    runs = {"ours": compile_plan(copy.deepcopy(model), plan),
            "control": torch.compile(torch.nn.parallel.DistributedDataParallel(copy.deepcopy(model)),
                                     backend="aot_eager")}
    flags = (torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic)
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic = False, True
    started, worst, scale, per_param = time.perf_counter(), {k: 0.0 for k in runs}, 0.0, {}
    try:
        for step, inputs in enumerate(batches):
            for m in (ddp, *runs.values()):
                m.zero_grad()
                loss_fn(m(*inputs), *inputs).backward()
            scale = max(scale, max(float(p.grad.abs().max()) for p in ddp.parameters()))
            for key, m in runs.items():
                for (n, a), b in zip(m.module.named_parameters(), ddp.parameters()):
                    d = float((a.grad - b.grad).abs().max())
                    worst[key] = max(worst[key], d)
                    if key == "ours" and d > per_param.get(n, (0.0,))[0]:
                        per_param[n] = (d, step)
        error = None
    except Exception as exc:  # noqa: BLE001 - reported in the JSON, the check fails
        error = f"{type(exc).__name__}: {exc}"
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic = flags
    rel = {k: v / max(scale, 1e-30) for k, v in worst.items()}
    ours = runs["ours"]
    return {"check": "compiled", "model": name, "ok": error is None and rel["ours"] <= max(1e-6, rel["control"]),
            "max_grad_diff": worst["ours"], "rel_diff": rel["ours"], "control_rel_diff": rel["control"],
            "largest_grad": scale, "error": error, "plan_execution": plan.execution,
            "worst_params": sorted(((d, n, s) for n, (d, s) in per_param.items()), reverse=True)[:5],
            "unplanned": {k: v[:8] for k, v in ours.unplanned.items()},
            "seconds": time.perf_counter() - started}


def sharded_plans(model: torch.nn.Module, example: tuple, loss_fn: Any, name: str) -> dict[str, Any]:
    """The sharded plans the check applies, made from a CPU copy of the model (see the module docstring)."""
    from schedopt import Cluster, Problem
    from schedopt.importers import from_torch
    from schedopt.solvers import get
    from schedopt.solvers.fine_units import least_memory_plan, pipelined_plan

    cpu = copy.deepcopy(model).cpu()
    graph = from_torch(cpu, tuple(x.cpu() for x in example), loss_fn=loss_fn, name=name)
    problem = Problem(graph=graph, cluster=Cluster.preset("100gbe", world_size=8), mode="sharded")
    per_block = get("fsdp-per-block")(problem)
    units = list(per_block.units)
    for k in range(1, len(units)):  # every all-gather issued two units ahead, where there are two
        units[k] = replace(units[k], prefetch_forward=min(2, k))
    units[-1] = replace(units[-1], reshard_after_forward=False, prefetch_backward=0)
    deeper = replace(per_block, units=tuple(units), predicted=None)
    plans = {"per-block-deeper": deeper, "size": get("fsdp-size")(problem),
             "pipelined": pipelined_plan(problem), "least-memory": least_memory_plan(problem)[0]}
    return {label: plan for label, plan in plans.items() if plan is not None}


def check_shard(name: str, device: torch.device) -> list[dict]:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from schedopt.runtime import records, shard
    from schedopt.runtime.sharded import per_block_units

    model, example, loss_fn, batches = on_device(name, device, batches=STEPS, seed=3)
    plans = sharded_plans(model, example, loss_fn, name)
    whole = lambda m: [(p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for p in m.parameters()]

    def adamw(m: torch.nn.Module) -> list:
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        for inputs in batches:
            opt.zero_grad()
            loss_fn(m(*inputs), *inputs).backward()
            opt.step()
        torch.cuda.synchronize() if device.type == "cuda" else None
        return whole(m)

    reference = copy.deepcopy(model)
    named = dict(reference.named_modules())
    for unit in per_block_units(reference):
        if not unit.is_root:
            fully_shard(named[unit.modules[0]])
    expected = adamw(fully_shard(reference))
    out = []
    for label, plan in plans.items():
        started = time.perf_counter()
        sharded = shard(copy.deepcopy(model), plan)
        diff = max_diff(adamw(sharded), expected)
        steps = records(sharded).steps
        collectives = [c for st in steps for c in st.collectives]
        resolved = all(c.end_s is not None and 0.0 <= c.issue_s <= c.end_s for c in collectives)
        seen = bool(collectives) == (dist.get_world_size() > 1)  # FSDP2 communicates only across ranks
        out.append({"check": f"shard-{label}", "model": name, "ok": diff == 0.0 and resolved and seen,
                    "max_param_diff": diff, "units": len(plan.units), "collectives": len(collectives),
                    "times_resolved": resolved,
                    "last_step_collectives": [c.to_json() for c in steps[-1].collectives][:8],
                    "peak_bytes": records(sharded).peak_bytes(steps[-1]), "seconds": time.perf_counter() - started})
    return out


def check_recorder(name: str, device: torch.device) -> dict:
    """The shard recorder's collectives, called as FSDP2 calls them, timed from the stream (see above)."""
    from schedopt.runtime import records, shard
    from train import load

    torch.manual_seed(SEED)
    model, _, _ = load(f"{MODELS_FILE}:{name}", None)
    rec = records(shard(model.to(device)))
    gather, scatter = rec.comms(0)
    world, rank = dist.get_world_size(), dist.get_rank()
    rec.begin_step()
    shard_in = torch.randn(1 << 20, device=device)
    gathered = torch.empty(world << 20, device=device)
    gather(gathered, shard_in, dist.group.WORLD)
    scattered = torch.empty(1 << 20, device=device)
    scatter(scattered, gathered, dist.group.WORLD, op=dist.ReduceOp.SUM)
    step = rec.steps[-1]
    times = [(c.kind, c.issue_s, c.end_s) for c in step.collectives]
    ordered = all(e is not None and 0.0 <= i <= e for _, i, e in times) and times[0][2] <= times[1][1] + 1e-6
    exact = bool(torch.equal(gathered[rank << 20: (rank + 1) << 20], shard_in)) and (world > 1 or bool(torch.equal(scattered, shard_in)))
    return {"check": "shard-recorder", "model": name, "ok": len(times) == 2 and ordered and exact,
            "events": device.type == "cuda", "collectives": times}


def guarded(check: Any, *args: Any) -> list[dict]:
    """The check's rows; one failed row, with the error, where it raised."""
    try:
        rows = check(*args)
    except Exception as exc:  # noqa: BLE001 - reported in the JSON, the check fails
        import traceback

        traceback.print_exc()
        return [{"check": check.__name__.removeprefix("check_"), "model": str(args[0]), "ok": False,
                 "error": f"{type(exc).__name__}: {exc}"}]
    return rows if isinstance(rows, list) else [rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--backend", choices=("nccl", "gloo"),
                        help="the process group's (default nccl on cuda, gloo on cpu; gloo on cuda lets ranks share a GPU)")
    parser.add_argument("--json", required=True, help="write the checks here, with the commit and the machine")
    parser.add_argument("--seed", type=int, default=0, help="the models' initialization and the batches")
    parser.add_argument("--models", default=",".join(MODELS), help=f"example models to train (default {','.join(MODELS)})")
    parser.add_argument("--profile-model", default="resnet18",
                        help="the example model to profile (default resnet18; empty: no profile check)")
    parser.add_argument("--shard-model", default="tiny_gpt", help="the example model to shard (default tiny_gpt)")
    args = parser.parse_args(argv)
    global SEED
    SEED = args.seed
    from provenance import provenance
    from schedopt.errors import SchedoptError
    from schedopt.runtime.launch import join_process_group

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (use --device cpu for a dry run on gloo)", file=sys.stderr)
        return 2
    backend = args.backend or ("nccl" if args.device == "cuda" else "gloo")
    if args.device == "cpu" and backend == "nccl":
        print("gpu_check: NCCL needs --device cuda", file=sys.stderr)
        return 2
    try:
        where = join_process_group(backend, what="bench/gpu_check.py")
    except SchedoptError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    if args.device == "cuda" and backend == "gloo":  # ranks may share the GPUs there are
        torch.cuda.set_device(where.local_rank % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    checks: list[dict] = []
    try:
        if args.profile_model:
            checks += guarded(check_profile, args.profile_model, device)
        for name in [m for m in args.models.split(",") if m]:
            checks += guarded(check_wrap, name, device)
            checks += guarded(check_compiled, name, device)
        checks += guarded(check_shard, args.shard_model, device)
        checks += guarded(check_recorder, args.shard_model, device)
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, [c["ok"] for c in checks])
        for k, c in enumerate(checks):  # a check passes where it passed on every rank
            c["ok"] = all(len(oks) == len(checks) and oks[k] for oks in everyone)
    finally:
        dist.destroy_process_group()
    if where.rank != 0:
        return 0 if all(c["ok"] for c in checks) else 1
    for c in checks:
        print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['check']:14s} {c['model']:12s} "
              + ", ".join(f"{k} {v}" for k, v in c.items() if k not in ("check", "model", "ok")), flush=True)
    result = {**provenance(vars(args)), "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (dry run: no CUDA path)",
              "backend": backend, "world_size": len(everyone), "torch": torch.__version__, "checks": checks, "ok": all(c["ok"] for c in checks)}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
