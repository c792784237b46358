"""Where the testbed's interference comes from: the CPU gloo's threads take, and what compute loses.

    sudo python bench/interference.py --rate 700mbit --model examples/models.py:resnet18 \\
        --json bench/results/interference.json

Two ranks in the testbed's namespaces over a capped veth (``testbed.Link``), one compute thread each,
launched with torchrun. Per round, every rank at once and in turn (ABC, then CBA): the compute alone
for ``--seconds``; all-reduces alone, sent one after another from a thread as the calibration's load
sends them (``runtime.calibrate.AllReduceLoad``); and both together. For each phase each rank reads the CPU time of its compute thread
and of everything else in the process (gloo's loop and worker threads, the sending thread), and the
compute's rate (units per second).

A row says how much slower the compute ran beside the all-reduces (the interference the simulator
uses), how much CPU the other threads took meanwhile (cores; two cores in all, one per rank), and how
much less work the compute thread did per second *of its own CPU*: what the other threads' CPU does
not explain (cache and scheduling: the compute is preempted, not only shared). Medians over rounds
and ranks. The figures go in ``docs/testbed.md``'s "What the model still leaves out".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("compute", "comm", "both")


def run_phase(name: str, unit, nbytes: int, seconds: float) -> dict[str, float]:
    """One phase on this rank (every rank at once): its wall time, compute rate and threads' CPU."""
    import torch.distributed as dist

    from runtime.calibrate import AllReduceLoad

    dist.barrier()
    load = AllReduceLoad(nbytes) if name != "compute" else contextlib.nullcontext()
    process0, own0, t0, units = time.process_time(), time.thread_time(), time.perf_counter(), 0
    with load:
        if name == "comm":
            time.sleep(seconds)
        else:
            while time.perf_counter() - t0 < seconds:
                unit()
                units += 1
        wall = time.perf_counter() - t0
    own = time.thread_time() - own0  # the process's CPU counts threads that have ended, too
    return {"wall_s": wall, "units_per_s": units / wall, "compute_cpu_s": own,
            "other_cpu_s": time.process_time() - process0 - own, "calls": getattr(load, "calls", 0)}


def worker(args: argparse.Namespace) -> int:
    """One rank (under torchrun): every phase of every round; rank 0 writes the samples to ``--out``."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    dist.init_process_group("gloo")
    if args.model:
        from schedopt.importers import load_factory

        unit = load_factory(args.model, batch_size=args.batch_size).forward_backward()
    else:
        a = torch.randn(192, 192)
        unit = lambda: a @ a  # noqa: E731
    unit()
    samples = []
    for r in range(args.rounds):
        for name in (PHASES if r % 2 == 0 else PHASES[::-1]):
            row = run_phase(name, unit, args.message_bytes, args.seconds)
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, row)
            samples += [{"round": r, "phase": name, "rank": k, **s} for k, s in enumerate(gathered)]
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(samples))
    dist.destroy_process_group()
    return 0


def summarize(samples: list[dict]) -> dict[str, float]:
    """The medians a reader compares (see the module's docstring)."""
    by = {(s["phase"], s["round"], s["rank"]): s for s in samples}
    keys = sorted({(s["round"], s["rank"]) for s in samples})
    alone = [by["compute", *k] for k in keys]
    both = [by["both", *k] for k in keys]
    comm = [by["comm", *k] for k in keys]
    med = statistics.median
    return {
        "units_per_s_alone": med(s["units_per_s"] for s in alone),
        "slowdown": med(a["units_per_s"] / b["units_per_s"] - 1 for a, b in zip(alone, both)),
        "other_cores_comm_alone": med(s["other_cpu_s"] / s["wall_s"] for s in comm),
        "other_cores_beside_compute": med(s["other_cpu_s"] / s["wall_s"] for s in both),
        "compute_core_share_alone": med(s["compute_cpu_s"] / s["wall_s"] for s in alone),
        "compute_core_share_beside": med(s["compute_cpu_s"] / s["wall_s"] for s in both),
        "work_per_cpu_s_loss": med(1 - (b["units_per_s"] * b["wall_s"] / b["compute_cpu_s"])
                                   / (a["units_per_s"] * a["wall_s"] / a["compute_cpu_s"])
                                   for a, b in zip(alone, both)),
        "calls_per_s_comm_alone": med(s["calls"] / s["wall_s"] for s in comm),
        "calls_per_s_beside_compute": med(s["calls"] / s["wall_s"] for s in both),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="700mbit", help="tbf rate on each veth end (tc units)")
    parser.add_argument("--model", default=None, help="path/to/file.py:factory whose forward and backward is "
                        "the compute (default: a 192 x 192 matmul, calibration's stand-in)")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=6.0, help="each phase's length")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--message-bytes", type=int, default=8 << 20, help="each all-reduce's size")
    parser.add_argument("--seed", type=int, default=0, help="the compute's inputs")
    parser.add_argument("--json", default=None, help="write the samples and the summary here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        return worker(args)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from testbed import Link, TestbedError, launch

    if os.geteuid() != 0:
        print("bench/interference.py needs root (network namespaces)", file=sys.stderr)
        return 2
    from provenance import begin, write_result

    begin()
    link = Link(args.rate)
    with tempfile.TemporaryDirectory(prefix="schedopt-interference-") as work:
        out = Path(work) / "samples.json"
        argv = [str(Path(__file__).resolve()), "--worker", "--out", str(out), "--seconds", str(args.seconds),
                "--rounds", str(args.rounds), "--message-bytes", str(args.message_bytes), "--seed", str(args.seed)]
        if args.model:
            argv += ["--model", args.model] + (["--batch-size", str(args.batch_size)] if args.batch_size else [])
        budget = 120 + 3 * args.rounds * (args.seconds + 20)
        try:
            link.open()
            launch(link, argv, env={"PYTHONPATH": str(ROOT)}, timeout_s=budget, log=Path(work) / "run.log")
        except TestbedError as exc:
            print(f"bench/interference.py: {exc}", file=sys.stderr)
            return 2
        finally:
            link.close()
        samples = json.loads(out.read_text())
    summary = summarize(samples)
    what = args.model or "matmul 192x192"
    print(f"{what} beside {args.message_bytes >> 20} MiB all-reduces at {args.rate}, "
          f"{args.rounds} rounds of {args.seconds:.0f} s per phase (medians over rounds and ranks):")
    print(f"  compute slower beside the all-reduces      {summary['slowdown']:+.1%}")
    print(f"  other threads' CPU, all-reduces alone      {summary['other_cores_comm_alone']:.3f} cores per rank")
    print(f"  other threads' CPU, beside the compute     {summary['other_cores_beside_compute']:.3f} cores per rank")
    print(f"  compute thread's CPU share, alone/beside   {summary['compute_core_share_alone']:.3f} / "
          f"{summary['compute_core_share_beside']:.3f}")
    print(f"  work per CPU-second of the compute thread  {-summary['work_per_cpu_s_loss']:+.1%}")
    print(f"  all-reduces per second, alone/beside       {summary['calls_per_s_comm_alone']:.2f} / "
          f"{summary['calls_per_s_beside_compute']:.2f}")
    if args.json:
        write_result(args.json, [{"compute": what, "rate": args.rate, **summary, "samples": samples}],
                     {k: v for k, v in vars(args).items() if k not in ("worker", "out")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
