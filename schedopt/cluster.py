"""The data-parallel cluster and its all-reduce cost model (alpha-beta).

Ring all-reduce of S bytes on n ranks takes

    t(S) = call_s + 2(n-1)·alpha + 2(n-1)/n · S / bandwidth

where ``bandwidth`` is the per-rank bus bandwidth and ``alpha`` the latency of
one step. The tree algorithm (NCCL's double binary tree) pays
``2·ceil(log2 n)`` latency steps instead of ``2(n-1)`` and keeps the same
bandwidth term. One rank needs no communication: t(S) = 0.

One collective runs at a time per communicator (NCCL and gloo serialize the
collectives of a process group), so the network is one FIFO channel.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from types import MappingProxyType
from typing import Any, Iterable, Literal, Mapping

import numpy as np

from .errors import SchedoptError, UnitError
from .units import parse_bandwidth, parse_duration

__all__ = ["Cluster", "PRESETS", "CLUSTER_SCHEMA", "FitQuality", "calibrate", "fit_quality", "fit_shard_cost",
           "misfits", "PLAN_SIZES_FROM", "MISFIT", "REFUSE"]

#: Plans issue buckets of megabytes: the all-reduce fit weighs the sizes from here up (where two or more
#: were measured); smaller ones can run faster than the link's rate (a token bucket's burst) or spike.
PLAN_SIZES_FROM = 1 << 20
#: A measured size the fit misses by more than MISFIT (relative to the measured time) is measured again;
#: a fit that still misses a size a plan would issue by more than REFUSE explains the link badly and is
#: refused (the 1000 Mbit/s sweep in ``calibrate``'s docstring: a factor of 8). Over localhost there is no
#: link, only memory copies that outgrow a cache: under a loaded test run 1-4 MiB bent by 65% to a factor
#: of 4.6, which ``--force`` keeps.
MISFIT, REFUSE = 0.2, 0.5

#: The schema of a cluster file (``schedopt calibrate -o``, ``--cluster FILE``).
CLUSTER_SCHEMA = "schedopt.cluster/1"

Algorithm = Literal["ring", "tree"]
Backend = Literal["nccl", "gloo"]
BACKENDS = ("nccl", "gloo")

#: Per-rank bus bandwidth, per-step latency and per-call overhead of common networks.
#: Latencies are typical one-way figures for the fabric with NCCL/gloo on top.
PRESETS: Mapping[str, Mapping[str, float]] = MappingProxyType({
    "10gbe": MappingProxyType({"bandwidth_Bps": 10e9 / 8, "latency_s": 25e-6, "call_s": 10e-6}),
    "25gbe": MappingProxyType({"bandwidth_Bps": 25e9 / 8, "latency_s": 20e-6, "call_s": 10e-6}),
    "100gbe": MappingProxyType({"bandwidth_Bps": 100e9 / 8, "latency_s": 10e-6, "call_s": 8e-6}),
    "ib-hdr": MappingProxyType({"bandwidth_Bps": 200e9 / 8, "latency_s": 5e-6, "call_s": 6e-6}),
    "nvlink": MappingProxyType({"bandwidth_Bps": 300e9, "latency_s": 2e-6, "call_s": 5e-6}),
})


#: The range a cluster may describe; outside it a figure is a unit error, and the simulator's sums
#: could overflow to infinity.
MAX_WORLD_SIZE = 1_000_000
MIN_BANDWIDTH_BPS, MAX_BANDWIDTH_BPS = 1e3, 1e15
MAX_LATENCY_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """Ranks and the network that joins them.

    Args:
        world_size: number of data-parallel ranks (>= 1).
        bandwidth_Bps: per-rank bus bandwidth in bytes per second.
        latency_s: alpha, the latency of one all-reduce step.
        algorithm: ``ring`` (default) or ``tree``.
        call_s: fixed overhead of issuing one collective.
        name: the preset this came from, or ``custom``.
        interference: the fraction by which compute slows while a collective
            runs (gloo on CPU shares the cores with the model: 0.3 means an
            op takes 1.3x as long while the channel is busy); 0 for separate
            hardware (NCCL on GPU). ``schedopt calibrate`` measures it. The
            simulator models it in ``barrier`` mode; the solvers plan without it.
        backend: how collectives relate to the host. ``nccl`` (default): on
            their own CUDA streams, the host and compute go on. ``gloo``: the
            host runs them; FSDP2's reduce-scatter blocks the backward, and its
            all-gathers block the host unless issued asynchronously (a sharded
            plan's ``async_unshard``). Only ``sharded`` mode's simulator reads
            it; ``schedopt calibrate`` records the group's backend.
        shard_costs: measured costs of FSDP2's collectives, ``(kind, fixed_s, s_per_byte)``
            per unsharded byte for ``all-gather`` and ``reduce-scatter`` (``schedopt
            calibrate``; a mapping ``{kind: [fixed_s, s_per_byte]}`` is accepted); where a kind
            is absent, :meth:`shard_collective_s` uses the ring formula.
        replicas: sharded mode's HSDP (FSDP2 on a 2-D mesh): the ranks in ``replicas``
            groups, each unit sharded over :attr:`shard_group` (``world_size / replicas``)
            ranks and its reduced shards all-reduced across the replicas. 1 (default): FSDP.
        shard_bandwidth_Bps, shard_latency_s: HSDP's link inside a replica (NVLink inside a
            node, say), which its all-gathers and reduce-scatters use where not measured; the
            all-reduce across replicas uses the cluster's own. None: the cluster's own for both.

    Example:
        >>> Cluster.preset("10gbe", world_size=8).allreduce_s(25 * 2**20) > 0.03
        True
    """

    world_size: int
    bandwidth_Bps: float
    latency_s: float = 0.0
    algorithm: Algorithm = "ring"
    call_s: float = 0.0
    name: str = "custom"
    interference: float = 0.0
    backend: Backend = "nccl"
    shard_costs: tuple[tuple[str, float, float], ...] | None = None
    replicas: int = 1
    shard_bandwidth_Bps: float | None = None
    shard_latency_s: float | None = None

    def __post_init__(self) -> None:
        if (isinstance(self.world_size, bool) or not isinstance(self.world_size, int)
                or not 1 <= self.world_size <= MAX_WORLD_SIZE):
            raise SchedoptError(f"world_size must be an integer from 1 to {MAX_WORLD_SIZE}, got {self.world_size!r}")
        if (isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 1
                or self.world_size % self.replicas):
            raise SchedoptError(f"replicas must be a whole number that divides the world size {self.world_size}, "
                                f"got {self.replicas!r}")
        for field in ("bandwidth_Bps", "shard_bandwidth_Bps"):  # the second is optional (None: the first)
            value = getattr(self, field)
            if value is None and field.startswith("shard_"):
                continue
            if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
                raise UnitError(f"{field} must be a positive number, got {value!r}")
            if not MIN_BANDWIDTH_BPS <= value <= MAX_BANDWIDTH_BPS:
                raise UnitError(f"{field} must be from {MIN_BANDWIDTH_BPS:g} to {MAX_BANDWIDTH_BPS:g} B/s (1 kB/s to "
                                f"1 PB/s), got {value!r}: a unit error?")
        for field in ("latency_s", "call_s", "shard_latency_s"):
            value = getattr(self, field)
            if value is None and field.startswith("shard_"):
                continue
            if not (isinstance(value, (int, float)) and 0 <= value <= MAX_LATENCY_S and math.isfinite(value)):
                raise UnitError(f"{field} must be a number from 0 to {MAX_LATENCY_S:g} s, got {value!r}")
        if not (isinstance(self.interference, (int, float)) and 0 <= self.interference <= 10
                and math.isfinite(self.interference)):
            raise UnitError(f"interference must be a number from 0 to 10, got {self.interference!r}")
        if self.shard_costs is not None:
            object.__setattr__(self, "shard_costs", _shard_costs(self.shard_costs))
        if self.backend not in BACKENDS:
            raise SchedoptError(f"unknown collective backend {self.backend!r}; valid: {', '.join(BACKENDS)}")
        if self.algorithm not in ("ring", "tree"):
            raise SchedoptError(f"unknown all-reduce algorithm {self.algorithm!r}; valid: ring, tree")

    @classmethod
    def preset(cls, name: str, *, world_size: int, **overrides: Any) -> Cluster:
        """Return the cluster of a named network (``10gbe``, ``100gbe``, ``nvlink``, ...)."""
        key = name.lower()
        if key not in PRESETS:
            raise SchedoptError(f"unknown network {name!r}; valid: {', '.join(PRESETS)}")
        return cls(world_size=world_size, name=key, **{**PRESETS[key], **overrides})

    @classmethod
    def from_strings(
        cls,
        *,
        world_size: int,
        bandwidth: str,
        latency: str = "0us",
        call: str = "0us",
        algorithm: Algorithm = "ring",
    ) -> Cluster:
        """Build a cluster from quantities with units (``10Gbps``, ``20us``)."""
        return cls(
            world_size=world_size,
            bandwidth_Bps=parse_bandwidth(bandwidth),
            latency_s=parse_duration(latency),
            call_s=parse_duration(call),
            algorithm=algorithm,
        )

    @property
    def num_latency_steps(self) -> int:
        """Number of alpha terms one all-reduce pays."""
        n = self.world_size
        if n == 1:
            return 0
        if self.algorithm == "ring":
            return 2 * (n - 1)
        return 2 * math.ceil(math.log2(n))

    @property
    def fixed_s(self) -> float:
        """The size-independent part of one all-reduce: call overhead plus latency steps."""
        if self.world_size == 1:
            return 0.0
        return self.call_s + self.num_latency_steps * self.latency_s

    @property
    def seconds_per_byte(self) -> float:
        """The size-dependent part of one all-reduce, per byte (beta)."""
        n = self.world_size
        return 2.0 * (n - 1) / n / self.bandwidth_Bps

    @property
    def effective_interference(self) -> float:
        """The compute slowdown while a collective runs: ``interference``, none on one rank."""
        return self.interference if self.world_size > 1 else 0.0

    def allreduce_s(self, nbytes: float) -> float:
        """Return the time of one all-reduce of ``nbytes`` bytes."""
        if self.world_size == 1:
            return 0.0
        return self.fixed_s + self.seconds_per_byte * nbytes

    @property
    def shard_group(self) -> int:
        """The ranks each unit is sharded over: the world, or one HSDP replica's (``world_size / replicas``)."""
        return self.world_size // self.replicas

    def shard_collective_s(self, nbytes: float, kind: str = "all-gather") -> float:
        """Return the time of one all-gather or reduce-scatter (``kind``) of ``nbytes`` unsharded bytes over
        the :attr:`shard_group`'s n ranks: measured (:attr:`shard_costs`) where calibrated, else the ring's
        ``call_s + (n-1)·alpha + (n-1)/n · nbytes / bandwidth``, by which an all-gather and a
        reduce-scatter of the same bytes move one ring all-reduce's volume together. With HSDP
        replicas, a reduce-scatter is followed by the all-reduce of its ``nbytes / n`` reduced bytes
        across them (FSDP2 issues it when the reduce-scatter ends; one channel here). Affine with a
        non-negative intercept either way (the sharded lower bound relies on it)."""
        n = self.shard_group
        time = 0.0
        if n > 1:
            measured = {name: (fixed, per_byte) for name, fixed, per_byte in self.shard_costs or ()}
            alpha = self.latency_s if self.shard_latency_s is None else self.shard_latency_s
            bandwidth = self.bandwidth_Bps if self.shard_bandwidth_Bps is None else self.shard_bandwidth_Bps
            if kind in measured:
                fixed, per_byte = measured[kind]
                time = fixed + per_byte * nbytes
            else:
                time = self.call_s + (n - 1) * alpha + (n - 1) / n * nbytes / bandwidth
        if kind == "reduce-scatter":
            time += self.replica_allreduce_s(nbytes)
        return time

    def with_ranks(self, world_size: int, replicas: int = 1) -> Cluster:
        """This cluster over ``world_size`` ranks in ``replicas`` HSDP replicas (the same link).

        Raises:
            SchedoptError: it holds :attr:`shard_costs`, measured over shard groups of another size than
                these ranks would form (an all-gather over 8 ranks is not one over 2: calibrate again);
                groups of one rank gather nothing and drop them.
        """
        resized = replace(self, world_size=world_size, replicas=replicas)
        if self.shard_costs and resized.shard_group != self.shard_group:
            if resized.shard_group == 1:  # replicas of one rank: nothing is gathered inside them
                return replace(resized, shard_costs=None)
            raise SchedoptError(
                f"the cluster's all-gather and reduce-scatter costs were measured over {self.shard_group} ranks; "
                f"{world_size} ranks in {replicas} replica(s) shard over {resized.shard_group}: calibrate on such "
                f"a group (torchrun ... schedopt calibrate --replicas R), or plan without the measured costs")
        return resized

    def replica_allreduce_s(self, nbytes: float) -> float:
        """The part of a reduce-scatter of ``nbytes`` unsharded bytes that crosses the HSDP replicas: the
        all-reduce of its ``nbytes / n`` reduced bytes among the :attr:`replicas` ranks that hold the
        same shard (0 without replicas)."""
        if self.replicas == 1:
            return 0.0
        return replace(self, world_size=self.replicas, replicas=1).allreduce_s(nbytes / self.shard_group)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form used inside plans."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Cluster:
        """Rebuild a cluster from :meth:`to_json` output."""
        known = {"world_size", "bandwidth_Bps", "latency_s", "algorithm", "call_s", "name", "interference", "backend",
                 "shard_costs", "replicas", "shard_bandwidth_Bps", "shard_latency_s"}
        if not isinstance(data, dict) or "world_size" not in data or "bandwidth_Bps" not in data:
            raise SchedoptError(f"a cluster needs world_size and bandwidth_Bps, got {data!r}")
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, path: Any, *, calibration: dict[str, Any] | None = None) -> None:
        """Write the cluster as a cluster file (atomically), with the calibration that made it."""
        from .io import write_json_atomic

        data: dict[str, Any] = {"schema": CLUSTER_SCHEMA, **self.to_json()}
        if calibration is not None:
            data["calibration"] = calibration
        write_json_atomic(path, data)

    @classmethod
    def load(cls, path: Any) -> Cluster:
        """Read a cluster file written by :meth:`save` (or a bare cluster object, as inside a plan)."""
        from .io import read_json

        data = read_json(path, what="cluster", error=SchedoptError)
        if isinstance(data, dict) and data.get("schema", CLUSTER_SCHEMA) != CLUSTER_SCHEMA:
            raise SchedoptError(f"cluster file {str(path)!r} has schema {data['schema']!r}; expected {CLUSTER_SCHEMA!r}")
        try:
            return cls.from_json(data)
        except TypeError as exc:
            raise SchedoptError(f"cluster file {str(path)!r} is malformed: {exc}") from None

    def describe(self) -> str:
        """Return a one-line human description."""
        from .units import format_bandwidth, format_duration

        return (
            f"{self.world_size} ranks, {format_bandwidth(self.bandwidth_Bps)} ({self.name}), "
            f"alpha {format_duration(self.latency_s)}, {self.algorithm}"
            + (f", compute {self.interference:.0%} slower during collectives" if self.interference else "")
            + (f", {self.backend} (collectives on the host)" if self.backend == "gloo" else "")
            + (f", HSDP: {self.replicas} replicas of {self.shard_group}" if self.replicas > 1 else "")
            + (f" (inside each: {format_bandwidth(self.shard_bandwidth_Bps or self.bandwidth_Bps)}, alpha "
               f"{format_duration(self.latency_s if self.shard_latency_s is None else self.shard_latency_s)})"
               if self.shard_bandwidth_Bps is not None or self.shard_latency_s is not None else "")
        )


