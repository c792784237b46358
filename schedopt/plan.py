"""The plan: an op order and gradient buckets, as versioned JSON.

A plan is data. ``buckets`` is in collective order: every rank issues bucket
k's collective (or its chunks, in order) before bucket k+1's. A bucket's
parameters are laid out in its flat buffer in the order listed; with
``chunks = c`` the buffer is cut into c nearly equal slices of whole elements,
and a chunk is issued once every gradient it covers is ready and the previous
chunk was issued (the layout: :mod:`schedopt.layout`).

``execution`` says how the order is run (:mod:`schedopt.problem`): an
``eager`` plan's order is the autograd engine's, which is what eager PyTorch
runs; a ``compiled`` plan's order is free.

Schema history: ``schedopt.plan/1`` had no ``execution``; its orders were
chosen freely, so such a plan loads as ``compiled`` (``Plan.schema`` keeps
what was read). ``schedopt.plan/2`` adds ``execution``.

``ops`` (optional, written since the compiled runtime) gives each op of the
order its kind, phase and the gradients it finishes, so the compiled runtime
can find the plan's ops in the graphs ``torch.compile`` traces without the
training graph file (:mod:`schedopt.runtime.compiled`). Older readers ignore it.

``schedopt.plan/4`` adds ``sharded`` plans: instead of buckets, ``units`` in forward order
(:class:`schedopt.sharding.Unit`: module paths, parameters, ``reshard_after_forward`` and prefetch
distances), ``memory_budget_bytes``, the per-rank peak the plan was made under, and
``async_unshard`` (on gloo, whether FSDP2 issues the all-gathers asynchronously; absent: true). Plans
of schemas 1-3 load unchanged (no units).

Loading a plan never executes code: it is JSON only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from .cluster import Cluster
from .errors import InvalidPlanError, PlanMismatchError, SchedoptError
from .fields import Fields
from .graph import TrainGraph
from .io import read_json, write_json_atomic
from .orders import engine_order
from .problem import EXECUTIONS, MODES, Problem
from .sharding import Unit, check_units, claim

__all__ = [
    "PLAN_SCHEMA",
    "Bucket",
    "PlanOp",
    "ModelRef",
    "SolverInfo",
    "Prediction",
    "Plan",
    "Unit",
    "validate",
]

PLAN_SCHEMA = "schedopt.plan/4"
#: Schemas this schedopt reads: schema 1 predates ``execution`` (it loads as ``compiled``), schemas
#: 1 and 2 predate bucket stages (every bucket is stage 1). A schedopt that reads only 1 and 2
#: refuses a schema-3 plan by name, so an ``osp`` plan never runs as an ``overlap`` one.
READABLE_SCHEMAS = ("schedopt.plan/1", "schedopt.plan/2", "schedopt.plan/3", PLAN_SCHEMA)


@dataclass(frozen=True, slots=True, kw_only=True)
class Bucket:
    """Parameters whose gradients travel in one collective (or ``chunks`` pieces).

    ``stage`` (``osp`` plans): 1, applied before the next step reads it, as in ``overlap``; 2,
    all-reduced in the background, the next step reading it corrected by the local gradient.
    """

    params: tuple[str, ...]
    chunks: int = 1
    stage: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(self.params))

    def to_json(self) -> dict[str, Any]:
        return {"params": list(self.params), "chunks": self.chunks, "stage": self.stage}


@dataclass(frozen=True, slots=True)
class PlanOp:
    """What the compiled runtime needs to know of one op: its kind, phase and the gradients it finishes."""

    kind: str
    phase: str
    grads: tuple[str, ...] = ()

    def to_json(self) -> list[Any]:
        return [self.kind, self.phase, list(self.grads)]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRef:
    """Which model a plan was made for.

    ``params`` lists ``(name, shape, dtype)`` of every trainable parameter in
    ``named_parameters()`` order (what ``params_fingerprint`` hashes), so the
    runtime can name the parameters a live model changed; None in plans
    written before it was recorded.
    """

    name: str
    fingerprint: str
    params_fingerprint: str
    num_params: int
    params: tuple[tuple[str, tuple[int, ...], str], ...] | None = None

    @classmethod
    def of(cls, graph: TrainGraph) -> ModelRef:
        return cls(
            name=graph.name,
            fingerprint=graph.fingerprint,
            params_fingerprint=graph.params_fingerprint,
            num_params=len(graph.params),
            params=tuple((p.name, p.shape, p.dtype) for p in graph.params.values()),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SolverInfo:
    """How a plan was found: what the user asked (``options``) and what happened (``stats``).

    ``bound_s`` is the solver's proven bound, if it has one; ``stats`` holds a solver's own record
    of the run (for ``cpsat``: which result it returned and why, what the bound covers, whether a
    phase timed out or fell back, model sizes).
    """

    name: str
    status: str = "HEURISTIC"
    solve_time_s: float = 0.0
    objective_s: float | None = None
    bound_s: float | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    stats: Mapping[str, Any] = field(default_factory=dict)

    @property
    def gap(self) -> float | None:
        """Relative gap between objective and proven bound, or None without a bound."""
        if self.objective_s is None or self.bound_s is None or self.objective_s <= 0:
            return None
        return max(self.objective_s - self.bound_s, 0.0) / self.objective_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """What the simulator predicts for a plan (seconds per iteration)."""

    iteration_s: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    lower_bound_s: float
    #: sharded plans: the peak per rank of parameter and gradient bytes (None for other modes)
    peak_memory_bytes: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """An op order and gradient buckets (``sharded`` mode: units) for one model, cluster and mode."""

    model: ModelRef
    cluster: Cluster
    mode: str
    order: tuple[str, ...]
    buckets: tuple[Bucket, ...]
    solver: SolverInfo
    predicted: Prediction | None = None
    execution: str = "eager"
    #: per op id of ``order``: kind, phase, gradients (None in plans written before it was recorded)
    ops: Mapping[str, PlanOp] | None = None
    #: sharded plans: the units in forward order, and the per-rank memory budget they were made under
    units: tuple[Unit, ...] = ()
    memory_budget_bytes: int | None = None
    #: sharded plans on gloo: the all-gathers are issued asynchronously (FSDP2's ``_set_unshard_async_op``),
    #: so a prefetched one overlaps compute; False is FSDP2's default, under which each blocks the host
    async_unshard: bool = True
    schema: str = PLAN_SCHEMA  # the schema it was read from; always written as PLAN_SCHEMA

    def __post_init__(self) -> None:
        object.__setattr__(self, "order", tuple(self.order))
        object.__setattr__(self, "buckets", tuple(self.buckets))
        object.__setattr__(self, "units", tuple(self.units))

    @classmethod
    def for_problem(
        cls,
        problem: Problem,
        *,
        order: Sequence[str],
        buckets: Iterable[Bucket | Sequence[str]] = (),
        solver: SolverInfo,
        units: Iterable[Unit] = (),
        async_unshard: bool = True,
    ) -> Plan:
        """Return a plan for ``problem``; plain name lists become one-chunk buckets."""
        return cls(
            units=tuple(units),
            async_unshard=async_unshard,
            memory_budget_bytes=problem.memory_budget_bytes,
            model=ModelRef.of(problem.graph),
            cluster=problem.cluster,
            mode=problem.mode,
            execution=problem.execution,
            order=tuple(order),
            buckets=tuple(b if isinstance(b, Bucket) else Bucket(params=tuple(b)) for b in buckets),
            solver=solver,
            ops={op.id: PlanOp(kind=op.kind, phase=op.phase, grads=tuple(op.grads))
                 for op in problem.graph.ops.values()},
        )

    # ------------------------------------------------------------------ JSON

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "schema": PLAN_SCHEMA,
            "model": {
                "name": self.model.name,
                "fingerprint": self.model.fingerprint,
                "params_fingerprint": self.model.params_fingerprint,
                "num_params": self.model.num_params,
                **({} if self.model.params is None else
                   {"params": [[n, list(shape), dtype] for n, shape, dtype in self.model.params]}),
            },
            "cluster": self.cluster.to_json(),
            "mode": self.mode,
            "execution": self.execution,
            "order": list(self.order),
            "buckets": [b.to_json() for b in self.buckets],
            "solver": {
                "name": self.solver.name,
                "status": self.solver.status,
                "solve_time_s": self.solver.solve_time_s,
                "objective_s": self.solver.objective_s,
                "bound_s": self.solver.bound_s,
                "gap": self.solver.gap,
                "options": dict(self.solver.options),
                "stats": dict(self.solver.stats),
            },
            "predicted": None,
        }
        if self.ops is not None:
            data["ops"] = {op_id: op.to_json() for op_id, op in self.ops.items()}
        if self.mode == "sharded":
            data["units"] = [u.to_json() for u in self.units]
            data["memory_budget_bytes"] = self.memory_budget_bytes
            data["async_unshard"] = self.async_unshard
        if self.predicted is not None:
            p = self.predicted
            data["predicted"] = {
                "iteration_s": p.iteration_s,
                "compute_s": p.compute_s,
                "comm_s": p.comm_s,
                "exposed_comm_s": p.exposed_comm_s,
                "lower_bound_s": p.lower_bound_s,
                **({} if p.peak_memory_bytes is None else {"peak_memory_bytes": p.peak_memory_bytes}),
            }
        return data

    @classmethod
    def from_json(cls, data: Any) -> Plan:
        """Rebuild a plan from :meth:`to_json` output.

        Raises:
            InvalidPlanError: unknown schema version, missing or malformed field.
        """
        root = Fields(data, InvalidPlanError, "plan")
        schema = data.get("schema")
        if isinstance(schema, str) and schema.startswith("schedopt.graph/"):
            raise InvalidPlanError(f"this is a training graph ({schema}), not a plan; make a plan from it with "
                                   "schedopt plan GRAPH -o plan.json")
        if schema not in READABLE_SCHEMAS:
            raise InvalidPlanError(
                f"unsupported plan schema {schema!r}; this schedopt reads {', '.join(map(repr, READABLE_SCHEMAS))}"
            )
        model, solver = root.object("model"), root.object("solver")
        params = _params_of(model)
        cluster = root.object("cluster")
        try:
            parsed_cluster = Cluster.from_json(cluster.data)
        except SchedoptError as exc:
            raise InvalidPlanError(f"plan JSON field cluster: {exc}") from None
        predicted = None
        if root.get("predicted", None) is not None:
            p = root.object("predicted")
            predicted = Prediction(**{k: p.number(k) for k in Prediction.__dataclass_fields__
                                      if k != "peak_memory_bytes"},
                                   peak_memory_bytes=p.number("peak_memory_bytes", None, optional=True))
        ops = _ops_of(root)
        return cls(
            model=ModelRef(name=model.string("name"), fingerprint=model.string("fingerprint"),
                           params_fingerprint=model.string("params_fingerprint"),
                           num_params=model.integer("num_params"), params=None if params is None else tuple(params)),
            cluster=parsed_cluster,
            mode=root.string("mode"),
            execution=root.string("execution") if schema != "schedopt.plan/1" else "compiled",
            schema=str(schema),
            order=root.strings("order"),
            buckets=tuple(Bucket(params=b.strings("params"), chunks=b.get("chunks", 1), stage=b.get("stage", 1))
                          for b in root.items("buckets")),
            solver=SolverInfo(
                name=solver.string("name"), status=solver.string("status", "UNKNOWN"),
                solve_time_s=solver.number("solve_time_s", 0.0),  # type: ignore[arg-type]
                objective_s=solver.number("objective_s", None, optional=True),
                bound_s=solver.number("bound_s", None, optional=True),
                options=solver.mapping("options", None), stats=solver.mapping("stats", None)),
            predicted=predicted,
            ops=ops,
            units=_units_of(root),
            memory_budget_bytes=_budget_of(root),
            async_unshard=_flag_of(root, "async_unshard", True),
        )

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan as JSON (atomically)."""
        write_json_atomic(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        """Read a plan written by :meth:`save` (JSON only; nothing is executed)."""
        return cls.from_json(read_json(path, what="plan", error=InvalidPlanError))

    def problem(self, graph: TrainGraph, cluster: Cluster | None = None, **changes: Any) -> Problem:
        """The problem this plan was made for, on ``graph``: its mode, execution and memory budget (the
        budget a sharded plan's lower bound is within), on ``cluster`` (default: the plan's own).
        ``changes``: other :class:`~schedopt.problem.Problem` fields (``rank_model=...``, ``mode=...``)."""
        mode = changes.pop("mode", self.mode)
        budget = self.memory_budget_bytes if mode == "sharded" else None  # a budget is a sharded problem's
        fields = {"execution": self.execution, "memory_budget_bytes": budget, **changes}
        return Problem(graph=graph, cluster=cluster or self.cluster, mode=mode, **fields)

    def with_prediction(self, predicted: Prediction) -> Plan:
        return replace(self, predicted=predicted)


def _params_of(model: Fields) -> list[tuple[str, tuple[int, ...], str]] | None:
    """The plan's ``model.params`` (``[name, shape, dtype]`` each), or None where it has none."""
    if model.get("params", None) is None:
        return None
    params = []
    for k, entry in enumerate(model.array("params")):
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
                and isinstance(entry[1], list) and isinstance(entry[2], str)
                and all(isinstance(d, int) and not isinstance(d, bool) for d in entry[1])):
            raise model.fail(f"params[{k}]", "[name, shape, dtype]", entry)
        params.append((entry[0], tuple(entry[1]), entry[2]))
    return params


