"""One testbed run's kept files in one file: ``bench/results/runs/NAME.json.gz``.

What ``bench/testbed.py --recompute`` needs of a run: each mode's per-round
step times (``MODE.ROUND.json``, trimmed to the step fields), the pooled
profile (``graph.pooled.json``), the calibrated cluster (``cluster.json``) and
each mode's plan (``MODE.plan.json``). They are stored as one gzipped JSON
object ``{"schema": "schedopt.testbed-kept/1", "name": ..., "files": {file name:
its JSON}}``; a directory of those files (``--keep``, or an older run) reads
the same.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Mapping

__all__ = ["SCHEMA", "SUFFIX", "read_kept", "write_kept", "kept_name"]

SCHEMA = "schedopt.testbed-kept/1"
SUFFIX = ".json.gz"


def kept_name(path: str | Path) -> str:
    """The run's name: the directory's name, or the file's without ``.json.gz``."""
    name = Path(path).name
    return name.removesuffix(SUFFIX)


def write_kept(path: str | Path, name: str, files: Mapping[str, str]) -> None:
    """Write ``files`` (file name -> JSON text) as one gzipped object (atomically, reproducible bytes)."""
    data = {"schema": SCHEMA, "name": name, "files": {k: json.loads(v) for k, v in sorted(files.items())}}
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=9) as out:
        out.write(json.dumps(data, separators=(",", ":")).encode())
    tmp.replace(target)


def read_kept(path: str | Path) -> dict[str, Any]:
    """Return a run's kept files (file name -> parsed JSON) from its ``.json.gz`` or its directory.

    Raises:
        ValueError: the file is not a kept run.
    """
    path = Path(path)
    if path.is_dir():
        return {p.name: json.loads(p.read_text()) for p in sorted(path.glob("*.json"))}
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"{path} is not a kept testbed run (schema {SCHEMA})")
    return data["files"]
