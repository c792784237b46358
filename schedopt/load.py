"""Turn a MODEL argument into a training graph.

MODEL is one of

- a graph JSON written by ``schedopt import`` or :meth:`TrainGraph.save`;
- an ``.onnx`` file (the forward graph; backward is synthesized);
- ``path/to/file.py:factory``, a function returning ``(model,
  example_inputs)`` or ``(model, example_inputs, loss_fn)`` (traced with
  torch at aten level by default).

The importers (torch, onnx) are imported only when a MODEL needs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .errors import GraphImportError, no_trainable_parameters
from .graph import TrainGraph

__all__ = ["ImportOptions", "load_model", "model_file", "model_kind"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportOptions:
    """How to import a model file: trace level, device for the roofline, factory batch size."""

    level: Literal["aten", "module"] = "aten"
    device: str = "a100"
    batch_size: int | None = None


def model_kind(spec: str) -> Literal["graph", "onnx", "factory"]:
    """Classify a MODEL argument.

    Raises:
        GraphImportError: the argument is none of the three forms.
    """
    from_factory = spec.rpartition(":")
    if from_factory[1] and from_factory[0].endswith(".py"):
        return "factory"
    suffix = Path(spec).suffix.lower()
    if suffix == ".json":
        return "graph"
    if suffix == ".onnx":
        return "onnx"
    raise GraphImportError(
        f"cannot read model {spec!r}: expected a graph .json, an .onnx file, or path/to/file.py:factory"
    )


def model_file(spec: str) -> str:
    """The file a MODEL argument reads: the ``.py`` of ``path/to/file.py:factory``, else the argument."""
    path, sep, _ = spec.rpartition(":")
    return path if sep and path.endswith(".py") else spec


def load_model(spec: str, options: ImportOptions | None = None) -> TrainGraph:
    """Return the training graph a MODEL argument names.

    Raises:
        GraphImportError: the file is missing, unreadable or untraceable.
        InvalidGraphError: a graph JSON breaks an invariant.
    """
    options = options or ImportOptions()
    kind = model_kind(spec)
    if kind == "graph":
        graph = TrainGraph.load(spec)
    elif kind == "onnx":
        from .importers import from_onnx

        graph = from_onnx(spec, device=options.device)
    else:
        from .importers import from_torch, load_factory

        model = load_factory(spec, batch_size=options.batch_size)
        graph = from_torch(model.model, model.example_inputs, loss_fn=model.loss_fn, level=options.level,
                           device=options.device, name=model.name)
    if not graph.params:  # every route says it the same way
        raise GraphImportError(no_trainable_parameters(graph.name))
    return graph
