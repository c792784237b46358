"""Write ``docs/results.md`` and the README's results table from the committed ``bench/results/``.

Every figure in those two places comes from here, so none is typed by hand:

1. each committed result is read (``bench/results/*.json``; a testbed run's
   period comes from its kept steps, ``runs/NAME.json.gz``, the way
   ``bench/testbed.py --recompute`` computes it);
2. ``docs/results.md`` gets one section per benchmark, every case a row;
3. the README gets the headline figures (:data:`HEADLINES`) between the lines
   :data:`BEGIN` and :data:`END`.

``python bench/report.py`` writes both; ``--check`` writes nothing and exits 1
when either differs from what it would write (a test runs it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from schedopt.units import format_bandwidth

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kept import SUFFIX, read_kept  # noqa: E402
from solver_quality import CASES as SOLVER_QUALITY_CASES  # noqa: E402
from stragglers import best_over_bound, build_parser as stragglers_parser, label as spread_label  # noqa: E402
from testbed import kept_runs, periods_of, rate_Bps, round_ratio  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "results.md"
README = ROOT / "README.md"
BEGIN = "<!-- results: written by bench/report.py from bench/results/; do not edit -->"
END = "<!-- results: end -->"
HEURISTICS = ("pytorch-ddp", "horovod", "mgwfbp", "tictac", "bytescheduler", "caramel")


def load(name: str) -> Any:
    return json.loads((RESULTS / name).read_text())


def rows_of(data: Any) -> list[dict]:
    """The rows of a result (results written before ``bench/provenance.py`` are a bare list)."""
    return data["rows"] if isinstance(data, dict) else data


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


# ----------------------------------------------------------------------------- the testbed


@dataclass(frozen=True)
class TestbedRow:
    mode: str
    solver: str
    period_s: float  # the median over rounds of the slower rank's mean step
    predicted_s: float
    speedup_vs: dict[str, float]  # per other mode: the median over rounds of its period over this one's
    by_period: bool  # False: an old result without kept steps (the slower rank's median step)
    baseline: str = "ddp"  # what the speedup is over: DDP, or FSDP2 per block for sharded runs
    peaks: tuple[float, float] | None = None  # sharded: (measured, predicted) peak bytes per rank
    rate: str = ""  # the link's tc rate (``550mbit``)

    @property
    def speedup(self) -> float:
        return self.speedup_vs[self.baseline]

    @property
    def error(self) -> float:
        return (self.predicted_s - self.period_s) / self.period_s


def testbed_rows(name: str) -> list[TestbedRow]:
    """One row per mode of ``bench/results/NAME.json``, measured by period where its steps are kept."""
    rows = rows_of(load(f"{name}.json"))
    kept = RESULTS / "runs" / f"{name}{SUFFIX}"
    periods = periods_of(kept_runs(read_kept(kept))) if kept.is_file() else {}
    base = "ddp" if any(r["mode"] == "ddp" for r in rows) else "fsdp"
    out = []
    for r in rows:
        mode = r["mode"]
        peaks = (r["measured_peak_bytes"], r["predicted_peak_bytes"]) if r.get("measured_peak_bytes") else None
        if mode in periods and base in periods:
            vs = {other: round_ratio(periods[other], periods[mode]) for other in periods}
            out.append(TestbedRow(mode, r["solver"], statistics.median(periods[mode]), r["predicted_s"], vs, True,
                                  base, peaks, r["rate"]))
        else:
            measured = r.get("measured_s", r.get("measured_median_s"))
            vs = {base: r[f"speedup_vs_{base}"], **r.get("speedup_vs", {})}
            out.append(TestbedRow(mode, r["solver"], measured, r["predicted_s"], vs, False, base, peaks, r["rate"]))
    return out


def testbed_names() -> list[str]:
    """The testbed results (rows, or a bare list of them); not a single run's record kept beside them."""
    return sorted(p.stem for p in RESULTS.glob("testbed_*.json")
                  if isinstance(data := json.loads(p.read_text()), list) or "rows" in data)


