"""The runtime's cost over torch DDP with the same buckets: two gloo ranks on localhost, steps interleaved.

Each rank holds three copies of the model: one under torch DDP, and two
under ``schedopt.runtime.wrap`` with the buckets DDP rebuilds (the
``pytorch-ddp`` plan), one in ``barrier`` mode and one in ``overlap`` mode
(its optimizer through ``wrap_optimizer``). It runs their steps in
ABC CBA order (so drift hits all alike), one compute thread per rank. A step
(zero_grad, forward, backward, SGD step) counts as long as the slower
rank's; an overlap step also ends with ``flush()``, so that it pays for its
own communication and the machinery of deferring (hooks, requests, per-bucket
optimizer calls) is all that differs from barrier mode. It prints, per model,
the medians, the ratios to DDP and of overlap to barrier, and the median of
the per-step ratios; ``--json FILE`` writes them. ``--startup MODEL`` also times ``wrap`` itself on that model (the
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import begin, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


#: How the workers (launched by torchrun) get --seed.
SEED_ENV = "SCHEDOPT_BENCH_SEED"

def startup_worker(model_name: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT / "examples"))
    from train import load

    from schedopt import Cluster, Problem
    from schedopt.importers import from_torch
    from schedopt.runtime import wrap
    from schedopt.solvers import get

    from schedopt.runtime.launch import join_process_group

    torch.set_num_threads(1)
    join_process_group("gloo", what="bench/runtime_overhead.py")
    torch.manual_seed(int(os.environ.get(SEED_ENV, "0")))
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
    from schedopt.runtime import wrap, wrap_optimizer
    from schedopt.solvers import get

    from schedopt.runtime.launch import join_process_group

    torch.set_num_threads(1)
    join_process_group("gloo", what="bench/runtime_overhead.py")
    rank, world = dist.get_rank(), dist.get_world_size()
    seed = int(os.environ.get(SEED_ENV, "0"))
    torch.manual_seed(seed)
    model, example, loss_fn = load(model_name, None)
    graph = from_torch(model, example, loss_fn=loss_fn, name=model_name)
    cluster = Cluster.preset("10gbe", world_size=world)
    plans = {mode: get("pytorch-ddp")(Problem(graph=graph, cluster=cluster, mode=mode)) for mode in ("barrier", "overlap")}
    copies = {"ddp": torch.nn.parallel.DistributedDataParallel(copy.deepcopy(model)),
              "barrier": wrap(copy.deepcopy(model), plans["barrier"]), "overlap": wrap(model, plans["overlap"])}
    optimizers = {k: wrap_optimizer(torch.optim.SGD(m.parameters(), lr=0.01), m) for k, m in copies.items()}
    generator = torch.Generator().manual_seed(seed + 1000 + rank)
    times: dict[str, list[float]] = {k: [] for k in copies}

    def step(kind: str) -> float:
        x = batch(example, generator, torch.device("cpu"))
        started = time.perf_counter()
        optimizers[kind].zero_grad(set_to_none=True)
        loss_fn(copies[kind](*x), *x).backward()
        optimizers[kind].step()
        getattr(copies[kind], "flush", lambda: None)()
        return time.perf_counter() - started

    for _ in range(2):  # warm-up; DDP rebuilds its buckets after its first
        for kind in copies:
            step(kind)
    order = list(copies)
    for i in range(steps):
        for kind in (order if i % 2 == 0 else order[::-1]):
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
    parser.add_argument("--json", help="write the figures here, with the commit and the machine")
    parser.add_argument("--seed", type=int, default=0, help="the models' initialization and the data (default 0)")
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
    begin()
    rows = []
    print(f"{'model':10s} {'ddp ms':>9s} {'barrier ms':>11s} {'overlap ms':>11s} {'barrier/ddp':>12s} "
          f"{'overlap/barrier':>16s} {'(per step)':>11s}")
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        times = _on_two_ranks("--worker", model, str(args.steps), seed=args.seed)
        if times is None:
            return 1
        med = {k: statistics.median(v) for k, v in times.items()}
        pair = {f"{a}/{b}": statistics.median(x / y for x, y in zip(times[a], times[b]))
                for a, b in (("barrier", "ddp"), ("overlap", "barrier"), ("overlap", "ddp"))}
        rows.append({"model": model, "ddp_median_s": med["ddp"], "schedopt_median_s": med["barrier"],
                     "overlap_median_s": med["overlap"], "ratio": med["barrier"] / med["ddp"],
                     "overlap_over_barrier": med["overlap"] / med["barrier"], "pair_ratio_medians": pair,
                     "pair_ratio_median": pair["barrier/ddp"], "num_steps": len(times["ddp"])})
        print(f"{model:10s} {med['ddp'] * 1e3:9.1f} {med['barrier'] * 1e3:11.1f} {med['overlap'] * 1e3:11.1f} "
              f"{med['barrier'] / med['ddp']:12.3f} {med['overlap'] / med['barrier']:16.3f} "
              f"{pair['overlap/barrier']:11.3f}", flush=True)
    if args.startup != "none":
        startup = _on_two_ranks("--startup-worker", args.startup, seed=args.seed)
        if startup is None:
            return 1
        print(f"wrap({startup['model']}, {startup['num_params']:,} parameters) on 2 ranks: {startup['wrap_s']:.2f} s")
        rows.append({"startup": startup})
    if args.json:
        write_result(args.json, rows, vars(args))
    return 0


def _on_two_ranks(*worker_args: str, seed: int) -> dict | None:
    """Run this script's worker under torchrun on 2 local ranks; what rank 0 wrote, or None (said why)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(Path(__file__).resolve()), *worker_args, str(out)]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200,
                              env={**os.environ, "OMP_NUM_THREADS": "1", SEED_ENV: str(seed)})
        if not out.exists():
            print(f"runtime_overhead: {' '.join(worker_args)} failed: {done.stderr.strip().splitlines()[-3:]}",
                  file=sys.stderr)
            return None
        return json.loads(out.read_text())


if __name__ == "__main__":
    raise SystemExit(main())
