"""The compiled runtime: a plan's op order, buckets and chunks inside ``torch.compile`` (:func:`compile`).

Example:
    >>> from schedopt.runtime import compile             # doctest: +SKIP
    >>> model = compile(model, "plan.json")               # doctest: +SKIP
"""

from __future__ import annotations

from .backend import CompiledDataParallel, compile

__all__ = ["CompiledDataParallel", "compile"]
