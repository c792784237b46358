"""Local search over buckets for ``overlap`` mode: which gradients travel together, and in which order.

In ``overlap`` mode the next step's forward waits, op by op, for the buckets
its parameters are in. Buckets in ready order (every heuristic, and the
exact barrier DP) send the last layers' gradients first, although the next
forward needs them last; on a busy network the better plan holds some early
gradients back so that the first layers' bucket is not stuck behind them.
No closed form decides how much to hold back, so this module searches.

:class:`SteadyState` evaluates a bucketing quickly for a fixed compute order
and one chunk per bucket on the simulator's own engine (:mod:`schedopt.steady`:
an update runs right before the first op of the next step that reads its
bucket, once the bucket's collective has ended; FIFO channel; interference;
period of the steady state), the ops between two points of interest merged
into one piece of work: per step ``O(buckets)`` work instead of walking
every op, so a search tries thousands of bucketings a second.

:func:`improve_buckets` is an iterated first-improvement local search from a
given bucketing. Moves: one unit to another bucket or a new last one; the
earlier- or later-ready part of a bucket into another bucket or a new last
one (holding back); merge two buckets; place a bucket elsewhere in the
collective order. Its local optima differ a lot by seed (ResNet-50, 64 x
100 GbE: 21.7-22.4 ms over 9 seeds of 10k evaluations; longer runs narrow
it). A unit is the set of parameters one op finishes that have the same
dtype and the same first reader; a bucket holds one dtype.
"""

from __future__ import annotations

import random
import time
from itertools import accumulate
from typing import Sequence

from schedopt.problem import Problem
from schedopt.simulate import update_costs
from schedopt.steady import StepProgram, run_steady_state

from .common import first_readers

__all__ = ["Budget", "SteadyState", "improve_buckets"]



class SteadyState:
    """The overlap-mode period of bucketings under one fixed compute order (see module docstring)."""

    def __init__(self, problem: Problem, order: Sequence[str]):
        graph, cluster = problem.graph, problem.cluster
        ops = [o for o in order if graph.ops[o].phase != "optimizer"]
        position = {o: i for i, o in enumerate(ops)}
        self.prefix = [0.0, *accumulate(graph.ops[o].duration_s for o in ops)]
        first_read = first_readers(graph, ops)
        per_param = update_costs(graph)
        keyed: dict[tuple[int, str, int], list[str]] = {}
        for name, p in graph.params.items():
            keyed.setdefault((position[p.grad_op], p.dtype, first_read[name]), []).append(name)
        # units sorted by ready position: unit indices follow ready order
        keys = sorted(keyed)
        self.units = [keyed[k] for k in keys]
        self.grad_pos = [k[0] for k in keys]
        self.dtype = [k[1] for k in keys]
        self.reader = [k[2] for k in keys]
        self.bytes_s = [cluster.seconds_per_byte * sum(graph.params[n].nbytes for n in u) for u in self.units]
        self.update_s = [sum(per_param[n] for n in u) for u in self.units]
        self.fixed_s = cluster.fixed_s
        self.interference = cluster.effective_interference

    def period(self, buckets: Sequence[Sequence[int]]) -> float:
        """Return the steady-state period of ``buckets`` (lists of unit indices, in collective order).

        The ops between two points where something happens (a bucket settled before its first
        reader, a bucket sent after its last gradient) run as one piece of work, which is exact
        (:mod:`schedopt.steady`); a plan that does not settle gets the mean of its last periods
        (the plan the search returns is simulated again, and that timeline says so).
        """
        prefix, grad_pos, reader = self.prefix, self.grad_pos, self.reader
        first = [min(map(reader.__getitem__, b)) for b in buckets]
        ready = [grad_pos[max(b)] + 1 for b in buckets]  # the op after which it is sent (units in ready order)
        cuts = sorted({0, len(prefix) - 1, *first, *ready})
        piece = {c: i for i, c in enumerate(cuts)}
        settle: dict[int, list[int]] = {}
        for k in sorted(range(len(buckets)), key=first.__getitem__):
            settle.setdefault(piece[first[k]], []).append(k)
        program = StepProgram(
            work=[prefix[b] - prefix[a] for a, b in zip(cuts, cuts[1:])], settle=settle,
            update=[sum(map(self.update_s.__getitem__, b)) for b in buckets],
            chunk_ready=[piece[r] - 1 for r in ready], chunk_bucket=range(len(buckets)),
            chunk_time=[self.fixed_s + sum(map(self.bytes_s.__getitem__, b)) for b in buckets],
            interference=self.interference)
        return run_steady_state(program).period

    def ready_order_buckets(self, buckets: Sequence[Sequence[str]]) -> list[list[int]]:
        """Translate buckets of parameter names to unit indices (a unit goes with its earliest bucket)."""
        home: dict[str, int] = {}
        for k, b in enumerate(buckets):
            for name in b:
                home.setdefault(name, k)
        out: list[list[int]] = [[] for _ in buckets]
        for u, names in enumerate(self.units):
            out[min(home[n] for n in names)].append(u)
        return [b for b in out if b]

    def names(self, buckets: Sequence[Sequence[int]]) -> list[list[str]]:
        """Translate unit-index buckets back to parameter names, each in ready order."""
        return [[n for u in sorted(b) for n in self.units[u]] for b in buckets]


