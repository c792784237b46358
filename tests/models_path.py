"""Where the example models live, and how tests load them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

MODELS_FILE = Path(__file__).resolve().parent.parent / "examples" / "models.py"


def example_models():
    spec = importlib.util.spec_from_file_location("schedopt_example_models", MODELS_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
