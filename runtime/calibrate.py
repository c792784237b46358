"""Measure all-reduce times on the real process group and fit the cluster's alpha-beta model.

Steps:

1. Sizes from ``min_bytes`` to ``max_bytes`` by factors of 4 (4 KiB to 256 MiB
   by default), float32 buffers on the backend's device (CUDA for NCCL).
2. Per size: one warm-up all-reduce, then repeats (at least 3, more while the
   size is cheap), each between barriers, timed to completion
   (``torch.cuda.synchronize`` on CUDA). Rank 0 decides whether the next size
   still fits the time limit (predicted from the last size's time, times 4)
   and broadcasts the decision, so every rank runs the same collectives.
3. Each size's time is the slowest rank's median. :func:`schedopt.cluster.calibrate`
   fits alpha and beta on the sizes plans issue (1 MiB up); a size measured more than 20% slower
   than the fit (a spike: a delayed ACK, a descheduled rank) is measured again, and every size from
   1 MiB up when the fit misses one of them by that much either way (which one is off, no fit can
   tell); each keeps its faster median, and the fit is redone. Every rank fits the same all-reduced medians, so every rank
   re-measures the same sizes. A fit that still misses a size from 1 MiB up by more than 50% is
   refused (:class:`~schedopt.errors.CalibrationError`, naming the sizes): a cluster file that
   misstates the link makes every plan on it wrong. :func:`schedopt.cluster.fit_quality` says how
   well the fit explains the whole sweep.
4. Interference (:func:`measure_interference`): how much slower compute runs
   while a collective is in flight. On CUDA, NCCL has its own hardware and
   it is 0; with gloo on CPU the collective's threads share the cores with
   the model.
5. The all-gather and the reduce-scatter FSDP2 calls (``all_gather_single``,
   ``reduce_scatter_single``), swept the same way from 64 KiB (of unsharded
   bytes) on half the time limit each, and each fitted as ``fixed + per_byte *
   B`` (:func:`schedopt.cluster.fit_shard_cost`): a backend need not run them
   as the ring formula says (gloo's reduce-scatter of 2 ranks takes as long as
   an all-reduce of the same buffer on a capped link, measured).

With ``replicas`` (HSDP: FSDP2 on a 2-D mesh of ``replicas`` rows of consecutive ranks), each
collective is swept on the group HSDP runs it on, all groups at once as HSDP runs them: the
all-reduce across the replicas (the ranks that hold the same shard; its fit is the cluster's link)
and the all-gather and reduce-scatter inside a replica (the cluster's ``shard_costs``).
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable

from schedopt.cluster import MISFIT, PLAN_SIZES_FROM, REFUSE, Cluster, FitQuality, calibrate, fit_quality, fit_shard_cost, misfits
from schedopt.errors import CalibrationError, SchedoptError
from schedopt.units import format_duration, format_size

#: Wraps one phase's items (sizes, samples) under its name, as a progress bar does; on rank 0 only.
Progress = Callable[[Iterable[Any], str], Iterable[Any]]


def _quiet(items: Iterable[Any], _what: str) -> Iterable[Any]:
    return items

log = logging.getLogger("schedopt.runtime")

__all__ = ["Measurement", "Calibration", "measure_allreduce", "measure_interference", "calibrate_process_group",
           "calibrate_launched"]


@dataclass(frozen=True, slots=True)
class Measurement:
    """The median time of ``num_repeats`` all-reduces of ``nbytes`` bytes (slowest rank)."""

    nbytes: int
    median_s: float
    num_repeats: int


@dataclass(frozen=True, slots=True)
class Calibration:
    """A fitted cluster, the fit's quality and the sweep it came from."""

    cluster: Cluster
    quality: FitQuality
    measurements: tuple[Measurement, ...]
    backend: str
    interference_samples: tuple[float, ...] = ()
    #: the compute whose interference was measured: the model's name, or ``matmul`` (the stand-in)
    interference_of: str = "matmul"
    #: step 5's sweeps, per kind (``all-gather``, ``reduce-scatter``), which the cluster's ``shard_costs`` fit
    shard_measurements: dict[str, tuple[Measurement, ...]] = field(default_factory=dict)

    @property
    def link(self) -> Cluster:
        """The all-reduce the sweep fitted: over every rank, or with HSDP replicas over one rank of each."""
        if self.cluster.replicas == 1:
            return self.cluster
        return replace(self.cluster, world_size=self.cluster.replicas, replicas=1)

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, **asdict(self.quality), "allreduce_ranks": self.link.world_size,
                "shard_group": self.cluster.shard_group, "measurements": [asdict(m) for m in self.measurements],
                "shard_measurements": {kind: [asdict(m) for m in ms] for kind, ms in self.shard_measurements.items()},
                "interference_samples": list(self.interference_samples), "interference_of": self.interference_of}


