"""``cpsat``: the joint optimizer — op order and gradient buckets with OR-Tools CP-SAT.

Read in the order of the OR-Tools samples:

- data: :mod:`.coarse` (ops contracted into chains; time in integer ticks, the
  tick chosen so that the best warm start's iteration is about 1e6 ticks),
  :mod:`.phases` (which ops are fixed, which are free);
- model and constraints: :mod:`.buckets` (the candidate buckets both models
  share), :mod:`.barrier` (one step to the last collective), :mod:`.overlap`
  (one cyclic steady-state period); their constant bounds are in
  :mod:`..bounds`, and :mod:`.relaxation` (overlap, few calls) bisects a
  channel-and-closure relaxation for a stronger bound and a plan;
- hint: :mod:`.warm` (heuristics, the exact contiguous bucketing, the overlap
  bucket search), checked against the model before CP-SAT sees it;
- solve and read back: :mod:`.solve` (two phases, the plan, and
  ``SolverInfo.stats``: what happened);
- settings: :mod:`.config` (:class:`CpsatOptions`), :mod:`.deadline`.

Chunks: none. A chunked bucket is never faster than its chunks cut into
buckets at parameter boundaries (:func:`..common.split_chunks`, a property
test on random plans), so the warm start splits Caramel's chunks and the
models search buckets only.

Scope of the proven bound (``stats["bound_covers"]``): plans with at most
``B`` buckets (``B`` >= the warm start's count + 2, at least 8, at most the
number of units; a chunked plan counts its pieces), and in ``overlap`` mode
the warm start's forward order and buckets that keep each unit whole (there,
splitting a unit can pay: its first part's update runs while the rest is on
the network). The overlap model's constant bounds (window, channel, anchor)
hold for every bucketing.

Time: each heuristic's own search gets 10% of the limit (only Caramel's
chunk trials take long), the overlap bucket search 50% (its two starts in
parallel processes when ``num_workers >= 2``), the barrier work profile at
most 5% (5 s), the overlap relaxation 85% of what is left after the constant
bounds, CP-SAT what is left; every phase gets at most what is left,
so the call ends within the limit plus about 2 s. An overlap model of more
than ``overlap_max_pairs`` (unit, bucket) pairs is not solved (CP-SAT's
first propagation of it overruns the limit): the warm start is returned with
the model's constant bound.
"""

from __future__ import annotations

from .coarse import Coarse, coarsen
from .config import CpsatOptions
from .solve import CpsatProgress, solve_cpsat

__all__ = ["solve_cpsat", "coarsen", "Coarse", "CpsatOptions", "CpsatProgress"]
