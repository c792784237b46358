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
