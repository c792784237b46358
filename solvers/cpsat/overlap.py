"""The ``overlap`` model: one steady-state period ``T``, the next forward waiting per bucket.

Data. The forward ops keep the warm start's order (so each parameter's first
reader is known; forward ops that neither lead to backward nor read a
parameter are free, like backward ops). Units are split by first reader too.

Variables and constraints. The forward ops, the backward ops and one update
interval per bucket run inside ``[0, T]`` under one ``NoOverlap`` (the next
step occupies ``[T, 2T]``). A bucket's collective of the previous step ended
at ``bstart + bdur - T`` in this frame; its update (the bucket's share of the
optimizer, by bytes) starts after that and after the forward op before its
first reader, and ends before that reader (``AddMinEquality`` picks the first
reader among the bucket's units, ``AddElement`` the times) — exactly where the
simulator applies it. The collectives of the next step queue behind this
step's (``bstart[0] + T >= bstart[b] + bdur[b]``).

Cuts: ``T >= end[grad op] + A + c_u + update_u - fstart[reader]`` per unit;
the constant window, channel and anchor bounds (:mod:`..bounds`); and a
*cycle cut* per bucket b: the channel's busy time from bucket 0 through b,
b's update, and the least work from b's first reader to any gradient (the
channel's idle before the next step's bucket 0) fit in one period.

Objective: minimize ``T``. The hint is the warm start's steady state in ticks
(:mod:`schedopt.steady`).
"""

from __future__ import annotations

import time
from typing import Any

import networkx as nx
import numpy as np

from schedopt.problem import Problem
from schedopt.simulate import update_costs
from schedopt.steady import StepProgram, run_steady_state

from ..bounds import anchor_bound, channel_bound, window_bound
from ..common import first_readers
from .buckets import BucketVars, unit_buckets
from .coarse import coarsen, reach, ticks
from .config import CpsatOptions

__all__ = ["OverlapModel", "overlap_units"]


def overlap_units(graph, forward: list[str]) -> list[list[str]]:
    """The overlap model's units: the parameters one op finishes, by dtype and first reader."""
    first_reader = first_readers(graph, forward)
    units: dict[tuple[str, str, int], list[str]] = {}
    for name, p in graph.params.items():
        units.setdefault((p.grad_op, p.dtype, first_reader[name]), []).append(name)
    return list(units.values())


