#!/usr/bin/env bash
# The trainer's half of `vllm-server` weight pushes on one GPU, in one command (docs/gpu.md): install the
# carried wheels when missing, then benchmarks/bench_push_gpu.py for each shape in $SHAPES (default
# qwen2.5-0.5b and qwen2.5-1.5b, ZeRO-2 and ZeRO-3 each), the JSONs and the log into $OUT (or /tmp/gpu_push_check).
# Arguments go to bench_push_gpu.py.
#
#   bash benchmarks/gpu_push_check.sh                                        # on the lent machine, .whl/ carried
#   SHAPES=tiny OUT=/tmp/push_dry bash benchmarks/gpu_push_check.sh --allow-cpu   # anywhere, CPU, seconds
set -u
cd "$(dirname "$0")/.." || exit 1
source benchmarks/gpu_env.sh || exit 1
out=${OUT:-/tmp/gpu_push_check}
mkdir -p "$out"
{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'; } \
  2>&1 | tee "$out/gpu_push_check.log"
rc=0
for shape in ${SHAPES:-qwen2.5-0.5b qwen2.5-1.5b}; do
  "$PY" benchmarks/bench_push_gpu.py --shape "$shape" --json "$out/push_$shape.json" "$@" 2>&1 \
    | grep -v -e "Warning" -e "return func" | tee -a "$out/gpu_push_check.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
done
exit $rc
