#!/usr/bin/env bash
# Issue 10 on ONE GPU: train the Wan VAE on the Meta-World clips (examples/wan_vae.toml), then the Wan DiT on
# its latents (examples/wan_t2v_metaworld5.toml), then pack both run folders weights-only (bf16 model
# weights in the legacy checkpoint layout, no optimizer state) with sample frames as PNG into
# $OUT/wan_sample.tgz. Each stage is capped by `timeout -s TERM`: on SIGTERM the trainer checkpoints the
# step it reached and exits 143, which this script accepts (the summary then has no eval).
#   GPU:  bash bench/jobs/wan_sample.sh            (run from the repo root, lf importable, CUDA_VISIBLE_DEVICES=one GPU)
#   CPU smoke test: WAN_SAMPLE_TINY=1 OUT=/tmp/ws_out bash bench/jobs/wan_sample.sh
set -uo pipefail
OUT=${OUT:?set OUT}
WORK=${WORK:-/tmp/wan_sample}
DATA=${DATA:-.lf-cache/metaworld5_30}
PY=${PY:-python3}
mkdir -p "$OUT" && rm -rf "$WORK" && mkdir -p "$WORK"
T0=$(date +%s)
if [[ "${WAN_SAMPLE_TINY:-0}" == 1 ]]; then  # CPU: same path, tiny sizes
  VAE_LIMIT=300; DIT_LIMIT=300; DATA=$WORK/data
  $PY -c "from lf_data import generate_metaworld as g; g('$DATA', tasks=['reach-v3'], episodes_per_task=2,
image_size=32, max_steps=60, seed=0, workers=1)" >/dev/null
  VAE_SET=(--set train.steps=3 --set train.global_batch=2 --set parallel.micro_batch=2 --set train.warmup_steps=1
           --set train.log_every=1 --set vae.eval_clips=2 --set run.device=cpu --set data.image_size=32)
  DIT_SET=(--set train.steps=3 --set train.global_batch=4 --set parallel.micro_batch=4 --set train.warmup_steps=1
           --set train.log_every=1 --set run.device=cpu --set video.sample_steps=2 --set data.image_size=32)
else
  VAE_LIMIT=${VAE_LIMIT:-120}; DIT_LIMIT=${DIT_LIMIT:-110}
  VAE_SET=(); DIT_SET=()
fi
export PYTHONUNBUFFERED=1
stage() {  # name, time limit (s), config, args...
  local name=$1 limit=$2 cfg=$3; shift 3
  local t=$(date +%s)
  timeout --preserve-status -s TERM --kill-after=60 "$limit" $PY -m lf_orchestrator run "$cfg" --run-dir "$WORK/$name" \
    --set data.source=lerobot --set "data.path=$DATA" --set "video.cache_dir=$WORK/latents" "$@" 2>&1 \
    | tee "$WORK/$name.log" | grep -v "^step " ; local rc=${PIPESTATUS[0]}
  grep "^step " "$WORK/$name.log" | tail -3
  echo "[wan_sample] $name: exit $rc after $(( $(date +%s) - t )) s"
  [[ $rc == 0 || $rc == 143 ]] || { tail -40 "$WORK/$name.log"; exit "$rc"; }
}
stage wan-vae "$VAE_LIMIT" examples/wan_vae.toml "${VAE_SET[@]}"
stage wan-t2v "$DIT_LIMIT" examples/wan_t2v_metaworld5.toml --set "video.vae_weights=$WORK/wan-vae" "${DIT_SET[@]}"
$PY - "$WORK" <<'PY'
"""Pack: weights-only copies of both run folders (bf16), PNG frames of one sample per task, a summary JSON."""
import json, shutil, sys, time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from lf_orchestrator.checkpoint import latest_checkpoint, load_weights
from lf_orchestrator.config import load_config
from lf_orchestrator.families.video_sample import sample_clip

work = Path(sys.argv[1])
pack = work / "pack"
summary = {}
for name in ("wan-vae", "wan-t2v"):
    src, dst = work / name, pack / name
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix in (".toml", ".json", ".jsonl") or f.name == "text_encoder.safetensors":
            shutil.copy2(f, dst / f.name)
    shutil.copy2(work / f"{name}.log", dst / "train.log")
    # the run read the carried dataset as `lerobot`; the example's `metaworld` source lets `lf sample` load the
    # config where that folder is absent (sampling never reads the data)
    text = (dst / "config.toml").read_text()
    (dst / "config.toml").write_text(text.replace('source = "lerobot"', 'source = "metaworld"', 1))
    if (src / "vae.safetensors").is_file():  # the trained VAE with its latent statistics, bf16
        from safetensors import safe_open
        with safe_open(str(src / "vae.safetensors"), "pt") as h:
            meta = h.metadata()
        save_file({k: v.bfloat16() for k, v in load_file(str(src / "vae.safetensors")).items()},
                  str(dst / "vae.safetensors"), metadata=meta)
    ckpt = latest_checkpoint(src)
    step = int(ckpt.name.split("-")[1])
    if name == "wan-t2v":  # the VAE's weights travel in the DiT folder's vae.safetensors
        out = dst / "checkpoints" / ckpt.name
        out.mkdir(parents=True)
        save_file({k: v.bfloat16().contiguous() for k, v in load_weights(ckpt).items()}, str(out / "model.safetensors"))
        torch.save({"step": step, "note": "weights-only copy (bf16) made by bench/jobs/wan_sample.sh"}, out / "state.pt")
    s = json.loads((src / "summary.json").read_text()) if (src / "summary.json").is_file() else {}
    lines = (src / "metrics.jsonl").read_text().splitlines()
    last = next((json.loads(line) for line in reversed(lines) if '"step_s"' in line), {})
    summary[name] = {"step": step, "eval": s.get("eval"), "step_s": last.get("step_s"),
                     "peak_mem_gib": last.get("peak_mem_gib"), "train_loss": last.get("train/loss"), "summary": s}
run = pack / "wan-t2v"
cfg = load_config(run / "config.toml")
from lf_data import LeRobotDataset
tasks = LeRobotDataset(cfg.data.path, action_horizon=1).tasks
rows = []
t = time.time()
for i, task in enumerate(tasks):
    clip = sample_clip(cfg, run, task, seed=0)  # (frames, H, W, 3) uint8, from the packed folder on the CPU
    rows.append(np.concatenate(list(clip), axis=1))
    Image.fromarray(clip[clip.shape[0] // 2]).save(pack / f"sample_task{i}_mid.png")
Image.fromarray(np.concatenate(rows, axis=0)).save(pack / "samples_all_tasks.png")
summary["sample"] = {"tasks": tasks, "cpu_s": time.time() - t, "frames": int(clip.shape[0]),
                     "size": list(clip.shape[1:3])}
(pack / "wan_sample_summary.json").write_text(json.dumps(summary, indent=1, default=str))
print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "summary"} for k, v in summary.items()},
                 default=str))
PY
rc=$?; [[ $rc == 0 ]] || { echo "[wan_sample] pack failed ($rc)"; exit $rc; }
tar czf "$OUT/wan_sample.tgz" -C "$WORK/pack" .
ls -la "$OUT/wan_sample.tgz"; tar tzvf "$OUT/wan_sample.tgz" | awk '{print $3, $6}'
echo "[wan_sample] total $(( $(date +%s) - T0 )) s"