def calibrate(
    sizes_bytes: Iterable[float],
    times_s: Iterable[float],
    *,
    world_size: int,
    algorithm: Algorithm = "ring",
    name: str = "calibrated",
    from_bytes: float = PLAN_SIZES_FROM,
) -> Cluster:
    """Fit alpha and bandwidth to a measured all-reduce sweep, on the sizes plans issue.

    Steps:
        1. The sizes from ``from_bytes`` up, where two or more were measured (else all): a plan's
           buckets are megabytes, and below that a capped link can run at its burst's speed (a tbf
           at 1000 Mbit/s ran 64-256 KiB at veth speed, 64 MiB at the cap; one fit through all nine
           sizes read 7.7 Gbit/s, every plan on it measured slower than DDP).
        2. Fit ``t = a + b·S`` minimizing the sum of *absolute relative*
           residuals ``|a + b·S - t| / t`` (iteratively reweighted least
           squares): timing noise is multiplicative, an unweighted fit lets
           the largest sizes drown the intercept, and a squared one lets a
           single slow size (a delayed ACK, a descheduled rank) move
           the intercept and with it the slope (measured on a 400 Mbit/s
           veth: one 16 KiB all-reduce at 2.9 ms made a squared fit read
           633 Mbit/s; this fit reads 396).
        3. Bandwidth from the slope: ``b = 2(n-1)/n / bandwidth``.
        4. Alpha from the intercept (the per-call overhead, which a size sweep cannot tell apart from
           alpha, is folded in): ``a = steps·alpha``. No all-reduce costs less than the fastest one
           measured: an intercept under that is fixed there, and the slope fitted again.

    Raises:
        SchedoptError: fewer than two distinct sizes, one rank, or a fit with a
            non-positive slope (the measurements do not grow with size).
    """
    sizes = np.asarray(list(sizes_bytes), dtype=float)
    times = np.asarray(list(times_s), dtype=float)
    if sizes.shape != times.shape:
        raise SchedoptError(f"calibrate needs one time per size, got {sizes.size} sizes and {times.size} times")
    if np.unique(sizes).size < 2:
        raise SchedoptError("calibrate needs measurements at two or more distinct sizes")
    if world_size < 2:
        raise SchedoptError("calibrate needs world_size >= 2 (one rank does not communicate)")
    if np.any(times <= 0):
        raise SchedoptError("calibrate needs positive times")
    large = sizes >= from_bytes
    use = large if np.unique(sizes[large]).size >= 2 else np.ones_like(large)
    intercept, slope = _relative_l1_fit(sizes[use], times[use])
    if intercept < times.min():  # no call costs less than the fastest measured: the slope for that intercept
        intercept, slope = _relative_l1_fit(sizes[use], times[use], intercept=float(times.min()))
    bandwidth_Bps = 2.0 * (world_size - 1) / world_size / slope if slope > 0 else math.inf
    if bandwidth_Bps > MAX_BANDWIDTH_BPS:  # falling, or flat within the noise
        raise SchedoptError(f"calibrate: time does not grow with size (slope {slope:.3g} s/B)")
    probe = Cluster(world_size=world_size, bandwidth_Bps=1e9, algorithm=algorithm)  # for its latency steps
    latency_s = intercept / probe.num_latency_steps
    return Cluster(
        world_size=world_size,
        bandwidth_Bps=float(bandwidth_Bps),
        latency_s=latency_s,
        algorithm=algorithm,
        name=name,
    )


