"""Launch paths: calibrate on real ranks, the cluster file, torchrun with SCHEDOPT_PLAN, the testbed's refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from schedopt import Cluster
from schedopt.cli import main

from . import runtime_workers as workers
from .distributed import run_ranks
from .models_path import MODELS_FILE

ROOT = Path(__file__).resolve().parent.parent


def test_calibrate_fits_a_cluster_on_real_gloo_ranks(tmp_path):
    results = run_ranks(workers.calibrate_small, 2)
    first = results[0]
    assert first["sizes"] == [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]
    assert all(r["cluster"] == first["cluster"] for r in results)  # every rank fits the same data
    cluster = first["cluster"]
    assert cluster.world_size == 2 and cluster.bandwidth_Bps > 1e6
    assert first["quality"].num_points == 6 and first["quality"].r2 <= 1.0
    path = tmp_path / "cluster.json"
    cluster.save(path, calibration=first["json"])
    assert Cluster.load(path) == cluster
    assert json.loads(path.read_text())["calibration"]["backend"] == "gloo"
    # FSDP2's collectives, measured on their own: the cluster's sharded costs are gloo's, not the ring's
    assert cluster.backend == "gloo" and [k for k, *_ in cluster.shard_costs] == ["all-gather", "reduce-scatter"]
    assert all(fixed >= 0 and per_byte > 0 for _, fixed, per_byte in cluster.shard_costs)
    swept = first["json"]["shard_measurements"]  # the sweeps those fits come from, from 64 KiB
    assert set(swept) == {"all-gather", "reduce-scatter"} and all(len(ms) >= 2 for ms in swept.values())
    assert all(m["nbytes"] >= 64 << 10 and m["median_s"] > 0 for ms in swept.values() for m in ms)
    # the matmul stands in for the model's compute, in the samples asked for
    assert first["json"]["interference_of"] == "matmul" and len(first["json"]["interference_samples"]) == 3


def test_calibrate_measures_hsdp_collectives_on_the_groups_fsdp2s_mesh_runs_them_on():
    """4 ranks as 2 replicas of 2 (mesh rows [0, 1] and [2, 3]): the all-reduces the link is fitted to
    run across the replicas ([0, 2], [1, 3]), the all-gathers and reduce-scatters inside one."""
    results = run_ranks(workers.calibrate_hsdp, 4, 2)
    cluster = results[0]["cluster"]
    assert (cluster.world_size, cluster.replicas, cluster.shard_group) == (4, 2, 2)
    assert [k for k, *_ in cluster.shard_costs] == ["all-gather", "reduce-scatter"]
    assert results[0]["json"]["allreduce_ranks"] == 2 and results[0]["json"]["shard_group"] == 2
    assert all(r["cluster"] == cluster for r in results)  # both replica groups' medians: the slowest
    for rank, result in enumerate(results):
        row, column = [2 * (rank // 2), 2 * (rank // 2) + 1], [rank % 2, rank % 2 + 2]
        assert result["ran"]["all_gather_single"] == result["ran"]["reduce_scatter_single"] == {tuple(row)}
        # the sweep across the replicas; the interference load and the medians' maximum over every rank
        assert tuple(column) in result["ran"]["all_reduce"] and tuple(row) not in result["ran"]["all_reduce"]
    # replicas of one rank: nothing to gather inside them, the all-reduce over all four
    alone = run_ranks(workers.calibrate_hsdp, 4, 4)[0]
    assert alone["cluster"].shard_costs is None and alone["json"]["allreduce_ranks"] == 4
    assert "all_gather_single" not in alone["ran"]
    # replicas that do not divide the ranks: one error on every rank, before any collective
    for refused in run_ranks(workers.calibrate_hsdp, 4, 3):
        assert "divides the 4 ranks" in refused["error"] and not refused["ran"]


def test_calibrate_measures_interference_on_the_model_it_is_given():
    results = run_ranks(workers.calibrate_with_model, 2)
    first = results[0]
    assert first["json"]["interference_of"] == "tiny_cnn" and first["grads"]
    # warm-up, three alone, one for k, and per sample k alone and k during (k >= 1)
    assert first["calls"] >= 5 + 2 * len(first["json"]["interference_samples"])
    assert len(first["json"]["interference_samples"]) == 9
    assert all(r["interference"] == first["interference"] >= 0 for r in results)  # the slowest rank's, on every rank
    # its progress, phase by phase: the sizes swept (and the one a sweep stopped at, on its time limit), the
    # interference samples, FSDP2's collectives' sizes
    swept = first["json"]["shard_measurements"]
    measured = [len(first["json"]["measurements"]), 9, len(swept["all-gather"]), len(swept["reduce-scatter"])]
    assert [what for what, _ in first["phases"]] == ["all-reduces", "interference", "all-gathers", "reduce-scatters"]
    assert all(n <= seen <= n + 1 for n, (_, seen) in zip(measured, first["phases"])), (first["phases"], measured)


def test_calibrate_refuses_a_model_it_cannot_run_in_one_line(capsys, monkeypatch):
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(key, value)
    assert main(["calibrate", "--model", "model.onnx", "-o", "c.json"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs path/to/file.py:factory" in err


def test_calibrate_outside_torchrun_says_how_to_run_it(capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert main(["calibrate", "-o", "c.json"]) == 2
    assert "not set: run schedopt calibrate" in capsys.readouterr().err


TORCHRUN_ENV = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize("name", ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"])
def test_calibrate_with_a_torchrun_variable_set_but_empty_is_one_line(capsys, monkeypatch, name):
    for key, value in {**TORCHRUN_ENV, name: ""}.items():
        monkeypatch.setenv(key, value)
    assert main(["calibrate", "-o", "c.json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{name} set but empty" in err and "Traceback" not in err


def test_calibrate_with_replicas_that_do_not_divide_the_ranks_is_one_line(capsys, monkeypatch):
    for key, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(key, value)
    assert main(["calibrate", "--replicas", "3", "-o", "c.json"]) == 2  # before joining any group
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--replicas 3 must divide the 2 ranks" in err


@pytest.mark.parametrize(("changes", "says"), [
    ({"RANK": "x"}, "RANK='x' is not an integer"), ({"RANK": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be at least 1"), ({"MASTER_PORT": "70000"}, "not a TCP port"),
    ({"LOCAL_RANK": " "}, "LOCAL_RANK set but empty"), ({"LOCAL_RANK": "-1"}, "LOCAL_RANK=-1"),
])
def test_rendezvous_check_names_the_variable_at_fault(changes, says):
    from schedopt.errors import LaunchError
    from schedopt.rendezvous import check_rendezvous_env

    with pytest.raises(LaunchError, match=says.replace("(", r"\(")):
        check_rendezvous_env({**TORCHRUN_ENV, **changes})
    assert check_rendezvous_env({**TORCHRUN_ENV, "LOCAL_RANK": "1"}).local_rank == 1


def test_train_script_with_an_empty_master_addr_is_one_line():
    env = {**os.environ, **TORCHRUN_ENV, "MASTER_ADDR": ""}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "train.py"), "tiny_cnn", "--steps", "1"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "train.py: MASTER_ADDR set but empty: run examples/train.py under torchrun " \
                                  "(torchrun --nproc-per-node 2 ...)"


def test_plan_takes_a_cluster_file_and_an_execution(tmp_path, capsys):
    cluster = Cluster(world_size=2, bandwidth_Bps=5e7, latency_s=1e-4, name="calibrated-gloo")
    cluster.save(tmp_path / "cluster.json")
    plan = tmp_path / "plan.json"
    assert main(["plan", f"{MODELS_FILE}:tiny_branches", "--solver", "caramel", "--cluster",
                 str(tmp_path / "cluster.json"), "-o", str(plan)]) == 0
    data = json.loads(plan.read_text())
    assert data["cluster"]["world_size"] == 2 and data["cluster"]["bandwidth_Bps"] == 5e7
    assert data["execution"] == "eager" and data["schema"] == "schedopt.plan/4"
    assert main(["plan", f"{MODELS_FILE}:tiny_branches", "--solver", "caramel", "--cluster",
                 str(tmp_path / "cluster.json"), "--execution", "compiled", "-o", str(plan)]) == 0
    assert json.loads(plan.read_text())["execution"] == "compiled"
    capsys.readouterr()
    assert main(["plan", f"{MODELS_FILE}:tiny_branches", "--solver", "caramel", "--cluster",
                 str(tmp_path / "missing.json"), "-o", str(plan)]) == 2
    assert "cluster file" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["barrier", "overlap"])
def test_torchrun_applies_the_plan_in_schedopt_plan(tmp_path, mode):
    """Also what ran: in overlap mode on gloo, when rank 0 queued, started and ended each collective."""
    plan = tmp_path / "plan.json"
    assert main(["plan", f"{MODELS_FILE}:tiny_cnn", "--solver", "pytorch-ddp", "--world-size", "2",
                 "--mode", mode, "-o", str(plan)]) == 0
    out = tmp_path / "run.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "examples" / "train.py"), "tiny_cnn", "--steps", "3", "--threads", "1", "--json", str(out)]
    done = subprocess.run(cmd, env={**os.environ, "SCHEDOPT_PLAN": str(plan)}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads(out.read_text())
    assert run["kind"] == "schedopt" and run["plan"] == str(plan) and len(run["step_s"]) == 3
    # the period is the slowest rank's mean step, at most its slowest step and at least the fastest
    assert max(map(min, run["rank_step_s"])) <= run["period_s"] <= max(run["step_s"])
    assert run["period_s"] == max(sum(ts) / 3 for ts in run["rank_step_s"])
    assert len(run["rank0_phases_s"]) == 3 and all(len(p) == 3 and min(p) > 0 for p in run["rank0_phases_s"])
    assert f"{run['period_s'] * 1e3:.1f} ms per step" in done.stdout
    if mode == "overlap":
        collectives = len(json.loads(plan.read_text())["buckets"])
        assert len(run["rank0_transfers"]) >= 3 * collectives  # the warm-up's too
        assert all(queued <= started <= done for _, queued, started, done in run["rank0_transfers"])
    else:
        assert run["rank0_transfers"] == []


def test_torchrun_applies_an_hsdp_plan_on_a_two_dimensional_mesh(tmp_path):
    """``train.py --shard --replicas 2``: a plan made for 2 replicas (``--replicas 2``) through FSDP2 on
    a (2, 1) mesh, quietly. A shard group of one rank issues no all-gather or reduce-scatter; each step
    records the replicas' all-reduce of every unit (FSDP2's own call, seen through its all-reduce
    hook). A count that does not divide the ranks: one line."""
    plan = tmp_path / "plan.json"
    assert main(["plan", f"{MODELS_FILE}:tiny_gpt", "--mode", "sharded", "--solver", "fsdp-per-block",
                 "--world-size", "2", "--replicas", "2", "-o", str(plan)]) == 0
    out = tmp_path / "run.json"
    train = [str(ROOT / "examples" / "train.py"), "tiny_gpt", "--shard", "--steps", "2", "--threads", "1", "--quiet"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *train,
           "--replicas", "2", "--json", str(out)]
    done = subprocess.run(cmd, env={**os.environ, "SCHEDOPT_PLAN": str(plan)}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "replicated over" not in done.stderr  # the mesh is laid out as the plan
    run = json.loads(out.read_text())
    units = len(json.loads(plan.read_text())["units"])
    assert run["kind"] == "schedopt-sharded" and len(run["rank0_collectives"]) == 2
    for step in run["rank0_collectives"]:
        assert sorted((kind, unit) for kind, unit, *_ in step) == [("all-reduce", k) for k in range(units)]
        assert all(0 <= issue <= end for *_, issue, end in step)
    # refused before joining, where torchrun's variables say the world's size: no launch needed to see it
    bad = subprocess.run([sys.executable, *train, "--replicas", "3"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, **TORCHRUN_ENV, "SCHEDOPT_PLAN": str(plan)})
    assert bad.returncode == 2 and bad.stderr.strip() == "train.py: --replicas 3 does not divide the 2 ranks"


def test_profile_under_torchrun_times_every_rank_at_once(tmp_path):
    """Ranks that share a host slow each other: profiled on every rank at once, each op's median over them."""
    out = tmp_path / "g.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "schedopt", "profile", f"{MODELS_FILE}:tiny_cnn", "--iterations", "2", "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("rank 0: measured step") == 1 and done.stdout.count("rank 1: measured step") == 1
    from schedopt import TrainGraph

    graph = TrainGraph.load(out)
    assert graph.meta["costs"] == "profiled" and graph.meta["profile_ranks"] == 2
    assert len(graph.meta["rank_step_s"]) == 2 and min(graph.meta["rank_step_s"]) > 0
    assert graph.meta["op_spread"] > 0 and graph.meta["step_spread"] >= 0  # the rank model's, RankModel.measured
    assert graph.totals.forward_s > 0 and graph.totals.backward_s > 0


