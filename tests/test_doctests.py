"""Every docstring example in the package runs (and passes) as part of the suite."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest


#: The packages of the distribution (``schedopt.solvers`` and the others live in folders of their own).
PACKAGES = ("schedopt", "schedopt.solvers", "schedopt.importers", "schedopt.runtime")


def _modules() -> list[str]:
    """Every module of every package, except ``__main__`` (it runs the CLI)."""
    names = []
    for package in PACKAGES:
        names.append(package)
        path = importlib.import_module(package).__path__
        names += [info.name for info in pkgutil.walk_packages(path, prefix=f"{package}.")
                  if not info.name.endswith("__main__")]
    return sorted(set(names))


MODULES = _modules()


def test_the_walk_finds_every_package():
    for name in ("schedopt.solvers", "schedopt.solvers.cpsat.solve", "schedopt.importers", "schedopt.runtime"):
        assert any(m == name for m in MODULES), name


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
