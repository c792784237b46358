"""The ``schedopt`` command line.

Every command reports bad input with one line on stderr and exit status 2.
Subcommands import the solvers only when they need them. The package:
:mod:`.parser` (the subcommands and their flags), :mod:`.options` (the flags
the commands share, and how they become graphs, clusters and problems),
:mod:`.runs` (commands that read a model or a run: import, profile, calibrate,
diagnose) and :mod:`.plans` (commands that make and read plans: plan,
simulate, inspect, compare, sweep).
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

from ..errors import SchedoptError
from .options import EXIT_USAGE, _check_outputs
from .parser import build_parser

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _check_outputs(args)
        return int(args.run(args))
    except SchedoptError as exc:
        print(f"schedopt: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("schedopt: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