def _units_of(root: Fields) -> tuple[Unit, ...]:
    """The plan's ``units`` (a sharded plan's), or none."""
    if root.get("units", None) is None:
        return ()
    units = []
    for u in root.items("units"):
        flags = {k: u.get(k, default) for k, default in (("reshard_after_forward", True), ("prefetch_forward", 0),
                                                          ("prefetch_backward", 1))}
        units.append(Unit(modules=u.strings("modules"), params=u.strings("params"), **flags))
    return tuple(units)


def _flag_of(root: Fields, key: str, default: bool) -> bool:
    value = root.get(key, default)
    if not isinstance(value, bool):
        raise root.fail(key, "true or false", value)
    return value


def _budget_of(root: Fields) -> int | None:
    budget = root.get("memory_budget_bytes", None)
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0):
        raise root.fail("memory_budget_bytes", "a positive whole number of bytes", budget)
    return budget


def _ops_of(root: Fields) -> dict[str, PlanOp] | None:
    """The plan's ``ops`` (``[kind, phase, [gradient, ...]]`` each), or None where it has none."""
    if root.get("ops", None) is None:
        return None
    ops = {}
    for op_id, entry in root.mapping("ops").items():
        if not (isinstance(entry, list) and len(entry) == 3 and all(isinstance(x, str) for x in entry[:2])
                and isinstance(entry[2], list) and all(isinstance(g, str) for g in entry[2])):
            raise root.fail(f"ops.{op_id}", "[kind, phase, [gradient, ...]]", entry)
        ops[op_id] = PlanOp(kind=entry[0], phase=entry[1], grads=tuple(entry[2]))
    return ops


