"""Train an example model data-parallel on synthetic data, with schedopt's plan or with plain DDP.

Launch it with torchrun; the plan comes from the environment, nothing else changes:

    schedopt plan examples/models.py:resnet18 --solver caramel --world-size 2 -o plan.json
    SCHEDOPT_PLAN=plan.json torchrun --nproc-per-node 2 examples/train.py resnet18 --steps 20
    torchrun --nproc-per-node 2 examples/train.py resnet18 --steps 20 --ddp       # the baseline

Sharded training goes through torch's own FSDP2: ``--shard`` applies the sharded plan in
``$SCHEDOPT_PLAN`` (``schedopt.runtime.shard``: its units, reshards and prefetches), ``--fsdp`` is the
baseline, FSDP2 per repeated block with its defaults (torchtitan's layout; it ignores the plan):

    schedopt plan graph.json --mode sharded --solver cpsat --cluster cluster.json -o sharded.json
    SCHEDOPT_PLAN=sharded.json torchrun --nproc-per-node 2 examples/train.py gpt_tied --shard
    torchrun --nproc-per-node 2 examples/train.py gpt_tied --fsdp
    torchrun --nproc-per-node 4 examples/train.py gpt_tied --fsdp --replicas 2     # HSDP: 2 replicas of 2

With ``--compile`` the plan runs inside ``torch.compile`` (``schedopt.runtime.compile``: its op order
too), and ``--ddp --compile`` is ``torch.compile`` of a DDP model (the compiled baseline; backend
``aot_eager`` by default, which runs the aten graphs as schedopt's compiled runtime does).

Across machines it is plain torchrun, the same command on every node:

    SCHEDOPT_PLAN=plan.json torchrun --nnodes 2 --node-rank R --nproc-per-node 8 \\
        --master-addr HOST0 --master-port 29500 examples/train.py resnet18

MODEL is an example model's name (``examples/models.py``) or ``path/to/file.py:factory``.
Each rank draws its own batches (before timing), shaped like the factory's example inputs.
Every rank times its steps from one step's start to the next (an overlap plan's
communication ends in the next step's forward; one more step runs after the last measured
one, so that each measured step is a steady-state one). The figure printed is the *period*: the
slowest rank's measured time over its number of steps, which is what throughput is. The slowest
rank's time per step (``step_s`` in ``--json``) overstates it where the ranks are loosely coupled:
in overlap mode they drift a step's jitter apart and back, rank 0's step long where rank 1's is
short, so the per-step maximum takes the long one of each pair (ResNet-18 on the testbed: a
period of 826 ms, a median per-step maximum of 923;
``bench/results/testbed_resnet18_550mbit_compiled_run3.json``). ``--json`` writes the steps of
every rank; rank 0's forward, backward and optimizer times per step, by the host's clock (on CUDA:
until the host returned, not until the kernels ran); in overlap and osp modes how long rank
0's forward waited for the network in each step; rank 0's backward tail per step (from the last
gradient's accumulation to ``backward()``'s return: DDP's exposed communication; not measured
sharded or compiled); ``first_step``, the loop index of the first measured step (a profiler
trace's ``ProfilerStep#N`` is loop index N); sharded, rank 0's every all-gather and
reduce-scatter (with ``--replicas``, all-reduce) per step (kind, unit, bytes, issue and end in s from
the step's start) and its peak
of shards plus unsharded parameters and gradients per step.
NCCL with CUDA (one GPU per local rank), gloo on CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent


def load(model: str, batch_size: int | None):
    """Return (model, example inputs, loss_fn) for an example name or a ``file.py:factory`` spec."""
    from schedopt.importers import load_factory

    spec = model if ":" in model else f"{HERE / 'models.py'}:{model}"
    made = load_factory(spec, batch_size=batch_size)
    return made.model, made.example_inputs, made.loss_fn


def batch(example: tuple, generator: torch.Generator, device: torch.device) -> tuple:
    """New inputs shaped like ``example``: normal floats, integers below the example's maximum."""
    out = []
    for x in example:
        if not isinstance(x, torch.Tensor):
            out.append(x)
        elif x.is_floating_point():
            out.append(torch.randn(x.shape, generator=generator, dtype=x.dtype).to(device))
        else:
            out.append(torch.randint(0, int(x.max()) + 1, x.shape, generator=generator, dtype=x.dtype).to(device))
    return tuple(out)


