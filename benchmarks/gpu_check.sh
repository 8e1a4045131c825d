#!/usr/bin/env bash
# Issue 28's GPU check in one command (docs/gpu.md): install the carried wheels when DeepSpeed, hjson or
# pydantic are missing (a lent GPU machine has none of them and no network), then run benchmarks/gpu_check.py,
# which runs bench_gpu_grpo.py four times under one time budget and writes gpu_check.{json,md,log} into
# $OUT (or --out DIR). Arguments go to gpu_check.py: --tiny (CPU dry run), --budget S, --only NAME....
#
#   bash benchmarks/gpu_check.sh                 # on the lent machine, repository root, .whl/ carried
#   bash benchmarks/gpu_check.sh --tiny --out /tmp/gpu_check_dry   # anywhere, CPU, ~2 minutes
set -u
cd "$(dirname "$0")/.." || exit 1
source benchmarks/gpu_env.sh || exit 1
out=${OUT:-/tmp/gpu_check}
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do [[ ${args[i]} == --out ]] && out=${args[i + 1]}; done
mkdir -p "$out"
{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)'
  "$PY" benchmarks/gpu_check.py --out "$out" "$@"; } 2>&1 | tee "$out/gpu_check.log"
exit "${PIPESTATUS[0]}"
