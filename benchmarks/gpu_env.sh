# Sourced by the GPU check scripts (gpu_check.sh, gpu_push_check.sh) from the repository root: installs the
# carried wheels when DeepSpeed, hjson or pydantic are missing (a lent GPU machine has none of them and no
# network; docs/gpu.md says how .whl/ is prepared), and sets PY and the environment the benchmarks need.
PY=${PYTHON:-python3}
if ! "$PY" -c 'import deepspeed, hjson, pydantic' >/dev/null 2>&1; then
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "deepspeed/hjson/pydantic are missing and there is no .whl/ folder to install them from (docs/gpu.md)" >&2
    return 1
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || return 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# DeepSpeed's JIT ops (CPU Adam under optimizer offload) compile into a folder that exists on a bare machine.
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch_extensions}
