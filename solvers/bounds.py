"""Constant lower bounds for :mod:`.cpsat`: the channel and the compute stream, relaxed apart.

Each takes integer ticks and returns a bound no plan in the bound's scope beats (the docstrings say
why); CP-SAT gets them as ``T >=`` constants and reports the best when it proves nothing higher.

- :func:`ready_time_bound`, :func:`profile_bound` (``barrier``): the bucketing DP with every
  gradient ready at its earliest, and with the y-th byte ready after the least work that readies
  y bytes (:func:`work_profile`: :class:`ClosureKnapsack` on a grid, :func:`closure_hull` between).
- :func:`window_bound` (``overlap``): the work and bytes inside each gradient's transfer window.
- :func:`channel_bound` (``overlap``): calls against channel idle at both ends of the period.
- :func:`anchor_bound` (``overlap``): one large gradient, delayed by the work done before its
  bucket starts or followed by the bytes that work leaves unready (:func:`late_calls`).
"""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass

import networkx as nx
import numpy as np

__all__ = ["BoundSettings", "DEFAULT_BOUNDS", "ClosureKnapsack", "WorkProfile", "anchor_bound", "bucket_ends", "late_calls", "channel_bound", "closure_hull",
           "coupled_channel_bound", "pieces", "profile_bound", "ready_time_bound", "window_bound", "work_profile"]

@dataclass(frozen=True, slots=True, kw_only=True)
class BoundSettings:
    """How much work the constant bounds may do (cpsat's ``tuning={"bounds": {...}}``)."""

    #: The work profile (:func:`work_profile`): the points it solves at most, the uniform points it
    #: starts from, the deterministic time (CP-SAT's clock, about a second on this machine) per point,
    #: and the wall time all points may take. GPT-2 on 64 x 100 GbE, bound with 32 / 64 / 128 uniform
    #: points: 136.14 / 136.55 / 136.76 ms (the plan: 137.11); one point takes about 16 ms there.
    profile_points: int = 160
    profile_first_points: int = 16
    profile_point_det_s: float = 0.25
    profile_wall_s: float = 5.0
    #: The byte grid (pieces) of the profile bound's bucketing DP.
    profile_bound_pieces: int = 2000
    #: The most min cuts :func:`closure_hull` makes (GPT-2: 5).
    hull_max_cuts: int = 200
    #: Above this many units the ready-time bound leaves out its O(units^3) last-gradient refinement.
    ready_bound_max_units: int = 400
    #: The channel bound (:func:`channel_bound`): its byte grid (pieces per side), the anchor units it
    #: tries, where it splits the units into an early and a late group (shares of the bytes), and its
    #: rows per split.
    channel_pieces: int = 2000
    channel_anchors: int = 8
    channel_splits: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8)
    channel_rows: int = 64


#: The settings every bound uses unless given others.
DEFAULT_BOUNDS = BoundSettings()


def ready_time_bound(earliest: list[int], cost: list[int], call: int, all_ready: int, *,
                     settings: BoundSettings = DEFAULT_BOUNDS) -> int:
    """A lower bound on the end of the last collective (barrier mode), in ticks.

    Unit u cannot be ready before ``earliest[u]`` (its op after its ancestors alone), and the unit
    ready last not before ``all_ready`` (every gradient op and their ancestors have run). Later
    ready times never shorten the best bucketing, and for fixed ready times buckets contiguous in
    ready order are optimal (:mod:`.bucketing`), so the least, over which unit w is last, of the
    bucketing DP with ``ready[w] = all_ready`` (at least ``earliest[w]``) bounds every plan. Without the
    refinement (many units) it is the DP at ``earliest`` alone.
    """
    if not earliest:
        return 0
    by_ready = sorted(range(len(earliest)), key=earliest.__getitem__)
    r = np.array([earliest[u] for u in by_ready], dtype=np.float64)
    c = np.array([cost[u] for u in by_ready], dtype=np.float64)
    _, full = bucket_ends(r, c, call)
    if len(r) > settings.ready_bound_max_units:
        return int(full[-1])
    bound = np.inf
    for w in range(len(r)):  # w is the unit ready last: the others' DP, then w's bucket after all_ready
        # the others' prefixes before w are full's; the bytes after the last bucket's start follow it
        volume, rest = bucket_ends(np.delete(r, w), np.delete(c, w), call, head=full[:w + 1])
        last = np.maximum(rest, all_ready) + call + c[w] + (volume[-1] - volume)  # all_ready >= every earliest
        bound = min(bound, float(last.min()))
    return int(max(bound, full[-1]))


