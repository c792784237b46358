"""Two ranks in their own network namespaces over a rate-capped veth pair: measured steps beside predictions.

What it does (as root; everything it creates is removed however it exits):

1. Two network namespaces joined by a veth pair (198.18.0.1/30 and
   198.18.0.2/30, addresses of a range reserved for benchmarks), each end
   capped with ``tc qdisc ... tbf`` at ``--rate`` (netem is not available
   here, so the cap is bandwidth only). One compute thread per rank (``--pin``: rank k on CPU k only), gloo
   over the veth (``GLOO_SOCKET_IFNAME``), launched with plain torchrun
   (``--nnodes 2``), one node per namespace.
2. ``schedopt calibrate`` on that link: the cluster JSON. With ``--rate balanced`` the rate is the
   machine's: the model is profiled first (step 3), and the link capped where the calibrated
   all-reduce of every gradient takes as long as the profiled compute (within 10%, re-capped and
   re-calibrated up to three times); the rows' ``rate`` says which rate that was. Machines of this
   kind differ by 1.6x in compute speed, so one fixed rate is balanced on one and comm-bound on the
   other.
3. ``schedopt profile`` of the model on this CPU, both ranks' processes
   profiling at once (as they compute at once when training). The plans are
   made from this profile. Again (3 iterations) just before every run of
   step 5, unless ``--no-reprofile``: this host's compute speed moves by
   tens of percent within minutes and from one run to the next, so the
   predictions use every op's median over all these profiles, sampled
   through the bench as the runs are (``predicted_planning_s``: from the
   planning profile alone; ``profiled_s``: each profile's step, in run order).
4. ``schedopt compare --execution eager`` with every solver for the
   calibrated cluster (for a mode named with ``-slack``, e.g.
   ``overlap-slack``: its bandwidth divided by 1 + ``--plan-margin``, so that
   the plans keep slack for jitter; every prediction uses the calibrated link), in barrier mode and in each of ``overlap`` and ``osp``
   that ``--modes`` names, and with ``--execution compiled`` for ``compiled``:
   the plans and their predictions.
5. For each of ``--rounds`` rounds, each mode once, in alternating order
   (``ddp``: torch DDP; ``barrier``, ``overlap`` and ``osp``: that mode's best
   predicted plan, by ``SCHEDOPT_PLAN``; ``compiled-ddp``: ``torch.compile``
   of the DDP model, backend ``aot_eager``; ``barrier-compiled``: the
   ``barrier`` plan in schedopt's compiled runtime; ``compiled``: the best
   ``--execution compiled`` barrier plan (free op order) in the compiled
   runtime), each run ``--steps`` measured steps
   after warm-up (``examples/train.py``, start to start). A run's figure is
   its period, the slower rank's mean step (what throughput is: in overlap
   mode the ranks drift a step's jitter apart and back, so the slower rank's
   time *per step* takes the long half of each pair and overstates it by up
   to 12% here); a row's is the median over its runs, and the speedup the
   median over rounds of DDP's period over the mode's (``speedup_vs``: the
   same against every other mode).

Prints a table; ``--json FILE`` writes one object per mode with ``mode``,
``solver``, ``measured_s`` (the median period; ``measured_runs_s``: each run's),
``step_median_s``, ``step_min_s``, ``step_max_s`` (the slower rank's steps),
``predicted_s`` (``predicted_planning_s``: from the profile the plans were made with),
``speedup_vs_ddp``, ``compute_s`` and ``comm_s`` (the
simulator's, for that plan), ``bound_s`` (the perfect-overlap bound
``max(compute, comm)`` of the profiled graph on the calibrated cluster) and
``host_bound_s`` (the simulator's lower bound with the calibrated interference:
no plan it models is faster; a run can measure below it where the calibration
overstates the interference or the host sped up), in
overlap and osp modes the forward's measured and predicted waits per step,
``measured_phases_s`` (rank 0's forward, backward and optimizer, medians) beside
``predicted_phases_s`` (the simulated forward, backward and the rest), and the
calibration; and every run's step times in ``runs/NAME.json.gz`` beside ``NAME.json``
(:mod:`kept`), with what the predictions came from (the pooled profile, the
cluster and each mode's plan), which ``--recompute`` reads: it prints the
periods and speedups again, and each plan predicted by today's simulator.

    sudo python bench/testbed.py --model examples/models.py:resnet18 --rate 550mbit \
        --modes ddp,barrier,overlap --json tb.json
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kept import SUFFIX, kept_name, read_kept, write_kept  # noqa: E402
from provenance import begin, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "train.py"
ADDRESSES = ("198.18.0.1", "198.18.0.2")
MODES = ("ddp", "barrier", "overlap", "osp", "compiled-ddp", "barrier-compiled", "compiled", "fsdp", "sharded")
#: The baselines other modes are compared with: torch's DDP, and FSDP2 per block (sharded training).
BASELINES = ("ddp", "fsdp")
#: Sharded modes: ``fsdp`` runs FSDP2 per block as it comes (its plan, ``fsdp-per-block``, predicts it);
#: ``sharded`` runs the best sharded plan within the memory ``fsdp`` holds (``examples/train.py --shard``).
SHARDED_MODES = ("fsdp", "sharded")
#: Modes that run another mode's plan inside torch.compile (``examples/train.py --compile``).
COMPILED_RUNS = {"compiled-ddp": "ddp", "barrier-compiled": "barrier"}
#: Modes launched with ``--compile``.
COMPILED_MODES = (*COMPILED_RUNS, "compiled")
#: A mode with this suffix is planned on a link ``--plan-margin`` slower than calibrated (slack for jitter).
SLACK = "-slack"
#: Kept beside the runs (``runs/NAME.json.gz``), so that ``--recompute`` can predict them again: the pooled
#: profile, the calibrated cluster and each mode's plan (``MODE.plan.json``).
POOLED, CLUSTER, PLAN = "graph.pooled.json", "cluster.json", ".plan.json"
#: ``--rate balanced``: the cap where the calibrated all-reduce of every gradient takes the profiled compute's time.
BALANCED = "balanced"


class TestbedError(Exception):
    """The testbed cannot run (not root, a command failed, a launch timed out)."""


# ----------------------------------------------------------------------------- network


class Link:
    """Two namespaces and a capped veth pair between them; :meth:`close` removes them (idempotent)."""

    def __init__(self, rate: str) -> None:
        tag = f"{os.getpid() % 100000}"
        self.ns = (f"sotb{tag}a", f"sotb{tag}b")
        self.dev = (f"sotb{tag}x", f"sotb{tag}y")
        self.rate = rate
        self._open = False

    def open(self) -> None:
        self._open = True
        for ns in self.ns:
            _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", self.dev[0], "netns", self.ns[0], "type", "veth",
              "peer", "name", self.dev[1], "netns", self.ns[1]])
        for ns, dev, address in zip(self.ns, self.dev, ADDRESSES):
            _run(["ip", "-n", ns, "addr", "add", f"{address}/30", "dev", dev])
            _run(["ip", "-n", ns, "link", "set", dev, "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            if self.rate != "none":
                _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", *self._tbf()])

    def set_rate(self, rate: str) -> None:
        """Cap both ends at ``rate`` from now on (opening the link first where it is not open)."""
        if not self._open:
            self.rate = rate
            self.open()
            return
        self.rate = rate
        for ns, dev in zip(self.ns, self.dev):
            _run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", *self._tbf()])

    def _tbf(self) -> list[str]:
        burst = max(int(rate_Bps(self.rate) / 100), 64 * 1024)  # 10 ms of traffic, at least a GSO segment
        return ["tbf", "rate", self.rate, "burst", str(burst), "latency", "200ms"]

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def rate_Bps(rate: str) -> float:
    """A tc rate (``550mbit``) in bytes per second."""
    from schedopt.units import parse_bandwidth

    return parse_bandwidth(rate.replace("mbit", "Mbps").replace("gbit", "Gbps").replace("kbit", "kbps"))


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise TestbedError(f"{' '.join(cmd)} failed: {done.stderr.strip()}")


# ----------------------------------------------------------------------------- launches


#: With ``--pin``, rank k's processes (and every thread they start) run on CPU k only. Tried as a cure
#: for rank skew, it made things worse: each rank's collectives then take CPU from its own compute
#: alone, which calibration (collectives without compute) cannot see (ResNet-18, 550 Mbit/s: DDP
#: 1002 ms against 794 predicted, overlap 1.12x; bench/results/testbed_resnet18_550mbit_pinned.json).
PIN = False


def _pinned(node: int):
    """A ``preexec_fn`` that pins the child to CPU ``node`` (modulo the CPUs this process may use)."""
    cpus = sorted(os.sched_getaffinity(0))
    if not PIN or len(cpus) < 2:
        return None
    return lambda: os.sched_setaffinity(0, {cpus[node % len(cpus)]})


def launch(link: Link, argv: list[str], *, env: dict[str, str], timeout_s: float, log: Path) -> None:
    """Run ``torchrun --nnodes 2 ... argv`` with one node in each namespace; raise when either fails."""
    port = str(29500 + os.getpid() % 1000)
    procs = []
    handles = []
    for node, (ns, dev) in enumerate(zip(link.ns, link.dev)):
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--nproc-per-node", "1", "--node-rank", str(node), "--master-addr", ADDRESSES[0],
               "--master-port", port, *argv]
        handle = open(log.with_suffix(f".node{node}.log"), "w")
        handles.append(handle)
        procs.append(subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT,
                                      env={**os.environ, **env, "GLOO_SOCKET_IFNAME": dev, "OMP_NUM_THREADS": "1"},
                                      start_new_session=True, preexec_fn=_pinned(node)))
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        raise TestbedError(f"{' '.join(argv[:3])} ran past {timeout_s:.0f} s (see {log.parent})") from None
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for handle in handles:
            handle.close()
    failed = [node for node, p in enumerate(procs) if p.returncode != 0]
    if failed:
        tail = log.with_suffix(f".node{failed[0]}.log").read_text().strip().splitlines()[-3:]
        raise TestbedError(f"{' '.join(argv[:3])} failed on node {failed[0]}: {' | '.join(tail)}")


def schedopt_cli(*args: str, timeout_s: float, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([sys.executable, "-m", "schedopt", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout_s, env={**os.environ, **(env or {})}, check=False)
    if done.returncode != 0:
        raise TestbedError(f"schedopt {args[0]} failed: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout


def profile_both(model: str, out: Path, *, batch: list[str], timeout_s: float, iterations: int = 5,
                 report: bool = True) -> None:
    """Profile on both cores at once, one thread each (as the two ranks compute), into ``out``: each op's
    median over the two (their mean); ``report``: print rank 0's summary."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "schedopt", "profile", model, "-o", str(out.with_suffix(f".{k}.json")),
                               "--iterations", str(iterations), *batch], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=_pinned(k))
             for k in range(2)]
    try:
        outputs = [p.communicate(timeout=timeout_s) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
        raise TestbedError(f"profiling ran past {timeout_s:.0f} s") from None
    for p, (stdout, stderr) in zip(procs, outputs):
        if p.returncode != 0:
            raise TestbedError(f"schedopt profile failed: {stderr.strip().splitlines()[-1:]}")
    if report:
        print(outputs[0][0].strip().splitlines()[-1])
    from schedopt import TrainGraph
    from schedopt.importers.profile import pooled

    pooled([TrainGraph.load(out.with_suffix(f".{k}.json")) for k in range(2)]).save(out)  # both ranks' op times


# ----------------------------------------------------------------------------- the bench


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="examples/models.py:resnet18", help="path/to/file.py:factory")
    parser.add_argument("--rate", default="550mbit",
                        help=f"tbf rate on each veth end (tc units), none, or {BALANCED}: profile and calibrate first, "
                             "and cap where every gradient's all-reduce takes as long as the compute")
    parser.add_argument("--steps", type=int, default=30, help="measured steps per run (default 30)")
    parser.add_argument("--warmup", type=int, default=4,
                        help="steps before measuring, per run (default 4: the first steps run slow, see docs/testbed.md)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every mode (default 2)")
    parser.add_argument("--modes", default="ddp,barrier,overlap", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--max-stale-fraction", type=float, default=0.5, help="osp plans' bound (default 0.5)")
    parser.add_argument("--plan-margin", type=float, default=0.2,
                        help=f"the {SLACK} modes plan for a link this much slower than calibrated (default 0.2: "
                             "slack for jitter); predictions stay on the calibrated link")
    parser.add_argument("--solve-time", type=float, default=30.0, help="cpsat's time limit in seconds")
    parser.add_argument("--time-limit", type=float, default=1800.0, help="the whole bench, in seconds")
    parser.add_argument("--seed", type=int, default=0, help="cpsat's seed and the training's (model and data)")
    parser.add_argument("--json", help="write the rows here, with the commit and the machine")
    parser.add_argument("--keep", help="keep the work files (graph, cluster, plans, logs) in this directory")
    parser.add_argument("--no-reprofile", dest="reprofile", action="store_false",
                        help="predict from the planning profile alone (default: profile again before every run "
                             "and predict from every op's median over those profiles)")
    parser.add_argument("--pin", action="store_true", help="pin rank k to CPU k (see PIN; slower here)")
    parser.add_argument("--recompute", nargs="+", metavar="RUN",
                        help="run nothing: print the periods and speedups of each kept RUN "
                             "(bench/results/runs/*.json.gz, or a --keep directory)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.recompute:
        return recompute(args.recompute)
    global PIN
    PIN = args.pin

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES) - {m + SLACK for m in ("barrier", "overlap", "osp")})
    if unknown or not set(BASELINES) & set(modes) or "sharded" in modes and "fsdp" not in modes:
        print(f"testbed: --modes takes a baseline (ddp, or fsdp for sharded) and any of {', '.join(MODES[1:])} "
              f"(barrier, overlap, osp also with {SLACK}), got {args.modes!r}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("testbed: needs root (it creates network namespaces and tc qdiscs); run it with sudo", file=sys.stderr)
        return 2
    begin()
    link = Link("none" if args.rate == BALANCED else args.rate)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="schedopt-testbed-"))
    work.mkdir(parents=True, exist_ok=True)
    atexit.register(link.close)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit(143))
    started = time.monotonic()
    try:
        rows = run(args, link, modes, work, deadline=started + args.time_limit)
        kept = {path.name: _trimmed(path) for _, _, path in _run_files(work)}
        kept |= {path.name: path.read_text() for path in [work / POOLED, work / CLUSTER, *work.glob(f"*{PLAN}")]}
    except TestbedError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("testbed: interrupted", file=sys.stderr)
        return 130
    finally:
        link.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print_table(rows)
    if args.json:
        write_result(args.json, rows, vars(args))
        # every run's step times beside it, and what its predictions came from, for --recompute
        runs_dir = Path(args.json).parent / "runs"
        runs_dir.mkdir(parents=True, exist_ok=True)
        write_kept(runs_dir / f"{Path(args.json).stem}{SUFFIX}", Path(args.json).stem, kept)
    print(f"testbed: {time.monotonic() - started:.0f} s")
    return 0