def test_torchrun_compile_applies_a_compiled_plan_and_compiles_the_ddp_baseline(tmp_path):
    plan = tmp_path / "plan.json"
    assert main(["plan", f"{MODELS_FILE}:tiny_branches", "--solver", "caramel", "--world-size", "2",
                 "--execution", "compiled", "-o", str(plan)]) == 0
    for extra, env, kind in ((["--compile"], {"SCHEDOPT_PLAN": str(plan)}, "schedopt-compiled"),
                             (["--ddp", "--compile"], {}, "ddp-compiled")):
        out = tmp_path / f"{kind}.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(ROOT / "examples" / "train.py"), "tiny_branches", "--steps", "1", "--warmup", "1",
               "--threads", "1", "--json", str(out), *extra]
        done = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(out.read_text())["kind"] == kind
    # (that the eager runtime refuses a compiled plan, naming schedopt.runtime.compile, is test_runtime's: in
    # process, without a third launch)


def test_testbed_refuses_without_root_and_bad_modes(monkeypatch, capsys):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import testbed
    finally:
        sys.path.remove(str(ROOT / "bench"))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert testbed.main(["--rate", "400mbit"]) == 2
    assert "needs root" in capsys.readouterr().err
    assert testbed.main(["--modes", "barrier,warp"]) == 2
    assert "--modes" in capsys.readouterr().err
    assert testbed.main(["--modes", "ddp,compiled-slack"]) == 2  # slack is for the eager modes
    assert "--modes" in capsys.readouterr().err


