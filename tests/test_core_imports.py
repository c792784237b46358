"""The core never imports torch, onnx or ortools."""

from __future__ import annotations

import subprocess
import sys


def test_core_modules_leave_heavy_frameworks_out():
    code = (
        "import sys, schedopt, schedopt.graph, schedopt.plan, schedopt.cluster, schedopt.simulate, "
        "schedopt.cost, schedopt.trace, schedopt.report, schedopt.cli, schedopt.synthetic;"
        "print(sorted(m for m in ('torch', 'onnx', 'ortools') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_training_rank_loads_no_planning_library():
    """``wrap`` and ``shard`` read a plan; every rank of a launch imports them, and networkx (0.4 s of
    import), OR-Tools and matplotlib are the planner's."""
    code = ("import sys, schedopt.runtime; from schedopt.runtime import wrap, shard;"
            "print(sorted(m for m in ('networkx', 'ortools', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