def run(args, link: Link, modes: list[str], work: Path, *, deadline: float) -> list[dict]:
    from schedopt import TrainGraph

    def left() -> float:
        if (rest := deadline - time.monotonic()) <= 0:
            raise TestbedError(f"the bench ran past its time limit ({args.time_limit:.0f} s)")
        return rest

    batch = ["--batch-size", str(args.batch_size)] if args.batch_size else []
    graph_file = work / "graph.json"
    model = ["--model", args.model, *batch]  # calibrate measures the interference on the model's steps
    if args.rate == BALANCED:  # 3 before 2: the rate comes from the compute
        profile_both(args.model, graph_file, batch=batch, timeout_s=min(600, left()))
        graph = TrainGraph.load(graph_file)
        cluster, fit = balance(link, graph, work, left, model)
    else:
        link.open()
        cluster, fit = calibrate_link(link, work, left, model)  # 2
        profile_both(args.model, graph_file, batch=batch, timeout_s=min(600, left()))  # 3
        graph = TrainGraph.load(graph_file)
    plan_of = plan_modes(args, modes, work, cluster, graph_file, left)  # 4
    measured = run_rounds(args, link, modes, plan_of, work, batch, left)  # 5
    return result_rows(args, modes, plan_of, measured, graph, cluster, fit["r2"], work, rate=link.rate)  # 6