def testbed_section() -> list[str]:
    lines = ["## The testbed: two ranks on a rate-capped link", "",
             "`sudo python bench/testbed.py --model M --rate R --modes ... --json bench/results/NAME.json`"
             " (method: `docs/testbed.md`). ms per step is the run's period, the median over rounds of the"
             " slower rank's mean step; the speedup is the median over rounds of DDP's period over the"
             " mode's; the error is the simulator's prediction against the period. Rows marked * predate"
             " the kept steps: their figure is the slower rank's median step.", ""]
    for name in testbed_names():
        first = rows_of(load(f"{name}.json"))[0]
        model = first["model"].rpartition(":")[2]
        lines += [f"### {name}", "", f"{model} at {first['rate']}.", ""]
        rows = testbed_rows(name)
        sharded = rows[0].baseline == "fsdp"
        lines += table(["mode", "plan", "ms/step", "predicted", "error", "vs FSDP2 per block" if sharded else "vs DDP",
                        *(["peak MiB measured / predicted"] if sharded else [])], [
            [r.mode, r.solver, ms(r.period_s) + ("" if r.by_period else "*"), ms(r.predicted_s),
             f"{r.error:+.1%}", f"{r.speedup:.3f}x",
             *([f"{r.peaks[0] / 2**20:.1f} / {r.peaks[1] / 2**20:.1f}"] if sharded else [])] for r in rows])
        if (limit := host_limit(name, rows)) is not None:
            lines += ["", f"Bounds: max(compute, comm) {ms(limit['bound_s'])} ms; with the calibrated interference "
                      f"{ms(limit['host_bound_s'])} ms. The fastest mode, {limit['mode']}, "
                      f"{limit['over_bound']:.3f}x the first, {limit['over_host']:.3f}x the second."]
        lines.append("")
    return lines


def host_limit(name: str, rows: list[TestbedRow] | None = None) -> dict | None:
    """The fastest mode of a testbed result (``rows``: its :func:`testbed_rows`, if read already) against
    its two bounds (``bound_s``: ``max(compute, comm)``; ``host_bound_s``: with the calibrated
    interference), where the result has the second."""
    bounds = [r for r in rows_of(load(f"{name}.json")) if r.get("host_bound_s")]
    if not bounds:
        return None
    fastest = min(rows or testbed_rows(name), key=lambda r: r.period_s)
    bound, host = bounds[0]["bound_s"], bounds[0]["host_bound_s"]
    return {"mode": fastest.mode, "period_s": fastest.period_s, "bound_s": bound, "host_bound_s": host,
            "over_bound": fastest.period_s / bound, "over_host": fastest.period_s / host}


# ----------------------------------------------------------------------------- simulated


def solver_quality_section(name: str = "solver_quality.json",
                           title: str = "Solvers on simulated clusters") -> list[str]:
    data = load(name)
    rows, args = data["rows"], data["arguments"]
    narrowed = "".join(f" --{k.replace('_', '-')} {args[k]}" for k, v in SOLVER_QUALITY_CASES.items()
                       if args.get(k, v) != v)
    lines = [f"## {title}", "",
             f"`python bench/solver_quality.py --time-limit {args['time_limit']:g} --seed {args['seed']}"
             f"{narrowed} --execution {args['execution']}` (A100 op costs, {args['workers']} CP-SAT workers): every"
             " heuristic and `cpsat` on each model, world size, network and mode; ms per iteration (overlap:"
             " the steady-state period), cpsat's proven gap to its bound.", ""]
    body = []
    for r in rows:
        best = min(HEURISTICS, key=lambda h: r[f"{h}_s"])
        body.append([r["model"], str(r["world_size"]), r["network"], r["mode"], ms(r["pytorch-ddp_s"]),
                     f"{ms(r[f'{best}_s'])} ({best})", ms(r["cpsat_s"]), r["cpsat_status"], f"{r['cpsat_gap']:.2%}",
                     "yes" if r["no_slower_than_best"] else "**no**"])
    lines += table(["model", "ranks", "network", "mode", "DDP", "best heuristic", "cpsat", "status", "gap",
                    "cpsat no slower"], body)
    return lines + [""]