def validate(plan: Plan, graph: TrainGraph) -> None:
    """Check that ``plan`` applies to ``graph``.

    1. The plan was made for this graph (fingerprint), in a known mode and
       execution.
    2. The order runs every op exactly once and respects every dependency;
       an ``eager`` plan's order is the engine's (:func:`schedopt.orders.engine_order`).
    3. Every parameter is in exactly one bucket; buckets are non-empty, hold
       one dtype, and have between 1 and (bucket elements) chunks; a bucket's
       stage is 1, or 2 in an ``osp`` plan.
       A ``sharded`` plan has units instead (:func:`schedopt.sharding.check_units`: each one
       something ``fully_shard`` can express, every parameter in one), and its simulated peak
       memory per rank is within its ``memory_budget_bytes``.

    Raises:
        PlanMismatchError: the fingerprints differ.
        InvalidPlanError: naming the first other problem found.
    """
    _check_identity(plan, graph)
    _check_order(plan, graph)
    if plan.mode == "sharded":
        _check_sharded(plan, graph)
        return
    if plan.units:
        raise InvalidPlanError(f"a {plan.mode} plan has buckets, not units; units belong to sharded plans")
    _check_buckets(plan, graph)


def _check_sharded(plan: Plan, graph: TrainGraph) -> None:
    """Step 3 of :func:`validate` for a sharded plan: its units, then its peak memory against its budget."""
    if plan.buckets:
        raise InvalidPlanError("a sharded plan has units, not buckets")
    check_units(graph, plan.order, plan.units)
    if plan.memory_budget_bytes is not None:
        from .shard_sim import peak_memory  # the simulator imports this module
        from .units import format_size

        peak, when, what = peak_memory(graph, plan)
        if peak > plan.memory_budget_bytes:
            raise InvalidPlanError(f"the plan peaks at {format_size(peak)} per rank ({what}, at "
                                   f"{when * 1e3:.3f} ms), over its memory budget of "
                                   f"{format_size(plan.memory_budget_bytes)}")


