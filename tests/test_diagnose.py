"""schedopt diagnose: interval arithmetic against brute force, a CUDA-format trace by hand, a real CPU
trace of 2 gloo ranks, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import warnings
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedopt import Cluster, Plan, Problem, simulate
from schedopt.cli import main
from schedopt.diagnose import diagnose, sharded_collectives
from schedopt.errors import SchedoptError, TraceError
from schedopt.intervals import covered, covered_union, length, uncovered, union
from schedopt.importers import from_torch
from schedopt.kineto import load_traces
from schedopt.solvers import get, solvers_for
from schedopt.synthetic import transformer_like
from schedopt.trace_costs import trace_costs
from schedopt.whatif import what_plans_gain
from schedopt.whatif_sharded import what_sharded_plans_gain

ROOT = Path(__file__).resolve().parents[1]

spans = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 15)).map(lambda t: (t[0], t[0] + t[1])), max_size=12)


@settings(max_examples=300, deadline=None)
@given(compute=spans, comm=spans)
def test_overlap_share_and_exposed_time_equal_a_brute_force_count(compute, comm):
    """On a unit grid: busy cells of each, cells of comm that compute also covers (hidden), the rest exposed."""
    cells = lambda ivs: {x for a, b in ivs for x in range(a, b)}  # noqa: E731
    busy, talk = cells(compute), cells(comm)
    u_compute, u_comm = union(compute), union(comm)
    assert length(u_compute) == len(busy) and length(u_comm) == len(talk)
    assert covered_union(u_compute, u_comm) == len(busy & talk)
    for a, b in comm:
        assert covered(u_compute, (a, b)) == len(busy & set(range(a, b)))
        assert length(uncovered(u_compute, (a, b))) == len(set(range(a, b)) - busy)


def _kineto(rank: int, events: list[dict]) -> dict:
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
            "traceEvents": events}


def cuda_trace(rank: int) -> dict:
    """One 10 ms step (times in us): compute kernels on stream 7 at 0-4 and 5-9 ms; NCCL kernels on stream
    20, launched at 3.0 and 8.0 ms (correlation ids 11, 12), running 3-6 ms (1 MiB) and 8-10 ms (4 MiB)."""
    def x(name, cat, ts, dur, tid, **args):  # kernels on the GPU's process, with their stream and device
        gpu = cat == "kernel"
        return {"ph": "X", "cat": cat, "name": name, "pid": 1 if gpu else 0, "tid": tid, "ts": ts, "dur": dur,
                "args": {**args, **({"stream": tid, "device": 0} if gpu else {})}}

    return _kineto(rank, [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "GPU 0"}},
        x("ProfilerStep#3", "user_annotation", 0, 10000, 1),
        x("c10d::allreduce_", "cpu_op", 2900, 200, 1), x("c10d::allreduce_", "cpu_op", 7900, 200, 1),
        x("cudaLaunchKernel", "cuda_runtime", 3000, 10, 1, correlation=11),
        x("cudaLaunchKernel", "cuda_runtime", 8000, 10, 1, correlation=12),
        x("ampere_sgemm_128x64_nn", "kernel", 0, 4000, 7, correlation=5),
        x("ampere_sgemm_128x64_nn", "kernel", 5000, 4000, 7, correlation=6),
        x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", 3000, 3000, 20, correlation=11,
          **{"In msg nelems": 262144, "dtype": "Float"}),
        x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", 8000, 2000, 20, correlation=12,
          **{"In msg nelems": 1048576, "dtype": "Float"}),
    ])


def test_a_cuda_trace_by_hand(tmp_path):
    """compute 8 ms, comm 5 ms; hidden: 3-4 and 5-6 (2 ms) and 8-9 (1 ms); exposed 2 ms: 4-5 and 9-10.
    (Holistic Trace Analysis reads these files too: its comm-comp overlap is 60.0%, as here;
    bench/diagnose_hta.py.)"""
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(cuda_trace(rank)))
    report = diagnose(load_traces([str(tmp_path)]))
    assert report.device == "cuda" and len(report.steps) == 2
    s = report.steps[0]
    assert (s.step_s, s.compute_s, s.comm_s, s.exposed_comm_s) == pytest.approx((0.010, 0.008, 0.005, 0.002))
    assert s.overlap_share == pytest.approx(0.6) and s.limit_s == pytest.approx(0.008)
    first, second = s.collectives
    assert (first.issue_s, first.start_s, first.end_s, first.nbytes) == pytest.approx((0.003, 0.003, 0.006, 1 << 20))
    assert (first.hidden_s, first.exposed_s) == pytest.approx((0.002, 0.001))
    assert second.nbytes == 4 << 20 and second.exposed_s == pytest.approx(0.001)
    assert any(r.startswith("late gradient") for r in second.reasons)  # 1 ms of compute left, 2 to send


def test_the_json_names_the_checks_read(tmp_path, capsys):
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(cuda_trace(rank)))
    assert main(["diagnose", str(tmp_path), "--json", str(tmp_path / "d.json"), "--plot", str(tmp_path / "d.png")]) == 0
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["schema"] == "schedopt.diagnosis/1" and (tmp_path / "d.png").stat().st_size > 0
    row = data["steps"][0]
    assert {"rank", "step", "step_s", "compute_s", "comm_s", "exposed_comm_s", "overlap_share"} <= set(row)
    assert {"issue_s", "start_s", "end_s", "bytes", "hidden_s", "exposed_s", "reasons"} <= set(row["collectives"][0])
    assert "exposed collectives" in capsys.readouterr().out


def test_save_cluster_writes_the_link_fitted_to_the_traced_all_reduces_for_plan(tmp_path, capsys):
    """The traced collectives' fit, on the traced device's backend, is a cluster file ``plan --cluster``
    reads; a sharded run's traces (FSDP2's collectives, calibrated apart) and a path that cannot be
    written end in one line each."""
    from schedopt.whatif import cluster_from_trace

    traces, out = tmp_path / "traces", tmp_path / "out"
    traces.mkdir(), out.mkdir()
    for rank in (0, 1):  # :func:`cuda_trace`'s two all-reduces, 4 MiB in 3 ms and 1 MiB in 2 ms
        trace = cuda_trace(rank)
        for e in trace["traceEvents"]:
            if "In msg nelems" in e["args"]:
                e["args"]["In msg nelems"] = 1048576 if e["ts"] < 5000 else 262144
        (traces / f"rank{rank}.json").write_text(json.dumps(trace))
    assert main(["diagnose", str(traces), "--save-cluster", str(out / "c.json")]) == 0
    saved = Cluster.load(out / "c.json")
    assert saved == cluster_from_trace(diagnose(load_traces([str(traces)])))
    assert (saved.world_size, saved.backend, saved.name) == (2, "nccl", "fitted to the trace")
    assert "-> " + str(out / "c.json") in capsys.readouterr().err
    transformer_like(2).save(out / "g.json")
    assert main(["plan", str(out / "g.json"), "--solver", "horovod", "--cluster", str(out / "c.json"),
                 "-o", str(out / "p.json")]) == 0
    assert Plan.load(out / "p.json").cluster == saved
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    _sharded_cuda_traces(sharded)
    for argv, says in (([str(sharded), "--save-cluster", str(out / "c2.json")], "sharded run"),
                       ([str(traces / "rank0.json"), "--save-cluster", "/proc/c.json"], "cannot write")):
        capsys.readouterr()
        assert main(["diagnose", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
    assert not (out / "c2.json").exists()


def test_a_trace_without_collective_sizes_asks_for_a_cluster_or_record_shapes(tmp_path):
    """A profile taken without record_shapes has no collective's bytes: no link can be fitted to it."""
    for rank in (0, 1):
        trace = cuda_trace(rank)
        for e in trace["traceEvents"]:
            e["args"].pop("In msg nelems", None)
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(trace))
    report = diagnose(load_traces([str(tmp_path)]))
    with pytest.raises(SchedoptError, match=r"give --cluster .*record_shapes=True .*--profile-sizes"):
        what_plans_gain(report, transformer_like(2))


