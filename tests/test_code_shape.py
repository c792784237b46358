"""The code stays readable: no function over 60 lines but a few that say why; packages all installed;
no import cycle in the runtime."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("schedopt", "solvers", "importers", "runtime", "bench")
MAX_LINES = 60
#: The functions allowed past MAX_LINES, each with the reason.
ALLOWED = {
    ("schedopt/cli/parser.py", "build_parser"): "declarative: a table of subcommands and their flags, no logic",
    ("schedopt/steady.py", "run_steady_state"): "the bucket search's hot loop, inlined on purpose: a call per "
                                                "chunk made each evaluation 12% slower",
}


def test_no_function_is_over_60_lines_but_the_allowed_ones():
    long = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    where = (path.relative_to(ROOT).as_posix(), node.name)
                    if lines > MAX_LINES and where not in ALLOWED:
                        long.append(f"{where[0]}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def test_every_package_is_installed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    folders = {"schedopt": "schedopt", **{v: k for k, v in config["package-dir"].items()}}
    found = set()
    for folder, package in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((package, *parts)))
    assert found == listed, sorted(found ^ listed)


def test_the_runtime_has_no_import_cycle():
    """Relative imports between runtime modules, TYPE_CHECKING ones too, form a DAG."""
    graph = nx.DiGraph()
    runtime = ROOT / "runtime"
    for path in runtime.rglob("*.py"):
        module = ".".join(path.relative_to(runtime).with_suffix("").parts)
        package = module.rpartition(".")[0] if path.name != "__init__.py" else module.removesuffix(".__init__")
        graph.add_node(module)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".") if package and package != "__init__" else []
                base = base[:len(base) - node.level + 1] if node.level > 1 else base
                target = ".".join([*base, node.module] if node.module else base) or "__init__"
                if path.name == "__init__.py":
                    continue  # a package's __init__ re-exports its modules
                graph.add_edge(module, target)
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, cycles


def test_every_test_the_conftest_names_exists():
    """A renamed test would silently lose its slow mark or its rank-pool group."""
    from .conftest import POOL_GROUPS, SLOW_TESTS

    defined = {path.stem: {node.name for node in ast.walk(ast.parse(path.read_text()))
                           if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}
               for path in (ROOT / "tests").glob("test_*.py")}
    missing = [f"{module}::{name}" for module, names in SLOW_TESTS.items() for name in names - {"*"}
               if name not in defined.get(module, set())]
    missing += [name for name in POOL_GROUPS if not any(name in names for names in defined.values())]
    assert not missing, missing
