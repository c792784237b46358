"""What every bench result carries: the commit, the machine and the arguments it came from."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    """``git ARGS``'s output in the repository; empty where there is no git (a copied tree on another machine)."""
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


_started_at: str | None = None


def begin() -> None:
    """Record the commit the bench starts from (what its code was); call it before the work."""
    global _started_at
    if _started_at is None:
        _started_at = (_git("rev-parse", "HEAD") or "unknown") + ("+dirty" if _git("status", "--porcelain") else "")


def provenance(arguments: dict[str, Any]) -> dict[str, Any]:
    """``commit`` (at :func:`begin`; ``+dirty`` with uncommitted changes), ``machine`` and ``arguments``."""
    begin()  # a bench that never called it: the commit now
    return {"commit": _started_at,
            "machine": {"python": platform.python_version(), "platform": platform.platform(),
                        "cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
            "arguments": arguments}


def write_result(path: str | Path, rows: list[dict[str, Any]], arguments: dict[str, Any]) -> None:
    """Write ``{"rows": rows, "commit": ..., "machine": ..., "arguments": ...}`` as JSON."""
    Path(path).write_text(json.dumps({"rows": rows, **provenance(arguments)}, indent=1, default=str) + "\n")
