"""Parse and format quantities with units: bandwidths, durations and sizes.

Examples:
    >>> parse_bandwidth("10Gbps")
    1250000000.0
    >>> parse_duration("20us")
    2e-05
    >>> parse_size("25MiB")
    26214400
"""

from __future__ import annotations

import math
import re

from .errors import UnitError

__all__ = [
    "parse_bandwidth",
    "parse_duration",
    "parse_size",
    "format_bandwidth",
    "format_duration",
    "format_size",
]

_NUMBER = r"(?P<value>[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(?P<unit>.*)"

_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_BIN_PREFIX = {"ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40}

# Bits per second: "bps", "bit/s", "b/s" with a decimal prefix; "Gbps", "Gbit/s", "Gb/s".
_BITS = re.compile(r"^(?P<prefix>[kmgt]?)(?:bps|bit/s|bits/s|b/s)$")
# Bytes per second: "B/s", "Bps" (capital B) with decimal or binary prefix.
_BYTES = re.compile(r"^(?P<prefix>[kKmMgGtT]i?)?(?:B/s|Bps)$")

#: Seconds per unit as (numerator, denominator): dividing by 10**6 is exact where multiplying by
#: 1e-6 is not (20 * 1e-6 == 1.9999999999999998e-05).
_DURATION = {
    "s": (1, 1),
    "sec": (1, 1),
    "ms": (1, 10**3),
    "us": (1, 10**6),
    "µs": (1, 10**6),
    "μs": (1, 10**6),
    "ns": (1, 10**9),
    "min": (60, 1),
}

_SIZE = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def _split(text: str, what: str, example: str) -> tuple[float, str]:
    match = re.fullmatch(_NUMBER, str(text).strip())
    if match is None:
        raise UnitError(f"bad {what} {text!r}: expected a number and a unit, such as {example}")
    value = float(match["value"])
    if not math.isfinite(value):
        raise UnitError(f"bad {what} {text!r}: the number must be finite")
    return value, match["unit"].strip()


def parse_bandwidth(text: str | float) -> float:
    """Return a bandwidth in bytes per second.

    Bits use a lower-case ``b`` (``10Gbps``, ``100Mbit/s``), bytes a capital
    ``B`` (``1.25GB/s``, ``12GiB/s``). Decimal prefixes are powers of 1000,
    ``Ki``/``Mi``/``Gi`` powers of 1024. A bare number is bytes per second.

    Raises:
        UnitError: the text has no number, an unknown unit, or is not positive.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        value, unit = _split(text, "bandwidth", "10Gbps or 1.25GB/s")
    if unit == "":
        scale = 1.0
    elif (m := _BITS.match(unit.lower())) and "B" not in unit:
        scale = _PREFIX[m["prefix"]] / 8.0
    elif m := _BYTES.match(unit):
        prefix = (m["prefix"] or "").lower()
        scale = _BIN_PREFIX[prefix] if prefix.endswith("i") else _PREFIX[prefix]
    else:
        raise UnitError(
            f"bad bandwidth {text!r}: unknown unit {unit!r} "
            "(use bps, Mbps, Gbps, Tbps, B/s, MB/s, GB/s, GiB/s, ...)"
        )
    result = value * scale
    if result <= 0:
        raise UnitError(f"bad bandwidth {text!r}: must be positive")
    return result


def parse_duration(text: str | float) -> float:
    """Return a duration in seconds (``20us``, ``1.5ms``, ``2s``; a bare number is seconds).

    Raises:
        UnitError: the text has no number, an unknown unit, or is negative.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), "s"
    else:
        value, unit = _split(text, "duration", "20us or 1.5ms")
        unit = unit or "s"
    if unit not in _DURATION:
        raise UnitError(
            f"bad duration {text!r}: unknown unit {unit!r} (use s, ms, us or ns)"
        )
    numerator, denominator = _DURATION[unit]
    result = value * numerator / denominator
    if result < 0:
        raise UnitError(f"bad duration {text!r}: must not be negative")
    return result


def parse_size(text: str | int) -> int:
    """Return a size in bytes (``25MiB``, ``1MB``, ``4096``; a bare number is bytes).

    Raises:
        UnitError: the text has no number, an unknown unit, or is negative.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value, unit = float(text), "b"
    else:
        value, unit = _split(text, "size", "25MiB or 1MB")
        unit = (unit or "b").lower()
    if unit not in _SIZE:
        raise UnitError(f"bad size {text!r}: unknown unit {unit!r} (use B, KB, MB, GB, KiB, MiB, GiB)")
    result = value * _SIZE[unit]
    if result < 0:
        raise UnitError(f"bad size {text!r}: must not be negative")
    return int(round(result))


def format_bandwidth(bandwidth_Bps: float) -> str:
    """Format bytes per second as bits per second, the way networks are sold (``10Gbps``)."""
    bits = bandwidth_Bps * 8
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if bits >= scale:
            return f"{bits / scale:g}{prefix}bps"
    return f"{bits:g}bps"


def format_duration(seconds: float) -> str:
    """Format seconds with a readable unit (``12.3ms``)."""
    magnitude = abs(seconds)
    if magnitude >= 1 or magnitude == 0:
        return f"{seconds:.3g}s"
    if magnitude >= 1e-3:
        return f"{seconds * 1e3:.3g}ms"
    if magnitude >= 1e-6:
        return f"{seconds * 1e6:.3g}us"
    return f"{seconds * 1e9:.3g}ns"


def format_size(nbytes: float) -> str:
    """Format bytes with a binary prefix (``25.0MiB``)."""
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.1f}{unit}"
    return f"{nbytes:.0f}B"
