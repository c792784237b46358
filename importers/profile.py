"""Measure per-op times of a real training step on the local device.

Steps:

1. Trace the training step at aten level with real tensors (the same trace
   :func:`from_torch` makes under fake tensors, so op ids match).
2. Run the traced step with an FX interpreter that times every aten call
   together with the tensor frees it makes due (on CUDA by timing events on
   the stream, read after the run: :class:`_Stopwatch`), leaving the
   interpreter's own bookkeeping out; repeat
   and keep each op's mean (a training run's pace is a mean: where op times
   spike, medians sum short of it; gpt_tied's traced medians by 12%). A node that became two ops (the split ``convolution_backward``)
   shares its time by their FLOPs.
3. Time the optimizer step (``torch.optim.SGD``) and the whole eager step
   (``zero_grad``, forward, loss, ``backward``, ``step``), interleaved with
   step 2 so that load from elsewhere hits all of them alike; means.
4. Write the measured times into the graph, scaled up (never down) so that
   the forward and backward add up to the eager step's compute: the ops timed
   one by one leave out the autograd engine's time between them (gpt_tied on
   this CPU: the ops summed 8% short of the step; ResNet-18's 2% over it, so
   not scaled). ``overhead`` in the graph's meta says by how much. The report
   compares the ops' own sum with the measured eager step.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from schedopt.cost import DeviceSpec, overhead_scale
from schedopt.errors import GraphImportError
from schedopt.graph import TrainGraph
from schedopt.trace_costs import op_spread

from .pytorch import AtenGraphBuilder, module_tree, record_grad_order, trace_train_step

__all__ = ["ProfileReport", "on_device", "profile_torch", "profile_launched", "pooled"]

#: what a profile says of how much its times vary (the rank model's, :meth:`schedopt.ranks.RankModel.measured`)
SPREADS = ("op_spread", "step_spread")
#: Wraps the profiled iterations (their indices), as a progress bar does.
Progress = Callable[[Iterable[int]], Iterable[int]]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileReport:
    """Measured against predicted: ``predicted_step_s`` sums the op times as timed, before the graph's
    are scaled by ``1 + overhead`` to add up to the measured step."""

    device: str
    num_iterations: int
    measured_step_s: float
    predicted_step_s: float
    optimizer_s: float
    num_ops_timed: int
    #: how much the op times were scaled up to take the step's time between ops (0 where they add up)
    overhead: float = 0.0

    @property
    def error(self) -> float:
        """Relative prediction error: ``(predicted - measured) / measured``."""
        return (self.predicted_step_s - self.measured_step_s) / self.measured_step_s


def on_device(model: Any, example_inputs: tuple, device: str) -> tuple[Any, tuple]:
    """``model`` and its tensor inputs moved to ``device`` (``cpu``, ``cuda`` or ``cuda:N``).

    Raises:
        GraphImportError: ``cuda`` on a machine without a CUDA device.
    """
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise GraphImportError("profile --on cuda: this machine has no CUDA device")
    return model.to(device), tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in example_inputs)


def profile_torch(
    model: Any,
    example_inputs: tuple,
    *,
    loss_fn: Callable[..., Any],
    name: str | None = None,
    iterations: int = 5,
    warmup: int = 2,
    lr: float = 0.01,
    progress: Progress | None = None,
) -> tuple[TrainGraph, ProfileReport]:
    """Return the aten-level graph of ``model`` with measured op times, and how well it predicts the step.

    The model runs on the device its parameters are on (CPU here, CUDA where present). ``progress``
    wraps the iterations, warm-up included (a tqdm bar in the CLI).

    Raises:
        GraphImportError: the model cannot be traced or run.
    """
    import torch

    if iterations < 1:
        raise GraphImportError(f"profiling needs iterations >= 1, got {iterations}")
    name = name or type(model).__name__
    model.train()
    first = next(model.parameters(), None)
    on_cuda = first is not None and first.is_cuda
    sync = torch.cuda.synchronize if on_cuda else (lambda: None)
    device = DeviceSpec.preset("cpu") if not on_cuda else DeviceSpec.preset("h100")

    # 1. real trace, graph with estimated costs
    traced, params, buffers = trace_train_step(model, example_inputs, loss_fn, name=name, fake=False)
    builder = AtenGraphBuilder(traced.graph, params, device, name)
    graph = builder.build("sgd").with_grad_order(record_grad_order(model, example_inputs, loss_fn, name=name))
    graph = graph.with_modules(module_tree(model))
    flat_args = [*params.values(), *buffers.values(), *example_inputs]

    # 2. time every op node
    samples: dict[str, list[float]] = {n: [] for n in builder.node_ops}
    timer = _op_timer(traced, samples, _Stopwatch(on_cuda))
    optimizer = torch.optim.SGD(list(params.values()), lr=lr)
    steps, opt_times, ratios = _interleaved_runs(model, example_inputs, loss_fn, optimizer, timer, flat_args,
                                                 samples, sync, warmup=warmup, iterations=iterations, name=name,
                                                 progress=progress)
    timed = {op_id: statistics.fmean(samples[node_name]) * share
             for node_name, parts in builder.node_ops.items() for op_id, share in parts}
    return _measured(graph, timed, samples, steps, opt_times, ratios, device="cuda" if on_cuda else "cpu")


def _measured(graph: TrainGraph, timed: dict[str, float], samples: dict[str, list[float]], steps: list[float],
              opt_times: list[float], ratios: dict[str, list[float]], *, device: str) -> tuple[TrainGraph, ProfileReport]:
    """Step 4: the engine's time between the ops spread over them (``timed``: each op's mean); the
    measured graph and the report."""
    optimizer_s, step_s = statistics.fmean(opt_times), statistics.fmean(steps)
    scale = overhead_scale(graph, timed, step_s - optimizer_s)
    durations = {op_id: d * scale for op_id, d in timed.items()}
    durations["optimizer.step"] = optimizer_s
    profiled = graph.with_durations(durations, meta={
        "costs": "profiled", "profile_device": device, "profile_iterations": len(steps),
        "overhead": scale - 1,
        # how much the times vary, for the rank model (schedopt.ranks): each op's, and the whole step's
        "op_spread": op_spread(samples),
        "step_spread": statistics.stdev(steps) / step_s if len(steps) > 1 else 0.0,
        # osp's stage-2 tie-break (solvers/stages.py): how far a stale copy moves per step
        "grad_to_weight": {n: statistics.median(v) for n, v in ratios.items() if v and n in graph.params},
    })
    report = ProfileReport(device=device, num_iterations=len(steps), measured_step_s=step_s,
                           predicted_step_s=sum(timed.values()) + optimizer_s, optimizer_s=optimizer_s,
                           num_ops_timed=len(durations), overhead=scale - 1)
    return profiled, report


class _Stopwatch:
    """Marks around each op, read once the run is over.

    On CPU a mark is the host's clock. On CUDA a call returns once its kernels are queued, and a
    synchronization around every op (as a first version did) adds a launch and a round trip to each:
    on an H200 ResNet-18's ops so timed summed to 11.6 ms against an 8.24 ms step, GPT-2 small's to
    +28%. So on CUDA a mark is a timing event recorded on the current stream, and an op's time is
    the device's between its two events, read after one synchronization at the end of the run.
    """

    def __init__(self, cuda: bool) -> None:
        import torch

        self._event = (lambda: torch.cuda.Event(enable_timing=True)) if cuda else None
        self._sync = torch.cuda.synchronize if cuda else (lambda: None)

    def mark(self) -> Any:
        if self._event is None:
            return time.perf_counter()
        event = self._event()
        event.record()
        return event

    def settle(self) -> None:
        """Wait for every mark (on CUDA: the device reaches the last event)."""
        self._sync()

    def seconds(self, start: Any, end: Any) -> float:
        return end - start if self._event is None else start.elapsed_time(end) / 1e3


def _op_timer(traced: Any, samples: dict[str, list[float]], watch: _Stopwatch) -> Any:
    """An FX interpreter of ``traced`` that adds each op node's time of a run to ``samples`` (see below)."""
    from torch.fx import Interpreter

    class Timer(Interpreter):
        """Time each call together with the frees it makes due, and nothing of the interpreter.

        A node's interval covers the aten call and dropping the tensors
        whose last use it was (in the eager step those frees happen inside
        the ops too); views and ``getitem`` launch no op of their own, and
        their time goes to the op that ran last.
        """

        def __init__(self, module) -> None:
            super().__init__(module, garbage_collect_values=False)
            self.last_op: str | None = None
            self.marks: list[tuple[str, Any, Any]] = []  # (op node, start, end) of this run
            last_user = {}
            for node in module.graph.nodes:
                for used in node.all_input_nodes:
                    last_user[used] = node
            self.dies_at: dict[Any, list[Any]] = {}
            for used, node in last_user.items():
                if node.op != "output":
                    self.dies_at.setdefault(node, []).append(used)

        def run_node(self, n):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            started = watch.mark()
            out = getattr(self, n.op)(n.target, args, kwargs)
            del args, kwargs
            for dead in self.dies_at.get(n, ()):
                del self.env[dead]
            ended = watch.mark()
            if n.name in samples:
                self.last_op = n.name
                self.marks.append((n.name, started, ended))
            elif self.last_op is not None and n.op == "call_function":
                self.marks.append((self.last_op, started, ended))
            return out

        def run(self, *args):
            for values in samples.values():
                values.append(0.0)
            self.last_op, self.marks = None, []
            watch.settle()  # nothing before the run is timed with it
            out = super().run(*args, enable_io_processing=False)
            watch.settle()
            for name, started, ended in self.marks:
                samples[name][-1] += watch.seconds(started, ended)
            return out


    return Timer(traced)