def calibrate_link(link: Link, work: Path, left, model: list[str]):
    """Step 2: ``schedopt calibrate`` over the link as it is capped now; the cluster and its fit's figures.
    ``model``: ``--model`` and its options, so that the interference is measured on the model's own steps."""
    from schedopt import Cluster

    cluster_file = work / "cluster.json"
    launch(link, ["-m", "schedopt", "calibrate", "-o", str(cluster_file), "--time-limit", "60s", *model],
           env={}, timeout_s=min(300, left()), log=work / "calibrate")
    cluster = Cluster.load(cluster_file)
    fit = json.loads(cluster_file.read_text())["calibration"]
    print(f"calibrated at {link.rate}: {cluster.describe()} (R^2 {fit['r2']:.4f}, "
          f"worst residual {fit['worst_residual']:.1%})")
    return cluster, fit


def balance(link: Link, graph, work: Path, left, model: list[str], *, tolerance: float = 0.1, tries: int = 3):
    """``--rate balanced``: cap the link where the calibrated all-reduce of every gradient takes as long as
    the profiled compute (within ``tolerance``); the cluster calibrated there and its fit.

    The first cap moves the gradients' bytes in the compute's time at the cap's full rate; each try
    after it scales the cap by the calibrated all-reduce's time over the compute (gloo and TCP reach a
    share of the cap that depends on the machine, which is why it is measured, not assumed).
    """
    compute = _step_s(graph)
    nbytes = sum(p.nbytes for p in graph.params.values())
    mbit = 8 * nbytes / compute / 1e6
    for attempt in range(tries):
        link.set_rate(f"{mbit:.0f}mbit")
        cluster, fit = calibrate_link(link, work, left, model)
        ratio = cluster.allreduce_s(nbytes) / compute
        print(f"balanced? every gradient's all-reduce {cluster.allreduce_s(nbytes) * 1e3:.0f} ms, compute "
              f"{compute * 1e3:.0f} ms ({ratio:.2f}x) at {link.rate}")
        if abs(ratio - 1) <= tolerance:
            break
        mbit *= ratio
    return cluster, fit


