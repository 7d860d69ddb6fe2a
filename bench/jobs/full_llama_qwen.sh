#!/bin/bash
# Issue 10, full size through `lf run` on 2 GPUs: Llama-3-8B (examples/full/llama3_8b.toml) for 200 steps, then
# Qwen2-VL-7B (examples/full/qwen2_vl_7b.toml) for 200 steps. Writes ONE archive $OUT/full_llama_qwen.tgz (run
# folders' metrics.jsonl, plan.json, summary.json, corpus.json, config.toml, logs, results JSON) and prints first /
# last losses, median step_s and peak memory per run.
#
# On the GPU machine, with lf importable (the monorepo installed, or PYTHONPATH over libs/*/src and apps/*/src):
#   bash bench/jobs/full_llama_qwen.sh                      # both, ~9 min budget (LLAMA_LIMIT + QWEN_LIMIT seconds)
#   ONLY=llama LLAMA_LIMIT=540 bash bench/jobs/full_llama_qwen.sh     # one of them per call, if both do not fit
#   ONLY=qwen QWEN_LIMIT=540 bash bench/jobs/full_llama_qwen.sh
# Needs .lf-cache/metaworld5_30 (Qwen's data; how to make it: bench/jobs/README.md) in the repository root.
# A run past its limit gets SIGTERM (timeout): lf stops after the step in flight (train.ckpt_every = 0: nothing is
# saved), metrics.jsonl keeps every finished step, the archive is still written.
# CPU dry run (tiny sizes, 2 gloo processes, 3 steps): FULL_TINY=1 OUT=/tmp/o bash bench/jobs/full_llama_qwen.sh
set -u
JOB=full_llama_qwen
OUT=${OUT:-/tmp/out}
PY=${PY:-python3}
W=/tmp/$JOB
rm -rf "$W"; mkdir -p "$W/results" "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
LLAMA_LIMIT=${LLAMA_LIMIT:-290}
QWEN_LIMIT=${QWEN_LIMIT:-250}
ONLY=${ONLY:-both}
LLAMA_SET=(); QWEN_SET=()
# PROFILE=10,12: torch.profiler over finished steps 10..12 (train.profile_steps); <run>/profile/ goes in the archive
if [ -n "${PROFILE:-}" ]; then LLAMA_SET=(--set "train.profile_steps=[$PROFILE]"); QWEN_SET=("${LLAMA_SET[@]}"); fi
if [ "${FULL_TINY:-0}" = 1 ]; then  # the same commands at tiny sizes on the CPU: proves the script and data paths
  COMMON=("${LLAMA_SET[@]}" --set run.device=cpu --set train.steps=3 --set train.warmup_steps=1)
  LLAMA_SET=("${COMMON[@]}" --set model.size=tiny --set "model.overrides={vocab_size=128256, max_seq_len=8192}"
             --set corpus.seq_len=1024)
  QWEN_SET=("${COMMON[@]}" --set model.size=tiny --set train.global_batch=4)
fi
DEVICE=$($PY -c "import torch; print(f'{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}' if torch.cuda.is_available() else f'cpu, torch {torch.__version__}')")
echo "device: $DEVICE"

run() {  # name config limit_s [--set ...]
  local name=$1 cfg=$2 limit=$3; shift 3
  local t0=$SECONDS
  timeout -s TERM -k 60 "$limit" $PY -m torch.distributed.run --nproc-per-node 2 -m lf_orchestrator run "$cfg" \
    --run-dir "$W/$name" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc wall=$((SECONDS - t0)) s (limit $limit s)"
  grep -v '^\s*$' "$W/$name.log" | grep -v "^step " | tail -n 12
  $PY -m lf_orchestrator.results "$W/$name" --name "$name" --out "$W/results" --set "device=$DEVICE" \
    --set "command=torchrun --nproc-per-node 2 -m lf_orchestrator run $cfg $*" --set "exit_code=$rc" \
    --set "wall_s=$((SECONDS - t0))" || true
}

[ "$ONLY" = qwen ] || run llama3_8b_h200x2 examples/full/llama3_8b.toml "$LLAMA_LIMIT" "${LLAMA_SET[@]}"
[ "$ONLY" = llama ] || run qwen2_vl_7b_h200x2 examples/full/qwen2_vl_7b.toml "$QWEN_LIMIT" "${QWEN_SET[@]}"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv 2>/dev/null | tail -n 2
# no checkpoints exist (ckpt_every = 0); keep the small files only
tar -czf "$OUT/$JOB.tgz" -C "$W" --exclude='checkpoints' --exclude='tb' --exclude='*.safetensors' . \
  && ls -la "$OUT/$JOB.tgz"
