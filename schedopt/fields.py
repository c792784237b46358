"""Reading typed fields out of parsed JSON, each error naming the field's path (``ops[3].duration_s``).

One reader for the graph, plan and cluster JSON: a value of the wrong type
raises the artifact's error class with the path, the expected type and the
value, instead of a ``TypeError`` from deep inside a constructor.

Example:
    >>> from schedopt.errors import InvalidGraphError
    >>> Fields({"ops": [{"id": 3}]}, InvalidGraphError, "graph").items("ops")[0].string("id")
    Traceback (most recent call last):
    ...
    schedopt.errors.InvalidGraphError: graph JSON field ops[0].id must be a string, got 3
"""

from __future__ import annotations

import math
from typing import Any

from .errors import SchedoptError

__all__ = ["Fields", "MISSING"]

MISSING = object()


class Fields:
    """A JSON object at ``path`` inside ``what`` (``"graph"``, ``"plan"``); errors raise ``error``."""

    __slots__ = ("data", "error", "what", "path")

    def __init__(self, data: Any, error: type[SchedoptError], what: str, path: str = ""):
        if not isinstance(data, dict):
            where = f"field {path}" if path else "top level"
            raise error(f"{what} JSON {where} must be an object, got {_show(data)}")
        self.data, self.error, self.what, self.path = data, error, what, path

    def _where(self, key: str | int) -> str:
        return f"{self.path}[{key}]" if isinstance(key, int) else (f"{self.path}.{key}" if self.path else key)

    def fail(self, key: str, expected: str, value: Any) -> SchedoptError:
        return self.error(f"{self.what} JSON field {self._where(key)} must be {expected}, got {_show(value)}")

    def get(self, key: str, default: Any = MISSING) -> Any:
        if key in self.data:
            return self.data[key]
        if default is MISSING:
            raise self.error(f"{self.what} JSON lacks field {self._where(key)!r}")
        return default

    def string(self, key: str, default: Any = MISSING) -> str:
        value = self.get(key, default)
        if not isinstance(value, str):
            raise self.fail(key, "a string", value)
        return value

    def number(self, key: str, default: Any = MISSING, *, optional: bool = False) -> float | None:
        """A finite number (an int or a float, not a bool); None allowed with ``optional``."""
        value = self.get(key, default)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(key, "a finite number" + (" or null" if optional else ""), value)
        return float(value)

    def integer(self, key: str, default: Any = MISSING) -> int:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, "an integer", value)
        return value

    def strings(self, key: str, default: Any = MISSING) -> tuple[str, ...]:
        value = self.get(key, default)
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, "a list of strings", value)
        return tuple(value)

    def integers(self, key: str, default: Any = MISSING) -> tuple[int, ...]:
        value = self.get(key, default)
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                           for v in value):
            raise self.fail(key, "a list of integers", value)
        return tuple(value)

    def array(self, key: str, default: Any = MISSING) -> list[Any]:
        value = self.get(key, default)
        if not isinstance(value, list):
            raise self.fail(key, "a list", value)
        return value

    def items(self, key: str, default: Any = MISSING) -> list[Fields]:
        """A list of objects, each as :class:`Fields`."""
        return [Fields(item, self.error, self.what, f"{self._where(key)}[{i}]")
                for i, item in enumerate(self.array(key, default))]

    def object(self, key: str, default: Any = MISSING) -> Fields:
        return Fields(self.get(key, default), self.error, self.what, self._where(key))

    def mapping(self, key: str, default: Any = MISSING) -> dict[str, Any]:
        """A JSON object kept as a dict (free-form: ``meta``, solver ``options``)."""
        value = self.get(key, default)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, "an object", value)
        return dict(value)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
