#!/usr/bin/env bash
# Issue 28's GPU check in one command (docs/gpu.md): install the carried wheels when DeepSpeed, hjson or
# pydantic are missing (a lent GPU machine has none of them and no network), then run benchmarks/gpu_check.py,
# which runs bench_gpu_grpo.py four times under one time budget and writes gpu_check.{json,md,log} into
# $OUT (or --out DIR). Arguments go to gpu_check.py: --tiny (CPU dry run), --budget S, --only NAME....
# Then the decode benchmark (issue 41: benchmarks/bench_decode.py, our hf loop vs model.generate on one batch of
# 512 rows, the 0.5B shape, 64 new tokens, eager and graphed; at most 180 s) into $out/bench_decode.{log,json}.
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
rc=${PIPESTATUS[0]}
decode=(--device cuda --hidden 896 --intermediate 4864 --layers 24 --heads 14 --kv-heads 2 --new-tokens 64 --compile
        --json)
[[ " $* " == *" --tiny "* ]] && decode=(--prompts 4 --n 2 --new-tokens 4 --vocab 2048 --hidden 32 --json)
timeout 180 "$PY" benchmarks/bench_decode.py "${decode[@]}" 2>&1 | tee "$out/bench_decode.log"
tail -n 1 "$out/bench_decode.log" > "$out/bench_decode.json"
exit "$rc"
