"""The core and the solvers stay readable: no function over 80 lines but the declarative ones."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Declarative: a table of arguments, not logic.
DECLARATIVE = {("schedopt/cli.py", "build_parser")}
MAX_LINES = 80


def test_no_function_in_the_core_or_the_solvers_is_over_80_lines():
    long = []
    for folder in ("schedopt", "solvers"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    where = (path.relative_to(ROOT).as_posix(), node.name)
                    if lines > MAX_LINES and where not in DECLARATIVE:
                        long.append(f"{where[0]}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long
