"""Load ``path/to/file.py:factory`` model specs.

A factory returns ``(model, example_inputs)`` or ``(model, example_inputs,
loss_fn)``. ``loss_fn(output, *example_inputs)`` returns a scalar; without
one the loss is the mean of the squared output (its first tensor, for tuples,
or ``.logits`` for output objects that have it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from schedopt.errors import GraphImportError

__all__ = ["ModelSpec", "load_factory", "default_loss", "is_factory_spec"]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What a factory returned: the model, a tuple of example inputs, and the loss."""

    name: str
    model: Any
    example_inputs: tuple
    loss_fn: Callable[..., Any]

    def forward_backward(self) -> Callable[[], None]:
        """One forward and backward of the model on its example inputs (gradients reset first), as a call."""
        model, inputs, loss_fn = self.model, self.example_inputs, self.loss_fn
        model.train()

        def step() -> None:
            model.zero_grad(set_to_none=True)
            loss_fn(model(*inputs), *inputs).backward()

        return step


def is_factory_spec(spec: str) -> bool:
    """True for ``something.py:name``."""
    path, sep, name = spec.rpartition(":")
    return bool(sep) and path.endswith(".py") and name.isidentifier()


@contextlib.contextmanager
def user_code(what: str, path: str) -> Iterator[None]:
    """Run a model file's code as a library call: ``sys.argv`` holds only the file (so a script's own
    argument parser sees none of schedopt's), and an exception, ``sys.exit`` or an argument parser's
    exit becomes one :class:`GraphImportError` line (what the code printed to stderr is kept for it)."""
    argv, err = sys.argv, io.StringIO()
    sys.argv = [path]
    try:
        with contextlib.redirect_stderr(err):
            yield
    except SystemExit as exc:
        said = err.getvalue().strip().splitlines()
        detail = f": {said[-1]}" if said else ""
        raise GraphImportError(f"{what} called sys.exit({exc.code!r}){detail} (guard script code with "
                               f"if __name__ == '__main__')") from None
    except Exception as exc:  # noqa: BLE001 - user code: report, don't crash
        raise GraphImportError(f"{what} failed: {type(exc).__name__}: {exc}") from exc
    else:
        sys.stderr.write(err.getvalue())  # what it printed while it worked, after all
    finally:
        sys.argv = argv


def default_loss(output: Any, *_inputs: Any) -> Any:
    """Mean of the squared output: its first tensor for tuples, ``.logits`` where present."""
    import torch

    if hasattr(output, "logits"):
        output = output.logits
    while isinstance(output, (tuple, list)):
        output = output[0]
    if not isinstance(output, torch.Tensor):
        raise GraphImportError(f"cannot build the default loss from an output of type {type(output).__name__}")
    return output.float().pow(2).mean()


def load_factory(spec: str, *, batch_size: int | None = None) -> ModelSpec:
    """Import ``file.py`` and call ``factory`` (with ``batch_size=`` when given).

    Raises:
        GraphImportError: the file or function does not exist, the factory
            fails, or it returns something other than the documented tuple.
    """
    path_text, _, name = spec.rpartition(":")
    path = Path(path_text)
    if not path.is_file():
        raise GraphImportError(f"model file {path_text!r} does not exist")
    module_name = f"_schedopt_model_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise GraphImportError(f"cannot import model file {path_text!r}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
    with user_code(f"importing {path_text!r}", path_text):
        module_spec.loader.exec_module(module)
    factory = getattr(module, name, None)
    if not callable(factory):
        available = sorted(n for n, v in vars(module).items()
                           if inspect.isfunction(v) and v.__module__ == module_name and not n.startswith("_"))
        raise GraphImportError(
            f"{path_text!r} has no factory {name!r}; functions there: {', '.join(available) or 'none'}"
        )
    kwargs = {}
    if batch_size is not None:
        if "batch_size" not in inspect.signature(factory).parameters:
            raise GraphImportError(f"factory {name!r} takes no batch_size argument")
        kwargs["batch_size"] = batch_size
    with user_code(f"factory {name!r}", path_text):
        result = factory(**kwargs)
    if not isinstance(result, tuple) or len(result) not in (2, 3):
        raise GraphImportError(
            f"factory {name!r} must return (model, example_inputs) or (model, example_inputs, loss_fn)"
        )
    model, inputs = result[0], result[1]
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    loss_fn = result[2] if len(result) == 3 and result[2] is not None else default_loss
    return ModelSpec(name=name, model=model, example_inputs=inputs, loss_fn=loss_fn)