def test_testbed_recompute_measures_runs_by_their_period(tmp_path, capsys):
    """Two ranks alternating long and short steps: the period is their mean, the per-step maximum more."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import testbed
    finally:
        sys.path.remove(str(ROOT / "bench"))
    runs = tmp_path / "tb"
    runs.mkdir()
    for k in range(2):
        ddp = [[1.0, 1.0], [1.0, 1.0]]
        overlap = [[0.6, 1.0], [1.0, 0.6]]  # out of phase: each step's slower rank took 1.0
        for mode, ranks in (("ddp", ddp), ("overlap", overlap), ("graph", ddp)):  # graph.K.json: not a run
            (runs / f"{mode}.{k}.json").write_text(json.dumps(
                {"rank_step_s": ranks, "step_s": [max(s) for s in zip(*ranks)]}))
    rows = [{"mode": "overlap", "solver": "cpsat", "predicted_s": 0.7}]
    (tmp_path / "tb.json").write_text(json.dumps({"rows": rows}))
    assert testbed.run_period({"rank_step_s": [[0.6, 1.0], [1.0, 0.6]]}) == 0.8
    assert testbed.recompute([str(runs)]) == 0
    out = capsys.readouterr().out
    assert "overlap" in out and "800.0 ms per step (runs 800/800), 1.250x DDP; cpsat, predicted 700.0 (-12.5%)" in out
    assert "slower rank's median step 1000.0 ms, 1.000x" in out and "graph" not in out
    (tmp_path / "tb.json").write_text(json.dumps(rows))  # before bench/provenance.py: a bare list of rows
    assert testbed.recompute([str(runs)]) == 0
    assert "cpsat, predicted 700.0 (-12.5%)" in capsys.readouterr().out
    assert testbed.recompute([str(tmp_path)]) == 2  # no runs there
    assert "holds no ddp or fsdp runs" in capsys.readouterr().err


def test_testbed_recompute_predicts_kept_plans_on_todays_engine_order(tmp_path, capsys):
    """With the pooled profile, cluster and plans kept, --recompute simulates them again, eager ones on
    the graph's engine order now (a plan recorded in another order is predicted as it runs)."""
    from dataclasses import replace

    from schedopt import Problem, simulate
    from schedopt.orders import engine_order
    from schedopt.solvers import get
    from schedopt.synthetic import diamond

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import testbed
    finally:
        sys.path.remove(str(ROOT / "bench"))
    graph, cluster = diamond(), Cluster(world_size=2, bandwidth_Bps=1e9, latency_s=5e-4)
    plan = get("pytorch-ddp")(Problem(graph=graph, cluster=cluster))
    engine = engine_order(graph)
    backward = [o for o in engine if graph.ops[o].phase == "backward"]
    other = [o for o in engine if o not in backward[-2:]] + backward[-2:][::-1]  # the last two swapped
    assert other != engine
    runs = tmp_path / "tb"
    runs.mkdir()
    for k in range(2):
        (runs / f"ddp.{k}.json").write_text(json.dumps({"rank_step_s": [[1.0], [1.0]], "step_s": [1.0]}))
    graph.save(runs / testbed.POOLED)
    cluster.save(runs / testbed.CLUSTER)
    (runs / f"ddp{testbed.PLAN}").write_text(json.dumps(replace(plan, order=tuple(other)).to_json()))
    (tmp_path / "tb.json").write_text(json.dumps({"rows": [{"mode": "ddp", "solver": "pytorch-ddp",
                                                             "predicted_s": 0.5}]}))
    assert testbed.recompute([str(runs)]) == 0
    today = simulate(Problem(graph=graph, cluster=cluster), plan).iteration_s
    line = f"predicted 500.0 (-50.0%), today {today * 1e3:.1f} ({today - 1:+.1%})"
    assert line in capsys.readouterr().out
    # the committed form: the same files as one gzipped object, read the same
    kept = tmp_path / "tb.json.gz"
    testbed.write_kept(kept, "tb", {p.name: p.read_text() for p in runs.glob("*.json")})
    assert testbed.recompute([str(kept)]) == 0
    assert line in capsys.readouterr().out
    (tmp_path / "bad.json.gz").write_bytes(b"not gzip")
    assert testbed.recompute([str(tmp_path / "bad.json.gz")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_pool_ranks_leave_when_the_test_process_that_spawned_them_is_gone():
    """A test process that exits without closing its rank pool (os._exit, as a worker may) leaves no rank
    behind: each notices its parent is gone within a poll and exits."""
    code = ("import os, json; from tests.distributed import rank_pid, run_ranks; "
            "print(json.dumps(run_ranks(rank_pid, 2, timeout_s=60)), flush=True); os._exit(0)")
    try:  # the ranks hold the process's stdout too: it ends when the last of them does
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90, cwd=ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail("the ranks outlived their test process by 90 s (its stdout stayed open)")
    assert done.returncode == 0, done.stderr[-1500:]
    pids = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(set(pids)) == 2 and os.getpid() not in pids
    def running(pid: int) -> bool:  # a zombie has exited; whoever adopted it may not reap it at once
        try:
            return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 30
    while any(map(running, pids)) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = [pid for pid in pids if running(pid)]
    assert not left, f"ranks {left} outlived their test process"