@dataclass(frozen=True)
class WorkProfile:
    """The least compute that readies a given number of bytes (:func:`work_profile`)."""

    xs: np.ndarray  # bytes, rising from 0
    work: np.ndarray  # a closed set finishing xs[k] bytes or more works at least work[k]
    hull: np.ndarray  # rows (work, bytes): no closed set lies above them (one row: none known)

    def least_work(self, position: np.ndarray) -> np.ndarray:
        """A lower bound on the work of any closed set finishing more than ``position`` bytes."""
        work = self.work[np.searchsorted(self.xs, position, side="right") - 1]
        if len(self.hull) > 1:
            work = np.maximum(work, np.interp(position, self.hull[:, 1], self.hull[:, 0]))
        return work


def work_profile(dur: list[int], edges: set[tuple[int, int]], own: list[int], wall_s: float | None = None, *,
                 settings: BoundSettings = DEFAULT_BOUNDS) -> WorkProfile:
    """Points ``(x[k], w[k])``: any ancestor-closed set of ops that finishes ``x[k]`` bytes or more
    (``own[v]``: the bytes, in channel ticks, of the units op v finishes) holds ``w[k]`` work or more.

    Each ``w[k]`` is :class:`ClosureKnapsack`'s least work for ``x[k]`` bytes (about 16 ms each on
    GPT-2's backward), then raised to the largest ``w`` at a smaller ``x`` (the least work only grows
    with the bytes). The points start uniform and are split where the profile jumps most (the step's area:
    work times bytes), up to ``settings.profile_points`` or ``wall_s`` (default ``settings.profile_wall_s``). ``x[0] = 0``, ``w[0] = 0``.
    """
    dag = nx.DiGraph(list(edges))
    dag.add_nodes_from(range(len(dur)))
    needed = {v for v in range(len(dur)) if own[v]}  # and their ancestors: no other op readies bytes
    needed |= set().union(*(nx.ancestors(dag, v) for v in needed))
    knapsack = ClosureKnapsack(dur, own, dag, sorted(needed), settings.profile_point_det_s)
    deadline = time.perf_counter() + (settings.profile_wall_s if wall_s is None else wall_s)
    hull = closure_hull(dur, own, dag, sorted(needed), deadline, max_cuts=settings.hull_max_cuts)
    work = {0: 0.0}
    for x in np.linspace(0, knapsack.bytes, settings.profile_first_points + 1)[1:].round().astype(int):
        if time.perf_counter() < deadline:
            work[int(x)] = knapsack.least_work(int(x))
    while len(work) < settings.profile_points and time.perf_counter() < deadline:
        xs = sorted(work)
        w = np.maximum.accumulate([work[x] for x in xs])
        area = [(w[k + 1] - w[k]) * (xs[k + 1] - xs[k]) if xs[k + 1] - xs[k] > 1 else 0.0
                for k in range(len(xs) - 1)]
        k = int(np.argmax(area)) if area else 0
        if not area or area[k] <= 0:
            break
        mid = (xs[k] + xs[k + 1]) // 2
        work[mid] = knapsack.least_work(mid)
    xs = sorted(work)
    return WorkProfile(np.array(xs, dtype=np.float64), np.maximum.accumulate([work[x] for x in xs]), hull)