def _device(process_group: Any) -> Any:
    import torch
    import torch.distributed as dist

    if dist.get_backend(process_group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def measure_allreduce(*, min_bytes: int = 4 << 10, max_bytes: int = 256 << 20, time_limit_s: float = 60.0,
                      process_group: Any = None, min_repeats: int = 3, max_repeats: int = 20,
                      collective: str = "all-reduce", sizes: list[int] | None = None,
                      agree_on: Any = None, progress: Progress = _quiet) -> list[Measurement]:
    """Time collectives of growing sizes on ``process_group`` (steps 1-2 of the module docstring):
    all-reduces, or FSDP2's ``all-gather`` / ``reduce-scatter`` of that many unsharded bytes; ``sizes``
    (the same on every rank) instead of ``min_bytes`` to ``max_bytes`` by factors of 4. The ranks of
    ``agree_on`` (a group holding ``process_group``'s ranks, HSDP's groups measuring at once; default
    ``process_group``) run the same sizes and return the same medians, the slowest of theirs.
    ``progress`` wraps the sizes (the sweep may stop before the last, at its time limit)."""
    import torch
    import torch.distributed as dist

    if min_bytes < 4 or max_bytes < min_bytes:
        raise SchedoptError(f"calibrate needs 4 <= min size <= max size, got {min_bytes} and {max_bytes}")
    device = _device(process_group)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    agree_on = process_group if agree_on is None else agree_on
    if sizes is None:
        sizes, size = [], min_bytes
        while size <= max_bytes:
            sizes.append(size)
            size *= 4
    started = time.perf_counter()
    results: list[tuple[int, float, int]] = []
    last_s = 0.0
    for nbytes in progress(sizes, f"{collective}s"):
        # rank 0 (of agree_on) decides for everyone whether this size still fits the limit
        elapsed = time.perf_counter() - started
        go = torch.tensor([int(not results or elapsed + 4 * last_s * (min_repeats + 1) <= time_limit_s)],
                          device=device)
        dist.broadcast(go, src=dist.get_global_rank(agree_on, 0) if agree_on else 0, group=agree_on)
        if not go.item():
            break
        run = _collective(collective, nbytes, device, process_group)
        samples: list[float] = []
        for k in range(1 + max_repeats):
            dist.barrier(group=process_group)
            sync()
            t0 = time.perf_counter()
            run()
            sync()
            if k > 0:
                samples.append(time.perf_counter() - t0)
            # the same stop rule on every rank: counts only, never times (ranks' times differ)
            if k >= min_repeats and (nbytes >= (4 << 20) or k >= max_repeats):
                break
        last_s = statistics.median(samples)
        results.append((nbytes, last_s, len(samples)))
    medians = torch.tensor([m for _, m, _ in results], dtype=torch.float64, device=device)
    dist.all_reduce(medians, op=dist.ReduceOp.MAX, group=agree_on)
    return [Measurement(nbytes=n, median_s=float(t), num_repeats=r)
            for (n, _, r), t in zip(results, medians.tolist())]


def _collective(kind: str, nbytes: int, device: Any, process_group: Any):
    """A call that runs one ``kind`` collective of ``nbytes`` (unsharded) float32 bytes."""
    import torch
    import torch.distributed as dist

    n = dist.get_world_size(process_group)
    numel = max(nbytes // 4 // n, 1) * n
    whole = torch.ones(numel, dtype=torch.float32, device=device)
    if kind == "all-reduce":
        return lambda: dist.all_reduce(whole, group=process_group)
    part = torch.ones(numel // n, dtype=torch.float32, device=device)
    if kind == "all-gather":
        return lambda: dist.all_gather_single(whole, part, group=process_group)
    if kind == "reduce-scatter":
        return lambda: dist.reduce_scatter_single(part, whole, group=process_group)
    raise SchedoptError(f"unknown collective {kind!r}; valid: all-reduce, all-gather, reduce-scatter")


def measure_interference(cluster: Cluster, *, process_group: Any = None, num_samples: int = 15,
                         work: Callable[[], Any] | None = None, progress: Progress = _quiet) -> list[float]:
    """Return samples of how much slower compute runs while all-reduces are in flight (``progress``
    wraps the samples).

    Steps:
        1. The unit of compute: ``work`` (``schedopt calibrate --model``: the model's forward and
           backward) or, without it, a 192 x 192 matmul on one thread's worth of work. Its time
           alone is the slowest rank's median of three; ``k`` units take 0.3 s or more.
        2. Per sample, every rank at once (as they train): ``k`` units alone, timed; then ``k``
           units while a thread sends all-reduces one after another until every rank's units are
           done (:class:`AllReduceLoad`), timed.
        3. A sample is ``time during / time alone - 1``, the slowest rank's.

    The cluster keeps the median. The matmul is a stand-in: on the two-core testbed it read 27-32%
    beside ResNet-18's runs and 13% beside gpt_tied's, whose kept runs are predicted best at 40-60% and
    about 40%; the models' own steps (``--model``) read 28-43% and 15-27% over three calibrations each.
    """
    import torch
    import torch.distributed as dist

    if _device(process_group).type == "cuda":
        return [0.0]  # NCCL runs on the GPU's copy engines and SMs of its own stream: not the host's cores
    if work is None:
        a = torch.randn(192, 192)
        work = lambda: a @ a  # noqa: E731

    def slowest(value: float) -> float:
        agreed = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=process_group)
        return float(agreed.item())

    def timed(k: int) -> float:
        t0 = time.perf_counter()
        for _ in range(k):
            work()
        return time.perf_counter() - t0

    work()  # warm-up
    k = max(1, math.ceil(0.3 / max(slowest(statistics.median(timed(1) for _ in range(3))), 1e-9)))
    # Each call lasts about an eighth of the compute on ``cluster``, from 1 to 64 MiB.
    nbytes = (slowest(timed(k)) / 8 - cluster.fixed_s) / cluster.seconds_per_byte
    load = AllReduceLoad(int(min(max(nbytes, 1 << 20), 64 << 20)), process_group)
    samples = []
    for _ in progress(range(num_samples), "interference"):
        dist.barrier(group=process_group)
        alone = timed(k)
        dist.barrier(group=process_group)
        with load:
            during = timed(k)
        samples.append(slowest(max(during / alone - 1.0, 0.0)))
    return samples


class AllReduceLoad:
    """All-reduces of ``nbytes`` sent one after another from a thread while the ranks compute (``with``).

    Each call's first element carries whether this rank still computes, so every rank learns at once
    that all are done and sends no more (the same number of calls everywhere, at most one after the
    last rank's compute; ``calls`` counts them). An error in the thread is raised when the block ends.
    """

    def __init__(self, nbytes: int, process_group: Any = None) -> None:
        import torch

        self.buffer = torch.zeros(max(nbytes // 4, 1), dtype=torch.float32)
        self.group, self.computing = process_group, threading.Event()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.calls = 0

    def _send(self) -> None:
        import torch.distributed as dist

        try:
            while True:
                self.buffer[0] = 1.0 if self.computing.is_set() else 0.0
                dist.all_reduce(self.buffer, group=self.group)
                self.calls += 1
                if float(self.buffer[0]) == 0.0:  # the number of ranks still computing
                    return
        except BaseException as exc:  # raised in the caller's thread by __exit__
            self.error = exc

    def __enter__(self) -> AllReduceLoad:
        self.computing.set()
        self.thread = threading.Thread(target=self._send, name="schedopt-calibrate-load", daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.computing.clear()
        assert self.thread is not None
        self.thread.join()
        if self.error is not None:
            raise self.error


def calibrate_process_group(*, process_group: Any = None, replicas: int = 1, algorithm: str = "ring",
                            force: bool = False, model: tuple[str, Callable[[], Any]] | None = None,
                            interference_samples: int | None = None, progress: Progress = _quiet,
                            **sweep: Any) -> Calibration:
    """Measure (:func:`measure_allreduce`) and fit the cluster of ``process_group``; ``model``: its name
    and one forward and backward of it, the compute whose interference step 4 measures, in
    ``interference_samples`` samples (default 9 with a model, 15 with the matmul; each takes 0.6 s or more).
    ``replicas``: HSDP's (the module docstring; the default group only); 1: FSDP or data parallel.
    ``progress`` wraps each phase's sizes or samples.

    Raises:
        SchedoptError: one rank; replicas that do not divide the ranks; fewer than two sizes measured
            within the time limit.
        CalibrationError: the fit misses a size plans issue by more than 50% after measuring it again
            (step 3; with ``force``, a warning and the fit kept).
    """
    import torch.distributed as dist

    process_group = dist.group.WORLD if process_group is None else process_group
    world_size = dist.get_world_size(process_group)
    if world_size < 2:
        raise SchedoptError("calibrate needs at least 2 ranks (one rank does not communicate)")
    across, inside = _mesh_groups(replicas, process_group)
    try:
        measurements = measure_allreduce(process_group=across, agree_on=process_group, progress=progress, **sweep)
        if len(measurements) < 2:
            raise SchedoptError("calibrate measured fewer than two sizes within its time limit; give it more time")
        backend = str(dist.get_backend(process_group))
        link, measurements = _fit_and_remeasure(measurements, world_size=dist.get_world_size(across),
                                                algorithm=algorithm, name=f"calibrated-{backend}",
                                                process_group=across, agree_on=process_group, sweep=sweep,
                                                force=force)
        quality = fit_quality(link, [m.nbytes for m in measurements], [m.median_s for m in measurements])
        interference = measure_interference(link, process_group=process_group, work=model[1] if model else None,
                                            num_samples=interference_samples or (9 if model else 15), progress=progress)
        swept = {} if inside is None else _sweep_shard_collectives(inside, sweep, agree_on=process_group,
                                                                   progress=progress)
    finally:
        for group in {across, inside} - {process_group, None}:
            dist.destroy_process_group(group)
    shard_costs = {kind: fit_shard_cost([m.nbytes for m in ms], [m.median_s for m in ms]) for kind, ms in swept.items()}
    cluster = replace(link, world_size=world_size, replicas=replicas, shard_costs=shard_costs or None,
                      interference=round(statistics.median(interference), 3),
                      backend="gloo" if backend == "gloo" else "nccl")
    return Calibration(cluster=cluster, quality=quality, measurements=tuple(measurements), backend=backend,
                       interference_samples=tuple(interference), interference_of=model[0] if model else "matmul",
                       shard_measurements=swept)


def _mesh_groups(replicas: int, process_group: Any) -> tuple[Any, Any]:
    """This rank's groups ``(across the replicas, inside its replica)`` as FSDP2's 2-D mesh lays the ranks
    out (``replicas`` rows of consecutive ranks); without replicas both are ``process_group`` (a group,
    not None), and where every replica is one rank there is nothing inside (None)."""
    import torch.distributed as dist

    world_size = dist.get_world_size(process_group)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1 or world_size % replicas:
        raise SchedoptError(f"replicas must be a whole number that divides the {world_size} ranks, got {replicas!r}")
    if replicas == 1:
        return process_group, process_group
    if process_group is not dist.group.WORLD:
        raise SchedoptError("calibrate lays HSDP's mesh out on the default process group only")
    n = world_size // replicas
    if n == 1:
        return process_group, None
    inside, _ = dist.new_subgroups_by_enumeration([list(range(r * n, (r + 1) * n)) for r in range(replicas)])
    across, _ = dist.new_subgroups_by_enumeration([list(range(s, world_size, n)) for s in range(n)])
    return across, inside


def _sweep_shard_collectives(group: Any, sweep: dict, *, agree_on: Any,
                             progress: Progress = _quiet) -> dict[str, tuple[Measurement, ...]]:
    """Step 5 on ``group``: the all-gather's and the reduce-scatter's sweeps, each where it measured two sizes."""
    swept = {}
    for kind in ("all-gather", "reduce-scatter"):
        measured = measure_allreduce(process_group=group, collective=kind, agree_on=agree_on, progress=progress, **{
            **sweep, "min_bytes": max(sweep.get("min_bytes", 0), 64 << 10),
            "time_limit_s": sweep.get("time_limit_s", 60.0) / 2})
        if len(measured) >= 2:
            swept[kind] = tuple(measured)
    return swept


def _fit_and_remeasure(measurements: list[Measurement], *, world_size: int, algorithm: str, name: str,
                       process_group: Any, sweep: dict, agree_on: Any = None,
                       force: bool = False) -> tuple[Cluster, list[Measurement]]:
    """Step 3: fit; measure again the sizes measured slower than the fit, and every size plans issue when
    the fit misses one of them or no line through them rises (each keeps its faster median); refit
    (where still no line rises, after one more sweep of every size); refuse a fit that still misses."""
    def fit(ms: list[Measurement]) -> Cluster:
        return calibrate([m.nbytes for m in ms], [m.median_s for m in ms], world_size=world_size,
                         algorithm=algorithm, name=name)  # type: ignore[arg-type]

    def missed(cluster: Cluster, ms: list[Measurement], tolerance: float) -> list[tuple[float, float, float]]:
        return misfits(cluster, [m.nbytes for m in ms], [m.median_s for m in ms], from_bytes=PLAN_SIZES_FROM,
                       tolerance=tolerance)

    plan_sizes = {m.nbytes for m in measurements if m.nbytes >= PLAN_SIZES_FROM}
    cluster: Cluster | None = None
    try:
        cluster = fit(measurements)
        again = {m.nbytes for m in measurements if m.median_s > (1 + MISFIT) * cluster.allreduce_s(m.nbytes)}
        if missed(cluster, measurements, MISFIT):  # which plan size is off, no fit can say: all of them
            again |= plan_sizes
    except SchedoptError:  # one slow size among the few plans issue can tilt the line flat or down
        again = plan_sizes
    def remeasure(sizes: set[int]) -> list[Measurement]:
        options = {k: v for k, v in sweep.items() if k in ("min_repeats", "max_repeats")}
        remeasured = {m.nbytes: m for m in measure_allreduce(process_group=process_group, agree_on=agree_on,
                                                             sizes=sorted(sizes),
                                                             time_limit_s=sweep.get("time_limit_s", 60.0), **options)}
        return [min(m, remeasured.get(m.nbytes, m), key=lambda x: x.median_s) for m in measurements]

    if again:
        measurements = remeasure(again)
    if again or cluster is None:
        try:
            cluster = fit(measurements)
        except SchedoptError:  # still flat: a loaded host slowed the small sizes; every size once more
            measurements = remeasure({m.nbytes for m in measurements})
            cluster = fit(measurements)  # raises where the measurements still do not grow with size
    if off := missed(cluster, measurements, REFUSE):
        named = ", ".join(f"{format_size(s)} measured {format_duration(t)}, fitted {format_duration(f)}"
                          for s, t, f in off)
        message = (f"calibrate: an alpha-beta fit ({cluster.describe()}) misses the sizes plans issue by more than "
                   f"{REFUSE:.0%}: {named}; the link is not one rate over them (a shaper's burst, a congested path): "
                   "calibrate again when it is quiet, plan with --bandwidth, or keep this fit with --force")
        if not force:
            raise CalibrationError(message)
        log.warning("%s (kept: --force)", message)
    return cluster, measurements


def calibrate_launched(backend: str | None = None, *, progress: Progress | None = None,
                       **options: Any) -> Calibration | None:
    """Join the process group torchrun describes, calibrate it, leave; rank 0 gets the result, others None.

    ``backend``: ``nccl`` or ``gloo``; by default NCCL with CUDA (one GPU per local rank), else gloo.
    ``progress``: rank 0's (:func:`calibrate_process_group`).
    """
    import torch.distributed as dist

    from .launch import join_process_group

    join_process_group(backend, what="schedopt calibrate")
    try:
        result = calibrate_process_group(progress=progress if progress and dist.get_rank() == 0 else _quiet, **options)
        return result if dist.get_rank() == 0 else None
    finally:
        dist.barrier()  # gloo can abort when one rank tears the group down while another still uses it
        dist.destroy_process_group()
