"""Compute costs: a roofline per device.

An op's estimated time is ``max(flops / peak_flops, bytes / mem_bandwidth) +
launch_s``. Measured times from ``schedopt profile`` replace the estimates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from .errors import SchedoptError

__all__ = ["DeviceSpec", "DEVICES", "overhead_scale"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceSpec:
    """Peak compute and memory bandwidth of one accelerator.

    Args:
        name: preset name or a label.
        peak_flops: dense FLOP/s the device sustains for large matrix work.
        mem_bandwidth_Bps: memory bandwidth in bytes per second.
        launch_s: fixed overhead per op (kernel launch, dispatcher).

    Example:
        >>> DeviceSpec.preset("h100").op_time_s(flops=1e12, nbytes=0) > 1e-3
        True
    """

    name: str
    peak_flops: float
    mem_bandwidth_Bps: float
    launch_s: float = 0.0

    def __post_init__(self) -> None:
        for field in ("peak_flops", "mem_bandwidth_Bps"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
                raise SchedoptError(f"DeviceSpec.{field} must be a positive number, got {value!r}")
        if not (self.launch_s >= 0 and math.isfinite(self.launch_s)):
            raise SchedoptError(f"DeviceSpec.launch_s must be >= 0, got {self.launch_s!r}")

    @classmethod
    def preset(cls, name: str) -> DeviceSpec:
        """Return a named device (``a100``, ``h100``, ``h200``, ``v100``, ``cpu``)."""
        key = name.lower()
        if key not in DEVICES:
            raise SchedoptError(f"unknown device {name!r}; valid: {', '.join(DEVICES)}")
        return DEVICES[key]

    def op_time_s(self, *, flops: float, nbytes: float) -> float:
        """Return the roofline time of one op; an op with no FLOPs and no bytes launches no kernel (a view)."""
        if flops <= 0 and nbytes <= 0:
            return 0.0
        return max(flops / self.peak_flops, nbytes / self.mem_bandwidth_Bps) + self.launch_s


# Dense 16-bit tensor-core peaks (the precision training runs in) and HBM
# bandwidth from the vendors' data sheets; the CPU entry is a 2-core AVX2 host.
DEVICES: Mapping[str, DeviceSpec] = MappingProxyType({
    "v100": DeviceSpec(name="v100", peak_flops=125e12, mem_bandwidth_Bps=900e9, launch_s=5e-6),
    "a100": DeviceSpec(name="a100", peak_flops=312e12, mem_bandwidth_Bps=2.0e12, launch_s=5e-6),
    "h100": DeviceSpec(name="h100", peak_flops=989e12, mem_bandwidth_Bps=3.35e12, launch_s=4e-6),
    "h200": DeviceSpec(name="h200", peak_flops=989e12, mem_bandwidth_Bps=4.8e12, launch_s=4e-6),
    "cpu": DeviceSpec(name="cpu", peak_flops=100e9, mem_bandwidth_Bps=20e9, launch_s=2e-6),
})


def overhead_scale(graph: Any, measured: Mapping[str, float], compute_s: float) -> float:
    """The factor (at least 1) by which the ``measured`` ops' times grow so that the graph's forward and
    backward, its other ops at their current times, add up to a measured step's ``compute_s``.

    A step's compute is more than its ops' times: the autograd engine, Python and hooks run between
    them. Measured op times (a profile's, a trace's) leave that out; scaling them up spreads it over the
    ops in proportion, as it runs. Never down: ops timed apart from each other can take longer in sum
    than the step (a synchronize around each CUDA op), and the step's own figure is then the less sure.
    """
    others = sum(op.duration_s for op in graph.ops.values()
                 if op.phase in ("forward", "backward") and op.id not in measured)
    total = sum(measured.values())
    return max(1.0, (compute_s - others) / total) if total > 0 else 1.0