def solver_quality_summary() -> dict[str, Any]:
    rows = load("solver_quality.json")["rows"]
    by_mode = {m: [r for r in rows if r["mode"] == m] for m in ("barrier", "overlap")}
    return {"cases": len(rows), "no_slower": sum(r["no_slower_than_best"] for r in rows),
            "gap": {m: max(r["cpsat_gap"] for r in rs) for m, rs in by_mode.items()},
            "optimal": {m: sum(r["cpsat_status"] == "OPTIMAL" for r in rs) for m, rs in by_mode.items()},
            "per_mode": {m: len(rs) for m, rs in by_mode.items()}}


def sharded_section(name: str = "sharded.json") -> list[str]:
    data = load(name)
    rows, args = data["rows"], data["arguments"]
    hsdp = args.get("replicas", 1) > 1
    flags = "".join(f" --{k.replace('_', '-')} {args[k]}" for k in ("models", "world_sizes", "networks", "fractions",
                                                                     "replicas", "shard_network")
                    if hsdp and args.get(k) is not None)
    lines = [("## HSDP: the same, as replicas" if hsdp else "## Sharded plans (FSDP2 units) on simulated clusters"), "",
             f"`python bench/sharded.py --time-limit {args['time_limit']:g} --seed {args['seed']}{flags}` (A100 op costs):"
             " each sharded solver's step (ms) and peak memory per rank, under a budget of 100% or 60% of"
             " `fsdp-per-block`'s peak or none (every unit may stay unsharded); `over` where a solver has no plan within the budget (its one line is in"
             " the JSON); cpsat's proven bound (the simulator's sharded lower bound, valid for every plan within"
             " the budget), its speedup over `fsdp-per-block`, and the most any plan could gain over"
             " `fsdp-per-block` at no more memory: its step over the bound within the budget and its own peak"
             " (`-` where no plan fits).", ""]
    names = ("fsdp-root", "fsdp-per-block", "fsdp-size", "cpsat")

    def cell(r: dict, name: str) -> str:
        t = r[f"{name}_s"]
        return "over" if t is None else f"{ms(t)} / {r[f'{name}_peak_bytes'] / 2**20:.0f} MiB"

    body = [[r["model"], str(r["world_size"]), r["network"],
             "none" if r["budget_fraction"] is None else f"{r['budget_fraction']:.0%}",
             *(cell(r, n) for n in names), ms(r["cpsat_bound_s"]) if r.get("cpsat_bound_s") else "-",
             f"{r['speedup_vs_per_block']:.3f}x" if r["speedup_vs_per_block"] else "-",
             f"{r['most_speedup_at_no_more_memory']:.3f}x" if r["most_speedup_at_no_more_memory"] else "-"]
            for r in rows]
    lines += table(["model", "ranks", "network", "budget", *names, "bound", "cpsat / per-block",
                    "most at no more memory"], body)
    below = [r for r in rows if r.get("memory_floor_bytes") and r["memory_budget_bytes"] is not None
             and r["memory_budget_bytes"] < r["memory_floor_bytes"]]
    if below:
        lines += ["", f"Budgets below the least peak any plan can hold (`schedopt.shard_sim.memory_floor`): {len(below)} of"
                  f" {len(rows)}, so no plan exists there: " + "; ".join(
                      f"{r['model']} {r['world_size']} x {r['network']} at {r['budget_fraction']:.0%}, "
                      f"{r['memory_budget_bytes'] / 2**20:.0f} < {r['memory_floor_bytes'] / 2**20:.0f} MiB" for r in below)
                  + "."]
    if hsdp:
        return lines + [""] + _hsdp_against_fsdp(rows)
    return lines + ["", "![step against budget](../bench/results/sharded.png) (`--plot`)", ""]


def hsdp_section() -> list[str]:
    return sharded_section("sharded_hsdp.json") if (RESULTS / "sharded_hsdp.json").exists() else []


