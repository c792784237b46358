#!/usr/bin/env bash
# Every CUDA path one GPU can exercise, each step under its own timeout (they add to
# 14.5 minutes; before the two-rank step was added the whole run took under 8 on an H200):
# profiling on CUDA, wrap in barrier, overlap
# and osp mode on NCCL against DDP, the compiled runtime, shard (FSDP2) against fully_shard, the same
# again on two ranks sharing the GPU over gloo; then real CUDA profiler traces for `schedopt diagnose`
# and `schedopt import --trace`. Writes into $OUT_DIR (default out/): gpu_check.json,
# gpu_check_gloo2.json, the traces (ddp_gpt_tied.json.gz, ddp_resnet18.json.gz,
# overlap_gpt_tied.json.gz: examples/train.py --profile on NCCL, world size 1), resnet18_cuda.json
# and gpt2_small_cuda.json (`schedopt profile --on cuda`) and log.txt.
#
# On a GPU machine whose python3 holds a CUDA build of torch (nothing is downloaded): the project is
# installed editable without dependencies when it does not import yet (OR-Tools is not needed: no
# step runs cpsat), then each step runs under torchrun (NCCL, world size 1). Exit status 0 when every
# check passed and every trace was written; a failing step does not stop the ones after it.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT_DIR=${OUT_DIR:-${OUT:-out}}
mkdir -p "$OUT_DIR"
exec > >(tee "$OUT_DIR/log.txt") 2>&1
"$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: torch sees no CUDA device')" || exit 2
"$PY" -c "import schedopt.solvers, schedopt.runtime" 2>/dev/null \
    || "$PY" -m pip install -q --no-deps --no-build-isolation -e . || exit 2
export PYTHONUNBUFFERED=1
"$PY" -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), \
'nccl', torch.cuda.nccl.version())"
RUN=("$PY" -m torch.distributed.run --standalone --nproc-per-node 1)
failed=0
timeout 240 "${RUN[@]}" bench/gpu_check.py --json "$OUT_DIR/gpu_check.json" || failed=1
# Two ranks on the one GPU, over gloo (NCCL refuses to share a device): the collectives between ranks
timeout 180 "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 bench/gpu_check.py --backend gloo \
    --profile-model '' --json "$OUT_DIR/gpu_check_gloo2.json" || failed=1

work=$(mktemp -d)
trace() {  # trace NAME MODEL [train.py flags]: 8 steps, the last 3 profiled, the trace gzipped into $OUT_DIR
    local name=$1 model=$2; shift 2
    timeout 90 "${RUN[@]}" examples/train.py "$model" --steps 8 --profile "$work/$name" --profile-sizes \
        --quiet --json "$work/$name.train.json" "$@" \
        && gzip -c "$work/$name/rank0.json" > "$OUT_DIR/$name.json.gz" || { echo "gpu_check: trace $name failed"; failed=1; }
}
trace ddp_gpt_tied gpt_tied --ddp
trace ddp_resnet18 resnet18 --ddp
"$PY" -m schedopt plan examples/models.py:gpt_tied --solver caramel --mode overlap --world-size 8 \
    --network 100gbe -o "$work/overlap.json" \
    && SCHEDOPT_PLAN="$work/overlap.json" trace overlap_gpt_tied gpt_tied || failed=1
for m in resnet18 gpt2_small; do  # the device's own op times, for planning
    timeout 90 "$PY" -m schedopt profile examples/models.py:$m --on cuda --iterations 5 -o "$OUT_DIR/${m}_cuda.json" || failed=1
done
for f in "$work"/*.train.json; do echo "== $f"; head -c 600 "$f"; echo; done
exit $failed