def plan_modes(args, modes: list[str], work: Path, cluster, graph_file: Path, left) -> dict[str, Path]:
    """Step 4: plan with every solver, in each mode measured (a -slack mode: on a link --plan-margin
    slower); each mode's best plan file."""
    cluster_file, slowed = work / "cluster.json", work / "cluster.slowed.json"
    if any(m.endswith(SLACK) for m in modes):
        replace(cluster, name=f"{cluster.name}, {args.plan_margin:.0%} slower",
                bandwidth_Bps=cluster.bandwidth_Bps / (1 + args.plan_margin)).save(slowed)
    plan_of: dict[str, Path] = plan_sharded(args, modes, work, cluster_file, graph_file, left)
    bucketed = [m for m in modes if m not in SHARDED_MODES]
    for mode in ["barrier", *(m for m in bucketed if m not in ("ddp", "barrier", *COMPILED_RUNS))] if bucketed else []:
        base = "barrier" if mode == "compiled" else mode.removesuffix(SLACK)
        execution = "compiled" if mode == "compiled" else "eager"
        plans_dir = work / f"plans-{mode}"
        stale = ["--max-stale-fraction", str(args.max_stale_fraction)] if base == "osp" else []
        plan_cluster = slowed if mode.endswith(SLACK) else cluster_file
        rows_json = schedopt_cli("compare", str(graph_file), "--cluster", str(plan_cluster), "--solvers", "all",
                                 "--mode", base, "--execution", execution, "--time-limit", f"{args.solve_time}s",
                                 "--seed", str(args.seed), *stale,
                                 "--format", "json", "--out", str(plans_dir),
                                 timeout_s=min(args.solve_time * 3 + 120, left()))
        compared = json.loads(rows_json)["rows"]
        best = min(compared, key=lambda r: r.get("period_s") or r["iteration_s"])  # on every rank where it varies
        print(f"planned ({mode}): " + ", ".join(f"{r['solver']} {r['iteration_s'] * 1e3:.0f} ms" for r in compared)
              + f"; best {best['solver']}")
        plan_of[mode] = plans_dir / f"{best['solver']}.plan.json"
        if mode == "barrier":
            plan_of["ddp"] = plans_dir / "pytorch-ddp.plan.json"
    for mode, same in COMPILED_RUNS.items():
        if same in plan_of:
            plan_of[mode] = plan_of[same]
    return plan_of