def _interleaved_runs(model: Any, example_inputs: tuple, loss_fn: Callable[..., Any], optimizer: Any, timer: Any,
                      flat_args: list[Any], samples: dict[str, list[float]], sync: Callable[[], None], *,
                      warmup: int, iterations: int, name: str,
                      progress: Progress | None = None) -> tuple[list[float], list[float], dict]:
    """Steps 2-3: the traced run, the eager step and the optimizer, interleaved; the eager steps, the
    optimizer steps and each parameter's ``|g| / |w|`` over the measured iterations."""
    import torch

    def timed(fn: Callable[[], Any]) -> float:
        sync()
        started = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - started

    def eager_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(*example_inputs), *example_inputs).backward()
        optimizer.step()

    # 2-3. interleave the traced run, the eager step and the optimizer so that
    # load from elsewhere on the machine hits all three alike
    steps, opt_times = [], []
    ratios: dict[str, list[float]] = {n: [] for n, p in model.named_parameters() if p.requires_grad}
    try:
        for i in (progress or iter)(range(warmup + iterations)):
            if i == warmup:
                for values in samples.values():
                    values.clear()
            with torch.no_grad():
                timer.run(*flat_args)
            step_s, opt_s = timed(eager_step), timed(optimizer.step)
            if i >= warmup:
                steps.append(step_s)
                opt_times.append(opt_s)
                _record_grad_to_weight(model, ratios)  # outside the timed calls
    except Exception as exc:  # noqa: BLE001 - user model failed at run time
        raise GraphImportError(f"running {name} failed while profiling: {type(exc).__name__}: {exc}") from exc
    return steps, opt_times, ratios


