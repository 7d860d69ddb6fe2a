#!/usr/bin/env bash
# Issue 10: train both Meta-World VLAs full-length (examples/metaworld5_{tokens,flow}.toml, 1,500 steps each)
# on ONE GPU, as two concurrent processes (each is launch-bound at this size: the GPU is mostly idle), on the
# pre-generated dataset .lf-cache/metaworld5_30 (no simulator needed: generate_metaworld returns a cached
# dataset whose parameters match), then pack both run folders (weights-only bf16 checkpoint, see
# bench/jobs/mw_pack.py) into $OUT/mw_vla.tgz and print the key numbers.
#
# GPU (with lf importable; carry .lf-cache/metaworld5_30):
#   CUDA_VISIBLE_DEVICES=0 bash bench/jobs/mw_vla.sh
# CPU smoke test (same script, tiny):
#   MW_STEPS=3 MW_DEVICE=cpu OUT=/tmp/mw_out bash bench/jobs/mw_vla.sh
# Env: MW_STEPS (1500), MW_LIMIT_S (per-run wall limit, 170: SIGTERM makes the trainer save the step and stop,
# so a slow run still packs a checkpoint), MW_DEVICE (auto), MW_THREADS (torch CPU threads per run, 4),
# MW_WEIGHTS (bf16: one archive; fp32: exact weights, two archives mw_vla_tokens.tgz + mw_vla_flow.tgz),
# MW_DATA (.lf-cache/metaworld5_30), MW_WORK (/tmp/mw_vla), PY (python3).
set -uo pipefail
PY=${PY:-python3}
STEPS=${MW_STEPS:-1500}
LIMIT=${MW_LIMIT_S:-170}
DEVICE=${MW_DEVICE:-auto}
THREADS=${MW_THREADS:-4}
WEIGHTS=${MW_WEIGHTS:-bf16}
DATA=${MW_DATA:-.lf-cache/metaworld5_30}
WORK=${MW_WORK:-/tmp/mw_vla}
: "${OUT:?set OUT to the folder that comes back}"
T0=$(date +%s)
WARMUP=$(( STEPS < 100 ? 1 : 100 ))
CKPT=$(( STEPS < 250 ? STEPS : 250 ))
LOG_EVERY=$(( STEPS < 50 ? 1 : 50 ))

# The dataset must be there, complete, and the one the configs expect (30 episodes/task): never regenerated.
"$PY" - "$DATA" <<'EOF' || exit 3
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
info = json.loads((d / "meta/info.json").read_text())
p = info["lf"]["params"]
assert p["episodes_per_task"] == 30 and p["image_size"] == 64 and len(p["tasks"]) == 5, p
assert (d / "data/chunk-000/file-000.parquet").is_file()
print(f"dataset {d}: {info['total_episodes']} episodes, {info['total_frames']} frames")
EOF
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader

rm -rf "$WORK" && mkdir -p "$WORK/runs" "$OUT"
declare -A PID RC
for n in tokens flow; do
  timeout --preserve-status -s TERM -k 30 "$LIMIT" "$PY" -m lf_orchestrator run "examples/metaworld5_$n.toml" \
    --run-dir "$WORK/runs/$n" \
    --set "data.path=$DATA" --set data.episodes_per_task=30 --set eval.at_end=false \
    --set "train.steps=$STEPS" --set "train.warmup_steps=$WARMUP" --set "train.ckpt_every=$CKPT" \
    --set "train.log_every=$LOG_EVERY" --set "run.device=$DEVICE" --set "run.threads=$THREADS" \
    > "$WORK/runs/$n.log" 2>&1 &
  PID[$n]=$!
done
for n in tokens flow; do
  wait "${PID[$n]}"; RC[$n]=$?
  echo "== $n: exit ${RC[$n]} after $(( $(date +%s) - T0 )) s$([ "${RC[$n]}" = 143 ] && echo " (stopped by MW_LIMIT_S, step saved)")"
  tail -n 4 "$WORK/runs/$n.log"
done
T_TRAIN=$(( $(date +%s) - T0 ))

PACK="$WORK/pack"
"$PY" bench/jobs/mw_pack.py "$WORK/runs" "$PACK" --data-path "$DATA" --dtype "$WEIGHTS" > "$WORK/pack.log" 2>&1 \
  || { echo "pack failed:"; tail -n 30 "$WORK/pack.log"; }
for n in tokens flow; do cp "$WORK/runs/$n.log" "$PACK/$n/train.log" 2>/dev/null; done
"$PY" - "$PACK" "${RC[tokens]}" "${RC[flow]}" "$T_TRAIN" "$STEPS" <<'EOF'
import json, sys, pathlib
pack, rc_t, rc_f, t_train, steps = pathlib.Path(sys.argv[1]), *sys.argv[2:]
recs = json.loads((pack / "pack.json").read_text()) if (pack / "pack.json").is_file() else {}
out = {"job": "mw_vla", "steps_requested": int(steps), "exit_codes": {"tokens": int(rc_t), "flow": int(rc_f)},
       "wall_s_both_runs": int(t_train), "runs": recs}
(pack / "mw_vla_summary.json").write_text(json.dumps(out, indent=1))
for name, r in recs.items():
    s = r.get("summary", {})
    f = s.get("final", {})
    print(f"{name}: steps {s.get('steps')} in {s.get('seconds', 0):.1f} s, loss {f.get('train/loss')}, "
          f"step_s {f.get('step_s')}, host batch {r.get('host_batch_ms', 0):.1f} ms, ckpt {r.get('checkpoint')} "
          f"({r.get('checkpoint_bytes', 0) / 2**20:.1f} MiB {r.get('weights_dtype')}), rounding {r.get('bf16_rounding')}")
EOF
if [ "$WEIGHTS" = fp32 ]; then
  for n in tokens flow; do tar czf "$OUT/mw_vla_$n.tgz" -C "$PACK" "$n" pack.json mw_vla_summary.json; done
else
  tar czf "$OUT/mw_vla.tgz" -C "$PACK" .
fi
ls -la "$OUT"/mw_vla*.tgz
echo "mw_vla: done in $(( $(date +%s) - T0 )) s"