def plan_sharded(args, modes: list[str], work: Path, cluster_file: Path, graph_file: Path, left) -> dict[str, Path]:
    """The sharded modes' plans: ``fsdp-per-block`` (what ``--fsdp`` runs), and the best plan of every sharded
    solver within the memory it holds (the budget of ``sharded``)."""
    from schedopt import Plan

    if "fsdp" not in modes:
        return {}
    plans_dir = work / "plans-sharded"
    plans_dir.mkdir(parents=True, exist_ok=True)
    per_block = plans_dir / "fsdp-per-block.plan.json"
    schedopt_cli("plan", str(graph_file), "--cluster", str(cluster_file), "--mode", "sharded", "--solver",
                 "fsdp-per-block", "-o", str(per_block), timeout_s=min(120, left()))
    plan_of = {"fsdp": per_block}
    if "sharded" in modes:
        budget = int(Plan.load(per_block).predicted.peak_memory_bytes)
        rows_json = schedopt_cli("compare", str(graph_file), "--cluster", str(cluster_file), "--solvers", "all",
                                 "--mode", "sharded", "--memory-budget", f"{budget}B", "--time-limit",
                                 f"{args.solve_time}s", "--seed", str(args.seed), "--format", "json",
                                 "--out", str(plans_dir), timeout_s=min(args.solve_time * 3 + 120, left()))
        compared = [r for r in json.loads(rows_json)["rows"] if r.get("iteration_s") is not None]
        best = min(compared, key=lambda r: r.get("period_s") or r["iteration_s"])  # on every rank where it varies
        print(f"planned (sharded, budget {budget / 2**20:.1f} MiB): " + ", ".join(
            f"{r['solver']} {r['iteration_s'] * 1e3:.0f} ms" for r in compared) + f"; best {best['solver']}")
        plan_of["sharded"] = plans_dir / f"{best['solver']}.plan.json"
    return plan_of


@dataclass
class Measured:
    """Step 5's record, per mode: the slowest rank's steps and mean step (each run), rank 0's forward
    waits and phases; and the profile taken before each run."""

    steps: dict[str, list[list[float]]]
    periods: dict[str, list[float]]
    waits: dict[str, list[float]]
    phases: dict[str, list[list[float]]]
    profiles: list
    #: sharded modes: rank 0's peak of shards plus unsharded parameters and gradients, per step
    peaks: dict[str, list[int]] = None  # type: ignore[assignment]


def run_rounds(args, link: Link, modes: list[str], plan_of: dict[str, Path], work: Path, batch: list[str],
               left) -> Measured:
    """Step 5: interleaved rounds (ABC, CBA, ...), each run profiled just before (--reprofile)."""
    from schedopt import TrainGraph

    m = Measured(steps={k: [] for k in modes}, periods={k: [] for k in modes}, waits={k: [] for k in modes},
                 phases={k: [] for k in modes}, profiles=[], peaks={k: [] for k in modes})
    for round_ in range(args.rounds):
        for mode in (modes if round_ % 2 == 0 else modes[::-1]):
            if args.reprofile:  # this host's compute speed moves by tens of percent within minutes
                run_graph = work / f"graph.{mode}.{round_}.json"
                profile_both(args.model, run_graph, batch=batch, timeout_s=min(600, left()), iterations=3,
                             report=False)
                m.profiles.append(TrainGraph.load(run_graph))
            out = work / f"{mode}.{round_}.json"
            torch_run = mode in ("ddp", "compiled-ddp", "fsdp")  # torch's own, no plan
            env = {} if torch_run else {"SCHEDOPT_PLAN": str(plan_of[mode])}
            extra = {"fsdp": ["--fsdp"], "sharded": ["--shard"]}.get(mode, ["--ddp"] if torch_run else [])
            extra += ["--compile"] if mode in COMPILED_MODES else []
            launch(link, [str(TRAIN), args.model, *extra, "--steps", str(args.steps), "--warmup", str(args.warmup),
                          "--threads", "1", "--quiet", "--seed", str(args.seed), "--json", str(out), *batch],
                   env=env, timeout_s=min(900, left()), log=work / f"{mode}-{round_}")
            measured = json.loads(out.read_text())
            m.steps[mode].append(measured["step_s"])
            m.periods[mode].append(run_period(measured))
            m.waits[mode] += measured.get("rank0_wait_s", [])
            m.phases[mode] += measured.get("rank0_phases_s", [])
            m.peaks[mode] += measured.get("rank0_peak_bytes", [])
            profiled = f" (profiled {_step_s(m.profiles[-1]) * 1e3:.0f} ms)" if args.reprofile else ""
            print(f"  round {round_} {mode:13s} {m.periods[mode][-1] * 1e3:.1f} ms per step{profiled}")
    return m