class ClosureKnapsack:
    """Subsets of ``ops`` closed under ancestors (within ``ops``), each op with work ``dur[v]`` and
    bytes ``own[v]``: the least work that finishes some bytes, the most bytes some work finishes.

    CP-SAT on one worker, ``det_s`` of deterministic time per question; each answer is its proven
    bound (exact when solved: tens of ms on the example models' backward), so it is safe either way.
    """

    def __init__(self, dur: list[int], own: list[int], dag: nx.DiGraph, ops: list[int], det_s: float):
        from ortools.sat.python import cp_model

        self.det_s = det_s
        self.work, self.bytes = sum(dur[v] for v in ops), sum(own[v] for v in ops)
        m = cp_model.CpModel()
        z = {v: m.NewBoolVar(f"z[{v}]") for v in ops}
        for a, b in dag.subgraph(ops).edges:
            m.AddImplication(z[b], z[a])
        self.work_in = m.NewIntVar(0, self.work, "work")
        self.bytes_in = m.NewIntVar(0, self.bytes, "bytes")
        m.Add(self.work_in == sum(dur[v] * z[v] for v in ops))
        m.Add(self.bytes_in == sum(own[v] * z[v] for v in ops if own[v]))
        self.model = m

    def _solve(self, work_max: int, bytes_min: int, maximize_bytes: bool) -> float | None:
        from ortools.sat.python import cp_model

        variables = self.model.Proto().variables
        work, bytes_ = variables[self.work_in.Index()].domain, variables[self.bytes_in.Index()].domain
        work[1], bytes_[0] = work_max, bytes_min
        self.model.ClearObjective()
        if maximize_bytes:
            self.model.Maximize(self.bytes_in)
        else:
            self.model.Minimize(self.work_in)
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.max_deterministic_time = self.det_s
        solver.parameters.catch_sigint_signal = False  # short; CP-SAT's handler would drop Python's (interrupt.py)
        status = solver.Solve(self.model)
        work[1], bytes_[0] = self.work, 0
        return solver.BestObjectiveBound() if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None

    def least_work(self, x: int) -> float:
        """A lower bound on the work of any closed set finishing ``x`` bytes or more (0 if none does)."""
        if x <= 0:
            return 0.0
        bound = self._solve(self.work, min(x, self.bytes), maximize_bytes=False)
        return 0.0 if bound is None else float(np.ceil(bound - 1e-6))  # the work is an integer

    def most_bytes(self, budget: int) -> int:
        """An upper bound on the bytes any closed set of at most ``budget`` work finishes."""
        if budget >= self.work:
            return self.bytes
        bound = self._solve(max(budget, 0), 0, maximize_bytes=True)
        return self.bytes if bound is None else int(np.floor(bound + 1e-6))


def closure_hull(dur: list[int], own: list[int], dag: nx.DiGraph, ops: list[int],
                 deadline: float = np.inf, *, max_cuts: int = DEFAULT_BOUNDS.hull_max_cuts) -> np.ndarray:
    """The upper concave hull of (work, bytes) over the ancestor-closed sets of ``ops``: rows (w, c).

    Every closed set's bytes lie on or below it, so a set with ``c`` bytes or more works at least the
    hull's inverse at ``c``: the linear relaxation of the knapsack in :func:`work_profile`, weaker
    at its points but a line between them. Vertices by parametric max-weight closure (a min cut
    with weights ``q own - p dur``, integers, so the cut is exact), found from the two ends
    inwards: a segment whose slope finds no set above it is a hull edge. Unfinished by ``deadline``
    (a perf_counter time), it returns one row (no hull).
    """
    edges = list(dag.subgraph(ops).edges)

    def best_closure(p: int, q: int) -> tuple[int, int]:
        flow = nx.DiGraph()
        flow.add_nodes_from(["s", "t"])
        for v in ops:
            weight = q * own[v] - p * dur[v]
            if weight > 0:
                flow.add_edge("s", v, capacity=weight)
            elif weight < 0:
                flow.add_edge(v, "t", capacity=-weight)
        for a, b in edges:
            flow.add_edge(b, a)  # no capacity: infinite (b in the set brings a)
        _, (chosen, _) = nx.minimum_cut(flow, "s", "t")
        chosen.discard("s")
        return sum(dur[v] for v in chosen), sum(own[v] for v in chosen)

    points = {(0, 0), (sum(dur[v] for v in ops), sum(own[v] for v in ops))}
    segments = [sorted(points)] if len(points) == 2 else []
    while segments and len(points) < max_cuts and time.perf_counter() < deadline:
        (w1, c1), (w2, c2) = segments.pop()
        if w2 <= w1:
            continue
        p, q = c2 - c1, w2 - w1
        w, c = best_closure(p, q)
        if q * c - p * w > q * c1 - p * w1:
            points.add((w, c))
            segments += [[(w1, c1), (w, c)], [(w, c), (w2, c2)]]
    if segments:  # unfinished: the hull of the points found could pass below a closed set
        return np.array([[0.0, 0.0]])
    rows = np.array(sorted(points), dtype=np.float64)
    return rows[np.concatenate([[True], np.diff(rows[:, 1]) > 0])]  # bytes rise strictly (np.interp)


