"""Shared helpers: tiny hand-built graphs with exact durations."""

from __future__ import annotations

from typing import Iterable

import pytest

from schedopt import Cluster, Op, Param, TrainGraph

MS = 1e-3


def op(op_id: str, phase: str, ms: float, *, reads: Iterable[str] = (), grads: Iterable[str] = ()) -> Op:
    return Op(id=op_id, kind=f"test.{phase}", phase=phase, duration_s=ms * MS, reads=tuple(reads), grads=tuple(grads))


def param(name: str, nbytes: int, grad_op: str) -> Param:
    assert nbytes % 4 == 0
    return Param(name=name, shape=(nbytes // 4,), grad_op=grad_op)


@pytest.fixture
def chain3() -> TrainGraph:
    """fwd (1 ms, reads w1 w2) -> b2 (2 ms, finishes w2: 1 MB) -> b1 (3 ms, finishes w1: 2 MB); opt 0.5 ms."""
    return TrainGraph(
        name="chain3",
        ops=[
            op("fwd", "forward", 1, reads=["w1", "w2"]),
            op("b2", "backward", 2, grads=["w2"]),
            op("b1", "backward", 3, grads=["w1"]),
            op("opt", "optimizer", 0.5, reads=["w1", "w2"]),
        ],
        edges=[("fwd", "b2"), ("b2", "b1"), ("b1", "opt"), ("b2", "opt")],
        params=[param("w1", 2_000_000, "b1"), param("w2", 1_000_000, "b2")],
    )


@pytest.fixture
def two_ranks() -> Cluster:
    """t(S) = 2(n-1)·alpha + 2(n-1)/n·S/B = 1 ms + S / 1e9 s on 2 ranks."""
    return Cluster(world_size=2, bandwidth_Bps=1e9, latency_s=0.5 * MS)


#: Modules whose tests spawn real ranks or processes: all of them are ``slow``.
SLOW_MODULES = {"test_runtime", "test_runtime_overlap", "test_osp_runtime", "test_compiled_runtime", "test_launch",
                "test_bench_scripts", "test_layout", "test_shard_runtime"}
#: Other tests that take over a second on 2 cores (``pytest --durations``): ``slow`` too.
SLOW_TESTS = {
    "test_cli": {"test_ctrl_c_during_a_cpsat_solve_ends_within_2_s_with_130_and_writes_nothing",
                 "test_overlap_compare_measures_speedups_against_ddp_as_torch_runs_it",
                 "test_plan_simulate_inspect_compare"},
    "test_cpsat": {"*"},
    "test_sharded": {"test_every_unit_of_every_solver_builds_with_fully_shard",
                     "test_cpsat_keeps_units_whole_blocks_when_fine_units_is_off",
                     "test_the_sharded_bounds_of_time_and_memory_never_exceed_a_plan"},
    "test_anchor_search": {"test_cpsat_warm_starts_hold_the_anchor_search_and_an_eager_one_keeps_the_engine_order"},
    "test_relaxation": {"test_cpsat_runs_it_where_few_calls_can_beat_the_warm_start"},
    "test_ranks": {"test_cpsat_keeps_the_candidate_with_the_shortest_period_on_varying_ranks",
                   "test_sharded_cpsat_keeps_the_start_with_the_shortest_period_on_varying_ranks",
                   "test_no_rank_model_period_is_below_the_one_rank_period_so_the_bound_holds_on_ranks",
                   "test_no_sharded_period_on_ranks_is_below_the_one_rank_period_or_the_sharded_bound"},
    "test_importers": {"test_aten_and_module_routes_agree_with_flop_counter", "test_cli_import_and_profile",
                       "test_frozen_parameters_and_buffers_are_not_parameters", "test_onnx_route_matches_torch_route",
                       "test_tied_weights_have_one_grad_op_after_accumulation"},
    "test_osp": {"test_every_solver_plans_osp", "test_max_stale_fraction_zero_gives_the_overlap_plan_and_timeline"},
    "test_overlap_search": {"test_cpsat_warm_starts_are_the_same_searched_in_parallel_processes"},
    "test_simulate_random": {"*"},
    "test_diagnose": {"test_a_real_cpu_trace_of_two_gloo_ranks", "test_a_real_fsdp2_trace_of_two_gloo_ranks",
                      "test_overlap_share_and_exposed_time_equal_a_brute_force_count"},
    "test_solvers": {"test_every_solver_returns_a_valid_plan_with_a_prediction",
                     "test_the_custom_solver_example_registers_a_heuristic_that_compare_runs_beside_the_others"},
}


#: Tests on rank pools of a size few tests use, by that size: each group runs in one test process
#: (``--dist loadgroup``), so that its pool of spawned ranks is started once, not once per process.
POOL_GROUPS = {
    "test_without_a_plan_wrap_is_torch_ddp_and_schedopt_plan_is_read": "ranks1",
    "test_pytorch_ddp_plans_have_the_buckets_real_ddp_builds": "ranks1",
    "test_three_ranks_exact_with_ddp_buckets_and_within_1e6_with_others": "ranks3",
    "test_on_3_ranks_within_1e_6_of_fsdp2_and_as_close_to_ddp_as_ddp_to_itself": "ranks3",
    "test_hsdp_of_2_replicas_of_2_ranks_equals_torchs_own_and_records_each_all_reduce": "ranks4",
    "test_calibrate_measures_hsdp_collectives_on_the_groups_fsdp2s_mesh_runs_them_on": "ranks4",
}


def pytest_collection_modifyitems(config, items) -> None:
    """Mark the slow tests (see :data:`SLOW_MODULES`, :data:`SLOW_TESTS`; ``make check`` runs the rest),
    and group the tests of :data:`POOL_GROUPS`."""
    for item in items:
        module = item.module.__name__.rpartition(".")[2]
        names = SLOW_TESTS.get(module, set())
        if module in SLOW_MODULES or "*" in names or item.originalname in names:
            item.add_marker(pytest.mark.slow)
        if item.originalname in POOL_GROUPS:
            item.add_marker(pytest.mark.xdist_group(POOL_GROUPS[item.originalname]))