def misfits(cluster: Cluster, sizes_bytes: Iterable[float], times_s: Iterable[float], *,
            from_bytes: float = 0.0, tolerance: float = MISFIT) -> list[tuple[float, float, float]]:
    """``(size, measured, modelled)`` of every size from ``from_bytes`` up that ``cluster`` misses by more
    than ``tolerance`` (relative to the measured time).

    Example:
        >>> c = Cluster(world_size=2, bandwidth_Bps=1e8)
        >>> misfits(c, [1e6, 1e7], [c.allreduce_s(1e6), 2 * c.allreduce_s(1e7)])
        [(10000000.0, 0.2, 0.1)]
    """
    return [(float(s), float(t), cluster.allreduce_s(s)) for s, t in zip(sizes_bytes, times_s)
            if s >= from_bytes and abs(cluster.allreduce_s(s) - t) > tolerance * t]


def _relative_l1_fit(sizes: np.ndarray, times: np.ndarray, *, intercept: float | None = None,
                     iterations: int = 50) -> tuple[float, float]:
    """``(a, b)`` minimizing ``sum |a + b·S - t| / t`` by iteratively reweighted least squares; with
    ``intercept``, ``a`` is fixed there and only ``b`` is fitted."""
    row_weight = np.ones_like(times)
    a, b = intercept or 0.0, 0.0
    for _ in range(iterations):
        weights = row_weight / times
        if intercept is None:
            design = np.column_stack([np.ones_like(sizes), sizes]) * weights[:, None]
            (a, b), *_ = np.linalg.lstsq(design, times * weights, rcond=None)
        else:
            (b,), *_ = np.linalg.lstsq((sizes * weights)[:, None], (times - intercept) * weights, rcond=None)
        residual = np.abs(a + b * sizes - times) / times
        row_weight = 1.0 / np.sqrt(np.maximum(residual, 1e-6))  # squared weight 1/|r|: an L1 fit
    return float(a), float(b)