def improve_buckets(state: SteadyState, buckets: list[list[int]], *, max_evaluations: int = 30_000,
                    time_limit_s: float = 60.0, seed: int = 0, accept_worse: float = 0.003,
                    kick_moves: tuple[int, int] = (2, 4)) -> tuple[list[list[int]], float]:
    """Return a bucketing at least as good as ``buckets`` and its period.

    First-improvement descent over the module's moves; at a local optimum,
    kick the last accepted one (a new local optimum is accepted when it is at
    most ``accept_worse`` worse) with ``kick_moves`` (least, most) random moves
    and descend again, keeping the best found (cpsat's ``search_accept_worse``
    and ``search_kick_moves``).
    It stops after ``max_evaluations`` periods, so the result depends on
    the seed only; ``time_limit_s`` is a safety net that cuts it shorter.
    """
    rng = random.Random(seed)
    budget = Budget(max_evaluations, time.perf_counter() + time_limit_s)
    best = [list(b) for b in buckets]
    best_t = state.period(best)
    current, current_t = best, best_t
    home, home_t = best, best_t
    while True:
        current, current_t = _descend(state, current, current_t, rng, budget)
        if current_t < best_t * (1 - 1e-9):
            best, best_t = current, current_t
        if current_t <= home_t * (1 + accept_worse):
            home, home_t = current, current_t
        if budget.spent() or len(state.units) < 2:
            return best, best_t
        current = home
        for _ in range(rng.randint(*kick_moves)):
            moves = _moves(current, rng)
            kicked = next((nb for nb in (_apply(current, m, state.dtype) for m in moves) if nb is not None), None)
            current = kicked or current
        current_t = state.period(current)
        budget.take()


class Budget:
    """Evaluations left, and a wall-clock deadline as a safety net."""

    def __init__(self, evaluations: int, deadline: float):
        self.left, self.deadline = evaluations, deadline

    def take(self) -> bool:
        """Count one evaluation; False once the budget is spent."""
        self.left -= 1
        return not self.spent()

    def spent(self) -> bool:
        return self.left <= 0 or time.perf_counter() >= self.deadline


def _descend(state: SteadyState, bs: list[list[int]], t: float, rng: random.Random,
             budget: Budget) -> tuple[list[list[int]], float]:
    improved = True
    while improved and not budget.spent():
        improved = False
        for move in _moves(bs, rng):
            candidate = _apply(bs, move, state.dtype)
            if candidate is None:
                continue
            t_new = state.period(candidate)
            if t_new < t * (1 - 1e-9):
                bs, t, improved = candidate, t_new, True
                break
            if not budget.take():
                break
    return bs, t


def _moves(bs: list[list[int]], rng: random.Random) -> list[tuple]:
    """Every move from ``bs``, shuffled: move a unit, move the earlier- or later-ready part of a bucket
    into another bucket or a new last one, place a bucket elsewhere, merge two."""
    B = len(bs)
    moves: list[tuple] = []
    for k in range(B):
        moves += [("move", k, u, j) for u in bs[k] for j in range(B + 1) if j != k]
        for cut in range(1, len(bs[k])):
            for j in range(B + 1):
                if j != k:
                    moves += [("split", k, cut, ("late", j)), ("split", k, cut, ("early", j))]
        moves += [("place", k, j, None) for j in range(B) if j != k]
        moves += [("merge", k, j, None) for j in range(k + 1, B)]
    rng.shuffle(moves)
    return moves


def _apply(bs: list[list[int]], move: tuple, dtype: list[str]) -> list[list[int]] | None:
    kind, k, a, b = move
    out = [list(x) for x in bs]
    if kind == "move":
        u, j = a, b
        out[k].remove(u)
        if j == len(bs):
            out.append([u])
        elif dtype[out[j][0]] != dtype[u]:
            return None
        else:
            out[j].append(u)
    elif kind == "split":  # the earlier- or later-ready part of bucket k joins bucket j, or goes last
        side, j = b
        members = sorted(out[k])
        kept, moved = (members[:a], members[a:]) if side == "late" else (members[a:], members[:a])
        out[k] = kept
        if j == len(bs):
            out.append(moved)
        elif dtype[out[j][0]] != dtype[moved[0]]:
            return None
        else:
            out[j] += moved
    elif kind == "place":
        bucket = out.pop(k)
        out.insert(a, bucket)
    elif kind == "merge":
        if dtype[out[k][0]] != dtype[out[a][0]]:
            return None
        out[k] += out[a]
        del out[a]
    return [x for x in out if x]
