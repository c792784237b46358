"""Small file helpers: read JSON with clear errors, write files atomically."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import SchedoptError

__all__ = ["read_json", "dumps", "write_text_atomic", "write_json_atomic", "destination", "temporary_beside", "publish",
           "check_output_file", "check_output_dir"]


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
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise error(
            f"{what} file {str(path)!r} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    except _NonFinite as exc:
        raise error(f"{what} file {str(path)!r} holds {exc.args[0]}, which is not a JSON number") from None
    except RecursionError:
        raise error(f"{what} file {str(path)!r} nests objects or lists too deeply to be a {what}") from None


class _NonFinite(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NonFinite(name)


def dumps(data: Any, *, indent: int | None = 2) -> str:
    """``data`` as strict JSON; a NaN or infinity anywhere raises :class:`SchedoptError` naming where
    (Python's default would write ``NaN``, which no JSON reader accepts)."""
    try:
        return json.dumps(data, indent=indent, allow_nan=False)
    except ValueError:
        raise SchedoptError(f"refusing to write invalid JSON: {_non_finite_path(data) or 'a value'} is not a "
                            f"finite number") from None


def _non_finite_path(data: Any, path: str = "") -> str | None:
    if isinstance(data, float) and not math.isfinite(data):
        return path or "the value"
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, (list, tuple)) else ()
    for key, value in items:
        found = _non_finite_path(value, f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else key))
        if found:
            return found
    return None


def destination(path: str | os.PathLike[str]) -> Path:
    """Where writing ``path`` lands: through a symbolic link to its target; never onto a non-regular file.

    Raises:
        SchedoptError: the path is empty, a directory, or a device, FIFO or socket (``-o /dev/null``
            must not replace the system's ``/dev/null`` with a regular file).
    """
    if not str(path):
        raise SchedoptError("an output path is empty")
    target = Path(os.path.realpath(path))
    if target.is_dir():
        raise SchedoptError(f"output {str(path)!r} is a directory, not a file path")
    if target.exists() and not target.is_file():
        raise SchedoptError(f"output {str(path)!r} is a device, FIFO or socket; schedopt writes regular files only")
    return target


def temporary_beside(target: Path, suffix: str = "") -> tuple[int, str]:
    """A new, uniquely named temporary file in ``target``'s directory (made if missing): ``(fd, path)``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename, so no reader sees half a file.

    A symbolic link is written through (its target is replaced); the temporary file is removed on
    every failure.
    """
    target = destination(path)
    try:
        fd, tmp = temporary_beside(target)
    except OSError as exc:
        raise SchedoptError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        publish(tmp, target)
    except OSError as exc:  # a full disk, a file system gone read-only since the check
        Path(tmp).unlink(missing_ok=True)
        raise SchedoptError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def publish(tmp: str, target: Path) -> None:
    """Give a finished temporary file the usual mode (mkstemp makes 0600) and rename it over ``target``."""
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, target)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _first_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_parent(path: str, target: Path) -> None:
    anchor = _first_existing(target.parent)
    if not anchor.is_dir():
        raise SchedoptError(f"cannot write {path!r}: {str(anchor)!r} is a file, not a directory")
    _probe(path, anchor)


def _probe(path: str, directory: Path) -> None:
    """Create and remove a file in ``directory``: ``os.access`` says yes to root on a read-only file
    system or in ``/sys``, where the write would fail only after the work."""
    if not os.access(directory, os.W_OK | os.X_OK):
        raise SchedoptError(f"cannot write {path!r}: {str(directory)!r} is not a writable directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".schedopt-probe.", dir=directory)
    except OSError as exc:
        raise SchedoptError(f"cannot write {path!r}: {exc.strerror or exc} in {str(directory)!r}") from None
    os.close(fd)
    os.unlink(probe)


def check_output_file(path: str, *, inputs: tuple[str, ...] = (), what: str = "output") -> None:
    """Refuse, before any work, a file output that cannot be written or whose writing would destroy an input.

    Raises:
        SchedoptError: see :func:`destination`; or the place is not a writable directory (a path
            below a regular file, a read-only directory); or the path is also one of ``inputs``.
    """
    target = destination(path)
    _check_parent(path, target)
    for source in inputs:
        if source and (_same_file(target, Path(source)) or target == Path(os.path.realpath(source))):
            raise SchedoptError(f"{what} {path!r} is also an input of this command; write elsewhere")


def check_output_dir(path: str, *, what: str = "--out") -> None:
    """Refuse, before any work, an output directory that is a file or cannot be made or written."""
    if not path:
        raise SchedoptError(f"{what} is empty")
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_dir():
        raise SchedoptError(f"{what} {path!r} is a file, not a directory")
    anchor = _first_existing(target)
    if not anchor.is_dir():
        raise SchedoptError(f"cannot write into {path!r}: {str(anchor)!r} is a file, not a directory")
    _probe(path, anchor)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, indent: int | None = 2) -> Path:
    """Write ``data`` as JSON atomically (see :func:`write_text_atomic`)."""
    return write_text_atomic(path, dumps(data, indent=indent) + "\n")
