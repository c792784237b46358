"""The command line: the happy path writes its files; bad input is one line and exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from schedopt import TrainGraph
from schedopt.cli import main
from schedopt.synthetic import diamond, transformer_like
from schedopt.units import format_duration


@pytest.fixture
def graph_file(tmp_path):
    path = tmp_path / "graph.json"
    transformer_like(2).save(path)
    return path


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "schedopt", *args], capture_output=True, text=True, timeout=120)


def test_simulate_says_when_its_lower_bound_counts_interference(tmp_path, graph_file, capsys):
    plan = tmp_path / "plan.json"
    assert main(["plan", str(graph_file), "--solver", "pytorch-ddp", "--world-size", "2", "--network", "10gbe",
                 "--mode", "overlap", "-o", str(plan)]) == 0
    cluster = {**json.loads(plan.read_text())["cluster"], "bandwidth_Bps": 1e11}  # comm beside compute
    for name, interference in (("quiet", 0.0), ("noisy", 0.3)):
        (tmp_path / f"{name}.json").write_text(json.dumps({**cluster, "interference": interference}))
    capsys.readouterr()
    bounds = {}
    for name in ("quiet", "noisy"):
        extra = ["--cluster", str(tmp_path / f"{name}.json")]
        assert main(["simulate", str(plan), str(graph_file), *extra]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("iteration"))
        assert ("30% slower beside the wire" in line) == (name == "noisy"), line
        assert main(["simulate", str(plan), str(graph_file), "--format", "json", *extra]) == 0
        bounds[name] = json.loads(capsys.readouterr().out)["lower_bound_s"]
    assert bounds["noisy"] > bounds["quiet"]


def test_plan_simulate_inspect_compare(tmp_path, graph_file, capsys):
    plan = tmp_path / "out" / "plan.json"
    assert main(["plan", str(graph_file), "--solver", "pytorch-ddp", "--world-size", "16", "--network", "25gbe",
                 "--mode", "overlap", "-o", str(plan)]) == 0
    data = json.loads(plan.read_text())
    assert data["cluster"]["world_size"] == 16 and data["cluster"]["name"] == "25gbe" and data["mode"] == "overlap"
    assert "proved" not in capsys.readouterr().out  # a heuristic proves no bound
    assert main(["plan", str(graph_file), "--solver", "cpsat", "--time-limit", "1", "-o",
                 str(tmp_path / "c.json")]) == 0
    solved = json.loads((tmp_path / "c.json").read_text())["solver"]  # cpsat's own bound, beside the simulator's
    assert f"cpsat proved {format_duration(solved['bound_s'])}, gap {solved['gap']:.2%}, for " \
        in capsys.readouterr().out
    trace, gantt = tmp_path / "trace.json", tmp_path / "gantt.png"
    assert main(["simulate", str(plan), str(graph_file), "--trace", str(trace), "--gantt", str(gantt)]) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    tracks = {e["tid"] for e in events if e["ph"] == "X"}
    assert tracks == {1, 2}  # compute and network on separate tracks
    assert all(e["dur"] >= 0 and "ts" in e for e in events if e["ph"] == "X")
    assert gantt.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert main(["simulate", str(plan), str(graph_file), "--format", "json", "--bandwidth", "100Gbps"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["mode"] == "overlap" and summary["cluster"]["bandwidth_Bps"] == pytest.approx(12.5e9)
    assert summary["lower_bound_s"] <= summary["iteration_s"]
    assert main(["inspect", str(plan), str(graph_file)]) == 0
    assert "buckets" in capsys.readouterr().out
    out_dir = tmp_path / "cmp"
    assert main(["compare", str(graph_file), "--solvers", "all", "--format", "json", "--out", str(out_dir)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"schema", "model", "cluster", "mode", "execution", "rows"}
    assert result["schema"] == "schedopt.compare/6" and result["mode"] == "barrier" and result["execution"] == "eager"
    rows = result["rows"]
    # the documented, stable keys of a row (schedopt/report.py): scripts parse them
    assert all(list(row) == ["solver", "status", "iteration_s", "peak_memory_bytes", "lower_bound_s", "bound_s",
                             "gap", "gap_to_lower_bound", "exposed_comm_s", "comm_s", "compute_s", "num_buckets",
                             "num_units", "solve_time_s", "speedup_vs_ddp", "perfect_overlap_s", "headroom_share",
                             "period_s", "speedup_vs_fsdp", "period_lower_bound_s"]
               for row in rows)
    assert json.loads((out_dir / "compare.json").read_text())["rows"] == rows
    ddp = next(r for r in rows if r["solver"] == "pytorch-ddp")
    assert ddp["speedup_vs_ddp"] == pytest.approx(1.0) and ddp["headroom_share"] == pytest.approx(0.0)
    assert all(r["speedup_vs_fsdp"] is None for r in rows)  # a sharded mode's figure
    for r in rows:  # the share of DDP's distance to max(compute, comm) that each plan takes
        assert r["perfect_overlap_s"] <= r["iteration_s"] * (1 + 1e-9)
        assert r["headroom_share"] == pytest.approx((ddp["iteration_s"] - r["iteration_s"])
                                                    / (ddp["iteration_s"] - r["perfect_overlap_s"]))
    assert (out_dir / "compare.png").exists()
    assert (out_dir / "pytorch-ddp.plan.json").exists() and (out_dir / "pytorch-ddp.gantt.png").exists()
    assert (out_dir / "compare.csv").read_text().startswith("solver,status,iteration_s")
    assert main(["compare", str(graph_file), "--solvers", "pytorch-ddp", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("solver,")


def test_the_compare_and_sweep_tables_show_only_the_columns_the_mode_fills(graph_file, capsys):
    """A person's table leaves out what no row has (sharded: buckets; other modes: units and memory);
    JSON and CSV keep every key."""
    def header(argv: list[str]) -> list[str]:
        capsys.readouterr()
        assert main(argv) == 0
        lines = capsys.readouterr().out.splitlines()
        return next(line for line in lines if line.startswith(("solver", "world_size"))).split()

    common = ["--world-size", "8", "--network", "100gbe"]
    shown = header(["compare", str(graph_file), "--solvers", "pytorch-ddp,horovod", *common])
    assert {"num_buckets", "speedup_vs_ddp"} <= set(shown)
    assert not {"num_units", "peak_memory", "period_ms"} & set(shown)
    shown = header(["compare", str(graph_file), "--solvers", "fsdp-per-block", "--mode", "sharded", *common])
    assert {"num_units", "peak_memory"} <= set(shown) and "num_buckets" not in shown
    shown = header(["sweep", str(graph_file), "--solvers", "fsdp-root", "--mode", "sharded", "--bandwidths", "1Gbps",
                    "--world-sizes", "8", "--replicas", "2", "--shard-network", "nvlink"])
    assert {"num_units", "peak_memory"} <= set(shown) and "num_buckets" not in shown
    assert main(["compare", str(graph_file), "--solvers", "pytorch-ddp", "--format", "csv", *common]) == 0
    assert "num_units" in capsys.readouterr().out.splitlines()[0]


def test_simulate_on_the_rank_model(tmp_path, graph_file, capsys):
    plan = tmp_path / "plan.json"
    assert main(["plan", str(graph_file), "--solver", "pytorch-ddp", "--world-size", "8", "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["simulate", str(plan), str(graph_file), "--format", "json", "--op-spread", "5%", "--step-spread",
                 "0.02", "--ranks", "16", "--seed", "3"]) == 0
    data = json.loads(capsys.readouterr().out)
    ranks = data["ranks"]
    assert (ranks["ranks"], ranks["op_spread"], ranks["step_spread"], ranks["seed"]) == (16, 0.05, 0.02, 3)
    assert ranks["period_s"] > data["iteration_s"] and ranks["stable"]  # the slowest of 16 ranks decides
    assert data["lower_bound_s"] <= ranks["lower_bound_s"] <= ranks["period_s"]  # and bounds it from below
    assert main(["simulate", str(plan), str(graph_file), "--op-spread", "5%"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("ranks      "))
    assert "; lower bound on the ranks " in line
    assert main(["simulate", str(plan), str(graph_file), "--format", "json"]) == 0
    assert "ranks" not in json.loads(capsys.readouterr().out)
    # a graph whose op times were measured varies as measured, unless told otherwise
    measured = tmp_path / "measured.json"
    TrainGraph.load(graph_file).with_durations({}, meta={"op_spread": 0.1, "step_spread": 0.03}).save(measured)
    assert main(["simulate", str(plan), str(measured), "--format", "json"]) == 0
    ranks = json.loads(capsys.readouterr().out)["ranks"]
    assert (ranks["ranks"], ranks["op_spread"], ranks["step_spread"]) == (8, 0.1, 0.03)
    assert main(["simulate", str(plan), str(measured), "--format", "json", "--op-spread", "0", "--step-spread", "0"]) == 0
    assert "ranks" not in json.loads(capsys.readouterr().out)
    # compare: each plan's period on the measured ranks beside its one-rank iteration
    assert main(["compare", str(measured), "--solvers", "pytorch-ddp,horovod", "--world-size", "8", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert all(r["period_s"] >= r["iteration_s"] * 0.99 for r in rows)
    assert all(r["lower_bound_s"] <= r["period_lower_bound_s"] <= r["period_s"] for r in rows)  # the ranks' bound
    assert main(["compare", str(measured), "--solvers", "horovod", "--rank-model", "none", "--format", "json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["period_s"] is None and row["period_lower_bound_s"] is None


@pytest.mark.parametrize("args, message", [
    (["plan", "{missing}", "--solver", "pytorch-ddp"], "does not exist"),
    (["plan", "{corrupt}", "--solver", "pytorch-ddp"], "not valid JSON"),
    (["plan", "{graph}", "--solver", "nope"], "unknown solver 'nope'"),
    (["plan", "{graph}", "--solver", "pytorch-ddp", "--bandwidth", "10Gbs"], "unknown unit 'Gbs'"),
    (["plan", "{graph}", "--solver", "pytorch-ddp", "--latency", "fast"], "bad duration"),
    (["plan", "{graph}", "--solver", "pytorch-ddp", "--world-size", "0"], "expected a number >= 1"),
    (["plan", "{graph}", "--solver", "pytorch-ddp", "--option", "bucket_size=3"], "no option 'bucket_size'"),
    (["plan", "model.pt", "--solver", "pytorch-ddp"], "expected a graph .json, an .onnx file"),
    (["plan", "missing.onnx", "--solver", "pytorch-ddp"], "does not exist"),
    (["plan", "{missing}.py:f", "--solver", "pytorch-ddp"], "does not exist"),
    (["simulate", "{plan}", "{other}"], "plan was made for model"),
    (["simulate", "{corrupt}", "{graph}"], "not valid JSON"),
    (["simulate", "{plan}", "{graph}", "--op-spread", "lots"], "expected a coefficient of variation"),
    (["simulate", "{plan}", "{graph}", "--step-spread", "900%"], "must be from 0 to 5"),
    (["inspect", "{graph}"], "a training graph (schedopt.graph/1), not a plan"),
    (["compare", "{graph}", "--solvers", "pytorch-ddp,nope"], "unknown solver 'nope'"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, graph_file, capsys, args, message):
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"schema": ')
    other = tmp_path / "other.json"
    diamond().save(other)
    plan = tmp_path / "plan.json"
    assert main(["plan", str(graph_file), "--solver", "pytorch-ddp", "-o", str(plan)]) == 0
    names = {"missing": tmp_path / "missing.json", "corrupt": corrupt, "graph": graph_file, "plan": plan,
             "other": other}
    capsys.readouterr()
    try:  # in this process (a second interpreter costs 0.7 s a case): argparse's refusals exit
        status = main([a.format(**names) for a in args])
    except SystemExit as exit_:
        status = exit_.code
    err = capsys.readouterr().err
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert message in lines[0]
    assert "Traceback" not in err


def test_the_installed_entry_point_refuses_in_one_line_too(tmp_path):
    """``python -m schedopt`` as a user runs it: an argparse refusal and one of schedopt's own."""
    for args, message in ((["frobnicate"], "invalid choice"),
                          (["plan", str(tmp_path / "missing.json"), "--solver", "pytorch-ddp"], "does not exist")):
        result = run(*args)
        assert result.returncode == 2 and result.stderr.count("\n") == 1 and message in result.stderr, result
        assert "Traceback" not in result.stderr


