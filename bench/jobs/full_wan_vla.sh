#!/bin/bash
# Issue 10, full size through `lf run` on ONE GPU each, concurrently: Wan2.1-1.3B at 81 x 480 x 832 on GPU 0
# (examples/full/wan_1p3b.toml) and the 3.24 B token VLA on GPU 1 (examples/full/vla_3b.toml), 200 steps each.
# Writes ONE archive $OUT/full_wan_vla.tgz (metrics.jsonl, plan.json, summary.json, config.toml, logs, results
# JSON per run) and prints first / last losses, median step_s and peak memory per run.
#
# On the GPU machine, with lf importable (the monorepo installed, or PYTHONPATH over libs/*/src and apps/*/src):
#   bash bench/jobs/full_wan_vla.sh
#   ONLY=wan WAN_LIMIT=560 bash bench/jobs/full_wan_vla.sh    # one of them (ONLY=wan|vla), e.g. on a one-GPU machine
# GPUs: the first two of CUDA_VISIBLE_DEVICES (default 0,1). Needs .lf-cache/metaworld5_30 (bench/jobs/README.md says how to make it).
# Limits: WAN_LIMIT (default 510 s: 200 steps at ~2.2-2.3 s/step + init are ~7.5-8 min; the LR schedule assumes 200
# steps, a cut run keeps its finished steps) and VLA_LIMIT (default 420 s). On SIGTERM lf stops after the step in
# flight (train.ckpt_every = 0: nothing saved); metrics.jsonl keeps every finished step.
# CPU dry run (tiny sizes, 3 steps): FULL_TINY=1 OUT=/tmp/o bash bench/jobs/full_wan_vla.sh
set -u
JOB=full_wan_vla
OUT=${OUT:-/tmp/out}
PY=${PY:-python3}
W=/tmp/$JOB
rm -rf "$W"; mkdir -p "$W/results" "$OUT"
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
WAN_LIMIT=${WAN_LIMIT:-510}
VLA_LIMIT=${VLA_LIMIT:-420}
IFS=, read -r -a GPUS <<< "${CUDA_VISIBLE_DEVICES:-0,1}"
G0=${GPUS[0]}; G1=${GPUS[1]:-${GPUS[0]}}
WAN_SET=(); VLA_SET=()
# PROFILE=10,12: torch.profiler over finished steps 10..12 (train.profile_steps); <run>/profile/ goes in the archive
if [ -n "${PROFILE:-}" ]; then WAN_SET=(--set "train.profile_steps=[$PROFILE]"); VLA_SET=("${WAN_SET[@]}"); fi
if [ "${FULL_TINY:-0}" = 1 ]; then  # the same commands at tiny sizes on the CPU
  COMMON=("${WAN_SET[@]}" --set run.device=cpu --set train.steps=3 --set train.warmup_steps=1)
  WAN_SET=("${COMMON[@]}" --set model.size=tiny --set "model.overrides={frames=9, height=32, width=32}"
           --set video.frames=9 --set video.height=32 --set video.width=32 --set video.vae_size=tiny
           --set memory.budget_gib=2)
  VLA_SET=("${COMMON[@]}" --set model.size=tiny --set train.global_batch=8 --set parallel.micro_batch=4)
fi
DEVICE=$($PY -c "import torch; print(f'1 x {torch.cuda.get_device_name(0)} per run, torch {torch.__version__}' if torch.cuda.is_available() else f'cpu, torch {torch.__version__}')")
echo "device: $DEVICE (wan on GPU $G0, vla on GPU $G1)"

run() {  # name gpu config limit_s [--set ...]
  local name=$1 gpu=$2 cfg=$3 limit=$4; shift 4
  local t0=$SECONDS
  CUDA_VISIBLE_DEVICES=$gpu timeout -s TERM -k 60 "$limit" $PY -m lf_orchestrator run "$cfg" --run-dir "$W/$name" \
    "$@" > "$W/$name.log" 2>&1
  echo "$? $((SECONDS - t0))" > "$W/$name.rc"
}

ONLY=${ONLY:-both}  # wan | vla | both (one GPU machine: one of them)
NAMES=()
if [ "$ONLY" != vla ]; then
  run wan_1p3b_h200 "$G0" examples/full/wan_1p3b.toml "$WAN_LIMIT" "${WAN_SET[@]}" &
  NAMES+=(wan_1p3b_h200)
fi
if [ "$ONLY" != wan ]; then
  { run vla_3b_h200 "$G1" examples/full/vla_3b.toml "$VLA_LIMIT" "${VLA_SET[@]}"
    if [ -n "${AFTER_VLA:-}" ]; then CUDA_VISIBLE_DEVICES=$G1 bash -c "$AFTER_VLA" > "$W/after_vla.log" 2>&1; fi; } &
  NAMES+=(vla_3b_h200)
fi
wait
for name in "${NAMES[@]}"; do
  read -r rc wall < "$W/$name.rc"
  echo "== $name: rc=$rc wall=$wall s"
  grep -v '^\s*$' "$W/$name.log" | grep -v "^step " | tail -n 12
  $PY -m lf_orchestrator.results "$W/$name" --name "$name" --out "$W/results" --set "device=$DEVICE" \
    --set "exit_code=$rc" --set "wall_s=$wall" || true
done
nvidia-smi --query-gpu=memory.used,memory.total --format=csv 2>/dev/null | tail -n 2
tar -czf "$OUT/$JOB.tgz" -C "$W" --exclude='checkpoints' --exclude='tb' --exclude='*.safetensors' . \
  && ls -la "$OUT/$JOB.tgz"