@dataclass(frozen=True, slots=True, kw_only=True)
class FitQuality:
    """How well a cluster's alpha-beta model explains a measured sweep.

    ``r2`` is the coefficient of determination of the times; ``worst_residual``
    the largest relative error ``|model - measured| / measured``, at
    ``worst_size_bytes``.
    """

    r2: float
    worst_residual: float
    worst_size_bytes: float
    num_points: int


def fit_shard_cost(sizes_bytes: Iterable[float], times_s: Iterable[float]) -> tuple[float, float]:
    """Fit ``time = fixed + per_byte * size`` to a sweep of one collective, as plans use it: on the sizes
    from 1 MiB up where at least two are (units are megabytes; below a link's burst small sizes run
    faster than its rate), least squares, the intercept at least 0 (else the line through the origin).

    Example:
        >>> fit_shard_cost([1 << 20, 4 << 20, 16 << 20], [0.021, 0.081, 0.321])
        (0.001, 1.9073486328125e-08)
    """
    points = sorted(zip(sizes_bytes, times_s))
    large = [(b, t) for b, t in points if b >= 1 << 20]
    points = large if len(large) >= 2 else points
    if len(points) < 2:
        raise SchedoptError("fitting a collective's cost needs at least two sizes")
    xs, ys = [b for b, _ in points], [t for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else my / max(mx, 1.0)
    fixed = my - slope * mx
    if fixed < 0 or slope <= 0:
        fixed, slope = 0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return (round(fixed, 9), slope)


def _shard_costs(value: Any) -> tuple[tuple[str, float, float], ...]:
    """``shard_costs`` as sorted ``(kind, fixed_s, s_per_byte)`` triples, checked."""
    items = value.items() if isinstance(value, Mapping) else [(v[0], v[1:]) for v in value]
    out = []
    for kind, cost in items:
        fixed, per_byte = (float(c) for c in cost)
        if kind not in ("all-gather", "reduce-scatter"):
            raise SchedoptError(f"shard_costs: unknown collective {kind!r}; valid: all-gather, reduce-scatter")
        if not (0 <= fixed <= MAX_LATENCY_S and 0 < per_byte < 1 and math.isfinite(per_byte)):
            raise UnitError(f"shard_costs: {kind} needs 0 <= fixed_s <= {MAX_LATENCY_S:g} and a positive "
                            f"seconds per byte, got {list(cost)!r}")
        out.append((kind, fixed, per_byte))
    return tuple(sorted(out))


def fit_quality(cluster: Cluster, sizes_bytes: Iterable[float], times_s: Iterable[float]) -> FitQuality:
    """Return how well ``cluster.allreduce_s`` predicts the measured ``times_s``.

    Example:
        >>> c = Cluster(world_size=2, bandwidth_Bps=1e9, latency_s=1e-5)
        >>> q = fit_quality(c, [1e3, 1e6], [c.allreduce_s(1e3), c.allreduce_s(1e6)])
        >>> round(q.r2, 6), round(q.worst_residual, 6)
        (1.0, 0.0)
    """
    sizes = np.asarray(list(sizes_bytes), dtype=float)
    times = np.asarray(list(times_s), dtype=float)
    model = np.array([cluster.allreduce_s(s) for s in sizes])
    total = float(((times - times.mean()) ** 2).sum())
    r2 = 1.0 - float(((times - model) ** 2).sum()) / total if total > 0 else 1.0
    relative = np.abs(model - times) / times
    worst = int(np.argmax(relative))
    return FitQuality(r2=r2, worst_residual=float(relative[worst]), worst_size_bytes=float(sizes[worst]),
                      num_points=int(sizes.size))