class OverlapModel(BucketVars):
    """The cyclic CP-SAT model of the ``overlap`` steady state (see the module docstring)."""

    def __init__(self, problem: Problem, forward: list[str], backward: list[str], tick_s: float,
                 num_buckets: int, options: CpsatOptions, *, until: float | None = None):
        """Prepare the data and the constant bounds; :meth:`build` creates the CP-SAT model.

        The channel and anchor bounds stop at ``until`` (``time.perf_counter()``): ``skipped`` names
        what was left out (every bound computed is valid alone)."""
        self.skipped: list[str] = []
        self._data(problem, forward, backward, tick_s, num_buckets)
        W = self._windows(self.position)  # rows: the units' ops
        nf = len(forward)
        self.window_bound = window_bound(
            work_ticks=W, finished_below=self.unit_below[:, [nf + i for i in self.unit_op]].T,
            readers=self.reader, call_ticks=self.A, transfer_ticks=self.c,
            least_update_ticks=[min(p) for p in self.param_upd])
        # H[j]: the least work from forward op j's start to the end of any gradient (for the cycle cut)
        self.H = [int(round(h)) for h in W.min(axis=0)] + [0]
        self.items = self._items()
        self.item_params = [n for unit in self.units for n in unit] if self.items else []  # one per item
        self.channel_bound = 0
        if self.items:
            _, release, tail, cost = (list(x) for x in zip(*self.items))
            self.channel_bound = channel_bound(release, tail, cost, self.A, until=until, settings=options.bounds)
        if until is not None and time.perf_counter() > until:
            self.skipped.append("part of the channel bound")
        anchor = anchor_bound(
            op_ticks=self.dur, edges=self.coarse.edges, items=self.items, call_ticks=self.A,
            anchors=options.anchor_bound_anchors, points=options.anchor_bound_points,
            point_det_s=options.anchor_point_det_s, until=until)
        if anchor is None:
            self.skipped.append("the anchor bound")
        self.anchor_bound = anchor or 0
        self.static_bound = max(self.total, self.A + sum(self.c), self.window_bound, self.channel_bound,
                                self.anchor_bound)

    # ---------------------------------------------------------------- data

    def _data(self, problem: Problem, forward: list[str], backward: list[str], tick_s: float,
              num_buckets: int) -> None:
        graph, cluster = problem.graph, problem.cluster
        self.graph, self.forward, self.head = graph, forward, forward
        self.coarse = coarsen(graph, backward, keep_order=not problem.reorders)
        self.fwd_dur = [ticks(graph.ops[o].duration_s, tick_s) for o in forward]
        self.dur = [sum(ticks(graph.ops[o].duration_s, tick_s) for o in chain) for chain in self.coarse.chains]
        first_reader = first_readers(graph, forward)
        per_param = update_costs(graph)
        self.units = overlap_units(graph, forward)
        self.reader = [first_reader[u[0]] for u in self.units]
        self.unit_op = [self.coarse.of[graph.params[u[0]].grad_op] for u in self.units]
        self.upd = [ticks(sum(per_param[n] for n in u), tick_s) for u in self.units]
        # the constant bounds hold for plans that split a unit too (its first part's update can then
        # run while the rest is on the network): per parameter, or with a unit's least update
        self.param_upd = [[ticks(per_param[n], tick_s) for n in u] for u in self.units]
        self.param_c = [[ticks(cluster.seconds_per_byte * graph.params[n].nbytes, tick_s) for n in u]
                        for u in self.units]
        self.A = ticks(cluster.fixed_s, tick_s)
        self.c = [ticks(cluster.seconds_per_byte * sum(graph.params[n].nbytes for n in u), tick_s)
                  for u in self.units]
        self.B = num_buckets
        self.position = {o: j for j, o in enumerate(forward)}
        self.total = sum(self.fwd_dur) + sum(self.dur) + sum(self.upd)

    def _windows(self, position: dict[str, int]) -> np.ndarray:
        """``W[u, j]``: ticks of work that must run between the start of forward op j and the end of unit u's op.

        Nodes: the forward ops (0..nf-1, chained in their fixed order) and the
        coarse backward ops (nf + i). ``W[u, j]`` sums the durations of the
        nodes that are both descendants-or-self of j and ancestors-or-self of
        u's op; all of them run between the start of j and the end of that op
        (0 when it is not below j).
        """
        nf, nc = len(self.forward), len(self.coarse.chains)
        n = nf + nc
        dag = nx.DiGraph()
        dag.add_nodes_from(range(n))
        dag.add_edges_from((j, j + 1) for j in range(nf - 1))
        dag.add_edges_from((nf + i, nf + j) for i, j in self.coarse.edges)
        for a, b in self.graph.dag.edges:
            if a in position and b in position:
                dag.add_edge(position[a], position[b])
            elif a in position and b in self.coarse.of:
                dag.add_edge(position[a], nf + self.coarse.of[b])
        below = reach(dag, n)
        below[np.arange(n), np.arange(n)] = True  # below[v, u]: u is an ancestor of v, or v itself
        self.unit_below = below[[nf + i for i in self.unit_op]]  # [u, v]
        self.below_fwd = below[nf:, :nf]  # [coarse op, forward op]: the forward op is its ancestor
        dur = np.array(self.fwd_dur + self.dur, dtype=np.float32)
        # float32 is exact here: every sum is at most the compute time, about 1e6 ticks < 2**24
        return (self.unit_below * dur) @ below[:, :nf].astype(np.float32)

    def _items(self) -> list[tuple[int, int, int, int]]:
        """One item per parameter (a plan may split a unit; a bucket holds whole parameters):
        ``(coarse op, release, tail, cost)`` in ticks, for the channel and anchor bounds; none
        without backward ops.

        Times count from the start of this step's first backward op: a parameter is ready no earlier
        than its op's backward ancestors and its op have run (``release``), and after its bucket's
        collective the next step's first backward op starts no earlier than its update and the
        forward ops from its first reader through the last one that every backward op waits for
        (``tail``; the forward order is fixed, so a backward op waits for every forward op up to
        its last forward ancestor).
        """
        nf = len(self.forward)
        real = [i for i, chain in enumerate(self.coarse.chains) if self.graph.ops[chain[0]].phase == "backward"]
        if not real:
            return []
        release = (self.unit_below[:, nf:] * np.array(self.dur, dtype=np.int64)).sum(axis=1)
        # the forward ops every backward op waits for: up to the least "last forward ancestor"
        last = min(int(np.flatnonzero(self.below_fwd[i]).max(initial=-1)) for i in real)
        suffix = np.concatenate([np.cumsum(np.array(self.fwd_dur[:last + 1], dtype=np.int64)[::-1])[::-1],
                                 np.zeros(nf - last, dtype=np.int64)])
        return [(self.unit_op[u], int(release[u]), int(suffix[self.reader[u]]) + upd, c)
                for u in range(len(self.units)) for upd, c in zip(self.param_upd[u], self.param_c[u])]

    # ---------------------------------------------------------------- model

    def build(self) -> None:
        """Create the CP-SAT model (``self.model``) over ``B`` candidate buckets."""
        from ortools.sat.python import cp_model

        self.model = cp_model.CpModel()
        U = len(self.units)
        horizon = 3 * (self.total + self.A * U + sum(self.c)) + 1
        self.T = self.model.NewIntVar(max(self.total, self.A + sum(self.c)), horizon, "T")
        intervals = self._add_ops(horizon)
        self.add_buckets(self.model, horizon)
        intervals += self._add_updates(horizon)
        self._add_update_points(horizon)
        self.model.AddNoOverlap(intervals)
        self._add_cuts()
        self.model.Minimize(self.T)

    def _add_ops(self, horizon: int) -> list[Any]:
        """Forward ops in their fixed order, backward ops free, all inside the period; their intervals."""
        m, fwd_dur, position = self.model, self.fwd_dur, self.position
        nf, nc = len(self.forward), len(self.coarse.chains)
        self.f = [m.NewIntVar(0, horizon, f"fstart[{j}]") for j in range(nf)]
        intervals = [m.NewFixedSizeIntervalVar(self.f[j], fwd_dur[j], f"fwd[{j}]") for j in range(nf)]
        for j in range(nf - 1):
            m.Add(self.f[j + 1] >= self.f[j] + fwd_dur[j])
        self.start = [m.NewIntVar(0, horizon, f"start[{i}]") for i in range(nc)]
        self.end = [m.NewIntVar(0, horizon, f"end[{i}]") for i in range(nc)]
        intervals += [m.NewIntervalVar(self.start[i], self.dur[i], self.end[i], f"op[{i}]") for i in range(nc)]
        for i, j in self.coarse.edges:
            m.Add(self.start[j] >= self.end[i])
        for u_op, v_op in self.graph.dag.edges:
            if u_op in position and v_op in self.coarse.of:
                m.Add(self.start[self.coarse.of[v_op]] >= self.f[position[u_op]] + fwd_dur[position[u_op]])
        for i in range(nc):
            m.Add(self.end[i] <= self.T)
        return intervals

    def _add_updates(self, horizon: int) -> list[Any]:
        """One update interval per bucket, after its previous collective, before its units' readers."""
        m, U = self.model, len(self.units)
        self.vstart = [m.NewIntVar(0, horizon, f"update[{b}]") for b in range(self.B)]
        self.vdur = [m.NewIntVar(0, sum(self.upd), f"update_time[{b}]") for b in range(self.B)]
        self.vend: list[Any] = []
        intervals = []
        for b in range(self.B):
            m.Add(self.vdur[b] == sum(self.upd[u] * self.x[u, b] for u in range(U)))
            vend = m.NewIntVar(0, horizon, f"update_end[{b}]")
            self.vend.append(vend)
            intervals.append(m.NewIntervalVar(self.vstart[b], self.vdur[b], vend, f"upd[{b}]"))
            m.Add(vend <= self.T)
            # last step's collective of bucket b ended at bstart + bdur - T in this step's frame
            m.Add(self.vstart[b] >= self.bstart[b] + self.bdur[b] - self.T)
            m.Add(self.bstart[0] + self.T >= self.bstart[b] + self.bdur[b])  # FIFO into the next step
            for u in range(U):
                m.Add(self.f[self.reader[u]] >= vend).OnlyEnforceIf(self.x[u, b])
        return intervals

    def _add_update_points(self, horizon: int) -> None:
        """Each bucket's update right before the first forward op reading any of its parameters
        (position ``first[b]``): after the op before it, before it — where the simulator applies it."""
        m, U, n_fwd = self.model, len(self.units), len(self.forward)
        prev_end = [0] + [self.f[j - 1] + self.fwd_dur[j - 1] for j in range(1, n_fwd)] + [0]
        starts = [*self.f, self.T]
        self.first: list[Any] = []
        self.after: list[Any] = []
        self.before: list[Any] = []
        for b in range(self.B):
            first = m.NewIntVar(0, n_fwd, f"first_reader[{b}]")  # n_fwd: unused bucket
            m.AddMinEquality(first, [self.reader[u] * self.x[u, b] + n_fwd * (1 - self.x[u, b]) for u in range(U)])
            after = m.NewIntVar(0, horizon, f"update_after[{b}]")
            before = m.NewIntVar(0, horizon, f"update_before[{b}]")
            m.AddElement(first, prev_end, after)
            m.AddElement(first, starts, before)
            m.Add(self.vstart[b] >= after)
            m.Add(self.vend[b] <= before)
            self.first.append(first)
            self.after.append(after)
            self.before.append(before)

    def _add_cuts(self) -> None:
        """Per unit: across the network and applied before its next first use; the constant bounds;
        per bucket: the cycle cut."""
        m = self.model
        for u in range(len(self.units)):
            m.Add(self.T >= self.end[self.unit_op[u]] + self.A + self.c[u] + self.upd[u] - self.f[self.reader[u]])
        m.Add(self.T >= self.static_bound)
        # between the end of this step's bucket b and the start of the next step's bucket 0 run b's
        # update and the work from b's first reader to the earliest gradient (H), so the channel's
        # busy time from bucket 0 through b plus that idle fits in one period
        self.idle = []
        for b in range(self.B):
            idle = m.NewIntVar(0, max(self.H), f"idle[{b}]")
            self.idle.append(idle)
            m.AddElement(self.first[b], self.H, idle)
            m.Add(self.bstart[0] + self.T >= self.bstart[b] + self.bdur[b] + self.vdur[b] + idle)

    # ---------------------------------------------------------------- hint

    def hint(self, order: list[str], buckets: list[list[str]]) -> dict[Any, int]:
        """The variable values of a plan's steady state, in ticks: the engine of
        :mod:`schedopt.steady` run on the model's data (forward ops, then the backward chains in
        ``order``; one chunk per candidate bucket), one period read back. ``self.hint_converged``
        says whether the period repeated."""
        bucket_of = unit_buckets(self.units, buckets)
        members = [[u for u in range(len(self.units)) if bucket_of[u] == k] for k in range(self.B)]
        upd = [sum(self.upd[u] for u in ms) for ms in members]
        nf = len(self.forward)
        position = {o: k for k, o in enumerate(order)}
        chain_order = sorted(range(len(self.coarse.chains)), key=lambda i: position[self.coarse.chains[i][0]])
        at = {i: nf + k for k, i in enumerate(chain_order)}  # a chain's position in the stream
        settle: dict[int, list[int]] = {}
        for k, ms in enumerate(members):
            if ms:
                settle.setdefault(min(self.reader[u] for u in ms), []).append(k)
        program = StepProgram(
            work=self.fwd_dur + [self.dur[i] for i in chain_order], settle=settle, update=upd,
            chunk_ready=[max((at[self.unit_op[u]] for u in ms), default=-1) for ms in members],
            chunk_bucket=range(self.B), chunk_time=[(self.A + sum(self.c[u] for u in ms)) if ms else 0 for ms in members])
        steps: list = []
        run = run_steady_state(program, on_step=lambda *step: steps.append(step))
        self.hint_converged = run.converged
        _, starts, ends, settled, chunks = steps[-1]
        origin = run.step_ends[-2]
        values: dict[Any, int] = {self.T: run.step_ends[-1] - origin}
        for j in range(nf):
            values[self.f[j]] = starts[j] - origin
        for i in chain_order:
            values[self.start[i]], values[self.end[i]] = starts[at[i]] - origin, ends[at[i]] - origin
        for k, _, _, start, _ in settled:
            values[self.vstart[k]] = start - origin
        for k, (_, start, _) in enumerate(chunks):
            values[self.bstart[k]], values[self.bdur[k]] = start - origin, program.chunk_time[k]
        self._hint_buckets(values, members, upd, bucket_of)
        return values

    def _hint_buckets(self, values: dict[Any, int], members: list[list[int]], upd: list[int],
                      bucket_of: list[int]) -> None:
        """The per-bucket values the engine does not time: updates, first readers, assignment."""
        period, nf = values[self.T], len(self.forward)
        for k in range(self.B):
            values[self.vdur[k]] = upd[k]
            if self.vstart[k] not in values:  # an unused bucket: an empty update at the end of the period
                values[self.vstart[k]] = period  # (inside an op, CP-SAT's NoOverlap rejects even an empty one)
            values[self.vend[k]] = values[self.vstart[k]] + upd[k]
            readers = [self.reader[u] for u in members[k]]
            first = min(readers) if readers else nf
            values[self.first[k]] = first
            values[self.idle[k]] = self.H[first]
            values[self.after[k]] = (values[self.f[first - 1]] + self.fwd_dur[first - 1]) if 0 < first < nf else 0
            values[self.before[k]] = values[self.f[first]] if first < nf else period
            for u in range(len(self.units)):
                values[self.x[u, k]] = int(bucket_of[u] == k)
            values[self.used[k]] = int(bool(members[k]))