def _hsdp_against_fsdp(rows: list[dict]) -> list[str]:
    """One line per case with no budget: cpsat's HSDP step and peak against its FSDP one (``sharded.json``)."""
    fsdp = {(r["model"], r["world_size"], r["network"]): r for r in load("sharded.json")["rows"]
            if r["budget_fraction"] is None}
    pairs = [(r, fsdp.get((r["model"], r["world_size"], r["network"]))) for r in rows if r["budget_fraction"] is None]
    return ["With no budget, cpsat as HSDP against cpsat as FSDP over every rank (`sharded.json`): " + "; ".join(
        f"{r['model']} {r['world_size']} x {r['network']} {ms(r['cpsat_s'])} against {ms(f['cpsat_s'])} ms "
        f"({f['cpsat_s'] / r['cpsat_s']:.3f}x) at {r['cpsat_peak_bytes'] / 2**20:.0f} against "
        f"{f['cpsat_peak_bytes'] / 2**20:.0f} MiB" for r, f in pairs if f and r["cpsat_s"] and f["cpsat_s"]) + ".", ""]


def sharded_summary() -> dict[str, Any]:
    rows = load("sharded.json")["rows"]
    planned = [r for r in rows if r["speedup_vs_per_block"]]
    same_memory = [r for r in planned if r["cpsat_peak_bytes"] <= r["fsdp-per-block_peak_bytes"]]
    barrier = [r for r in rows if r["barrier_like"]]
    return {"cases": len(rows), "planned": len(planned), "fast": sum(r["speedup_vs_per_block"] >= 1.15 for r in same_memory),
            "best_same": max((r["speedup_vs_per_block"] for r in same_memory), default=1.0),
            "best": max((r["speedup_vs_per_block"] for r in planned), default=1.0),
            "no_slower": all(r["no_slower_than_best"] for r in rows),
            "possible": sum((r["most_speedup_at_no_more_memory"] or 0) >= 1.15 for r in rows),
            "infeasible": sum(1 for r in rows if r["memory_budget_bytes"] is not None
                              and r["memory_budget_bytes"] < r.get("memory_floor_bytes", 0)),
            "unplanned": sum(r["cpsat_s"] is None for r in rows), "barrier_like": len(barrier),
            "barrier_gap": max((r["cpsat_gap"] for r in barrier), default=0.0),
            "barrier_within_2": sum(r["cpsat_gap"] <= 0.02 for r in barrier)}


def execution_section() -> list[str]:
    rows = load("execution_value.json")["rows"]
    lines = ["## What a free op order is worth", "",
             "`python bench/execution_value.py --json bench/results/execution_value.json`: the best predicted"
             " iteration with the autograd engine's order kept (`eager`, what `wrap` runs) and free"
             " (`compiled`, what the compiled runtime runs); ratio = eager / compiled.", ""]
    lines += table(["model", "ranks", "network", "mode", "DDP", "eager (solver)", "compiled (solver)", "ratio"], [
        [r["model"], str(r["world_size"]), r["network"], r["mode"], ms(r["ddp_s"]),
         f"{ms(r['eager_s'])} ({r['eager_solver']})", f"{ms(r['compiled_s'])} ({r['compiled_solver']})",
         f"{r['ratio']:.3f}"] for r in rows])
    return lines + [""]


def steady_state_section() -> list[str]:
    rows = load("steady_state.json")["rows"]
    lines = ["## The steady-state engine's speed", "",
             "`python bench/steady_state.py --json bench/results/steady_state.json`: one overlap-mode period"
             " by the overlap search's fast path, by `simulate`, and as cpsat's hint check.", ""]
    lines += table(["graph", "ops", "units", "search period ms", "simulate ms", "cpsat hint ms"], [
        [r["graph"], str(r["ops"]), str(r["units"]), f"{r['search_period_ms']:.3f}", f"{r['simulate_ms']:.1f}",
         f"{r['cpsat_hint_ms']:.1f}"] for r in rows])
    return lines + [""]


# ----------------------------------------------------------------------------- measured on real ranks