def _check_identity(plan: Plan, graph: TrainGraph) -> None:
    """Step 1 of :func:`validate`: the plan's model, mode and execution."""
    if plan.model.fingerprint != graph.fingerprint:
        raise PlanMismatchError(
            f"plan was made for model {plan.model.name!r} ({plan.model.fingerprint[:19]}...), "
            f"but the graph is {graph.name!r} ({graph.fingerprint[:19]}...)"
        )
    if plan.mode not in MODES:
        raise InvalidPlanError(f"plan has unknown mode {plan.mode!r}; valid: {', '.join(MODES)}")
    if plan.execution not in EXECUTIONS:
        raise InvalidPlanError(f"plan has unknown execution {plan.execution!r}; valid: {', '.join(EXECUTIONS)}")


def _check_order(plan: Plan, graph: TrainGraph) -> None:
    """Step 2 of :func:`validate`: every op once, dependencies kept, an eager plan in the engine's order."""
    position: dict[str, int] = {}
    for i, op_id in enumerate(plan.order):
        if op_id not in graph.ops:
            raise InvalidPlanError(f"order names unknown op {op_id!r}")
        if op_id in position:
            raise InvalidPlanError(f"order runs op {op_id!r} twice (positions {position[op_id]} and {i})")
        position[op_id] = i
    missing = [op_id for op_id in graph.ops if op_id not in position]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise InvalidPlanError(f"order lacks op(s) {', '.join(map(repr, missing[:3]))}{more}")
    for before, after in graph.dag.edges:
        if position[before] > position[after]:
            raise InvalidPlanError(
                f"order breaks a dependency: {after!r} (position {position[after]}) runs before "
                f"{before!r} (position {position[before]}), which it depends on"
            )
    if plan.execution == "eager":
        engine = engine_order(graph)
        if list(plan.order) != engine:
            k = next(i for i, (a, b) in enumerate(zip(plan.order, engine)) if a != b)
            raise InvalidPlanError(
                f"an eager plan must keep the autograd engine's order, but position {k} runs "
                f"{plan.order[k]!r} where the engine runs {engine[k]!r} (plan with --execution compiled "
                "to reorder)"
            )