def result_rows(args, modes: list[str], plan_of: dict[str, Path], m: Measured, graph, cluster, r2: float,
                work: Path, *, rate: str) -> list[dict]:
    """Step 6: a row per mode, predicted from the pooled profile (kept in ``work`` with each mode's plan)."""
    from schedopt import Plan
    from schedopt.problem import DEFERRED_MODES

    from schedopt.importers.profile import pooled as pool

    pooled = pool(m.profiles) if m.profiles else graph
    pooled.save(work / POOLED)
    bound, host_bound = bounds(pooled, cluster)
    rows = []
    for mode in modes:
        plan = Plan.load(plan_of[mode])
        shutil.copy(plan_of[mode], work / f"{mode}{PLAN}")
        timeline = predict(plan, pooled, cluster)
        period = predict_period(plan, pooled, cluster)
        flat = [t for run_ in m.steps[mode] for t in run_]
        measured_s = statistics.median(m.periods[mode])
        rows.append({
            "mode": mode, "solver": plan.solver.name, "model": args.model, "rate": rate, "rate_asked": args.rate,
            "measured_s": measured_s, "measured_runs_s": m.periods[mode],
            "step_median_s": statistics.median(flat), "step_min_s": min(flat),
            "step_max_s": max(flat), "num_steps": len(flat),
            "predicted_s": period, "predicted_one_rank_s": timeline.iteration_s,
            "predicted_planning_s": predict(plan, graph, cluster).iteration_s,
            "profiled_s": [_step_s(g) for g in m.profiles], "compute_s": timeline.compute_s,
            "comm_s": timeline.comm_s, "bound_s": bound, "host_bound_s": host_bound,
            "measured_wait_median_s": statistics.median(m.waits[mode]) if m.waits[mode] else None,
            "predicted_wait_s": _steady_waits(timeline) if plan.mode in DEFERRED_MODES else None,
            "speedup_vs_ddp": round_ratio(m.periods["ddp"], m.periods[mode]) if "ddp" in modes else None,
            "speedup_vs_fsdp": round_ratio(m.periods["fsdp"], m.periods[mode]) if "fsdp" in modes else None,
            "measured_peak_bytes": statistics.median(m.peaks[mode]) if m.peaks and m.peaks[mode] else None,
            "predicted_peak_bytes": timeline.peak_memory_bytes,
            "memory_budget_bytes": plan.memory_budget_bytes,
            "speedup_vs": {other: round_ratio(m.periods[other], m.periods[mode]) for other in modes if other != mode},
            "execution": plan.execution,
            "measured_phases_s": [statistics.median(p) for p in zip(*m.phases[mode])] if m.phases[mode] else None,
            "predicted_phases_s": _phases(timeline),
            "prediction_error": (period - measured_s) / measured_s,
            "cluster": cluster.to_json(), "calibration_r2": r2,
        })
    return rows

def predict_period(plan, graph, cluster, *, engine: bool = False) -> float:
    """``plan``'s predicted period on every rank: each rank's ops varying as the profile measured
    (:meth:`schedopt.ranks.RankModel.measured`), each collective waiting for the last rank; a sharded
    plan on one rank (:func:`predict`). ``engine`` as for :func:`predict`."""
    from schedopt.ranks import RankModel, period

    plan = _as_run(plan, graph, engine)
    return period(plan.problem(graph, cluster, rank_model=RankModel.measured(graph, cluster.world_size)), plan)


def predict(plan, graph, cluster, *, engine: bool = False):
    """The simulated timeline of ``plan`` on ``graph``; ``engine``: an eager plan on the graph's engine order now.

    ``engine`` is for re-predicting a kept run: the plan's buckets, chunks and stages as they were
    run, on the order :func:`schedopt.orders.engine_order` gives today (an eager plan runs in the
    autograd engine's order whatever the plan says; the model of that order can improve).
    """
    from schedopt import simulate

    plan = _as_run(plan, graph, engine)
    return simulate(plan.problem(graph, cluster), plan)


def _as_run(plan, graph, engine: bool):
    """``plan`` as it runs: with ``engine``, an eager plan on the engine order of ``graph`` today."""
    from schedopt.orders import engine_order

    return replace(plan, order=tuple(engine_order(graph))) if engine and plan.execution == "eager" else plan


#: What ``--json`` keeps of each run's ``examples/train.py --json`` (in ``runs/NAME/`` beside the rows).
RUN_FIELDS = ("kind", "model", "plan", "world_size", "period_s", "step_s", "rank_step_s", "median_s", "rank0_phases_s",
              "rank0_wait_s", "rank0_peak_bytes", "rank0_collectives")


def _run_files(directory: Path) -> list[tuple[str, int, Path]]:
    """``(mode, round, path)`` of each run's ``examples/train.py --json`` in ``directory`` (``MODE.ROUND.json``)."""
    found = []
    for path in sorted(directory.glob("*.json")):
        if (key := _run_key(path.name)) is not None:
            found.append((*key, path))
    return found