def accuracy_section() -> list[str]:
    rows = load("osp_accuracy.json")
    ddp = {r["task"]: r["value"] for r in rows if r["mode"] == "ddp"}
    lines = ["## OSP's accuracy", "",
             "`python bench/osp_accuracy.py --json bench/results/osp_accuracy.json --png"
             " bench/results/osp_accuracy.png`: two gloo ranks, the same seeds and data for every mode;"
             " digits is scikit-learn's digits with a small CNN (test accuracy), text is `gpt_tied` on the"
             " standard library's Python sources (validation loss).", ""]
    body = []
    for r in rows:
        delta = (f"{(r['value'] - ddp[r['task']]) * 100:+.2f} pt" if r["metric"] == "test_accuracy"
                 else f"{(r['value'] - ddp[r['task']]) / ddp[r['task']]:+.2%}")
        value = f"{r['value']:.2%}" if r["metric"] == "test_accuracy" else f"{r['value']:.4f}"
        body.append([r["task"], r["mode"], r["metric"], value, delta, ", ".join(r["stage2"]) or "-",
                     f"{r['stale_fraction']:.0%}"])
    lines += table(["task", "mode", "metric", "value", "vs DDP", "stage 2", "stale bytes"], body)
    return lines + ["", "![curves](../bench/results/osp_accuracy.png)", ""]


def overhead_section() -> list[str]:
    rows = load("runtime_overhead.json")
    lines = ["## The runtime's overhead", "",
             "`python bench/runtime_overhead.py --startup none`: two gloo ranks on localhost (no rate cap),"
             " DDP and `wrap` with DDP's buckets in barrier and overlap mode, steps interleaved; medians.", ""]
    lines += table(["model", "DDP ms", "barrier ms", "overlap ms", "barrier / DDP", "overlap / barrier"], [
        [r["model"], ms(r["ddp_median_s"]), ms(r["schedopt_median_s"]), ms(r["overlap_median_s"]),
         f"{r['ratio']:.3f}", f"{r['overlap_over_barrier']:.3f}"] for r in rows])
    return lines + [""]


def diagnose_section() -> list[str]:
    rows = load("diagnose.json")["rows"]
    lines = ["## Diagnosing traced runs", "",
             "`sudo .venv/bin/python bench/diagnose.py --json bench/results/diagnose.json`: per model, two ranks on"
             " the testbed at its balanced rate; a profiled DDP run, `schedopt import --trace` and `schedopt"
             " diagnose --model` on its traces, a cpsat overlap plan on the trace-built graph, its profiled run,"
             " then 3 interleaved unprofiled rounds of each. Exposure: diagnose's exposed communication against"
             " what `train.py` measured itself (the backward's tail, the forward's waits), the worst step as a"
             " share of its step; the predictions run on the rank model fitted to the traces.", ""]
    lines += table(["model", "rate", "exposure (worst)", "DDP predicted ms", "DDP traced ms", "error", "rank model",
                    "gain predicted", "gain measured", "error"], [
        [r["model"].rpartition(":")[2], r["rate"], f"{r['exposure_worst_of_step']:.1%}", ms(r["predicted_ddp_s"]),
         ms(r["traced_ddp_s"]), f"{r['ddp_step_error']:+.1%}",
         f"{r['rank_model']['ranks']} ranks, {r['rank_model']['op_spread']:.0%} op, {r['rank_model']['step_spread']:.0%} step",
         f"{r['predicted_gain']:.3f}", f"{r['measured_gain']:.3f}", f"{r['gain_error']:+.1%}"] for r in rows])
    waits = [(r["model"].rpartition(":")[2], c) for r in rows for c in r.get("collective_waits", [])]
    if waits:
        ranks = sorted({k for _, c in waits for k in c if k.startswith("rank")})
        lines += ["", "DDP's all-reduces in issue order (ms from the step's start; medians over the traced steps):"
                  " issued, waiting in the queue, and on the wire, simulated (one rank) and as each rank traced"
                  " them. A rank's time on the wire includes waiting for the other rank to issue.", ""]
        lines += table(["model", "all-reduce", "MiB"] + [f"{who} issue / wait / wire" for who in ["simulated", *ranks]], [
            [model, str(c["collective"]), f"{c['bytes'] / 2 ** 20:.1f}"]
            + [" / ".join(f"{c[who][k] * 1e3:.0f}" for k in ("issue_s", "wait_s", "wire_s")) if who in c else "-"
               for who in ["simulated", *ranks]] for model, c in waits])
    return lines + [""]


