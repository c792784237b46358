"""Every bench script takes --seed and --json (its figures can be rerun and kept with their provenance)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
#: Modules the scripts share, and the report that turns results into docs: not benchmarks.
HELPERS = {"provenance.py", "kept.py", "report.py"}
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name not in HELPERS)


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


def test_osp_accuracy_writes_each_tasks_figure_per_mode_and_overlap_equals_ddp(tmp_path):
    out, png = tmp_path / "acc.json", tmp_path / "acc.png"
    done = subprocess.run([sys.executable, str(BENCH / "osp_accuracy.py"), "--epochs", "1", "--text-steps", "4",
                           "--eval-every", "2", "--text-mib", "0.25", "--seq-len", "32", "--text-batch", "2",
                           "--batch-size", "128", "--json", str(out), "--png", str(png)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [(r["task"], r["mode"], r["metric"]) for r in rows] == [
        (task, mode, metric) for task, metric in (("digits", "test_accuracy"), ("text", "val_loss"))
        for mode in ("ddp", "overlap", "osp", "osp-no-lgp")]
    by = {(r["task"], r["mode"]): r for r in rows}
    for task in ("digits", "text"):
        assert by[task, "overlap"]["params_sha256"] == by[task, "ddp"]["params_sha256"]  # exact synchronous SGD
        assert by[task, "osp"]["stage2"] and by[task, "osp"]["params_sha256"] != by[task, "osp-no-lgp"]["params_sha256"]
    assert 0.0 <= by["digits", "ddp"]["value"] <= 1.0 and by["text", "ddp"]["value"] > 0
    assert len(by["text", "osp"]["curve"]) == 2 and png.stat().st_size > 0


def test_the_gpu_check_dry_runs_on_gloo(tmp_path):
    """bench/gpu_check.py's every check, on CPU (the CUDA paths need a GPU; the script itself must work)."""
    out = tmp_path / "gpu_check.json"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(BENCH / "gpu_check.py"), "--device", "cpu", "--models", "tiny_gpt",
                           "--profile-model", "tiny_cnn", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["ok"] and result["device"].startswith("cpu") and result["world_size"] == 2
    names = [(c["check"], c["model"]) for c in result["checks"]]
    assert ("profile", "tiny_cnn") in names and ("compiled", "tiny_gpt") in names
    assert {c["check"] for c in result["checks"]} == {"profile", "wrap-barrier", "wrap-overlap", "wrap-osp", "compiled",
                                                      "shard-per-block-deeper", "shard-size", "shard-pipelined",
                                                      "shard-least-memory", "shard-recorder"}
    compiled = next(c for c in result["checks"] if c["check"] == "compiled")
    assert compiled["rel_diff"] == 0.0 and compiled["control_rel_diff"] == 0.0  # torch.compile's control ran too
    recorded = next(c for c in result["checks"] if c["check"] == "shard-recorder")["collectives"]
    assert [kind for kind, _, _ in recorded] == ["all-gather", "reduce-scatter"]
    assert all(c["chunked_buckets"] >= 1 for c in result["checks"] if c["check"].startswith("wrap"))
    assert all(c["stage2_params"] >= 1 for c in result["checks"] if c["check"] == "wrap-osp")
    assert all(c["rank_spread"] == 0.0 for c in result["checks"] if c["check"].startswith("wrap"))
    osp = next(c for c in result["checks"] if c["check"] == "wrap-osp")
    assert osp["max_param_diff"] > 0.0  # two ranks: stage 2 is not DDP's mathematics, and the check knows it


def test_the_demo_summary_puts_each_run_beside_its_prediction_and_ddp(tmp_path):
    """The end of ``make demo``: measured and predicted steps, and both ratios to DDP's run."""
    from schedopt import Cluster, Problem
    from schedopt.solvers import get
    from schedopt.synthetic import transformer_like

    graph, cluster = transformer_like(2), Cluster(world_size=2, bandwidth_Bps=1e9, latency_s=1e-4)
    graph.save(tmp_path / "g.json")
    cluster.save(tmp_path / "c.json")
    args = [str(tmp_path / "g.json"), str(tmp_path / "c.json")]
    for kind, solver, period in (("ddp", "pytorch-ddp", 0.2), ("schedopt", "horovod", 0.16)):
        get(solver)(Problem(graph=graph, cluster=cluster)).save(tmp_path / f"{kind}.plan.json")
        run = {"kind": kind, "period_s": period, "step_s": [period * 0.9, period, period * 1.1]}
        (tmp_path / f"{kind}.run.json").write_text(json.dumps(run))
        args.append(f"{tmp_path / kind}.plan.json:{tmp_path / kind}.run.json")
    done = subprocess.run([sys.executable, str(BENCH.parent / "examples" / "demo_summary.py"), *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-1000:]
    lines = done.stdout.splitlines()
    ddp, ours = lines[1].split(), lines[2].split()
    assert ddp[:3] == ["ddp", "pytorch-ddp", "200.0ms"] and ddp[5:7] == ["1.000x", "(1.000x)"]
    assert ours[:3] == ["schedopt", "horovod", "160.0ms"] and ours[5] == "1.250x" and ours[-2:] == ["144-176", "ms"]
    predicted = float(ours[6].strip("()x"))
    assert predicted == pytest.approx(float(ddp[3].removesuffix("ms")) / float(ours[3].removesuffix("ms")), rel=2e-3)
    assert "one launch each" in lines[-1] and "vs ddp" in lines[0]
