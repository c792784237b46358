"""What a CP-SAT solve may do: one frozen, validating dataclass (the user's options and the tuning).

The first four fields are the solver's options (``--time-limit``, ``--seed``,
``--option num_workers=...``, ``--option max_buckets=...``); the rest are tuning
that a researcher may change through ``tuning={...}`` and a test may shrink.
The figures beside each were measured when it was chosen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

from schedopt.errors import SolverError

from ..bounds import DEFAULT_BOUNDS, BoundSettings
from ..options import SEED_MAX

__all__ = ["CpsatOptions", "USER_OPTIONS"]

#: The fields that are the solver's options (keyword arguments of ``solve_cpsat``); the rest is tuning.
USER_OPTIONS = ("time_limit_s", "num_workers", "seed", "max_buckets")


@dataclass(frozen=True, slots=True, kw_only=True)
class CpsatOptions:
    """Every setting of one CP-SAT solve; invalid values raise :class:`SolverError` naming the field."""

    #: The whole call ends within this plus 2 s (heuristics, searches, both CP-SAT phases).
    time_limit_s: float = 60.0
    num_workers: int = 2
    seed: int = 0
    #: Candidate buckets in the model (default: the warm start's count + 2, at least 8, at most the units).
    max_buckets: int | None = None

    #: The heuristics whose plans are warm starts (with the exact bucketing and the other starts of
    #: :mod:`.warm`). Named explicitly: a solver a user registers is not run unless listed here.
    warm_starts: tuple[str, ...] = ("pytorch-ddp", "horovod", "mgwfbp", "tictac", "bytescheduler", "caramel")
    #: How much work the constant bounds may do (:class:`..bounds.BoundSettings`; ``tuning={"bounds": {...}}``).
    bounds: BoundSettings = DEFAULT_BOUNDS
    #: The hint check (a solve with every variable fixed to the hint) takes at most this long.
    hint_check_s: float = 10.0
    #: Overlap mode: the share of the time left after the warm start that the optional constant bounds
    #: (the coupled channel bound, the anchor bound) may take.
    bounds_share: float = 0.5
    #: Overlap mode: the closure relaxation (:mod:`.relaxation`) runs where at most this many calls
    #: can beat the warm start (ResNet-50 and Inception on 64 x 100 GbE: 4 and 5; GPT-2 small there:
    #: 35, where 60 s raised nothing), for this share of the time left after the constant bounds.
    relaxation_max_calls: int = 12
    #: ... and takes this share of what is left: where it runs, CP-SAT's model rarely finds a plan in
    #: the rest, and its bisection is what raises the bound (60 s, 64 x 100 GbE, 0.6 -> 0.85: Inception's
    #: bound 20.69 -> 20.86 ms, its gap 2.07% -> 1.28%; ResNet-50 and BERT base unchanged).
    relaxation_share: float = 0.85
    #: Overlap mode, where the closure relaxation is skipped: the anchor-split relaxation
    #: (:mod:`.split_bound`) takes this share of the time left (GPT-2 small, 64 x 100 GbE: 118.31 ->
    #: 118.87 ms in 5 s, 119.26 in 10; in a 60 s solve 119.15 with 0.7, 119.19 with 0.9: CP-SAT's own
    #: phases improved on the warm start in none of GPT-2 small's and BERT base's 100 GbE cases),
    #: keeping the parameters whose bytes are at least this share of the anchor's (50 of GPT-2
    #: small's 148), and is skipped above this many kept.
    split_share: float = 0.9
    split_min_share: float = 0.01
    split_max_items: int = 400
    #: Overlap mode: the search moves on from a local optimum up to this much worse than the one it left.
    search_accept_worse: float = 0.003
    #: Overlap mode: a kick is this many random moves (least, most). Inception on 64 x 100 GbE, 150k
    #: evaluations, 4 seeds, mean period: 21.56 ms with 2-4, 21.87 with 1-2, 21.64 with 3-6, 21.81 with 5-10.
    search_kick_moves: tuple[int, int] = (2, 4)
    #: Overlap mode: the bucket search starts from the best plan of this many distinct op orders.
    search_orders: int = 2
    #: The share of CP-SAT's time spent raising the bound (objective lower-bound search) after searching.
    bound_phase_share: float = 0.3
    #: Overlap mode: the periods each start's search may evaluate, over all its rounds. 50k take 2-4 s
    #: on the example models, so the searches end on this count, not on the clock, when they run in
    #: parallel. From Caramel's start, 4 seeds, mean period: Inception 64 x 100 GbE 21.54 ms with
    #: three rounds of 300k in all, 21.48 with one, 21.40 the best of two seeds of 150k (spread
    #: 21.1-21.9 in each: the seed matters more); GPT-2 small 64 x 100 GbE 123.09 with the rounds,
    #: 124.19 the best of two seeds of 150k.
    search_evaluations: int = 300_000
    #: ... and at most this many per unit (small problems converge long before; tests stay fast).
    search_evaluations_per_unit: int = 2_000
    #: Overlap mode: the bucket search's rounds (shares of its evaluations and time); after each, the
    #: backward order becomes the bucket-first order of its result if that is faster, and the next
    #: round goes on from there (GPT-2 small on 64 x 100 GbE: 126.0 -> 123.5 ms over three rounds).
    search_round_shares: tuple[float, ...] = (0.5, 0.25, 0.25)
    #: Overlap mode, compiled: the share of each round's time that holds buckets back behind the one
    #: the forward waits for, their ops with them (:mod:`..deferral`; GPT-2 small on 8 x 100 GbE:
    #: 117.71 -> 115.84 ms from the search's local optimum).
    search_deferral_share: float = 0.3
    #: Overlap mode: also run :mod:`..anchor_search` (which units travel before the
    #: anchor gradient, which after) beside the bucket searches (GPT-2 small, 64 x 100 GbE, 60 s
    #: solves in ``bench/solver_quality.py``: 121.41 ms with it, 122.05 with the bucket searches alone).
    anchor_search: bool = True
    #: ... in the last search lane (process), taking this share of its time from that lane's bucket search.
    anchor_search_share: float = 0.5
    #: ... which stops after this many DPs (about 1 ms each on GPT-2 small's 123 units), at most this
    #: many per unit, so that it ends on its count rather than on the clock.
    anchor_search_evaluations: int = 12_000
    anchor_search_evaluations_per_unit: int = 100
    #: ... and which is skipped above this many units (a DP takes 0.7 ms at transformer_like(12)'s 75,
    #: 2.7 ms at transformer_like(48)'s 291; the search keeps to its time either way).
    anchor_search_max_units: int = 600
    #: Overlap mode: a search process still running this long after its share of the time is killed.
    search_grace_s: float = 1.0
    #: Overlap mode: the share of the time limit the bucket search may use at most (CP-SAT rarely
    #: improves on the search's plan in the large cases; the search does, given time). With two or
    #: more workers the starts search in parallel processes (the search is pure Python and CP-SAT
    #: has not started), each for this share; else one after the other, splitting it.
    search_share: float = 0.5
    #: The share of the time limit each heuristic's own search may use (Caramel's chunk trials: 40 s
    #: unbounded on transformer_like(96), one 0.4 s simulation per trial).
    heuristic_share: float = 0.1
    #: The horizon of the best warm start, in ticks.
    horizon_ticks: int = 1_000_000
    #: Above this many variables CP-SAT's presolve does not finish within a minute on 2 workers
    #: (transformer_like(96) at aten granularity: no solution with it, the hint and a 2.3% bound without).
    presolve_max_variables: int = 50_000
    #: Overlap mode: above this many (unit, bucket) pairs CP-SAT is not run; the warm start is
    #: returned with the model's constant bound. Its initial propagation of the cyclic model ignores
    #: the time limit (transformer_like(96): 1,156 units x 390 buckets, 56 s for a 10 s limit;
    #: transformer_like(48), 123k variables: 65 s for 60) and it found nothing beyond the warm start
    #: there; the example models have at most 190 units (Inception), so fewer than 50k pairs even with
    #: a bucket per unit.
    overlap_max_pairs: int = 50_000
    #: Barrier mode: the work profile (:func:`..bounds.work_profile`) may take at most this share of
    #: the time limit (and :data:`..bounds.PROFILE_WALL_S`).
    profile_share: float = 0.05
    #: The anchor bound (:func:`..bounds.anchor_bound`): anchors tried, knapsack points each, and the
    #: deterministic time per knapsack (GPT-2: the second anchor's knapsacks ran into the limit, 8 s
    #: for nothing; the first's take 1 s together, all solved).
    anchor_bound_anchors: int = 1
    anchor_bound_points: int = 24
    anchor_point_det_s: float = 0.05

    def __post_init__(self) -> None:
        from ..registry import SOLVERS

        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "max_buckets" and value is None:
                continue
            if f.name == "warm_starts":
                unknown = [n for n in value if n not in SOLVERS or n == "cpsat"] if isinstance(value, tuple) else value
                if not isinstance(value, tuple) or not value or unknown:
                    raise SolverError(f"cpsat option warm_starts must name registered heuristics, got {unknown!r}; "
                                      f"valid: {', '.join(n for n in SOLVERS if n != 'cpsat')}")
                continue
            if f.name == "bounds":
                if not isinstance(value, BoundSettings):
                    raise SolverError(f"cpsat option bounds must be BoundSettings, got {value!r}")
                continue
            if f.name == "search_kick_moves":
                if not (isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int) for v in value)
                        and 1 <= value[0] <= value[1]):
                    raise SolverError(f"cpsat option search_kick_moves must be (least, most) moves, got {value!r}")
                continue
            if f.name == "search_round_shares":
                if not value or not all(_positive(s) and s <= 1 for s in value):
                    raise SolverError(f"cpsat option {f.name} must be shares in (0, 1], got {value!r}")
                continue
            if f.name == "search_deferral_share":  # 0 turns the deferral off
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                    raise SolverError(f"cpsat option {f.name} must be a share in [0, 1), got {value!r}")
                continue
            if f.type == "bool":
                if not isinstance(value, bool):
                    raise SolverError(f"cpsat option {f.name} must be true or false, got {value!r}")
                continue
            if f.type.startswith("int"):
                low = 0 if f.name == "seed" else 1
                high = SEED_MAX if f.name == "seed" else math.inf
                if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                    raise SolverError(f"cpsat option {f.name} must be an integer from {low}"
                                      f"{'' if high == math.inf else f' to {high}'}, got {value!r}")
            elif not _positive(value) or (f.name.endswith("_share") and value > 1):
                limit = " and at most 1" if f.name.endswith("_share") else ""
                raise SolverError(f"cpsat option {f.name} must be a finite number above 0{limit}, got {value!r}")

    @classmethod
    def make(cls, tuning: Mapping[str, Any] | None = None, **options: Any) -> "CpsatOptions":
        """The options with ``tuning`` applied; an unknown tuning name raises :class:`SolverError`."""
        tuning = dict(tuning or {})
        if isinstance(tuning.get("bounds"), Mapping):
            try:
                tuning["bounds"] = BoundSettings(**tuning["bounds"])
            except TypeError as exc:
                raise SolverError(f"cpsat tuning bounds: {exc}") from None
        for name in ("warm_starts", "search_round_shares", "search_kick_moves"):
            if isinstance(tuning.get(name), list):  # JSON has no tuples
                tuning[name] = tuple(tuning[name])
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(tuning) - known) + sorted(set(tuning) & set(options))
        if unknown:
            raise SolverError(f"cpsat has no tuning {', '.join(map(repr, unknown))}; tuning: "
                              f"{', '.join(sorted(known - set(options)))}")
        return cls(**options, **tuning)

    def asked(self) -> dict[str, Any]:
        """The user's options (``max_buckets`` when set) and every tuning that differs from its default
        (for ``SolverInfo.options``)."""
        default = CpsatOptions()
        out = {name: getattr(self, name) for name in USER_OPTIONS}
        if self.max_buckets is None:
            del out["max_buckets"]
        for f in fields(self):
            if f.name not in USER_OPTIONS and getattr(self, f.name) != getattr(default, f.name):
                out[f.name] = getattr(self, f.name)
        return out


def _positive(value: Any) -> bool:
    return (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
            and value > 0)