def stragglers_section(name: str = "stragglers.json") -> list[str]:
    data = load(name)
    rows, spreads = data["rows"], data["rows"][0]["spreads"]
    sharded = any(r.get("baseline", "pytorch-ddp") != "pytorch-ddp" for r in rows)
    png = name.replace(".json", ".png")
    command = (f"`python bench/stragglers.py {''.join(_stragglers_args(data))}--json bench/results/{name} --plot "
               f"bench/results/{png}`")
    args = data.get("arguments", {})
    intro = (" each sharded solver's plan (made on one rank; no memory budget, or with `-peak` within FSDP2 per"
             " block's peak per rank) and FSDP2 per block's on the rank model; `hsdp` shards over one node's"
             f" {args.get('gpus_per_node')} ranks ({args.get('shard_network')}) and replicates across nodes"
             if sharded else
             " each solver's plan (made on one rank) and DDP's on the rank model (`schedopt.ranks`)")
    baseline = "FSDP2 per block" if sharded else "DDP"
    lines = ["## Stragglers: every rank" + (", sharded" if sharded else ""), "",
             f"{command}:{intro}, every op varying per rank and step (op), and each rank's whole step (step); the"
             f" speedup over {baseline} on one rank and at each spread, and its change. Per solver, the median change"
             " over the models:", ""]
    solvers = sorted({r["solver"] for r in rows if r["solver"] != r.get("baseline", "pytorch-ddp")})
    cases = sorted({(r["world_size"], r["mode"]) for r in rows})

    head = ["solver"] + [f"{n} ranks {mode}, {spread_label(s)}" for n, mode in cases for s in spreads]

    def change(solver: str, case: tuple, i: int) -> str:
        mine = [r["change"][i] for r in rows if r["solver"] == solver and (r["world_size"], r["mode"]) == case]
        return f"{statistics.median(mine):+.1%}" if mine else "-"

    body = [[solver] + [change(solver, case, i) for case in cases for i in range(len(spreads))] for solver in solvers]
    lines += table(head, body)
    lines += _bound_table(rows, spreads)
    lines += ["", "Every case:", ""]
    lines += table(["model", "ranks", "mode", "solver", "1 rank"] + [spread_label(s) for s in spreads], [
        [r["model"], str(r["world_size"]), r["mode"], r["solver"]] + [f"{x:.3f}x" for x in r["speedup"]]
        for r in rows if r["solver"] != r.get("baseline", "pytorch-ddp")])
    if sharded:
        lines += ["", "The step itself, the baseline's and cpsat's: one rank's, and how much longer at each spread. A"
                  " step that hides its compute behind the wire hides the stragglers too; one that computes most of"
                  " the time (HSDP inside NVLink, cpsat's) waits for the slowest rank at each all-reduce:", ""]
        lines += table(["model", "ranks", "mode", "solver", "1 rank"] + [spread_label(s) for s in spreads], [
            [r["model"], str(r["world_size"]), r["mode"], r["solver"], ms(r["periods_s"][0]) + " ms"]
            + [f"{p / r['periods_s'][0] - 1:+.1%}" for p in r["periods_s"][1:]]
            for r in rows if r["solver"] in (r["baseline"], "cpsat")])
    return lines + ["", f"![speedups](../bench/results/{png})", ""]


def _bound_table(rows: list[dict], spreads: list) -> list[str]:
    """How far each case's best plan is from the lower bound on the ranks (rows that record it)."""
    cases = list(dict.fromkeys((r["model"], r["world_size"], r["mode"]) for r in rows if "bounds_s" in r))
    if not cases:
        return []
    lines = ["", "The best plan of each case (any solver's) over the lower bound: on one rank the simulator's, on"
             " the ranks the larger of it and the slowest rank's (`schedopt/rank_bound.py`: what stragglers cost"
             " every plan). What is left at the wider spreads is the plans' own loss to stragglers, or the bound's"
             " slack:", ""]
    return lines + table(["model", "ranks", "mode", "1 rank"] + [spread_label(s) for s in spreads], [
        [model, str(n), mode] + [f"{best_over_bound(rows, (model, n, mode), i):.3f}x" for i in range(len(spreads) + 1)]
        for model, n, mode in cases])