def profile_bound(earliest: list[int], cost: list[int], call: int, start: int, profile: WorkProfile, *,
                  grid: int = DEFAULT_BOUNDS.profile_bound_pieces) -> int:
    """A lower bound on the end of the last collective (barrier mode) from the work profile, in ticks.

    Put every byte in the order the bytes become ready. The bytes up to the y-th are all ready only
    after every op that finishes them and those ops' ancestors have run on the one compute stream
    (which starts at ``start``), so the y-th byte is ready no earlier than ``start + w[k]`` for any
    profile point ``x[k] <= y`` (:func:`work_profile`), nor before the y-th smallest of the
    bytes' own earliest ready times (each unit's ``earliest``). With those ready times, buckets
    contiguous in ready order are optimal (:mod:`.bucketing`): the DP over pieces of ``delta`` bytes
    is within ``delta`` of every bucketing (move each bucket's end to the next piece boundary: every
    end grows by less than ``delta``). Where :func:`ready_time_bound` lets every gradient be ready
    at its earliest at once, this makes their ops share the compute stream: GPT-2 on 64 x 100 GbE,
    135.7 -> 136.8 ms.
    """
    if not cost or sum(cost) == 0:
        return 0
    total = float(sum(cost))
    delta = total / grid
    order = sorted(range(len(cost)), key=earliest.__getitem__)
    position = np.arange(grid) * delta  # bytes before each piece
    ends = np.cumsum([cost[u] for u in order])
    own_earliest = np.array([earliest[u] for u in order], dtype=np.float64)
    holder = np.minimum(np.searchsorted(ends, position, side="right"), len(order) - 1)
    ready = np.maximum(own_earliest[holder], start + profile.least_work(position))
    _, end = bucket_ends(ready, np.full(grid, delta), call)
    return max(int(np.floor(end[-1] - delta)), 0)


def channel_bound(release: list[int], tail: list[int], cost: list[int], call: int, *,
                  until: float | None = None, settings: BoundSettings = DEFAULT_BOUNDS) -> int:
    """A lower bound on the ``overlap`` period from the channel alone, in ticks.

    Unit u's bytes (``cost[u]`` ticks on the channel) leave no earlier than ``release[u]`` after
    the step's first backward op starts, and the next step's first backward op starts no earlier
    than ``tail[u]`` after u's bucket ends; buckets go one after another, ``call`` ticks each plus
    their bytes. Take any unit a and its bucket beta; L and R are the units sent before and after
    beta. Then

        T >= max(f(L), release[a]) + call + (all bytes - c(L) - c(R)) + max(tail[a], g(R))

    where f(L) is when L's buckets can end at the earliest (releases only) and g(R) the least
    ``max(end + tail)`` of R's buckets counted from beta's end (tails only; tails are releases
    backwards in time). Bytes released earlier never make a bucket end later (each bucket takes as
    many earlier-released bytes), so for a given volume the earliest-released bytes are best for
    L - cut at any byte, which only lowers the bound - and likewise the least-tail bytes for R.
    So, with x and y the volumes of L and R (x + y <= the bytes of the others),

        T >= call + all bytes + min_{x, y} [max(f(x), release[a]) - x] + [max(g(y), tail[a]) - y]

    f and g are the exact bucketing DP (:mod:`.bucketing`) on a grid of pieces (each unit cut into
    equal pieces of at most delta ticks); buckets ending only at piece boundaries overestimate them
    by at most delta, and a volume between grid points another delta, so the bound subtracts 2 delta
    per side. It weighs bucket calls against channel idle at both ends of the period: BERT-base on
    64 x 100 GbE, 73.6 (window bound) -> 77.6 ms.

    Both sides want the same bytes (the last layers: ready first, read last), which the bound
    above lets each have; :func:`coupled_channel_bound` shares them out. The result is the best of
    both over the anchors with the largest ``release + tail``; the coupled splits stop once
    ``time.perf_counter()`` passes ``until`` (each is a valid bound alone).
    """
    U = len(cost)
    if U == 0:
        return 0
    total = float(sum(cost))
    delta = total / settings.channel_pieces  # the largest piece
    anchors = sorted(range(U), key=lambda u: -(release[u] + tail[u]))[:settings.channel_anchors]
    best = 0.0
    for a in anchors:
        others = [u for u in range(U) if u != a]
        if not others:
            best = max(best, release[a] + call + cost[a] + tail[a])
            continue
        vol_l, end_l = bucket_ends(*pieces(others, release, cost, delta), call)
        vol_r, end_r = bucket_ends(*pieces(others, tail, cost, delta), call)
        phi = np.maximum(end_l, release[a]) - vol_l
        psi = np.minimum.accumulate(np.maximum(end_r, tail[a]) - vol_r)  # best with at most that volume
        j = np.searchsorted(vol_r, total - cost[a] - vol_l + 1e-9, side="right") - 1
        fits = j >= 0
        best = max(best, call + total + float(np.min(phi[fits] + psi[j[fits]])) - 4 * delta)
    for split in settings.channel_splits:
        if until is not None and time.perf_counter() > until:
            break
        best = max(best, coupled_channel_bound(release, tail, cost, call, anchors, split, delta,
                                               num_rows=settings.channel_rows))
    return max(int(np.floor(best)), 0)