def test_failed_plan_does_not_clobber_an_existing_file(tmp_path, graph_file):
    plan = tmp_path / "plan.json"
    plan.write_text("precious")
    assert run("plan", str(graph_file), "--solver", "nope", "-o", str(plan)).returncode == 2
    assert plan.read_text() == "precious"


def test_sweep_writes_csv_json_and_plot(tmp_path, graph_file, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", str(graph_file), "--bandwidths", "1Gbps,100Gbps", "--world-sizes", "4,32",
                 "--solvers", "pytorch-ddp,caramel", "--out", str(out), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 * 2 * 2
    assert {(r["world_size"], r["bandwidth_Bps"]) for r in rows} == {(4, 1.25e8), (4, 1.25e10), (32, 1.25e8),
                                                                    (32, 1.25e10)}
    assert (out / "sweep.csv").read_text().startswith("world_size,bandwidth_Bps,solver")
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["sweep", str(graph_file), "--bandwidths", "fast"]) == 2
    assert "bad bandwidth 'fast'" in capsys.readouterr().err


def _snapshot(root) -> dict:
    """Every entry below ``root``: kind, and size and mtime of regular files (what a refusal must not change)."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            out[str(path)] = ("link", str(path.readlink()))
        elif path.is_file():
            out[str(path)] = ("file", path.stat().st_size, path.stat().st_mtime_ns)
        else:
            out[str(path)] = ("other", path.is_dir())
    return out


@pytest.mark.parametrize("args, message", [
    (["plan", "{graph}", "--solver", "pytorch-ddp", "-o", "{graph}"], "also an input"),
    (["plan", "{graph}", "--solver", "pytorch-ddp", "--cluster", "{cluster}", "-o", "{cluster}"], "also an input"),
    (["plan", "{graph}", "--solver", "pytorch-ddp", "-o", "/dev/null"], "device, FIFO or socket"),
    (["plan", "{graph}", "--solver", "pytorch-ddp", "-o", "{fifo}"], "device, FIFO or socket"),
    (["plan", "{graph}", "--solver", "pytorch-ddp", "-o", "{fifo_link}"], "device, FIFO or socket"),
    (["plan", "{graph}", "--solver", "pytorch-ddp", "-o", "{afile}/plan.json"], "is a file, not a directory"),
    (["plan", "{graph}", "--solver", "pytorch-ddp", "-o", "{afile}/deeper/plan.json"], "is a file, not a directory"),
    (["plan", "{graph}", "--solver", "pytorch-ddp", "-o", ""], "output path is empty"),
    (["plan", "{graph}", "--solver", "pytorch-ddp", "-o", "{dir}"], "is a directory"),
    (["import", "{factory}:make", "-o", "{factory}"], "also an input"),
    (["simulate", "{plan}", "{graph}", "--trace", "{plan}"], "also an input"),
    (["simulate", "{plan}", "{graph}", "--trace", "/dev/null"], "device, FIFO or socket"),
    (["simulate", "{plan}", "{graph}", "--gantt", "{afile}/g.png"], "is a file, not a directory"),
    (["simulate", "{plan}", "{graph}", "--gantt", "{dir}"], "is a directory"),
    (["compare", "{graph}", "--solvers", "pytorch-ddp", "--out", "{afile}"], "is a file, not a directory"),
    (["compare", "{graph}", "--solvers", "pytorch-ddp", "--out", "{afile}/sub"], "is a file, not a directory"),
    (["compare", "{graph}", "--solvers", "pytorch-ddp", "--out", ""], "--out is empty"),
    (["sweep", "{graph}", "--solvers", "pytorch-ddp", "--out", "{afile}"], "is a file, not a directory"),
    (["sweep", "{graph}", "--solvers", "pytorch-ddp", "--plot", "{graph}"], "also an input"),
])
def test_bad_outputs_are_refused_before_any_work_and_touch_nothing(tmp_path, graph_file, capsys, args, message):
    import os

    from schedopt import Cluster

    work = tmp_path / "work"
    (work / "dir").mkdir(parents=True)
    plan = work / "plan.json"
    assert main(["plan", str(graph_file), "--solver", "pytorch-ddp", "-o", str(plan)]) == 0
    Cluster.preset("10gbe", world_size=4).save(work / "cluster.json")
    (work / "afile").write_text("a regular file")
    (work / "m.py").write_text("raise SystemExit('never imported')\n")
    os.mkfifo(work / "fifo")
    (work / "fifo_link").symlink_to(work / "fifo")
    names = {"graph": graph_file, "plan": plan, "cluster": work / "cluster.json", "afile": work / "afile",
             "factory": work / "m.py", "fifo": work / "fifo", "fifo_link": work / "fifo_link", "dir": work / "dir"}
    before, null_before = _snapshot(tmp_path), os.stat("/dev/null")
    capsys.readouterr()
    assert main([a.format(**names) for a in args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0], err
    assert _snapshot(tmp_path) == before
    assert os.stat("/dev/null").st_rdev == null_before.st_rdev and not os.path.isfile("/dev/null")


def test_a_symlinked_output_is_written_through_and_the_link_kept(tmp_path, graph_file):
    link = tmp_path / "latest.json"
    link.symlink_to(tmp_path / "plans" / "v1.json")
    assert main(["plan", str(graph_file), "--solver", "pytorch-ddp", "-o", str(link)]) == 0
    assert link.is_symlink() and json.loads((tmp_path / "plans" / "v1.json").read_text())["schema"]
    assert [p.name for p in (tmp_path / "plans").iterdir()] == ["v1.json"]  # no temporary left behind


def test_overlap_compare_measures_speedups_against_ddp_as_torch_runs_it(tmp_path, graph_file, capsys):
    from schedopt import Cluster, Plan, Problem, TrainGraph, simulate

    args = ["compare", str(graph_file), "--solvers", "pytorch-ddp,caramel", "--mode", "overlap", "--network",
            "100gbe", "--world-size", "8", "--format", "json", "--out", str(tmp_path / "cmp")]
    assert main(args) == 0
    rows = {r["solver"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    ddp_plan = Plan.load(tmp_path / "cmp" / "pytorch-ddp.plan.json")
    problem = Problem(graph=TrainGraph.load(graph_file), cluster=Cluster.preset("100gbe", world_size=8))
    ddp_barrier = simulate(problem, ddp_plan).iteration_s  # DDP waits for every collective before its step
    for r in rows.values():
        assert r["speedup_vs_ddp"] == pytest.approx(ddp_barrier / r["iteration_s"])


@pytest.mark.parametrize("args, message", [
    (["--solver", "pytorch-ddp", "--option", "bucket_cap_mb=abc"], "option bucket_cap_mb must be a number, got 'abc'"),
    (["--solver", "pytorch-ddp", "--option", "bucket_cap_mb=-1"], "option bucket_cap_mb must be a finite number above 0"),
    (["--solver", "pytorch-ddp", "--option", "bucket_cap_mb=NaN"], "got nan"),
    (["--solver", "pytorch-ddp", "--option", "bucket_cap_mb=Infinity"], "got inf"),
    (["--solver", "pytorch-ddp", "--option", "first_bucket_mb=true"], "option first_bucket_mb must be a number"),
    (["--solver", "pytorch-ddp", "--option", "seed=3"], "use --seed"),
    (["--solver", "pytorch-ddp", "--option", "time-limit-s=3"], "use --time-limit"),
    (["--solver", "pytorch-ddp", "--seed", "99999999999"], "option seed must be an integer from 0 to 2147483647"),
    (["--solver", "pytorch-ddp", "--seed", "-1"], "option seed must be an integer from 0"),
    (["--solver", "cpsat", "--option", "num_workers=1.5"], "option num_workers must be an integer, got 1.5"),
    (["--solver", "cpsat", "--option", "max_buckets=0"], "option max_buckets must be an integer from 1"),
    (["--solver", "cpsat", "--option", 'tuning={"nope": 1}'], "cpsat has no tuning 'nope'"),
    (["--solver", "cpsat", "--option", 'tuning={"bound_phase_share": 2}'], "bound_phase_share must be a finite number above 0 and at most 1, got 2"),
    (["--solver", "caramel", "--option", "max_chunks=1e9"], "option max_chunks must be an integer"),
    (["--solver", "caramel", "--option", "max_chunks=5000"], "from 1 to 1024, got 5000"),
    (["--solver", "horovod", "--option", "cycle_time_ms=0"], "option cycle_time_ms must be a finite number above 0"),
    (["--solver", "bytescheduler", "--option", "partition_bytes=[1]"], "option partition_bytes must be a number"),
])
def test_bad_solver_options_name_the_option_and_the_value(tmp_path, graph_file, capsys, args, message):
    out = tmp_path / "plan.json"
    assert main(["plan", str(graph_file), *args, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_the_api_raises_solver_error_for_bad_options():
    from schedopt import Cluster, Problem, SolverError
    from schedopt.solvers import get

    problem = Problem(graph=transformer_like(2), cluster=Cluster.preset("10gbe", world_size=4))
    with pytest.raises(SolverError, match="option max_chunks must be an integer"):
        get("caramel")(problem, max_chunks=2.5)
    assert get("caramel")(problem, max_chunks=2).solver.name == "caramel"  # a good value still runs


def test_the_plan_line_says_what_the_solver_proved_and_whose_plan_the_ranks_kept():
    from schedopt.cli.plans import _proven
    from schedopt.plan import SolverInfo

    stats = {"bound_covers": "plans of at most 8 buckets in the engine's order (the model's)", "rank_choice": "horovod",
             "rank_period_s": 0.7, "rank_gap": 0.0}
    info = SolverInfo(name="cpsat", status="FEASIBLE", objective_s=0.632, bound_s=0.617, stats=stats)
    assert _proven(info) == ("; cpsat proved 617ms, gap 2.37%, for plans of at most 8 buckets in the engine's order; "
                             "horovod's plan kept, the fastest on the ranks' varying op times: 700ms, 0.00% above "
                             "the bound there (700ms)")  # the slowest rank's bound, above the one rank's
    assert _proven(SolverInfo(name="cpsat", status="OPTIMAL", objective_s=0.632, bound_s=0.632,
                              stats={"rank_choice": "cpsat", "rank_period_s": 0.6636, "rank_gap": 0.05})) == (
        "; cpsat proved 632ms, gap 0.00%; on the ranks' varying op times: 664ms, 5.00% above the bound there (632ms)")
    assert _proven(SolverInfo(name="cpsat", status="OPTIMAL", objective_s=0.632, bound_s=0.632)) == \
        "; cpsat proved 632ms, gap 0.00%"  # one rank alike: nothing re-checked
    assert _proven(SolverInfo(name="caramel", status="HEURISTIC")) == ""  # no bound, nothing claimed


@pytest.mark.parametrize("after_s", [2.0, 7.0])  # in the warm-start search, then in CP-SAT's own solve
def test_ctrl_c_during_a_cpsat_solve_ends_within_2_s_with_130_and_writes_nothing(tmp_path, after_s):
    import signal
    import time

    graph, out = tmp_path / "t8.json", tmp_path / "plan.json"
    transformer_like(8).save(graph)
    proc = subprocess.Popen([sys.executable, "-m", "schedopt", "plan", str(graph), "--solver", "cpsat", "--mode",
                             "overlap", "--network", "100gbe", "--time-limit", "40", "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(after_s)
    assert proc.poll() is None, "the solve ended before the interrupt"
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 2.0
    assert proc.returncode == 130 and err.strip().splitlines() == ["schedopt: interrupted"]
    assert not out.exists()