def _record_grad_to_weight(model: Any, ratios: dict[str, list[float]]) -> None:
    """Append ``|grad| / |weight|`` of each trainable parameter (its gradient of the step just run)."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in ratios and p.grad is not None:
                ratios[name].append(float(p.grad.norm() / p.norm().clamp_min(1e-12)))


def profile_launched(model: Any, example_inputs: tuple, *, loss_fn: Callable[..., Any], name: str | None = None,
                     iterations: int = 5,
                     progress: Progress | None = None) -> tuple[TrainGraph, list[ProfileReport]] | None:
    """Under torchrun: every rank profiles at once, as the ranks will compute when they train.

    Ranks that share a host share its memory bandwidth and caches (two CPU ranks on this machine: each
    op slower than with the host to itself), so a profile of one process alone predicts their steps
    short. Every rank times the step (:func:`profile_torch`) after a common barrier; rank 0 returns the
    graph whose every op takes its median time over the ranks (and the spreads theirs), and each rank's report (their measured
    steps: how much the ranks' speeds differ); the other ranks return None.

    Raises:
        LaunchError: torchrun's variables are missing or malformed.
        GraphImportError: the model cannot be traced or run on some rank.
    """
    import torch.distributed as dist

    from schedopt.rendezvous import check_rendezvous_env

    rank = check_rendezvous_env(what="schedopt profile on several ranks").rank
    dist.init_process_group("gloo")
    try:
        dist.barrier()
        try:
            graph, report = profile_torch(model, example_inputs, loss_fn=loss_fn, name=name, iterations=iterations,
                                          progress=progress if rank == 0 else None)  # one bar, rank 0's
            spreads = {k: graph.meta[k] for k in SPREADS}
            mine: Any = ({op_id: op.duration_s for op_id, op in graph.ops.items()}, report, spreads)
        except GraphImportError as exc:
            mine = exc
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
    finally:
        dist.destroy_process_group()
    if failed := next((g for g in gathered if isinstance(g, GraphImportError)), None):
        raise GraphImportError(str(failed))
    if rank != 0:
        return None
    reports = [r for _, r, _ in gathered]
    return pooled([graph.with_durations(d, meta=s) for d, _, s in gathered], meta={
        "profile_ranks": len(gathered), "rank_step_s": [r.measured_step_s for r in reports],
        "overhead": statistics.median(r.overhead for r in reports)}), reports


def pooled(profiles: Sequence[TrainGraph], *, meta: dict[str, Any] | None = None) -> TrainGraph:
    """One graph of the same model's ``profiles`` (ranks profiled at once, or one host again and again):
    every op its median time over them, each spread the median of theirs, and ``meta`` added."""
    first = profiles[0]
    spreads = {key: statistics.median(vals) for key in SPREADS
               if (vals := [g.meta[key] for g in profiles if key in g.meta])}
    return first.with_durations({op_id: statistics.median(g.ops[op_id].duration_s for g in profiles)
                                 for op_id in first.ops}, meta={**spreads, **(meta or {})})