def test_the_text_report_sums_exposure_per_kind_and_lists_the_most_exposed_first():
    """A long run's every exposed collective would be thousands of lines: per kind, the exposed time per
    step and rank; then the most exposed (``--json`` keeps every one)."""
    from schedopt.diagnose import LISTED_EXPOSED, CollectiveRow, Diagnosis, StepRow, format_report

    def collective(name: str, exposed_ms: float) -> CollectiveRow:
        return CollectiveRow(name=name, issue_s=0.0, start_s=0.0, end_s=0.1, nbytes=None, hidden_s=0.0,
                             exposed_s=exposed_ms * 1e-3, reasons=["late gradient"])

    steps = [StepRow(rank=r, step=n, step_s=0.1, compute_s=0.05, comm_s=0.05, exposed_comm_s=0.03,
                     collectives=[collective("all_gather", 1 + n + 10 * r) for _ in range(4)] +
                     [collective("reduce_scatter", 0.5), collective("all_gather", 0.0)])
             for r in (0, 1) for n in (1, 2, 3)]
    lines = format_report(Diagnosis(device="cuda", world_size=2, files=["a", "b"], steps=steps)).splitlines()
    # all-gathers: 4 per step and rank, (2 + 3 + 4) x 4 on rank 0 and (12 + 13 + 14) x 4 on rank 1, over 6 rows
    assert lines[8] == ("exposed per step and rank, by collective: all_gather 32.0 ms (4.0 exposed), "
                        "reduce_scatter 0.5 ms (1.0 exposed)")
    assert lines[9] == f"the {LISTED_EXPOSED} most exposed of 30 (ms from the step's start):"
    listed = lines[10:]
    assert len(listed) == LISTED_EXPOSED and all(x.startswith("  rank 1 step 3: all_gather") for x in listed[:4])
    assert [float(x.split(", ")[-1].split()[0]) for x in listed] == sorted(
        (float(x.split(", ")[-1].split()[0]) for x in listed), reverse=True)