def pieces(units: list[int], key: list[int], cost: list[int], delta: float) -> tuple[np.ndarray, np.ndarray]:
    """``units`` in ``key`` order, each cut into equal pieces of at most ``delta``: their keys and sizes."""
    items = sorted(units, key=key.__getitem__)
    counts = [max(1, int(np.ceil(cost[u] / delta))) if delta > 0 else 1 for u in items]
    r = np.repeat(np.array([key[u] for u in items], dtype=np.float64), counts)
    c = np.repeat(np.array([cost[u] / k for u, k in zip(items, counts)], dtype=np.float64), counts)
    return r, c


def bucket_ends(r: np.ndarray, c: np.ndarray, call: int,
                 head: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Prefix volumes and ``end[i]``: the least end of buckets sending the first i pieces (pieces
    ready at ``r``), -inf for none. ``head``: ``end`` of a shorter stream this one extends.

    ``end[i] = min over j < i of max(end[j], r[i-1]) - volume[j] + call + volume[i]``. With ``r``
    rising (every caller's pieces are in ready order) ``end`` rises too, so the j with
    ``end[j] < r[i-1]`` are a prefix [0, p): there the term is ``r[i-1] - volume[j]``, least at the
    prefix's last j; beyond it, ``end[j] - volume[j]``, whose least over the window [p, i) a
    monotone queue keeps. The same terms as the formula's, so the same floats, in O(n).
    """
    volume = np.concatenate([[0.0], np.cumsum(c)])
    end = np.empty(len(r) + 1)
    end[0] = -np.inf  # nothing sent: no bucket
    first = 1
    if head is not None:
        end[:len(head)] = head
        first = len(head)
    if np.any(np.diff(r) < 0):
        return volume, _bucket_ends_direct(r, volume, call, end, first)
    ends, vol, ready = end.tolist(), volume.tolist(), r.tolist()
    window: collections.deque[int] = collections.deque()  # j in [p, i), end[j] - volume[j] rising
    p = 0
    for i in range(1, len(ready) + 1):
        j = i - 1  # j joins the candidates
        while window and ends[window[-1]] - vol[window[-1]] >= ends[j] - vol[j]:
            window.pop()
        window.append(j)
        if i < first:
            continue
        at = ready[i - 1]
        while p < i and ends[p] < at:  # j = p moves to the prefix
            p += 1
        while window and window[0] < p:
            window.popleft()
        best = at - vol[p - 1] if p > 0 else np.inf
        if window:
            best = min(best, ends[window[0]] - vol[window[0]])
        ends[i] = best + call + vol[i]
    return volume, np.array(ends)


def _bucket_ends_direct(r: np.ndarray, volume: np.ndarray, call: int, end: np.ndarray, first: int) -> np.ndarray:
    """:func:`bucket_ends`' formula term by term, from ``end[first]`` on (``end`` filled before it)."""
    for i in range(first, len(r) + 1):
        end[i] = np.min(np.maximum(end[:i], r[i - 1]) - volume[:i]) + call + volume[i]
    return end


def coupled_channel_bound(release: list[int], tail: list[int], cost: list[int], call: int,
                           anchors: list[int], split: float, delta: float, *,
                           num_rows: int = DEFAULT_BOUNDS.channel_rows
                           ) -> float:
    """:func:`channel_bound` with L and R sharing one early group of units instead of both having it.

    Tails are first lowered (which only lowers the bound) so that they never fall along the release
    order: each unit's becomes the least of its own and every later-released unit's. Then the first
    units in release order holding ``split`` of the bytes (G1) come before the others (G2) in both
    orders, and L and R are described by their volumes in each group: y and z. For a given (y, z),
    the best L is G1's y earliest bytes, then G2's z earliest, as above. f is computed exactly for
    y on ``num_rows`` rows (and every z), and for G1 alone (z = 0, every y). Any (y, z)
    maps onto one of those with the same volume and no later bytes: y up to the next row, z down by
    as much (or, if z is smaller than that, onto G1 alone with y + z), so y grows by at most a row's
    step. Hence, with caps c(G1) and c(G2) less a's bytes,

        y_L + y_R <= cap1 + 2 step,   z_L + z_R <= cap2

    over those points, with the same 2 delta per side for the piece grid.
    """
    U = len(cost)
    order = sorted(range(U), key=lambda u: (release[u], tail[u]))
    nested = list(tail)
    least = np.inf
    for u in reversed(order):
        least = min(least, tail[u])
        nested[u] = least
    total = float(sum(cost))
    cut = int(np.searchsorted(np.cumsum([cost[u] for u in order]), split * total)) + 1
    g1, g2 = order[:cut], order[cut:]
    if not g1 or not g2:
        return 0.0
    sides = [_group_side(g1, g2, key, cost, delta, call, num_rows) for key in (release, nested)]
    (vol1_l, end1_l, y_l, z_l, ends_l), (vol1_r, end1_r, y_r, z_r, ends_r) = sides
    step = max(float(np.diff(y_l).max(initial=0.0)), float(np.diff(y_r).max(initial=0.0)))
    in_g1 = set(g1)
    best = 0.0
    for a in anchors:
        room1 = sum(cost[u] for u in g1) - (cost[a] if a in in_g1 else 0) + 2 * step  # cap1 + 2 step
        cap2 = sum(cost[u] for u in g2) - (0 if a in in_g1 else cost[a])
        # R: the least psi with at most (y, z), on the rows, and for G1 alone
        psi_rows = np.maximum(ends_r, tail[a]) - (y_r[:, None] + z_r[None, :])
        psi_rows = np.minimum.accumulate(np.minimum.accumulate(psi_rows, axis=0), axis=1)
        psi_g1 = np.minimum.accumulate(np.maximum(end1_r, tail[a]) - vol1_r)
        # L: every point (rows x z, and G1 alone with z = 0)
        ly = np.concatenate([np.repeat(y_l, len(z_l)), vol1_l])
        lz = np.concatenate([np.tile(z_l, len(y_l)), np.zeros(len(vol1_l))])
        phi = np.concatenate([(np.maximum(ends_l, release[a]) - (y_l[:, None] + z_l[None, :])).ravel(),
                              np.maximum(end1_l, release[a]) - vol1_l])
        ok = (ly <= room1) & (lz <= cap2 + 1e-9)
        ly, lz, phi = ly[ok], lz[ok], phi[ok]
        row = np.searchsorted(y_r, room1 - ly + 1e-9, side="right") - 1
        col = np.searchsorted(z_r, cap2 - lz + 1e-9, side="right") - 1
        g1_only = np.searchsorted(vol1_r, room1 - ly + 1e-9, side="right") - 1
        right = np.where((row >= 0) & (col >= 0), psi_rows[np.maximum(row, 0), np.maximum(col, 0)], np.inf)
        right = np.minimum(right, np.where(g1_only >= 0, psi_g1[np.maximum(g1_only, 0)], np.inf))
        value = float(np.min(phi + right))
        if np.isfinite(value):
            best = max(best, call + total + value - 4 * delta)
    return best


def _group_side(g1: list[int], g2: list[int], key: list[int], cost: list[int], delta: float, call: int,
                num_rows: int) -> tuple[np.ndarray, ...]:
    """One side (L by release, R by nested tail) of :func:`coupled_channel_bound`: G1 alone, and the rows."""
    r1, c1 = pieces(g1, key, cost, delta)
    r2, c2 = pieces(g2, key, cost, delta)
    vol1, end1 = bucket_ends(r1, c1, call)  # G1 alone
    rows = np.unique(np.linspace(0, len(r1), num_rows).astype(int))
    y, z = vol1[rows], np.concatenate([[0.0], np.cumsum(c2)])
    # a last bucket that starts inside G1 (boundary j <= y) is the least of max(end1[j], r) - vol1[j] over
    # j <= y (row by row, the least over j <= row: a running minimum over j, read at the rows)
    from_g1 = np.minimum.accumulate(np.maximum(end1[:, None], r2[None, :]) - vol1[:, None], axis=0)[rows]
    ends = np.empty((len(rows), len(r2) + 1))
    ends[:, 0] = end1[rows]
    ready, volume = r2.tolist(), z.tolist()
    for row, (y_row, g1_row) in enumerate(zip(y.tolist(), from_g1.tolist())):
        ends[row, 1:] = _extended_ends(ready, volume, y_row, g1_row, call)
    return vol1, end1, y, z, ends


def _extended_ends(r: list[float], z: list[float], y: float, from_g1: list[float], call: int) -> list[float]:
    """One row of :func:`_group_side`: G1's first y bytes, then G2's pieces (ready at ``r``, prefix volumes
    ``z``). ``end[i] = min(from_g1[i-1], min over 1 <= k < i of max(end[k], r[i-1]) - (y + z[k])) + call
    + y + z[i]``. As in :func:`bucket_ends`, ``end`` rises with ``r`` (each term does), so the k with
    ``end[k] < r[i-1]`` are a prefix [1, p), least at its last k, and beyond it a monotone queue keeps the
    least ``end[k] - (y + z[k])``: the formula's terms, the same floats, in O(n) (a test holds both)."""
    n = len(r)
    end, tail = [0.0] * (n + 1), [0.0] * (n + 1)
    queue: collections.deque[int] = collections.deque()
    p = 1
    for i in range(1, n + 1):
        ready = r[i - 1]
        if i > 1:
            k = i - 1
            term = tail[k] = end[k] - (y + z[k])
            while queue and tail[queue[-1]] >= term:
                queue.pop()
            queue.append(k)
        while p < i and end[p] < ready:
            p += 1
        while queue and queue[0] < p:
            queue.popleft()
        least = ready - (y + z[p - 1]) if p > 1 else math.inf
        if queue and tail[queue[0]] < least:
            least = tail[queue[0]]
        first = from_g1[i - 1]
        end[i] = (first if first < least else least) + call + y + z[i]
    return end[1:]


def window_bound(*, work_ticks: np.ndarray, finished_below: np.ndarray, readers: list[int], call_ticks: int,
                 transfer_ticks: list[int], least_update_ticks: list[int]) -> int:
    """A lower bound on the ``overlap`` period from the work inside transfer windows, in ticks.

    ``work_ticks[w, j]``: the work that must run between the start of forward op j and the end of
    unit w's op (0 when that op is not below j); ``finished_below[w, u]``: unit u's op is unit w's
    op or below it; ``readers[u]``: u's first reader. A unit finished at or below w's op and read
    first at or before j is sent after w ends and must be back before j starts again one period
    later, so

        T >= work[w, j] + call + (transfer of those units)             (w below j)
        T >= work[u, reader(u)] + call + transfer_u + least update_u     (every unit u)

    where the least update is that of u's parameter with the least (a plan may split u; its last
    part's update comes after all of u's bytes).
    """
    nf, U = work_ticks.shape[1], len(readers)
    reader = np.array(readers)
    c = np.array(transfer_ticks, dtype=np.float64)
    W = work_ticks.astype(np.float64)
    per_unit = W[np.arange(U), reader] + call_ticks + c + np.array(least_update_ticks, dtype=np.float64)
    read_by = reader[:, None] <= np.arange(nf)[None, :]  # [u, j]
    window_bytes = (finished_below * c) @ read_by  # [w, j]
    windows = np.where((W > 0) & (window_bytes > 0), W + call_ticks + window_bytes, 0)
    return int(round(max(per_unit.max(initial=0), windows.max(initial=0))))


def anchor_bound(*, op_ticks: list[int], edges: set[tuple[int, int]], items: list[tuple[int, int, int, int]],
                 call_ticks: int, anchors: int, points: int, point_det_s: float,
                 until: float | None = None) -> int | None:
    """A lower bound on the ``overlap`` period from one large gradient (the anchor), in ticks.

    ``items``: per parameter ``(op, release, tail, transfer)`` in ticks, as for
    :func:`channel_bound` (times from the step's first backward op); ``op_ticks`` and ``edges``:
    the backward ops and their DAG. Take an anchor a, its bucket's start S, and X the backward
    work done by S besides a's op and its ancestors (``release[a]``), so ``S >= release[a] + X``:

        T >= release[a] + X + call + c[a] + tail[a]                                  (a's cycle)

    and the bytes not ready by S, at least ``c(others) - P(X)``, go in later buckets, after a's on
    the channel, each call delivering its bytes when it ends (:func:`late_calls`, L):

        T >= release[a] + X + call + c[a] + max(tail[a], L(c(others) - P(X)))

    P(X), the most bytes of the other parameters any closed set of ops holding a's ancestors and X
    more work finishes, is a knapsack: CP-SAT's proven upper bound (``point_det_s`` deterministic
    seconds each) on ``points`` values of X (between points the lower X for the first line, the
    higher for P). T is at least the least, over X, of the larger line. GPT-2's tied embedding:
    finished last, read first, 24 ms on 64 x 100 GbE; doing the other layers' weight-gradient ops
    before it delays it, leaving them for later queues their 54 ms of bytes behind it, in calls
    that each pay the call and deliver by the earliest reader they carry (116.2 -> 118.3 ms over
    the window bound; 117.8 with every late byte in one call delivered at the least tail). The ``anchors`` parameters with the largest
    ``release + c + tail`` are tried. None when ``time.perf_counter()`` passes ``until`` first.
    """
    if not items:
        return 0
    op, release, tail, cost = (list(x) for x in zip(*items))
    n = len(op_ticks)
    dag = nx.DiGraph(list(edges))
    dag.add_nodes_from(range(n))
    best = 0
    for a in sorted(range(len(cost)), key=lambda i: -(release[i] + cost[i] + tail[i]))[:anchors]:
        others = [i for i in range(len(cost)) if i != a]
        done = nx.ancestors(dag, op[a]) | {op[a]}
        spare = [v for v in range(n) if v not in done]
        if not others or not spare:
            continue
        own = [0] * n
        for i in others:
            own[op[i]] += cost[i]
        ready = sum(own[v] for v in done)  # finished with a's ancestors
        knapsack = ClosureKnapsack(op_ticks, own, dag, spare, point_det_s)
        grid = np.linspace(0, knapsack.work, points + 1)
        most = []
        for x in grid:
            if until is not None and time.perf_counter() > until:
                return None
            most.append(ready + knapsack.most_bytes(int(x)))
        c_others = sum(cost[i] for i in others)
        tails, costs = [tail[i] for i in others], [cost[i] for i in others]
        # the anchor's call, then the bytes its start leaves unready in calls of their own
        lines = [release[a] + grid[k] + call_ticks + cost[a]
                 + max(tail[a], late_calls(tails, costs, c_others - most[k + 1], call_ticks)) for k in range(points)]
        best = max(best, int(np.floor(min(lines))))
    return best


def late_calls(tails: list[int], costs: list[int], late: float, call: int) -> float:
    """The least ``max(end of its call + tail)`` over items sent in calls one after another from time 0,
    each call ``call`` plus its bytes, over every choice of items whose bytes add to ``late`` or more
    (0 when ``late <= 0``).

    A lower bound computed exactly on a relaxation: items may be cut anywhere, so the cheapest choice
    takes the bytes with the least tails (moving bytes to a smaller tail ends no call later and lowers
    no call's largest tail), and the calls go in order of decreasing tail, each a run of that order
    (Webster and Baker's exchange for batches that deliver when they end); a call starts where a tail
    changes. Over ``k`` calls, ``g_k[j]``: the least max over the first ``j`` groups of equal tail.
    """
    if late <= 0:
        return 0.0
    by_tail: dict[int, float] = collections.defaultdict(float)
    for t, c in sorted(zip(tails, costs)):  # smallest tails first, until the late bytes are covered
        if late <= 0:
            break
        by_tail[t] += min(c, late)
        late -= c
    tau = np.array(sorted(by_tail, reverse=True), dtype=np.float64)  # groups, largest tail first
    end = np.cumsum([by_tail[t] for t in sorted(by_tail, reverse=True)])
    m = len(tau)
    lower = np.tril(np.ones((m, m), dtype=bool))  # [j, i]: group i can start the call that ends with group j
    opens = np.concatenate([[0.0], np.full(m - 1, np.inf)])  # g_{k-1} before group i: no groups sent yet
    best = np.inf
    for k in range(1, m + 1):
        if k * call + end[-1] >= best:
            break
        # a k-th call of groups i..j: max(g_{k-1} over the groups before i, its end + tau[i])
        g = np.where(lower, np.maximum(opens[None, :], k * call + end[:, None] + tau[None, :]), np.inf).min(axis=1)
        best = min(best, g[-1])
        opens = np.concatenate([[np.inf], g[:-1]])
    return float(best)