class _NoProfiler:
    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False

    def step(self) -> None:
        pass


def profiler_for(args, rank: int, cuda: bool):
    """torch.profiler over the last measured steps (``--profile DIR``: DIR/rank{R}.json), or nothing.

    The schedule skips the warm-up steps and all but the last few measured ones, warms the profiler up
    for one step, then records up to 3 (``ProfilerStep#N`` spans: what ``schedopt diagnose`` reads)."""
    if not args.profile:
        return _NoProfiler()
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile, schedule

    Path(args.profile).mkdir(parents=True, exist_ok=True)
    # every op's arguments (what gives a collective's bytes) made ResNet-18's profiled backward on CPU
    # 1.7x longer here (630-713 ms against 349-434 without; unprofiled steps ~500 ms): only when asked
    torch._C._profiler._set_record_concrete_inputs_enabled_val(args.profile_sizes)
    try:  # every thread: schedopt's gloo channel issues its collectives from a thread of its own
        config = {"experimental_config": _ExperimentalConfig(profile_all_threads=True)}
    except TypeError:  # a torch before profile_all_threads: the training thread's ops (on CUDA, every kernel)
        config = {}
    active = max(1, min(3, args.steps - 1))
    skip = args.warmup + max(0, args.steps - active - 1)
    return profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])],
                   schedule=schedule(skip_first=skip, wait=0, warmup=1, active=active, repeat=1),
                   record_shapes=args.profile_sizes, **config,
                   on_trace_ready=lambda p: p.export_chrome_trace(str(Path(args.profile) / f"rank{rank}.json")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="example model name (resnet18, gpt_tied, ...) or file.py:factory")
    parser.add_argument("--ddp", action="store_true", help="train with torch DDP, ignoring $SCHEDOPT_PLAN")
    parser.add_argument("--shard", action="store_true", help="sharded: the plan in $SCHEDOPT_PLAN through FSDP2")
    parser.add_argument("--fsdp", action="store_true",
                        help="sharded baseline: FSDP2 per repeated block, its defaults (ignores $SCHEDOPT_PLAN)")
    parser.add_argument("--replicas", type=int, default=1,
                        help="--shard, --fsdp: HSDP, the ranks as this many replicas on a 2-D mesh (default 1: FSDP)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile: the plan with schedopt's compiled runtime, or (with --ddp) the DDP model")
    parser.add_argument("--compile-backend", default="aot_eager",
                        help="torch.compile backend of --ddp --compile (default aot_eager; inductor generates code)")
    parser.add_argument("--steps", type=int, default=20, help="measured steps (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="steps before measuring (default 2)")
    parser.add_argument("--batch-size", type=int, default=None, help="per-rank batch size (the factory's default)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0, help="the model's initialization; rank r's data uses seed + 1000 + r")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per rank (default: torch's)")
    parser.add_argument("--json", help="rank 0 writes the per-step times (every rank's) here")
    parser.add_argument("--quiet", action="store_true", help="no per-step lines")
    parser.add_argument("--profile", metavar="DIR",
                        help="write a Chrome trace per rank (DIR/rank{R}.json) of the last measured steps "
                             "(torch.profiler: wait 1, warm-up 1, then active; read it with schedopt diagnose)")
    parser.add_argument("--profile-sizes", action="store_true",
                        help="--profile records every op's arguments too, which gives each collective's bytes "
                             "(on CPU it slows the profiled steps: ResNet-18's backward 1.7x)")
    args = parser.parse_args(argv)

    from schedopt.errors import SchedoptError
    from schedopt.runtime import compile as compile_plan
    from schedopt.runtime import wrap, wrap_optimizer

    if args.ddp + args.shard + args.fsdp > 1 or args.compile and (args.shard or args.fsdp):
        print("train.py: choose one of --ddp, --shard and --fsdp (--compile goes with a bucketed plan or --ddp)",
              file=sys.stderr)
        return 2
    if args.replicas < 1 or args.replicas > 1 and not (args.shard or args.fsdp):
        print("train.py: --replicas takes a whole number from 1, with --shard or --fsdp", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    from schedopt.rendezvous import check_rendezvous_env
    from schedopt.runtime.launch import join_process_group

    try:
        where = check_rendezvous_env(what="examples/train.py")
        if where.world_size % args.replicas:  # before any rank waits for the others
            print(f"train.py: --replicas {args.replicas} does not divide the {where.world_size} ranks", file=sys.stderr)
            return 2
        join_process_group(what="examples/train.py")
    except SchedoptError as exc:
        print(f"train.py: {exc}", file=sys.stderr)
        return 2
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    try:
        torch.manual_seed(args.seed)
        model, example, loss_fn = load(args.model, args.batch_size)
        model.to(device)
        last_grad = [0.0]  # when the last gradient of the step was accumulated (host clock)
        timed_tail = not (args.shard or args.fsdp or args.compile)  # the backward's tail (see --json)
        if timed_tail:
            for p in model.parameters():
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(lambda _, cell=last_grad: cell.__setitem__(0, time.perf_counter()))
        plan = None if args.ddp or args.fsdp else os.environ.get("SCHEDOPT_PLAN")
        if args.shard or args.fsdp:
            from torch.distributed.device_mesh import init_device_mesh

            from schedopt.runtime import shard  # FSDP2's imports, only where it runs

            if args.fsdp:
                os.environ.pop("SCHEDOPT_PLAN", None)
            mesh = None if args.replicas == 1 else init_device_mesh(
                device.type, (args.replicas, world // args.replicas), mesh_dim_names=("replicate", "shard"))
            ddp_model = shard(model, mesh=mesh)  # a 2-D mesh: HSDP, replicated over the first dimension
        elif args.ddp:
            ddp_model = torch.nn.parallel.DistributedDataParallel(model)
            if args.compile:
                ddp_model = torch.compile(ddp_model, backend=args.compile_backend)
        else:
            ddp_model = compile_plan(model) if args.compile else wrap(model)
        kind = ("fsdp" if args.fsdp else "schedopt-sharded" if args.shard else
                "ddp" if args.ddp or isinstance(ddp_model, torch.nn.parallel.DistributedDataParallel)
                else "schedopt") + ("-compiled" if args.compile else "")
        # the user's own optimizer; with an overlap plan it steps per bucket, where the next forward reads
        optimizer = wrap_optimizer(torch.optim.SGD(ddp_model.parameters(), lr=args.lr), ddp_model)
        generator = torch.Generator().manual_seed(args.seed + 1000 + rank)
        # one step more than measured: the last measured step ends where the next begins
        batches = [batch(example, generator, device) for _ in range(args.warmup + args.steps + 1)]
        marks: list[float] = []  # when each measured step began, and the step after the last
        waits: list[float] = []  # overlap mode: time the forward waited for the network, per step
        settles: list[list] = []  # and each settle: bucket, where, what, waited (s)
        phases: list[list[float]] = []  # rank 0, per measured step: forward, backward, optimizer (s, host clock)
        tails: list[float] = []  # per measured step: from the last gradient's accumulation to backward's return
        profiler = profiler_for(args, rank, cuda)
        profiler.__enter__()
        for step, x in enumerate(batches):
            if cuda:
                torch.cuda.synchronize()
            if step >= args.warmup:
                marks.append(time.perf_counter())
            if step == len(batches) - 1:
                break
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(ddp_model(*x), *x)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            optimizer.step()
            if step >= args.warmup:
                phases.append([t1 - t0, t2 - t1, time.perf_counter() - t2])
                if timed_tail:  # None: no gradient accumulated in this backward
                    tails.append(t2 - last_grad[0] if last_grad[0] > t1 else None)
            deferred = getattr(ddp_model, "deferred", None)
            if deferred is not None and step >= args.warmup:
                waits.append(sum(s.wait_s for s in deferred.settled))
                settles.append([[s.bucket, s.where, s.what, round(s.wait_s, 6)] for s in deferred.settled])
            if rank == 0 and not args.quiet:
                label = "warm-up" if step < args.warmup else "step"
                print(f"{label} {step:3d}  loss {loss.item():.4f}", flush=True)
            profiler.step()
        profiler.__exit__(None, None, None)
        getattr(ddp_model, "flush", lambda: None)()  # overlap mode: the last step's updates
        recorder = None
        if args.shard or args.fsdp:
            from schedopt.runtime import records

            recorder = records(ddp_model)  # FSDP2's collectives and memory, per step
        sharded = [] if recorder is None else recorder.steps[args.warmup:args.warmup + args.steps]
        channel = getattr(ddp_model, "channel", None)  # gloo, overlap and osp: the link's use, rank 0
        transfers = [[t.numel, t.queued_s, t.started_s, t.done_s] for t in channel.history] if channel else []
        # a step is the time from its start to the next one's: in overlap mode a step's
        # communication ends inside the next step's forward
        times = [b - a for a, b in zip(marks, marks[1:])]
        gathered: list = [None] * world
        dist.all_gather_object(gathered, times)
        slowest = [max(ts) for ts in zip(*gathered)]
        period = max(sum(ts) / len(ts) for ts in gathered)
        if rank == 0:
            median = statistics.median(slowest)
            print(f"{kind}: {args.model} on {world} ranks ({'nccl' if cuda else 'gloo'}), "
                  f"{period * 1e3:.1f} ms per step over {len(slowest)} steps (the slowest rank's step: median "
                  f"{median * 1e3:.1f}, min {min(slowest) * 1e3:.1f}, max {max(slowest) * 1e3:.1f})"
                  + (f", plan {plan}" if kind.startswith("schedopt") else ""), flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps({
                    "kind": kind, "model": args.model, "plan": plan, "world_size": world,
                    "period_s": period, "step_s": slowest, "rank_step_s": gathered, "median_s": median,
                    "rank0_wait_s": waits, "rank0_settles": settles, "rank0_phases_s": phases,
                    "rank0_backward_tail_s": tails, "first_step": args.warmup,
                    "rank0_step_marks_s": marks, "rank0_transfers": transfers,
                    "rank0_collectives": [[c.to_json() for c in st.collectives] for st in sharded],
                    "rank0_peak_bytes": [recorder.peak_bytes(st) for st in sharded],
                }, indent=1))
    except SchedoptError as exc:
        print(f"train.py: rank {rank}: {exc}", file=sys.stderr)
        return 2
    finally:
        # every rank leaves together: gloo aborts ("terminate called without an active exception",
        # 1 run in 6 here) when one rank tears its group down while the other still uses it
        dist.barrier()
        dist.destroy_process_group()
        # what the run built lives until the process leaves without destructors (below): freeing the
        # DDP model and the profiler as this frame unwinds hung the process now and then under load
        # (py-spy: both ranks idle at `status = main()`, every step done and reported)
        _KEEP.append(dict(locals()))
    return 0


#: objects ``main`` built, kept from destruction until the process leaves with ``os._exit``
_KEEP: list = []


if __name__ == "__main__":
    status = main()
    # Leave without running C++ static destructors: torch 2.13's gloo aborts in them now and then
    # ("terminate called without an active exception", SIGABRT, about 1 run in 6 on the testbed)
    # after everything above has finished and been written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