def _sharded_cuda_traces(directory: Path) -> None:
    """:func:`cuda_trace` as an FSDP run's: its first NCCL kernel an all-gather, the second a reduce-scatter."""
    for rank in (0, 1):
        trace = cuda_trace(rank)
        for e in trace["traceEvents"]:
            if e["name"].startswith("ncclDevKernel"):
                e["name"] = "ncclDevKernel_AllGather_f32_RING_LL" if e["ts"] < 5000 else \
                    "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL"
        (directory / f"rank{rank}.json").write_text(json.dumps(trace))


def test_a_sharded_runs_what_if_is_fsdp2_per_block_and_the_plans_within_its_peak(tmp_path, capsys):
    """An FSDP run's all-gathers and reduce-scatters: the replicated what-if refuses them; the sharded
    one predicts the run as FSDP2 per block on the given cluster (at the trace's world size, on its
    device's backend) and plans within that layout's peak; without a cluster, one line."""
    _sharded_cuda_traces(tmp_path)
    report = diagnose(load_traces([str(tmp_path)]))
    assert sharded_collectives(report) == ["ncclDevKernel_AllGather_f32_RING_LL",
                                           "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL"]
    graph = transformer_like(2)
    with pytest.raises(SchedoptError, match="sharded run .*what_sharded_plans_gain"):
        what_plans_gain(report, graph)
    cluster = Cluster(world_size=8, bandwidth_Bps=1e9, latency_s=1e-5, backend="gloo")
    seen: list[str] = []
    result = what_sharded_plans_gain(report, graph, cluster, time_limit_s=1, progress=lambda solves: (
        seen.append(x) or x for x in solves))
    assert seen == [f"sharded {name}" for name in solvers_for("sharded")]
    assert (result.cluster.world_size, result.cluster.backend) == (2, "nccl")
    assert result.measured_s == pytest.approx(0.010) and result.traced_gathers == 1.0
    problem = Problem(graph=graph, cluster=result.cluster, mode="sharded")
    layout = get("fsdp-per-block")(problem)
    assert result.predicted_s == layout.predicted.iteration_s
    assert result.peak_bytes == layout.predicted.peak_memory_bytes
    assert result.layout_gathers == len(layout.units) + sum(u.reshard_after_forward for u in layout.units)
    times = [t for t, _ in result.best.values()]
    assert times == sorted(times) and result.best["cpsat"][0] <= result.predicted_s
    assert all(peak <= result.peak_bytes for _, peak in result.best.values())
    assert "fsdp-root" not in result.best  # its one unit holds more than per block's peak
    assert main(["diagnose", str(tmp_path)]) == 0  # the diagnosis itself holds for any run
    capsys.readouterr()
    assert main(["diagnose", str(tmp_path), "--model", "examples/models.py:tiny_gpt"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs the collectives' costs: give --cluster" in err[0]
    # a cluster whose all-gathers were measured over 4 ranks: this run shards over 2 (one line, before the import)
    (tmp_path / "cluster").mkdir()
    measured = Cluster(world_size=4, bandwidth_Bps=1e9, shard_costs={"all-gather": (1e-4, 1e-9)})
    measured.save(tmp_path / "cluster" / "c.json")
    assert main(["diagnose", str(tmp_path), "--model", "examples/models.py:tiny_gpt", "--cluster",
                 str(tmp_path / "cluster" / "c.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "measured over 4 ranks" in err[0] and "shard over 2" in err[0]


def _pg(desc: str, size: int) -> dict:
    return {"pg_name": desc, "pg_desc": desc, "backend_config": "cuda:nccl", "pg_size": size, "ranks": list(range(size))}


@pytest.mark.parametrize("groups, size, other", [
    (None, None, ()), ([_pg("default_pg", 2)], None, ()), ([_pg("default_pg", 2), _pg("mesh_shard", 1)], 1, ()),
    ([_pg("default_pg", 16), _pg("mesh_dp_replicate", 2), _pg("mesh_dp_shard", 8)], 8, ()),
    ([_pg("default_pg", 32), _pg("mesh_dp_shard", 4), _pg("mesh_dp_shard_cp", 8), _pg("mesh_tp", 4)], 4,
     ("dp_shard_cp", "tp")),
    ([{"pg_desc": "mesh_shard", "pg_size": "8"}, "junk"], None, ()),
])
def test_the_shard_group_is_read_from_the_traces_process_groups(groups, size, other):
    """torch names a DeviceMesh dimension's process group ``mesh_<name>`` in the trace's pg_config; one
    over the whole world reuses the default group and is not listed (FSDP over every rank). Dimensions
    of tensor, pipeline, context or expert parallelism (torchtitan's names) are set apart."""
    from schedopt.kineto import mesh_shard_size, model_parallel_dims

    info = {} if groups is None else {"pg_config": groups}
    assert (mesh_shard_size(info), model_parallel_dims(info)) == (size, other)


def test_the_plan_a_traced_run_applied_is_predicted_in_place_of_its_baseline(tmp_path, capsys):
    """--plan: the traced step is the plan's, predicted as that plan on the same rank model and cluster,
    DDP's prediction kept beside it (FSDP's: the plan is the layout the others are planned within). A
    sharded plan for a replicated run, a bucketed one for a sharded run, a plan of another model and
    --plan without --model: one line each, before any planning."""
    from schedopt.errors import InvalidPlanError
    from schedopt.ranks import simulate_ranks

    for rank in (0, 1):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(cuda_trace(rank)))
    report = diagnose(load_traces([str(tmp_path)]))
    graph, cluster = transformer_like(2), Cluster(world_size=2, bandwidth_Bps=1e9, latency_s=1e-5)
    overlap = Problem(graph=graph, cluster=cluster, mode="overlap")
    plan = get("caramel")(overlap)
    seen: list[str] = []  # the progress hook sees every solve, "mode solver"
    plain = what_plans_gain(report, graph, cluster, time_limit_s=1, progress=lambda solves: (
        seen.append(x) or x for x in solves))
    assert seen == [f"{mode} {name}" for mode in ("barrier", "overlap", "osp") for name in solvers_for(mode)]
    # per mode, what no plan beats on the traced ranks: the one-rank bound, or the slowest rank's
    from schedopt.orders import engine_order
    from schedopt.rank_bound import rank_lower_bound

    for mode, (_, t) in plain.best.items():
        problem = Problem(graph=graph, cluster=cluster, mode=mode)
        one = simulate(problem, get("pytorch-ddp")(problem)).lower_bound_s
        assert plain.bounds[mode] == max(one, rank_lower_bound(problem, engine_order(graph), plain.ranks))
        assert plain.bounds[mode] <= t * 1.01 and plain.to_json()["best"][mode]["lower_bound_s"] == plain.bounds[mode]
        assert f"no {mode} plan under {plain.bounds[mode] * 1e3:.1f} ms on these ranks" in plain.describe()
    result = what_plans_gain(report, graph, cluster, time_limit_s=1, applied=plan)
    assert result.applied == ("caramel", "overlap", simulate_ranks(overlap, plan, result.ranks).period)
    assert (result.measured_s, result.predicted_ddp_s) == (plain.measured_s, plain.predicted_ddp_s)
    applied = result.to_json()["applied"]
    assert result.to_json()["measured_ddp_s"] is None and applied["measured_s"] == plain.measured_s
    assert applied["prediction_error"] == pytest.approx((applied["predicted_s"] - plain.measured_s) / plain.measured_s)
    assert "the applied plan's step (overlap, caramel)" in result.describe()
    sharded = Problem(graph=graph, cluster=cluster, mode="sharded")
    with pytest.raises(SchedoptError, match="--plan is a sharded plan"):
        what_plans_gain(report, graph, cluster, applied=get("fsdp-per-block")(sharded))
    with pytest.raises(InvalidPlanError):
        what_plans_gain(report, transformer_like(3), cluster, applied=plan)
    plan.save(tmp_path / "plan.json.keep")
    assert main(["diagnose", str(tmp_path), "--plan", str(tmp_path / "plan.json.keep")]) == 2
    assert "--plan (the plan the traced run applied) needs --model" in capsys.readouterr().err
    # a sharded run: the applied plan is the layout, and the others are planned within its peak
    (tmp_path / "fsdp").mkdir()
    _sharded_cuda_traces(tmp_path / "fsdp")
    fsdp = diagnose(load_traces([str(tmp_path / "fsdp")]))
    size = get("fsdp-size")(sharded)
    result = what_sharded_plans_gain(fsdp, graph, cluster, time_limit_s=1, applied=size)
    predicted = simulate(sharded, size)
    assert (result.predicted_s, result.peak_bytes) == (predicted.iteration_s, predicted.peak_memory_bytes)
    assert result.to_json()["layout"] == "fsdp-size" and result.to_json()["applied"]
    assert result.layout_gathers == len(size.units) + sum(u.reshard_after_forward for u in size.units)
    assert all(peak <= result.peak_bytes for _, peak in result.best.values())
    assert "predicted as the applied plan (fsdp-size)" in result.describe()
    with pytest.raises(SchedoptError, match="--plan is a bucketed plan .overlap mode."):
        what_sharded_plans_gain(fsdp, graph, cluster, applied=plan)


def test_a_run_with_tensor_parallelism_gets_one_line_and_no_what_if(tmp_path, capsys):
    """The per-step diagnosis holds for any run; the what-ifs plan data parallelism only and say so."""
    for rank in (0, 1):
        trace = cuda_trace(rank)
        trace["distributedInfo"]["pg_config"] = [_pg("default_pg", 2), _pg("mesh_tp", 2)]
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(trace))
    report = diagnose(load_traces([str(tmp_path)]))
    assert report.model_parallel == ("tp",) and report.to_json()["model_parallel"] == ["tp"]
    with pytest.raises(SchedoptError, match="mesh dimensions tp"):
        what_plans_gain(report, transformer_like(2))
    with pytest.raises(SchedoptError, match="plans data parallelism only"):
        what_sharded_plans_gain(report, transformer_like(2), Cluster(world_size=2, bandwidth_Bps=1e9))
    assert main(["diagnose", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["diagnose", str(tmp_path), "--model", "examples/models.py:tiny_gpt"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "other parallelism besides data parallelism" in err[0]


def test_an_hsdp_run_whose_shard_groups_are_one_rank_gets_the_sharded_what_if(tmp_path, capsys):
    """FSDP2 on a (2, 1) mesh issues no all-gather or reduce-scatter, only each unit's all-reduce across
    the replicas: the trace's process groups say it is HSDP, and the what-if predicts it as such."""
    for rank in (0, 1):
        trace = cuda_trace(rank)
        trace["distributedInfo"]["pg_config"] = [_pg("default_pg", 2), _pg("mesh_shard", 1)]
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(trace))
    report = diagnose(load_traces([str(tmp_path)]))
    assert (report.shard_group, report.replicas, sharded_collectives(report)) == (1, 2, [])
    assert report.to_json()["replicas"] == 2
    graph = transformer_like(2)
    with pytest.raises(SchedoptError, match="FSDP2 as HSDP, 2 replicas of 1"):
        what_plans_gain(report, graph)
    result = what_sharded_plans_gain(report, graph, Cluster(world_size=8, bandwidth_Bps=1e9, latency_s=1e-5),
                                     time_limit_s=1)
    assert (result.cluster.world_size, result.cluster.replicas, result.cluster.shard_group) == (2, 2, 1)
    assert (result.traced_gathers, result.layout_gathers) == (0.0, 0)
    layout = get("fsdp-per-block")(Problem(graph=graph, cluster=result.cluster, mode="sharded"))
    assert result.predicted_s == layout.predicted.iteration_s
    assert main(["diagnose", str(tmp_path)]) == 0
    assert "world size 2, HSDP: 2 replicas of 1" in capsys.readouterr().out
    # a cluster whose all-gathers were measured over 2 ranks: shard groups of one rank gather nothing
    measured = Cluster(world_size=2, bandwidth_Bps=1e9, shard_costs={"all-gather": (1e-4, 1e-9)})
    assert what_sharded_plans_gain(report, graph, measured, time_limit_s=1).cluster.shard_costs is None
    other = cuda_trace(1)  # a rank of another layout
    other["distributedInfo"]["pg_config"] = [_pg("default_pg", 2)]
    (tmp_path / "rank1.json").write_text(json.dumps(other))
    with pytest.raises(TraceError, match="shard groups of"):
        load_traces([str(tmp_path)])


@pytest.mark.parametrize("content, expected", [
    ('{"traceEvents": [', "not valid JSON"),
    ("", "not valid JSON"),
    ('{"a": 1}', "not a Chrome/Kineto trace"),
    ('{"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 0, "dur": 5}]}', "no ProfilerStep#N spans"),
])
def test_bad_traces_end_with_one_line_and_status_2(tmp_path, capsys, content, expected):
    (tmp_path / "t.json").write_text(content)
    assert main(["diagnose", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err


def test_traces_of_different_runs_are_refused(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(cuda_trace(0)))
    other = cuda_trace(1)
    other["distributedInfo"]["world_size"] = 4
    (tmp_path / "b.json").write_text(json.dumps(other))
    with pytest.raises(TraceError, match="different runs"):
        load_traces([str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    with pytest.raises(TraceError, match="two traces of rank 0"):
        load_traces([str(tmp_path / "a.json"), str(tmp_path / "a.json")])
    later = cuda_trace(1)
    next(e for e in later["traceEvents"] if e["name"].startswith("ProfilerStep"))["name"] = "ProfilerStep#9"
    (tmp_path / "b.json").write_text(json.dumps(later))
    with pytest.raises(TraceError, match="no ProfilerStep number in common"):
        load_traces([str(tmp_path / "a.json"), str(tmp_path / "b.json")])


def test_a_real_cpu_trace_of_two_gloo_ranks(tmp_path):
    """examples/train.py --profile under torchrun: each step's collectives move every gradient once
    (DDP's buckets), each on gloo's threads after its issue on the training thread."""
    run = _profiled_run(tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    report = diagnose(load_traces([str(tmp_path)]))
    assert report.device == "cpu" and report.world_size == 2 and {s.rank for s in report.steps} == {0, 1}
    model, inputs, loss_fn = _factory("tiny_gpt")
    param_bytes = sum(p.numel() * 4 for p in model.parameters())
    for s in report.steps:
        assert sum(c.nbytes for c in s.collectives) == param_bytes
        assert all(c.issue_s <= c.start_s < c.end_s for c in s.collectives)
        assert 0 <= s.exposed_comm_s <= s.comm_s and s.compute_s <= s.step_s
    # the same trace's op times on the imported graph: most ops matched. On a toy model the framework's own
    # work (autograd, DDP's hooks) is much of the traced compute, and more of it under load: the matched ops
    # explained 39-45% of tiny_gpt's steps on an idle machine, 19% in CI beside other tests (gpt_tied's: 96%)
    graph = from_torch(model, inputs, loss_fn=loss_fn, name="tiny_gpt")
    costs = trace_costs(graph, tmp_path / "rank0.json")
    assert costs.matched_ops / costs.graph_ops > 0.8 and 0.05 < costs.explained_share <= 1.0, costs.describe()
    changed = [o for o in costs.graph.ops.values() if o.duration_s != graph.ops[o.id].duration_s]
    assert len(changed) == costs.matched_ops  # the matched ops take the trace's times, the rest their estimates
    # ... scaled up so that forward and backward add up to the traced compute (the engine's and the hooks' time)
    totals = costs.graph.totals
    assert costs.overhead > 0 and totals.forward_s + totals.backward_s == pytest.approx(costs.compute_s, rel=1e-9)
    # the traced times hold the collectives' slowdown already: no simulation adds the cluster's again
    noisy = Cluster(world_size=2, bandwidth_Bps=1e8, interference=0.5)
    problem = Problem(graph=costs.graph, cluster=noisy, mode="overlap")
    assert problem.cluster.interference == 0.0
    plan = get("pytorch-ddp")(problem)
    quiet = Problem(graph=costs.graph, cluster=replace(noisy, interference=0.0), mode="overlap")
    assert simulate(problem, plan).iteration_s == simulate(quiet, plan).iteration_s
    assert Problem(graph=graph, cluster=noisy).cluster.interference == 0.5  # estimated op times: it applies
    # and what plans would gain, from the trace alone (the cluster fitted to its collectives)
    whatif = what_plans_gain(report, costs.graph, time_limit_s=0.5)  # what it checks holds at any time limit
    assert whatif.predicted_ddp_s > 0 and set(whatif.best) == {"barrier", "overlap", "osp"}
    assert all(t <= whatif.predicted_ddp_s * 1.001 for _, t in whatif.best.values())


def test_a_real_fsdp2_trace_of_two_gloo_ranks(tmp_path, capsys):
    """examples/train.py --fsdp --profile: FSDP2 per block on gloo. Each step's all-gathers are the
    ones that layout issues, and diagnose --model with a cluster predicts the run as that layout."""
    traces = tmp_path / "traces"
    run = _profiled_run(traces, "--fsdp")
    assert run.returncode == 0, run.stderr[-2000:]
    report = diagnose(load_traces([str(traces)]))
    assert "gloo:all_gather" in sharded_collectives(report)
    model, inputs, loss_fn = _factory("tiny_gpt")
    cluster = Cluster(world_size=2, bandwidth_Bps=1e9, latency_s=1e-4, backend="gloo")
    layout = get("fsdp-per-block")(Problem(graph=from_torch(model, inputs, loss_fn=loss_fn), cluster=cluster,
                                           mode="sharded"))
    gathers = len(layout.units) + sum(u.reshard_after_forward for u in layout.units)
    assert all(sum(c.name == "gloo:all_gather" for c in s.collectives) == gathers for s in report.steps)
    cluster.save(tmp_path / "cluster.json")
    capsys.readouterr()
    assert main(["diagnose", str(traces), "--model", "examples/models.py:tiny_gpt", "--cluster",
                 str(tmp_path / "cluster.json"), "--time-limit", "1", "--json", str(tmp_path / "d.json")]) == 0
    assert "predicted as FSDP2 per block" in capsys.readouterr().out
    whatif = json.loads((tmp_path / "d.json").read_text())["what_if"]
    assert whatif["layout"] == "fsdp-per-block" and whatif["traced_all_gathers_per_step"] == gathers
    assert whatif["best"]["cpsat"]["predicted_s"] <= whatif["predicted_s"]


def _profiled_run(out: Path, runtime: str = "--ddp") -> subprocess.CompletedProcess:
    """examples/train.py --profile on 2 torchrun ranks; a launch that hangs is retried once.

    Three profiled launches hung at exit under load before examples/train.py kept what it built from
    destruction (py-spy: the ranks idle at ``status = main()``; concurrent launches reproduced it, 3 of 6;
    12 of 12 finished after the fix). The retry stays as a guard; a second hang fails the test with
    what both launches printed."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "examples" / "train.py"), "tiny_gpt", runtime, "--steps", "4", "--warmup", "1",
           "--threads", "1", "--quiet", "--profile", str(out), "--profile-sizes"]
    hung = []
    for _ in range(2):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=90, cwd=ROOT, env=env)
        except subprocess.TimeoutExpired as exc:
            hung.append(str(exc.stderr or b"")[-1500:])
            warnings.warn(f"a profiled torchrun launch hung for 90 s; retrying. It printed: {hung[-1]}")
    pytest.fail("the profiled torchrun launch hung twice: " + " | ".join(hung))


def _factory(name: str):
    sys.path.insert(0, str(ROOT / "examples"))
    import models

    model, inputs, loss_fn = getattr(models, name)()
    return model, inputs, loss_fn


def test_import_with_a_trace_that_is_not_the_model_s_says_so(tmp_path, capsys):
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(cuda_trace(rank)))  # kernels, no aten ops
    status = main(["import", f"{ROOT / 'examples' / 'models.py'}:tiny_cnn", "--trace", str(tmp_path),
                   "-o", str(tmp_path / "g.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "no op of the graph's kinds" in err[0], err
    assert not (tmp_path / "g.json").exists()


def test_a_convolution_s_backward_is_one_traced_op_shared_by_its_two_parts(tmp_path):
    """The importer splits a convolution's backward into input- and weight-gradient parts; the trace has one
    ``aten::convolution_backward``: both parts take it, in proportion to their FLOPs, and sum to it."""
    from torch.profiler import ProfilerActivity, profile, schedule

    model, inputs, loss_fn = _factory("tiny_cnn")
    graph = from_torch(model, inputs, loss_fn=loss_fn, name="tiny_cnn")
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=2),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(tmp_path / "rank0.json"))) as prof:
        for _ in range(3):
            model.zero_grad()
            loss_fn(model(*inputs), *inputs).backward()
            prof.step()
    costs = trace_costs(graph, tmp_path / "rank0.json")
    parts = [o for o in graph.ops.values() if o.kind.startswith("aten.convolution_backward.")]
    assert len(parts) >= 3 and all(costs.graph.ops[o.id].duration_s != o.duration_s for o in parts)
    # nearly every op matched; what share of the traced time they explain depends on the host's load
    # (the engine's time between a tiny model's ops: 35% on a loaded CI run, above half when quiet)
    assert costs.matched_ops >= 0.9 * costs.graph_ops and costs.explained_share > 0.2, costs.describe()
    halves = {o.id.rpartition(".")[0] for o in parts if o.id.endswith(".grad_input")}
    for node in halves:
        a, b = (costs.graph.ops[f"{node}.{p}"] for p in ("grad_input", "grad_weight"))
        assert a.duration_s / b.duration_s == pytest.approx(graph.ops[a.id].flops / graph.ops[b.id].flops, rel=1e-6)


#: A real CUDA trace: ``examples/train.py resnet18 --ddp --steps 8 --profile DIR --profile-sizes`` on one
#: NVIDIA H200 (torch 2.11+cu130, NCCL, world size 1), recorded by bench/gpu_check.sh; steps 7-9 profiled.
H200_TRACE = ROOT / "tests" / "data" / "h200_ddp_resnet18.json.gz"


def test_a_real_cuda_trace_reads_the_host_s_steps_and_the_device_s_work(capsys):
    """Each step is also a ``gpu_user_annotation`` of 0.25 ms in this trace: the step is the host's span
    (27.7-30.1 ms); the device computed about 2.1 ms of each, and at world size 1 NCCL ran no kernel.
    The report says the host bounds the run."""
    trace = load_traces([str(H200_TRACE)])[0]
    assert trace.device == "cuda" and trace.world_size == 1 and not trace.collectives
    assert {n: round((b - a) * 1e3, 2) for n, (a, b) in trace.steps.items()} == {7: 27.67, 8: 30.05, 9: 28.67}
    report = diagnose([trace])
    assert all(1.5e-3 < s.compute_s < 3e-3 and s.comm_s == 0.0 for s in report.steps)
    assert main(["diagnose", str(H200_TRACE)]) == 0
    assert "the device computed 2.1 ms and communicated 0.0 ms of each 28.7 ms step" in capsys.readouterr().out


def test_op_times_from_a_real_cuda_trace_are_the_device_s():
    """On CUDA an op's time is its kernels' (the host's spans are launches: ResNet-18's forward ops
    spanned 5.8 ms on the host for 0.66 ms on the device); the backward's ops are read on the autograd
    engine's device thread; cuDNN's BatchNorm and the engine's in-place gradient sums match the graph's
    ``native_batch_norm`` and ``add``. The ops then add up to the device's compute per step."""
    model, inputs, loss_fn = _factory("resnet18")
    graph = from_torch(model, inputs, loss_fn=loss_fn, name="resnet18")
    costs = trace_costs(graph, H200_TRACE)
    assert costs.steps == 3 and costs.matched_ops >= costs.graph_ops - 1 and costs.op_spread < 0.05
    totals = costs.graph.totals
    assert 1.5e-3 < costs.compute_s < 3e-3
    assert totals.forward_s + totals.backward_s == pytest.approx(costs.compute_s, rel=1e-6)
    assert totals.forward_s < 1e-3 < totals.backward_s
