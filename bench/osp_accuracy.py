"""OSP's accuracy beside DDP's and overlap mode's: two gloo ranks training on data that ships in a package.

Tasks (nothing is downloaded):

- ``digits``: ``DigitsCNN`` (``examples/models.py``) on scikit-learn's bundled
  8x8 digits (1,797 images; 20% held out, stratified, ``random_state`` 0),
  SGD with momentum; metric: test accuracy, after every epoch.
- ``text``: ``gpt_tied`` (``examples/models.py``) on the bytes of this
  Python's standard-library sources (its ``*.py`` files in sorted order, the
  first ``--text-mib`` MiB; the last 10% held out), byte-level, AdamW;
  metric: validation loss (nats per byte on 32 fixed held-out windows), every
  ``--eval-every`` steps.

Modes, each in fresh processes with the same seeds (initialization, data
order, each rank's shard): ``ddp`` (torch DDP), ``overlap`` (schedopt's
overlap plan), ``osp`` (its osp plan, LGP on) and ``osp-no-lgp`` (the same
plan with ``wrap(..., lgp=False)``: the ablation). Evaluation calls
``model.eval()``, which commits every pending update (as any user's
evaluation does), on rank 0.

Plans: each task's graph (``from_torch``, a100 op costs) on two ranks whose
bandwidth makes DDP's all-reduce as long as the step's compute (the regime
where OSP matters); ``caramel`` plans ``overlap``, and ``osp`` under
``--max-stale-fraction``. The stage-2 buckets are printed.

Prints the final figures; writes the curves as a PNG (``--png``); ``--json
FILE`` writes a list of objects with ``task``, ``mode``, ``metric``, ``value``
(and the curve, the stale fraction and the commit).

    python bench/osp_accuracy.py --json bench/results/osp_accuracy.json --png bench/results/osp_accuracy.png
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import socket
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import begin, provenance  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODES = ("ddp", "overlap", "osp", "osp-no-lgp")
TASKS = ("digits", "text")
METRIC = {"digits": "test_accuracy", "text": "val_loss"}


@functools.cache
def _models():
    """``examples/models.py`` as a module (imported once per process)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("schedopt_example_models", ROOT / "examples" / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- the tasks


@dataclass
class Task:
    """One task: its model, optimizer, training batches per rank and step, and its held-out metric."""

    name: str
    build: Callable[[], tuple[Any, tuple, Callable]]  # (model, example inputs, loss_fn) for planning
    optimizer: Callable[[Any], Any]
    steps: int
    eval_every: int
    batches: Callable[[int, int, int], tuple]  # (rank, world, step) -> (inputs, target)
    loss: Callable[[Any, tuple, Any], Any]  # (output, inputs, target) -> scalar
    evaluate: Callable[[Any], float]


def digits_task(args) -> Task:
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = torch.tensor(data.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(data.target, dtype=torch.long)
    train_i, test_i = train_test_split(range(len(y)), test_size=0.2, stratify=data.target, random_state=0)
    x_train, y_train, x_test, y_test = x[train_i], y[train_i], x[test_i], y[test_i]
    per_rank = args.batch_size
    steps_per_epoch = len(y_train) // (2 * per_rank)

    @functools.lru_cache(maxsize=1)
    def order(epoch: int):  # the same shuffle on every rank, drawn once per epoch
        return torch.randperm(len(y_train), generator=torch.Generator().manual_seed(args.seed + epoch))

    def batches(rank: int, world: int, step: int) -> tuple:
        epoch, i = divmod(step, steps_per_epoch)
        mine = order(epoch)[rank::world][i * per_rank:(i + 1) * per_rank]
        return (x_train[mine],), y_train[mine]

    def evaluate(model) -> float:
        with torch.no_grad():
            return (model(x_test).argmax(1) == y_test).float().mean().item()

    return Task(name="digits", build=lambda: _models().digits_cnn(per_rank),
                optimizer=lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4),
                steps=args.epochs * steps_per_epoch, eval_every=steps_per_epoch, batches=batches,
                loss=lambda out, _inputs, target: F.cross_entropy(out, target), evaluate=evaluate)


def stdlib_bytes(mib: float) -> bytes:
    """The first ``mib`` MiB of this Python's standard-library ``*.py`` sources, in sorted path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out, need = [], int(mib * 2**20)
    for path in sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts):
        if need <= 0:
            break
        chunk = path.read_bytes()[:need]
        out.append(chunk)
        need -= len(chunk)
    return b"".join(out)


def text_task(args) -> Task:
    import torch

    corpus = torch.frombuffer(bytearray(stdlib_bytes(args.text_mib)), dtype=torch.uint8).long()
    split = int(len(corpus) * 0.9)
    train, val = corpus[:split], corpus[split:]
    seq, per_rank = args.seq_len, args.text_batch
    windows = torch.linspace(0, len(val) - seq - 1, 32).long()
    val_batch = torch.stack([val[i:i + seq] for i in windows])

    def batches(rank: int, world: int, step: int) -> tuple:
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * world + rank)
        starts = torch.randint(0, len(train) - seq, (per_rank,), generator=g)
        tokens = torch.stack([train[s:s + seq] for s in starts])
        return (tokens,), None

    def build():
        return _models().gpt_tied(per_rank, seq)

    loss_fn = _models().next_token_loss

    def evaluate(model) -> float:
        with torch.no_grad():
            return sum(loss_fn(model(val_batch[i:i + 8]), val_batch[i:i + 8]).item() for i in range(0, 32, 8)) / 4

    return Task(name="text", build=build, optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
                steps=args.text_steps, eval_every=args.eval_every, batches=batches,
                loss=lambda out, inputs, _target: loss_fn(out, *inputs), evaluate=evaluate)


TASK_MAKERS = {"digits": digits_task, "text": text_task}


# ----------------------------------------------------------------------------- plans


def make_plans(task: Task, max_stale_fraction: float) -> dict[str, Any]:
    """The task's overlap and osp plans on a two-rank cluster balanced for it (see the module docstring)."""
    import torch

    from schedopt import Cluster, Problem, simulate
    from schedopt.importers import from_torch
    from schedopt.solvers import get

    torch.manual_seed(0)
    model, example, loss_fn = task.build()
    graph = from_torch(model, example, loss_fn=loss_fn, name=task.name)
    probe = Cluster.preset("10gbe", world_size=2)
    ddp = simulate(Problem(graph=graph, cluster=probe), get("pytorch-ddp")(Problem(graph=graph, cluster=probe)))
    balanced = replace(probe, name="balanced", bandwidth_Bps=probe.bandwidth_Bps * ddp.comm_s / ddp.compute_s)
    plans = {"overlap": get("caramel")(Problem(graph=graph, cluster=balanced, mode="overlap"))}
    plans["osp"] = get("caramel")(Problem(graph=graph, cluster=balanced, mode="osp",
                                          max_stale_fraction=max_stale_fraction))
    return plans


# ----------------------------------------------------------------------------- every mode on two ranks


def _rank_main(rank: int, world: int, port: int, jobs: list[tuple[str, str, str | None]],
               args: argparse.Namespace, out_dir: str) -> None:
    """Train each ``(task, mode, plan path)`` in turn on this group (one spawn for the whole bench)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    tasks: dict[str, Task] = {}  # each task's data, loaded once (its batches depend on the step only)
    try:
        for j, (task_name, mode, plan_path) in enumerate(jobs):
            started = time.monotonic()
            if task_name not in tasks:
                tasks[task_name] = TASK_MAKERS[task_name](args)
            result = _train(rank, world, tasks[task_name], mode, plan_path, args.seed)
            if rank == 0:
                result["seconds"] = time.monotonic() - started
                Path(out_dir, f"{j}.json").write_text(json.dumps(result))
    finally:
        dist.barrier()
        dist.destroy_process_group()


def _train(rank: int, world: int, task: Task, mode: str, plan_path: str | None, seed: int) -> dict[str, Any]:
    """One training run from the same seed: rank 0's curve, training losses and final-parameter hash."""
    import torch

    from schedopt.runtime import wrap, wrap_optimizer

    torch.manual_seed(seed)
    model = task.build()[0]
    if mode == "ddp":
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    else:
        wrapped = wrap(model, plan_path, lgp=mode != "osp-no-lgp")
    optimizer = wrap_optimizer(task.optimizer(wrapped.parameters()), wrapped)
    curve, losses = [], []
    for step in range(task.steps):
        inputs, target = task.batches(rank, world, step)
        optimizer.zero_grad()
        loss = task.loss(wrapped(*inputs), inputs, target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % task.eval_every == 0 or step + 1 == task.steps:
            wrapped.eval()  # commits every pending update
            if rank == 0:
                curve.append((step + 1, task.evaluate(model)))
            wrapped.train()
    if mode != "ddp":
        wrapped.flush()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    return {"curve": curve, "train_loss": losses, "params_sha256": digest}


def run_jobs(jobs: list[tuple[str, str, str | None]], args, *, timeout_s: float) -> list[dict[str, Any]]:
    """Train every job on two fresh gloo ranks, one after another; their results in order."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        context = mp.start_processes(_rank_main, args=(2, port, jobs, args, tmp), nprocs=2,
                                     join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                raise TimeoutError(f"the ranks ran past {timeout_s:.0f} s")
        return [json.loads(Path(tmp, f"{j}.json").read_text()) for j in range(len(jobs))]


# ----------------------------------------------------------------------------- report


def plot(rows: list[dict], path: Path) -> None:
    """Each task's held-out metric per step, a line per mode (DDP dashed, on top: overlap mode's equals it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in rows))
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for r in (r for r in rows if r["task"] == task):
            steps, values = zip(*r["curve"])
            ddp = r["mode"] == "ddp"
            ax.plot(steps, values, marker="o", markersize=3, label=r["mode"], linestyle="--" if ddp else "-",
                    color="black" if ddp else None, zorder=3 if ddp else 2)
        ax.set_xlabel("step")
        ax.set_ylabel(METRIC[task].replace("_", " "))
        ax.set_title(f"{task}: 2 gloo ranks")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, of {', '.join(TASKS)}")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--epochs", type=int, default=20, help="digits: epochs (default 20)")
    parser.add_argument("--batch-size", type=int, default=32, help="digits: per-rank batch (default 32)")
    parser.add_argument("--text-steps", type=int, default=300, help="text: steps (default 300)")
    parser.add_argument("--text-batch", type=int, default=8, help="text: per-rank windows (default 8)")
    parser.add_argument("--seq-len", type=int, default=128, help="text: window length in bytes (default 128)")
    parser.add_argument("--text-mib", type=float, default=4.0, help="text: corpus size in MiB (default 4)")
    parser.add_argument("--eval-every", type=int, default=50, help="text: steps between evaluations")
    parser.add_argument("--max-stale-fraction", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=3600.0, help="the whole bench, in seconds")
    parser.add_argument("--json", help="write the list of {task, mode, metric, value} here")
    parser.add_argument("--png", help="write the curves here")
    args = parser.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    modes = [m for m in args.modes.split(",") if m]
    if set(tasks) - set(TASKS) or set(modes) - set(MODES) or not tasks or not modes:
        print(f"osp_accuracy: --tasks takes {', '.join(TASKS)} and --modes {', '.join(MODES)}", file=sys.stderr)
        return 2
    begin()
    started = time.monotonic()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        jobs, facts = [], []
        for task_name in tasks:
            task = TASK_MAKERS[task_name](args)
            plans = make_plans(task, args.max_stale_fraction)
            stage2 = [n for b in plans["osp"].buckets if b.stage == 2 for n in b.params]
            fraction = plans["osp"].solver.stats.get("stale_fraction", 0.0)
            print(f"{task_name}: {task.steps} steps; osp plan: stage 2 = {', '.join(stage2) or 'nothing'} "
                  f"({fraction:.0%} of the parameter bytes)", flush=True)
            paths = {}
            for mode, plan in plans.items():
                paths[mode] = str(Path(tmp) / f"{task_name}.{mode}.json")
                plan.save(paths[mode])
            for mode in modes:
                jobs.append((task_name, mode, None if mode == "ddp" else paths["osp" if mode.startswith("osp") else mode]))
                facts.append((task.steps, stage2 if mode.startswith("osp") else [],
                              fraction if mode.startswith("osp") else 0.0))
        results = run_jobs(jobs, args, timeout_s=args.time_limit - (time.monotonic() - started))
        for (task_name, mode, _), (steps, stage2, fraction), r in zip(jobs, facts, results):
            value = r["curve"][-1][1]
            print(f"  {task_name:7s} {mode:11s} {METRIC[task_name]} {value:.4f}  ({r['seconds']:.0f} s)", flush=True)
            rows.append({"task": task_name, "mode": mode, "metric": METRIC[task_name], "value": value,
                         "curve": r["curve"], "stale_fraction": fraction, "stage2": stage2, "steps": steps,
                         "params_sha256": r["params_sha256"]})
    print_summary(rows)
    if args.png:
        plot(rows, Path(args.png))
    if args.json:
        meta = provenance(vars(args))
        Path(args.json).write_text(json.dumps([{**row, "commit": meta["commit"]} for row in rows], indent=1) + "\n")
    print(f"osp_accuracy: {time.monotonic() - started:.0f} s")
    return 0


def print_summary(rows: list[dict]) -> None:
    """Each mode's figure beside DDP's: the difference in points (accuracy) or percent (loss)."""
    ddp = {r["task"]: r for r in rows if r["mode"] == "ddp"}
    print(f"{'task':7s} {'mode':11s} {'metric':14s} {'value':>8s} {'vs ddp':>9s}")
    for r in rows:
        base = ddp.get(r["task"])
        if base is None:
            versus = ""
        elif r["metric"] == "test_accuracy":
            versus = f"{(r['value'] - base['value']) * 100:+.2f} pt"
        else:
            versus = f"{(r['value'] - base['value']) / base['value']:+.2%}"
        same = " (= ddp's parameters)" if base is not None and r is not base and \
            r["params_sha256"] == base["params_sha256"] else ""
        print(f"{r['task']:7s} {r['mode']:11s} {r['metric']:14s} {r['value']:8.4f} {versus:>9s}{same}")


if __name__ == "__main__":
    raise SystemExit(main())
