"""The runtime's cost over torch DDP with the same buckets: two gloo ranks on localhost, steps interleaved.

Each rank holds two copies of the model: one under torch DDP, one under
``schedopt.runtime.wrap`` with the ``pytorch-ddp`` plan (the buckets DDP
rebuilds), and runs their steps in ABBA order (so drift hits both alike),
one compute thread per rank. A step (zero_grad, forward, backward, SGD step)
counts as long as the slower rank's. It prints, per model, both medians,
their ratio and the median of the per-pair ratios; ``--json FILE`` writes
them. ``--startup MODEL`` also times ``wrap`` itself on that model (the
agreement check, the broadcast of parameters and buffers, the bucket
buffers, the hooks), the slower rank's.

    python bench/runtime_overhead.py --models resnet18,gpt_tied --steps 20
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def startup_worker(model_name: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT / "examples"))
    from train import load

    from schedopt import Cluster, Problem
    from schedopt.importers import from_torch
    from schedopt.runtime import wrap
    from schedopt.solvers import get

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model, example, loss_fn = load(model_name, 1)
    graph = from_torch(model, example, loss_fn=loss_fn, name=model_name)
    plan = get("pytorch-ddp")(Problem(graph=graph, cluster=Cluster.preset("10gbe", world_size=2)))
    dist.barrier()
    started = time.perf_counter()
    wrap(model, plan)
    elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"model": model_name, "wrap_s": elapsed.item(),
                                         "num_params": sum(p.numel() for p in model.parameters())}))
    dist.barrier()
    dist.destroy_process_group()


def worker(model_name: str, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT / "examples"))
    from train import batch, load

    from schedopt import Cluster, Problem
    from schedopt.importers import from_torch
    from schedopt.runtime import wrap
    from schedopt.solvers import get

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model, example, loss_fn = load(model_name, None)
    graph = from_torch(model, example, loss_fn=loss_fn, name=model_name)
    plan = get("pytorch-ddp")(Problem(graph=graph, cluster=Cluster.preset("10gbe", world_size=world)))
    copies = {"ddp": torch.nn.parallel.DistributedDataParallel(copy.deepcopy(model)), "schedopt": wrap(model, plan)}
    optimizers = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in copies.items()}
    generator = torch.Generator().manual_seed(rank)
    times: dict[str, list[float]] = {"ddp": [], "schedopt": []}

    def step(kind: str) -> float:
        x = batch(example, generator, torch.device("cpu"))
        started = time.perf_counter()
        optimizers[kind].zero_grad(set_to_none=True)
        loss_fn(copies[kind](*x), *x).backward()
        optimizers[kind].step()
        return time.perf_counter() - started

    for _ in range(2):  # warm-up; DDP rebuilds its buckets after its first
        step("ddp"), step("schedopt")
    for i in range(steps):
        for kind in (("ddp", "schedopt") if i % 2 == 0 else ("schedopt", "ddp")):
            times[kind].append(step(kind))
    gathered: list = [None] * world
    dist.all_gather_object(gathered, times)
    if rank == 0:
        slowest = {k: [max(ts) for ts in zip(*(g[k] for g in gathered))] for k in times}
        Path(out).write_text(json.dumps(slowest))
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet18,gpt_tied", help="comma-separated example models")
    parser.add_argument("--steps", type=int, default=20, help="measured steps per copy (default 20)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--startup", default="gpt2_small", help="time wrap() on this model (default gpt2_small; "
                        "'none' to skip)")
    parser.add_argument("--worker", nargs=3, metavar=("MODEL", "STEPS", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--startup-worker", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.startup_worker:
        startup_worker(*args.startup_worker)
        sys.stdout.flush()
        os._exit(0)
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), args.worker[2])
        sys.stdout.flush()
        os._exit(0)  # past gloo's teardown, which aborts now and then in torch 2.13 (see examples/train.py)
    rows = []
    print(f"{'model':10s} {'ddp ms':>9s} {'schedopt ms':>12s} {'ratio':>7s} {'pair ratio':>11s}")
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        times = _on_two_ranks("--worker", model, str(args.steps))
        if times is None:
            return 1
        ddp, ours = statistics.median(times["ddp"]), statistics.median(times["schedopt"])
        pair = statistics.median(o / d for o, d in zip(times["schedopt"], times["ddp"]))
        rows.append({"model": model, "ddp_median_s": ddp, "schedopt_median_s": ours, "ratio": ours / ddp,
                     "pair_ratio_median": pair, "num_steps": len(times["ddp"])})
        print(f"{model:10s} {ddp * 1e3:9.1f} {ours * 1e3:12.1f} {ours / ddp:7.3f} {pair:11.3f}", flush=True)
    if args.startup != "none":
        startup = _on_two_ranks("--startup-worker", args.startup)
        if startup is None:
            return 1
        print(f"wrap({startup['model']}, {startup['num_params']:,} parameters) on 2 ranks: {startup['wrap_s']:.2f} s")
        rows.append({"startup": startup})
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def _on_two_ranks(*worker_args: str) -> dict | None:
    """Run this script's worker under torchrun on 2 local ranks; what rank 0 wrote, or None (said why)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(Path(__file__).resolve()), *worker_args, str(out)]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        if not out.exists():
            print(f"runtime_overhead: {' '.join(worker_args)} failed: {done.stderr.strip().splitlines()[-3:]}",
                  file=sys.stderr)
            return None
        return json.loads(out.read_text())


if __name__ == "__main__":
    raise SystemExit(main())
