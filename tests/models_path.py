"""Where the example models live, and how tests load them."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

MODELS_FILE = Path(__file__).resolve().parent.parent / "examples" / "models.py"
TRAIN_FILE = MODELS_FILE.with_name("train.py")


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def example_models():
    return _load(MODELS_FILE, "schedopt_example_models")


@functools.cache
def example_train():
    """``examples/train.py`` as a module (its ``batch`` draws the synthetic inputs)."""
    return _load(TRAIN_FILE, "schedopt_example_train")
