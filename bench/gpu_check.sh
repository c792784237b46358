#!/usr/bin/env bash
# Every CUDA path one GPU can exercise, in under 8 minutes: profiling on CUDA, wrap in barrier, overlap
# and osp mode on NCCL against DDP, the compiled runtime; writes $OUT_DIR/gpu_check.json (default out/).
#
# On a GPU machine whose python3 holds a CUDA build of torch (nothing is downloaded): the project is
# installed editable without dependencies when it does not import yet, then one torchrun process
# (NCCL, world size 1) runs bench/gpu_check.py. Exit status 0 when every check passed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT_DIR=${OUT_DIR:-${OUT:-out}}
mkdir -p "$OUT_DIR"
"$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: torch sees no CUDA device')"
"$PY" -c "import schedopt.solvers, schedopt.runtime" 2>/dev/null \
    || "$PY" -m pip install -q --no-deps --no-build-isolation -e .
timeout 480 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 \
    bench/gpu_check.py --json "$OUT_DIR/gpu_check.json"
