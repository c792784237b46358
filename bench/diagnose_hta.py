"""Cross-check schedopt diagnose's overlap share against Holistic Trace Analysis on the same traces.

    python bench/diagnose_hta.py DIR [DIR ...] [--json bench/results/diagnose_hta.json]

Each DIR holds one run's traces (one per rank). For each rank: schedopt's overlap share (the median
over the run's steps of hidden / communication time) beside HTA's comm-comp overlap percentage
(``TraceAnalysis.get_comm_comp_overlap``), or why HTA gave none. HTA is not one of schedopt's
dependencies (it pulls in jupyterlab); run this script with a Python that has both, e.g. a venv with
``pip install HolisticTraceAnalysis`` and ``PYTHONPATH`` at this checkout.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from provenance import write_result  # noqa: E402
from schedopt.diagnose import diagnose  # noqa: E402
from schedopt.kineto import load_traces  # noqa: E402


def hta_overlap(directory: str) -> dict[int, float | None]:
    """HTA's comm-comp overlap share per rank (None where it computes none: it reads GPU kernels only)."""
    from hta.trace_analysis import TraceAnalysis

    frame = TraceAnalysis(trace_dir=directory).get_comm_comp_overlap(visualize=False)
    return {int(r): (None if math.isnan(v) else v / 100) for r, v in zip(frame["rank"], frame["comp_comm_overlap_pctg"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--seed", type=int, default=0, help="unused: nothing here is drawn at random (the bench "
                                                             "scripts' common options)")
    args = parser.parse_args(argv)
    try:
        import hta  # noqa: F401
    except ImportError:
        print("diagnose_hta: Holistic Trace Analysis is not installed here (pip install HolisticTraceAnalysis in "
              "a venv of its own; see this script's docstring)", file=sys.stderr)
        return 2
    rows = []
    for directory in args.dirs:
        report = diagnose(load_traces([directory]))
        theirs = hta_overlap(directory)
        for rank in sorted({s.rank for s in report.steps}):
            shares = [s.overlap_share for s in report.steps if s.rank == rank and s.overlap_share is not None]
            ours = statistics.median(shares) if shares else None
            rows.append({"traces": directory, "device": report.device, "rank": rank, "schedopt": ours,
                         "hta": theirs.get(rank)})
            fmt = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
            print(f"{directory} ({report.device}) rank {rank}: schedopt {fmt(ours)}, HTA {fmt(theirs.get(rank))}")
    if args.json:
        write_result(args.json, rows, vars(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
