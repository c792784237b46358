"""Turn a MODEL argument into a training graph.

MODEL is a graph JSON written by ``schedopt import`` (or by
:meth:`TrainGraph.save`). ONNX files and ``file.py:factory`` arrive with the
importers.
"""

from __future__ import annotations

from pathlib import Path

from .errors import GraphImportError
from .graph import TrainGraph

__all__ = ["load_model"]


def load_model(spec: str) -> TrainGraph:
    """Return the training graph a MODEL argument names.

    Raises:
        GraphImportError: the file is missing, unreadable, or of a kind this
            build cannot import.
        InvalidGraphError: the graph JSON breaks an invariant.
    """
    path = Path(spec)
    if path.suffix.lower() == ".json":
        return TrainGraph.load(path)
    raise GraphImportError(
        f"cannot read model {spec!r}: expected a graph JSON file (.json) written by TrainGraph.save"
    )
