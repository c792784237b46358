"""OSP in the runtime on real gloo ranks: the committed state agrees every step, LGP is really applied,
the trajectory is the one the module docstring defines, and without stage 2 it is overlap mode exactly."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import torch  # noqa: F401  # make setup installs it: a missing torch fails the suite, it does not shrink it

from schedopt import Plan  # noqa: E402

from . import runtime_workers as workers  # noqa: E402
from .distributed import run_ranks  # noqa: E402
from .test_runtime import expected_log, graph_of  # noqa: E402
from .test_runtime_overlap import overlap_plan  # noqa: E402


def osp_plan(name: str, stale: tuple[str, ...]) -> Plan:
    """The scrambled overlap plan of ``name`` in osp mode, with the buckets holding ``stale`` in stage 2."""
    plan = overlap_plan(name)
    buckets = tuple(replace(b, stage=2 if set(b.params) & set(stale) else 1) for b in plan.buckets)
    assert any(b.stage == 2 for b in buckets) and any(b.stage == 1 for b in buckets)
    return replace(plan, mode="osp", buckets=buckets)


def stale_names(plan: Plan) -> set[str]:
    return {n for b in plan.buckets if b.stage == 2 for n in b.params}


TIED = ("embed.weight", "up.weight")  # the tied embedding (read first, ready last) and the chunked bucket


@pytest.mark.parametrize("kind", ["sgd-momentum", "adamw"])
def test_committed_parameters_and_optimizer_state_agree_on_every_rank_after_every_step(kind):
    plan = osp_plan("tied_frozen_norm", TIED)
    a, b = run_ranks(workers.osp_training, 2, "tied_frozen_norm", plan, kind, 6, timeout_s=120)
    assert a["committed"] == b["committed"]  # every step: parameters, committed stage-2 weights, state
    assert all(x != y for x, y in zip(a["live"][1:], b["live"][1:]))  # what each forward reads is its own
    for r in (a, b):
        assert not r["pending_after_flush"]
        assert all(np.array_equal(r["params"][n], b["params"][n]) for n in r["params"])
        assert r["state"] == b["state"]
        assert r["logs"] == expected_log(plan, graph_of("tied_frozen_norm"))  # the plan's order, chunks too
        for step, settles in enumerate(r["settles"]):
            stage2 = [(k, what) for k, where, what, _ in settles if plan.buckets[k].stage == 2]
            if step == 1:  # the first step's average is only in flight: its correction, no commit
                assert sorted(stage2) == sorted((k, "lgp") for k, s in enumerate(plan.buckets) if s.stage == 2)
            if step >= 2:  # each forward commits the step before last, then corrects by the last
                for k in (k for k, s in enumerate(plan.buckets) if s.stage == 2):
                    assert [what for j, what in stage2 if j == k] == ["commit", "lgp"], (step, k)


@pytest.mark.parametrize("lgp", [True, False])
def test_the_trajectory_is_osps_bit_for_bit_and_lgp_changes_it(lgp):
    """Plain SGD, against the same mathematics computed in one process for two virtual ranks."""
    plan = osp_plan("tied_frozen_norm", TIED)
    results = run_ranks(workers.osp_training, 2, "tied_frozen_norm", plan, "sgd", 6, lgp=lgp, timeout_s=120)
    reference = workers.osp_reference("tied_frozen_norm", stale_names(plan), 6, lr=0.05, lgp=lgp)
    other = workers.osp_reference("tied_frozen_norm", stale_names(plan), 6, lr=0.05, lgp=not lgp)
    for r in results:
        assert all(np.array_equal(r["params"][n], reference[n].numpy()) for n in reference), \
            max((np.abs(r["params"][n] - reference[n].numpy()).max(), n) for n in reference)
    # the correction is really applied: with it and without it, the weights part measurably
    moved = max((reference[n] - other[n]).abs().max().item() for n in reference)
    scale = max(reference[n].abs().max().item() for n in reference)
    assert moved > 1e-4 * scale


def test_an_osp_plan_without_stage_2_trains_exactly_as_overlap_mode():
    overlap = overlap_plan("tied_frozen_norm")
    osp = replace(overlap, mode="osp")  # what --max-stale-fraction 0 plans (tests/test_osp.py)
    ours = run_ranks(workers.osp_training, 2, "tied_frozen_norm", osp, "adamw", 5, timeout_s=120)
    theirs = run_ranks(workers.osp_training, 2, "tied_frozen_norm", overlap, "adamw", 5, timeout_s=120)
    for r, o in zip(ours, theirs):
        assert r["committed"] == o["committed"] and r["losses"] == o["losses"]
        assert all(np.array_equal(r["params"][n], o["params"][n]) for n in o["params"])
        assert r["state"] == o["state"]
        assert r["settles"] == o["settles"]


def test_ranks_whose_plans_differ_only_in_a_stage_fail_alike():
    plan = osp_plan("tied_frozen_norm", TIED)
    other = replace(plan, buckets=tuple(replace(b, stage=1) if "embed.weight" in b.params else b
                                        for b in plan.buckets))
    for result in run_ranks(workers.wrap_and_time, 2, "tied_frozen_norm", [plan, other]):
        assert result["error"] == "PlanMismatchError" and result["wall_s"] < 10


@pytest.mark.parametrize("mode", ["overlap", "osp"])
def test_loading_a_checkpoint_mid_training_applies_what_is_pending_first(mode):
    plan = osp_plan("tied_frozen_norm", TIED) if mode == "osp" else overlap_plan("tied_frozen_norm")
    for r in run_ranks(workers.load_mid_training, 2, "tied_frozen_norm", plan, timeout_s=120):
        assert r["pending_before_load"] and not r["pending_after_load"]
        assert r["equal"]  # no pending step or commit moved the loaded weights
