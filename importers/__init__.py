"""Model front ends: PyTorch modules (aten or module level) and ONNX files -> ``TrainGraph``.

Example:
    >>> from schedopt.importers import from_torch          # doctest: +SKIP
    >>> graph = from_torch(model, (x,), level="aten")       # doctest: +SKIP
"""

from __future__ import annotations

from .factory import ModelSpec, load_factory
from .onnx_graph import from_onnx
from .pytorch import from_torch

__all__ = ["ModelSpec", "from_onnx", "from_torch", "load_factory"]
