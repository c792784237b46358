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
   gradients of three steps against DDP's.

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


def check_profile(name: str, device: torch.device) -> dict:
    """``schedopt profile`` on the device: the model's ops timed there, and how well they sum to its step."""
    from schedopt.importers.profile import profile_torch
    from train import load

    torch.manual_seed(SEED)
    model, example, loss_fn = load(f"examples/models.py:{name}", None)
    started = time.perf_counter()
    graph, report = profile_torch(model.to(device), tuple(x.to(device) for x in example), loss_fn=loss_fn,
                                  name=name, iterations=5)
    return {"check": "profile", "model": name, "ok": report.device == device.type and report.num_ops_timed > 0,
            "measured_step_s": report.measured_step_s, "predicted_step_s": report.predicted_step_s,
            "num_ops": len(graph.ops), "seconds": time.perf_counter() - started}


def check_wrap(name: str, device: torch.device) -> list[dict]:
    from schedopt.runtime import wrap
    from train import batch, load

    torch.manual_seed(SEED)
    model, example, loss_fn = load(f"examples/models.py:{name}", None)
    model.to(device)
    example = tuple(x.to(device) for x in example)
    plans = plans_for(name, example, loss_fn, model)
    generator = torch.Generator().manual_seed(SEED + 1)
    batches = [batch(example, generator, device) for _ in range(STEPS)]
    reference, _ = train(torch.nn.parallel.DistributedDataParallel(copy.deepcopy(model)), batches, loss_fn)
    out = []
    for mode, plan in plans.items():
        started = time.perf_counter()
        params, wait_s = train(wrap(copy.deepcopy(model), plan), batches, loss_fn)
        diff = max_diff(params, reference)
        ok = diff == 0.0 and (mode == "barrier" or device.type != "cuda" or wait_s < HOST_WAIT_LIMIT_S)
        out.append({"check": f"wrap-{mode}", "model": name, "ok": ok, "max_param_diff": diff,
                    "host_wait_per_step_s": wait_s if mode != "barrier" else None,
                    "stage2_params": sum(len(b.params) for b in plan.buckets if b.stage == 2),
                    "chunked_buckets": sum(b.chunks > 1 for b in plan.buckets),
                    "seconds": time.perf_counter() - started})
    return out


def check_compiled(name: str, device: torch.device) -> dict:
    from schedopt.runtime import compile as compile_plan
    from train import batch, load

    torch.manual_seed(SEED)
    model, example, loss_fn = load(f"examples/models.py:{name}", None)
    model.to(device)
    example = tuple(x.to(device) for x in example)
    plan = plans_for(name, example, loss_fn, model)["barrier"]
    generator = torch.Generator().manual_seed(SEED + 2)
    batches = [batch(example, generator, device) for _ in range(3)]
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(model))
    ours = compile_plan(copy.deepcopy(model), plan)
    started, worst = time.perf_counter(), 0.0
    try:
        for inputs in batches:
            for m in (ddp, ours):
                m.zero_grad()
                loss_fn(m(*inputs), *inputs).backward()
            worst = max(worst, max(float((a.grad - b.grad).abs().max())
                                   for a, b in zip(ours.parameters(), ddp.parameters())))
        error = None
    except Exception as exc:  # noqa: BLE001 - reported in the JSON, the check fails
        error = f"{type(exc).__name__}: {exc}"
    return {"check": "compiled", "model": name, "ok": error is None and worst <= 1e-6, "max_grad_diff": worst,
            "error": error, "seconds": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--json", required=True, help="write the checks here, with the commit and the machine")
    parser.add_argument("--seed", type=int, default=0, help="the models' initialization and the batches")
    parser.add_argument("--models", default=",".join(MODELS), help=f"example models to train (default {','.join(MODELS)})")
    parser.add_argument("--profile-model", default="resnet18", help="the example model to profile (default resnet18)")
    args = parser.parse_args(argv)
    global SEED
    SEED = args.seed
    from provenance import provenance
    from schedopt.errors import SchedoptError
    from schedopt.runtime.launch import join_process_group

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (use --device cpu for a dry run on gloo)", file=sys.stderr)
        return 2
    try:
        join_process_group("nccl" if args.device == "cuda" else "gloo", what="bench/gpu_check.py")
    except SchedoptError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    checks: list[dict] = []
    try:
        checks.append(check_profile(args.profile_model, device))
        for name in [m for m in args.models.split(",") if m]:
            checks += check_wrap(name, device)
            checks.append(check_compiled(name, device))
    finally:
        dist.destroy_process_group()
    for c in checks:
        print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['check']:14s} {c['model']:12s} "
              + ", ".join(f"{k} {v}" for k, v in c.items() if k not in ("check", "model", "ok")), flush=True)
    result = {**provenance(vars(args)), "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (dry run: no CUDA path)",
              "torch": torch.__version__, "checks": checks, "ok": all(c["ok"] for c in checks)}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