def _check_buckets(plan: Plan, graph: TrainGraph) -> None:
    """Step 3 of :func:`validate`: every parameter in one bucket of one dtype, chunks and stages in range."""
    home: dict[str, int] = {}
    for k, bucket in enumerate(plan.buckets):
        if not bucket.params:
            raise InvalidPlanError(f"bucket {k} is empty")
        dtypes = set()
        for name in bucket.params:
            claim(home, name, k, group="bucket", known=graph.params)
            dtypes.add(graph.params[name].dtype)
        if len(dtypes) > 1:
            raise InvalidPlanError(f"bucket {k} mixes dtypes {sorted(dtypes)}; a flat buffer holds one dtype")
        numel = sum(graph.params[name].numel for name in bucket.params)
        if not isinstance(bucket.chunks, int) or isinstance(bucket.chunks, bool) or not 1 <= bucket.chunks <= max(numel, 1):
            raise InvalidPlanError(
                f"bucket {k} has chunks = {bucket.chunks!r}; expected an integer from 1 to {max(numel, 1)}"
            )
        if bucket.stage not in ((1, 2) if plan.mode == "osp" else (1,)):
            raise InvalidPlanError(f"bucket {k} has stage = {bucket.stage!r}; expected 1"
                                   + (" or 2" if plan.mode == "osp" else f" (stage 2 needs an osp plan, not {plan.mode})"))
    unbucketed = [name for name in graph.params if name not in home]
    if unbucketed:
        more = f" and {len(unbucketed) - 3} more" if len(unbucketed) > 3 else ""
        raise InvalidPlanError(f"parameter(s) {', '.join(map(repr, unbucketed[:3]))}{more} are in no bucket")
