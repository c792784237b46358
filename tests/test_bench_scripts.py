"""Every bench script takes --seed and --json (its figures can be rerun and kept with their provenance)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name != "provenance.py")


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_takes_seed_and_json(script):
    done = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-1000:]
    assert "--seed" in done.stdout and "--json" in done.stdout


def test_a_bench_result_carries_its_commit_machine_and_arguments(tmp_path):
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, str(BENCH / "steady_state.py"), "--models", "transformer_like:2",
                           "--candidates", "20", "--rounds", "1", "--seed", "3", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-1000:]
    result = json.loads(out.read_text())
    assert len(result["commit"]) >= 40 and result["machine"]["cpus"] >= 1
    assert result["arguments"]["seed"] == 3 and result["rows"][0]["graph"] == "transformer_like:2"