def _stragglers_args(data: dict) -> list[str]:
    """The arguments of the committed run that differ from the bench's defaults, each with a trailing space."""
    args, defaults = data.get("arguments", {}), vars(stragglers_parser().parse_args([]))
    return [f"--{k.replace('_', '-')} {args[k]} " for k in ("models", "world_sizes", "modes")
            if args.get(k, defaults[k]) != defaults[k]]


def stragglers_sharded_section() -> list[str]:
    return stragglers_section("stragglers_sharded.json") if (RESULTS / "stragglers_sharded.json").exists() else []


def diagnose_summary() -> dict[str, float]:
    rows = load("diagnose.json")["rows"]
    return {"exposure": max(r["exposure_worst_of_step"] for r in rows),
            "step": max(abs(r["ddp_step_error"]) for r in rows), "gain": max(abs(r["gain_error"]) for r in rows),
            "models": ", ".join(r["model"].rpartition(":")[2] for r in rows)}


def eager_solver_quality_section() -> list[str]:
    return solver_quality_section("solver_quality_eager_100gbe.json",
                                  "The transformers in eager overlap mode (the engine's op order kept)")


SECTIONS: tuple[Callable[[], list[str]], ...] = (
    solver_quality_section, eager_solver_quality_section, sharded_section, hsdp_section, execution_section,
    stragglers_section, stragglers_sharded_section, testbed_section,
    diagnose_section, accuracy_section, overhead_section, steady_state_section)


def render_results() -> str:
    lines = ["# Results", "", "Written by `python bench/report.py` from the committed `bench/results/`; every"
             " command that made a result is named beside it. Do not edit: rerun the command, then the report.",
             ""]
    for section in SECTIONS:
        lines += section()
    return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------------- the README's headline table


def _row(name: str, mode: str) -> TestbedRow:
    return next(r for r in testbed_rows(name) if r.mode == mode)


def _testbed_headline(what: str, name: str, mode: str, against: str | None = None) -> list[str]:
    """A headline row; ``{rate}`` in ``what`` becomes the result's own link rate."""
    row = _row(name, mode)
    what = what.format(rate=format_bandwidth(rate_Bps(row.rate)))
    names = {None: "DDP", "fsdp": "FSDP2 per block"}
    return [what, f"{row.speedup_vs[against or 'ddp']:.3f}x {names.get(against, against)}, predicted {row.error:+.1%}",
            f"`{name}`"]


def _limit_headline(*runs: tuple[str, str]) -> list[str]:
    """A headline row: each run's fastest mode against ``max(compute, comm)`` and the bound with interference."""
    limits = [(model, host_limit(name)) for model, name in runs]
    return ["the fastest mode against the bounds, same runs (measured; the simulator's bound with interference "
            "counts compute slowed beside the wire, as calibrated)",
            "; ".join(f"{model} {lim['mode']} {lim['over_bound']:.3f}x max(compute, comm), {lim['over_host']:.3f}x "
                      f"the bound with interference" for model, lim in limits),
            ", ".join(f"`{name}`" for _, name in runs)]