def _run_key(file_name: str) -> tuple[str, int] | None:
    """``(mode, round)`` of a kept ``MODE.ROUND.json``; None for any other file."""
    mode, _, round_ = file_name.removesuffix(".json").rpartition(".")
    if (mode in MODES or mode.removesuffix(SLACK) in MODES) and round_.isdigit():
        return mode, int(round_)
    return None


def _trimmed(path: Path) -> str:
    measured = json.loads(path.read_text())
    return json.dumps({k: measured[k] for k in RUN_FIELDS if k in measured}, separators=(",", ":")) + "\n"


def kept_runs(files: dict[str, dict]) -> dict[str, dict[int, dict]]:
    """A kept run's ``examples/train.py --json`` records by mode and round (its other files left out)."""
    runs: dict[str, dict[int, dict]] = {}
    for file_name, measured in files.items():
        if (key := _run_key(file_name)) is not None:
            runs.setdefault(key[0], {})[key[1]] = measured
    return runs


def periods_of(runs: dict[str, dict[int, dict]]) -> dict[str, list[float]]:
    """Each mode's period per round, over the rounds every mode ran."""
    rounds = sorted(set.intersection(*(set(r) for r in runs.values()))) if runs else []
    return {m: [run_period(runs[m][k]) for k in rounds] for m in runs}


def run_period(measured: dict) -> float:
    """A run's period from its ``examples/train.py --json``: the slower rank's mean step."""
    return max(sum(ts) / len(ts) for ts in measured["rank_step_s"])


def round_ratio(other: list[float], mine: list[float]) -> float:
    """The speedup over ``other``: the median over rounds of its period over mine."""
    return statistics.median(o / m for o, m in zip(other, mine))


def recompute(dirs: list[str]) -> int:
    """Print each mode's periods and speedups from the runs kept in ``dirs`` (``NAME.json.gz`` or a directory).

    Beside each, the prediction of the bench's rows when they are found (``NAME.json`` beside it, or
    ``bench/results/NAME.json`` for ``bench/results/runs/NAME.json.gz``), and where the run keeps the
    pooled profile, the cluster and the mode's plan, the prediction of today's simulator
    (:func:`predict` with ``engine=True``).
    """
    from schedopt import Cluster, Plan, TrainGraph

    for directory in dirs:
        try:
            files = read_kept(directory)
        except (OSError, ValueError) as exc:
            print(f"testbed: cannot read {directory}: {exc}", file=sys.stderr)
            return 2
        runs = kept_runs(files)
        base = next((b for b in BASELINES if b in runs), None)
        if base is None:
            print(f"testbed: {directory} holds no ddp or fsdp runs (MODE.ROUND.json from examples/train.py --json)",
                  file=sys.stderr)
            return 2
        here = Path(directory)
        name = kept_name(here)
        found = [f for f in (here.parent / f"{name}.json", here.parent.parent / f"{name}.json") if f.is_file()]
        result = json.loads(found[0].read_text()) if found else {"rows": []}
        # results written before bench/provenance.py are a bare list of rows
        predicted = {r["mode"]: r for r in (result["rows"] if isinstance(result, dict) else result)}
        graph = TrainGraph.from_json(files[POOLED]) if POOLED in files else None
        cluster = Cluster.from_json(files[CLUSTER]) if CLUSTER in files else None
        print(directory)
        rounds = sorted(set.intersection(*(set(r) for r in runs.values())))
        periods = periods_of(runs)
        per_step = {m: [statistics.median(runs[m][k]["step_s"]) for k in rounds] for m in runs}
        label = "DDP" if base == "ddp" else "FSDP2 per block"
        for mode in sorted(runs, key=lambda m: (m != base, m)):
            measured = statistics.median(periods[mode])
            row = predicted.get(mode)
            against = (f"; {row['solver']}, predicted {row['predicted_s'] * 1e3:.1f} "
                       f"({(row['predicted_s'] - measured) / measured:+.1%})" if row else "")
            if graph is not None and cluster is not None and f"{mode}{PLAN}" in files:
                now = predict_period(Plan.from_json(files[f"{mode}{PLAN}"]), graph, cluster, engine=True)
                against += f", today {now * 1e3:.1f} ({(now - measured) / measured:+.1%})"
            each = "/".join(f"{t * 1e3:.0f}" for t in periods[mode])
            print(f"  {mode:16s} {measured * 1e3:7.1f} ms per step (runs {each}), "
                  f"{round_ratio(periods[base], periods[mode]):.3f}x {label}{against}; by the slower rank's median "
                  f"step {statistics.median(per_step[mode]) * 1e3:.1f} ms, "
                  f"{round_ratio(per_step[base], per_step[mode]):.3f}x")
            if len(runs) > 2 and mode != base:
                print("    " + ", ".join(f"{round_ratio(periods[o], periods[mode]):.3f}x {o}" for o in runs
                                         if o not in (base, mode)))
        if graph is not None and cluster is not None:
            print("  " + bound_line({m: statistics.median(periods[m]) for m in runs}, *bounds(graph, cluster)))
    return 0


