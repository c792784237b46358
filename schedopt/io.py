"""Small file helpers: read JSON with clear errors, write files atomically."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import SchedoptError

__all__ = ["read_json", "write_text_atomic", "write_json_atomic"]


def read_json(path: str | os.PathLike[str], *, what: str, error: type[SchedoptError]) -> Any:
    """Return the parsed JSON of ``path``, raising ``error`` with one clear line on failure."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{what} file {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise error(f"{what} file {str(path)!r} is a directory") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {what} file {str(path)!r}: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(
            f"{what} file {str(path)!r} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename, so no reader sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, indent: int | None = 2) -> Path:
    """Write ``data`` as JSON atomically (see :func:`write_text_atomic`)."""
    return write_text_atomic(path, json.dumps(data, indent=indent) + "\n")
