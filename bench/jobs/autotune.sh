#!/bin/bash
# Auto-tuner check sweeps on 2 GPUs, or 1 (bench/autotune_check.py --exhaustive): predicted vs measured per plan.
# One archive: $OUT/autotune.tgz (JSON per model + logs). Sizes / selection by env:
#   AUTOTUNE_GPUS=2 (default) | 1: one GPU (the first of CUDA_VISIBLE_DEVICES), e.g. beside another job on GPU 0:
#     CUDA_VISIBLE_DEVICES=1 AUTOTUNE_GPUS=1 AUTOTUNE_SWEEP=medium AUTOTUNE_MODELS="llama3 wan_dit" bash ...
#   AUTOTUNE_MODELS="wan_dit llama3 qwen2_vl"  (default: wan_dit; ~5 min each with the tiny sweep, see --estimate)
#   AUTOTUNE_SWEEP=tiny|small|medium (default tiny)   AUTOTUNE_MAX_PLANS=N (default 0: all)
#   AUTOTUNE_BUDGET_S=540 (wall seconds for all models together; each model gets what is left)
#   AUTOTUNE_DRY=1: CPU run of the same script (tiny models, 2 gloo processes), for testing this file.
set -u
OUT=${OUT:-/tmp/autotune_out}; mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONPATH=${PYTHONPATH:-}:$(ls -d libs/*/src apps/*/src | tr '\n' ':')
if ! $PY -c "import msgspec" 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl .whl/orch/*.whl 2>&1 | tail -2
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
MODELS=${AUTOTUNE_MODELS:-wan_dit}; SWEEP=${AUTOTUNE_SWEEP:-tiny}; MAXP=${AUTOTUNE_MAX_PLANS:-0}
NGPU=${AUTOTUNE_GPUS:-2}; SUFFIX=$([ "$NGPU" = 1 ] && echo h200 || echo h200x2)
BUDGET=${AUTOTUNE_BUDGET_S:-540}; START=$(date +%s)
WORK=/tmp/autotune_work; rm -rf $WORK; mkdir -p $WORK
for m in $MODELS; do
  LEFT=$(( BUDGET - ($(date +%s) - START) )); [ $LEFT -lt 60 ] && { echo "$m: no time left"; continue; }
  ARGS="--gpus $NGPU --model $m --exhaustive --sweep $SWEEP --max-plans $MAXP --out $WORK/autotune_${m}_$SUFFIX.json"
  if [ "${AUTOTUNE_DRY:-0}" = 1 ]; then
    timeout $LEFT $PY bench/autotune_check.py --dry $ARGS > $WORK/$m.log 2>&1
  elif [ "$NGPU" = 1 ]; then
    timeout $LEFT $PY bench/autotune_check.py $ARGS > $WORK/$m.log 2>&1
  else
    timeout $LEFT $PY -m torch.distributed.run --nproc-per-node 2 bench/autotune_check.py $ARGS > $WORK/$m.log 2>&1
  fi
  echo "$m rc=$? ($(( $(date +%s) - START )) s)"
  grep -E "estimated GPU time|chosen_fraction|Error|error:" $WORK/$m.log | cut -c1-600 | tail -5
done
tar -czf "$OUT/autotune.tgz" -C $WORK .
ls -la "$OUT"