def bounds(graph, cluster) -> tuple[float, float]:
    """(``max(compute, comm)``, the simulator's lower bound with the cluster's interference) of ``graph``: no
    plan the simulator models is faster than either; the second counts the compute beside the wire running
    slower, as calibrated."""
    from schedopt import Problem, lower_bound
    from schedopt.report import perfect_overlap_s

    problem = Problem(graph=graph, cluster=cluster, mode="overlap")
    return perfect_overlap_s(problem), lower_bound(problem)


def bound_line(measured: dict[str, float], bound: float, host_bound: float) -> str:
    """The best measured period against both bounds of :func:`bounds`."""
    mode = min(measured, key=measured.get)
    return (f"bounds: max(compute, comm) {bound * 1e3:.1f} ms; with the calibrated interference {host_bound * 1e3:.1f} "
            f"ms; the fastest mode, {mode}, {measured[mode] * 1e3:.1f} ms: {measured[mode] / bound:.3f}x the first, "
            f"{measured[mode] / host_bound:.3f}x the second")


def _step_s(graph) -> float:
    """The profiled one-rank step: every op's time, summed."""
    return sum(op.duration_s for op in graph.ops.values())


def _phases(timeline) -> list[float]:
    """The simulated step in the measured phases: forward, backward, the rest (optimizer, and comm after backward).

    Of one steady-state step (the second to last simulated); the forward from its first op's start to
    its last op's end (overlap and osp: waits included, as measured), the backward from there to its
    last op's end. In barrier mode the measured backward holds the communication after the last
    backward op (DDP's and the wrapper's ``backward()`` return when every gradient is averaged),
    which the simulated split counts in the rest.
    """
    step = max(timeline.num_steps - 2, 0)
    ops = [e for e in timeline.events if e.track == "compute" and e.step == step]
    forward = [e for e in ops if e.category == "forward"]
    backward = [e for e in ops if e.category == "backward"]
    f0, f1 = min(e.start_s for e in forward), max(e.end_s for e in forward)
    b1 = max(e.end_s for e in backward)
    return [f1 - f0, b1 - f1, timeline.iteration_s - (b1 - f0)]


def _steady_waits(timeline) -> float:
    """The simulated time the forward waits for the network in one steady-state step (overlap and osp)."""
    step = timeline.num_steps - 2
    return sum(e.duration_s for e in timeline.events if e.category == "wait" and e.step == step)


def print_table(rows: list[dict]) -> None:
    head = f"{'mode':16s} {'solver':12s} {'ms/step':>8s} {'runs':>17s} {'predicted':>10s} " \
           f"{'error':>7s} {'compute':>8s} {'comm':>8s} {'bound':>8s} {'speedup':>8s}"
    print(head)
    for r in rows:
        runs = "/".join(f"{t * 1e3:.0f}" for t in r["measured_runs_s"])
        print(f"{r['mode']:16s} {r['solver']:12s} {r['measured_s'] * 1e3:8.1f} {runs:>17s} "
              f"{r['predicted_s'] * 1e3:10.1f} {r['prediction_error']:+7.1%} "
              f"{r['compute_s'] * 1e3:8.1f} {r['comm_s'] * 1e3:8.1f} {r['bound_s'] * 1e3:8.1f} "
              f"{r['speedup_vs_ddp'] if r['speedup_vs_ddp'] is not None else r['speedup_vs_fsdp']:8.3f}")
    if rows and rows[0].get("host_bound_s"):
        print(bound_line({r["mode"]: r["measured_s"] for r in rows}, rows[0]["bound_s"], rows[0]["host_bound_s"]))
    for r in rows:
        if r["mode"] in ("barrier-compiled", "compiled"):
            print(f"{r['mode']}: " + ", ".join(f"{ratio:.3f}x {other}" for other, ratio in r["speedup_vs"].items()))
    for r in rows:
        if r.get("measured_peak_bytes") is not None:
            budget = r["memory_budget_bytes"]
            print(f"{r['mode']}: peak {r['measured_peak_bytes'] / 2**20:.1f} MiB per rank measured, "
                  f"{r['predicted_peak_bytes'] / 2**20:.1f} predicted ({r['measured_peak_bytes'] / r['predicted_peak_bytes'] - 1:+.1%})"
                  + (f", budget {budget / 2**20:.1f} MiB" if budget else "")
                  + (f"; {r['speedup_vs_fsdp']:.3f}x FSDP2 per block" if r["mode"] != "fsdp" else ""))
    for r in rows:
        if r.get("measured_wait_median_s") is not None:
            print(f"{r['mode']}: the forward waited {r['measured_wait_median_s'] * 1e3:.1f} ms per step for the network "
                  f"(median, rank 0; predicted {r['predicted_wait_s'] * 1e3:.1f} ms)")
    for r in rows:
        if r.get("measured_phases_s"):
            measured, predicted = (" / ".join(f"{t * 1e3:.0f}" for t in r[k])
                                   for k in ("measured_phases_s", "predicted_phases_s"))
            print(f"{r['mode']}: forward / backward / optimizer {measured} ms (rank 0, medians); simulated forward / "
                  f"backward / rest {predicted} ms")


if __name__ == "__main__":
    raise SystemExit(main())