def headline_rows() -> list[list[str]]:
    q = solver_quality_summary()
    sh = sharded_summary()
    ev = load("execution_value.json")["rows"]
    ratios = [r["ratio"] for r in ev]
    acc = {(r["task"], r["mode"]): r["value"] for r in load("osp_accuracy.json")}
    overhead = {r["model"]: r for r in load("runtime_overhead.json")}
    d = diagnose_summary()
    return [
        ["cpsat against the best heuristic (simulated, 5 models x 8/64 ranks x 10/100 GbE x 2 modes)",
         f"no slower in {q['no_slower']} of {q['cases']}; proven gap at most {q['gap']['barrier']:.2%} barrier "
         f"({q['optimal']['barrier']} of {q['per_mode']['barrier']} optimal), {q['gap']['overlap']:.2%} overlap",
         "`solver_quality.json`"],
        ["cpsat's sharded plans against torchtitan's FSDP2 layout (simulated, 3 models x 8/64 ranks x 100 GbE/"
         "ib-hdr x budgets of 100%, 60% of its peak and none)",
         f"never slower than the best baseline: {'yes' if sh['no_slower'] else 'no'}; at no more memory up to "
         f"{sh['best_same']:.3f}x fsdp-per-block (1.15x in {sh['fast']} of {sh['cases']}; the lower bound at its"
         f" memory leaves room for 1.15x in {sh['possible']}), with memory to spare up "
         f"to {sh['best']:.3f}x; at 60% no solver's plan fits in {sh['unplanned']} cases, "
         f"and in {sh['infeasible']} none can (under the least peak of any plan); with no budget (nothing "
         f"resharded) within {sh['barrier_gap']:.2%} of its bound ({sh['barrier_within_2']} of {sh['barrier_like']} "
         "within 2%)", "`sharded.json`"],
        ["the engine's op order against a free one (simulated, best plan each)",
         f"at most {max(ratios) - 1:.1%} slower, median {statistics.median(ratios) - 1:.1%}",
         "`execution_value.json`"],
        _testbed_headline("ResNet-18, overlap, 2 ranks at the balanced rate, {rate} (measured; predicted from the "
                          "profile on every rank, interference measured on the model)",
                          "testbed_resnet18_balanced_model_run7", "overlap"),
        _testbed_headline("gpt_tied, osp, 2 ranks at the balanced rate, {rate} (measured)",
                          "testbed_gpt_tied_balanced_model_run7", "osp"),
        _testbed_headline("gpt_tied, osp over overlap (measured)", "testbed_gpt_tied_balanced_model_run7", "osp",
                          "overlap"),
        _limit_headline(("ResNet-18", "testbed_resnet18_balanced_model_run7"),
                        ("gpt_tied", "testbed_gpt_tied_balanced_model_run7")),
        _testbed_headline("ResNet-18, compiled runtime with a free-order plan, over torch.compile + DDP (measured)",
                          "testbed_resnet18_550mbit_compiled_order", "compiled", "compiled-ddp"),
        _testbed_headline("gpt_tied, a cpsat sharded plan through FSDP2 over FSDP2 per block, within its memory, "
                          "2 ranks at {rate} (measured)", "testbed_gpt_tied_400mbit_sharded", "sharded", "fsdp"),
        [f"`schedopt diagnose` on traced testbed runs ({d['models']}; DDP and a cpsat overlap plan, 2 ranks)",
         f"exposed communication within {d['exposure']:.1%} of the step of what the runs measured; DDP's step "
         f"predicted within {d['step']:.1%}, the plan's gain within {d['gain']:.1%}", "`diagnose.json`"],
        ["OSP's accuracy, 2 ranks (digits test accuracy; text validation loss)",
         f"digits {(acc['digits', 'osp'] - acc['digits', 'ddp']) * 100:+.2f} pt, text "
         f"{(acc['text', 'osp'] - acc['text', 'ddp']) / acc['text', 'ddp']:+.2%} against DDP; overlap mode equal "
         "to DDP bit for bit", "`osp_accuracy.json`"],
        ["the runtime's own cost, no rate cap (ResNet-18, DDP's buckets)",
         f"barrier {overhead['resnet18']['ratio']:.3f}x DDP's step, overlap "
         f"{overhead['resnet18']['overlap_over_barrier']:.3f}x barrier's", "`runtime_overhead.json`"],
    ]


def render_headline() -> str:
    lines = [BEGIN] + table(["what", "figure", "from `bench/results/`"], headline_rows()) + [END]
    return "\n".join(lines)


def readme_with_headline(text: str) -> str:
    """``text`` (the README) with the block between :data:`BEGIN` and :data:`END` rewritten.

    Raises:
        ValueError: the README lacks the two marker lines.
    """
    if BEGIN not in text or END not in text:
        raise ValueError(f"README.md has no results block ({BEGIN!r} ... {END!r})")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return head + render_headline() + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is out of date")
    args = parser.parse_args(argv)
    wanted = {DOC: render_results(), README: readme_with_headline(README.read_text())}
    stale = [path for path, text in wanted.items() if not path.is_file() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"report: {path.relative_to(ROOT)} is out of date: run python bench/report.py", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(wanted[path])
        print(f"report: wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
