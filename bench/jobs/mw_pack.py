"""Pack finished Meta-World VLA run folders for `lf eval` on another machine (used by bench/jobs/mw_vla.sh).

For each run folder under RUNS: copies the small files (config, encoder, model spec, metrics, summary, plan,
loss curve, TensorBoard events), and replaces the checkpoints by ONE weights-only DCP checkpoint of the latest
step (``checkpoints/step-N/{.metadata,__0_0.distcp,.lf_complete}`` + ``checkpoints/latest``; no optimizer
state, no train_state.pt: ``lf eval`` reads only the model weights through ``load_weights``). ``--dtype bf16``
rounds the weights to bfloat16 (half the bytes: both models fit one 15 MiB archive) and measures what the
rounding changes, on ``--check`` dataset samples, fp32 compute on both sides: the token model's greedy action
tokens (fraction identical) and the flow model's sampled chunks (same noise; max |diff| in normalized units),
plus the training loss. ``config.toml``'s ``data.path`` (absolute on the training machine) is rewritten to
``--data-path`` (relative: resolved from the directory `lf eval` runs in). Also times the host-side batch
assembly (``dataset[i]`` + collate, ``train.global_batch`` samples), to compare with the logged ``step_s``.

    python3 bench/jobs/mw_pack.py RUNS PACK --data-path .lf-cache/metaworld5_30 --dtype bf16
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from lf_data import LeRobotDataset
from lf_orchestrator.checkpoint import MARKER, PREFIX, latest_checkpoint, load_weights
from lf_orchestrator.config import load_config
from lf_orchestrator.families.vla import assembly

SKIP = {".lock", "checkpoints"}


def _obs(batch: dict, device) -> tuple:
    return tuple(batch[k].to(device) for k in ("image", "instruction_ids", "instruction_mask", "state"))


@torch.no_grad()
def rounding_check(run: Path, cfg, ds, weights: dict, n: int, device) -> dict:
    """What bf16 rounding of the weights changes, fp32 compute, ``n`` fixed dataset samples."""
    enc = assembly.load_encoder(cfg, run)
    idx = torch.randperm(len(ds), generator=torch.Generator().manual_seed(1))[:n].tolist()
    batch = enc.collate([ds[i] for i in idx])
    if cfg.model.recipe == "vla_flow":
        from lf_ir.recipes.vla_flow import sample_seeds

        batch["sample_seed"] = sample_seeds(cfg.run.seed, 0, idx)
    batch = {k: v.to(device) for k, v in batch.items()}
    out = {}
    for name, w in (("fp32", weights), ("bf16", {k: v.to(torch.bfloat16).float() for k, v in weights.items()})):
        model = assembly.build_model(assembly.load_model_config(run), device, cfg.run.seed)
        model.load_state_dict(w)
        model.eval()
        loss, _ = model.training_loss(batch)
        denom = float(model.loss_normalizer(batch))
        if hasattr(model, "sample_actions"):
            noise = torch.randn(n, model.cfg.action_horizon, model.cfg.action_dim,
                                generator=torch.Generator().manual_seed(2)).to(device)
            acts = model.sample_actions(*_obs(batch, device), noise=noise)
        else:
            acts = model.generate(*_obs(batch, device))
        out[name] = (float(loss) / max(denom, 1.0), acts.float().cpu())
    (l32, a32), (l16, a16) = out["fp32"], out["bf16"]
    rec = {"samples": n, "loss_fp32_weights": l32, "loss_bf16_weights": l16}
    if cfg.model.recipe == "vla_flow":
        rec["chunk_max_abs_diff_normalized"] = float((a32 - a16).abs().max())
        rec["chunk_mean_abs_diff_normalized"] = float((a32 - a16).abs().mean())
    else:
        rec["action_tokens_identical"] = float((a32 == a16).float().mean())
    return rec


def batch_ms(cfg, ds, repeats: int = 30) -> float:
    """Host-side milliseconds to assemble one global batch (``dataset[i]`` + collate), as the trainer does."""
    enc = assembly.build_encoder(cfg, ds)
    g = torch.Generator().manual_seed(0)
    b = cfg.train.global_batch
    enc.collate([ds[i] for i in range(b)])
    t0 = time.perf_counter()
    for _ in range(repeats):
        enc.collate([ds[i] for i in torch.randint(0, len(ds), (b,), generator=g).tolist()])
    return (time.perf_counter() - t0) / repeats * 1000


def partial_summary(run: Path, step: int) -> dict:
    """summary.json of a run stopped (SIGTERM) at checkpoint ``step``: seconds summed from the logged ``step_s``."""
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    seconds, prev, step_s = 0.0, 0, 0.0
    for line in lines:
        if "step_s" in line and line["step"] <= step:
            seconds += line["step_s"] * (line["step"] - prev)
            prev, step_s = line["step"], line["step_s"]
    seconds += step_s * (step - prev)  # the steps after the last log line, at its pace
    final = next((x for x in reversed(lines) if x["step"] <= step), {})
    return {"steps": step, "resumed_from": 0, "seconds": seconds, "final": final, "preempted": True,
            "written_by": "mw_pack.py: the run stopped at its time limit; seconds summed from metrics.jsonl "
                          "step_s, the unlogged tail at the last pace"}


def pack(run: Path, dest: Path, data_path: str, dtype: str, check: int, device) -> dict:
    """Copy ``run`` slimmed into ``dest``; returns its record (checkpoint, bytes, summary, rounding check,
    host batch time)."""
    cfg = load_config(run / "config.toml")
    ds = LeRobotDataset(cfg.data.path, action_horizon=cfg.data.action_horizon)
    dest.mkdir(parents=True)
    for p in run.iterdir():
        if p.name in SKIP:
            continue
        (shutil.copytree if p.is_dir() else shutil.copy2)(p, dest / p.name)
    text = (dest / "config.toml").read_text()
    text, n = re.subn(r'(?m)^(\[data\][^\[]*?^path = )"[^"\n]*"', rf'\1"{data_path}"', text)
    if n != 1:
        raise ValueError(f"{run / 'config.toml'}: no [data] path line to rewrite")
    (dest / "config.toml").write_text(text)
    ckpt = latest_checkpoint(run)
    rec = {"run": run.name, "recipe": cfg.model.recipe, "checkpoint": ckpt.name if ckpt else None}
    if (run / "summary.json").is_file():
        rec["summary"] = json.loads((run / "summary.json").read_text())
    elif ckpt is not None:  # stopped by the time limit: `lf eval --baseline bc-mlp` needs a summary
        rec["summary"] = partial_summary(run, int(ckpt.name.removeprefix("step-")))
        (dest / "summary.json").write_text(json.dumps(rec["summary"], indent=1))
    rec["host_batch_ms"] = batch_ms(cfg, ds)
    if ckpt is None:
        return rec
    weights = load_weights(ckpt, "cpu")
    if dtype == "bf16" and check:
        rec["bf16_rounding"] = rounding_check(run, cfg, ds, weights, check, device)
    cast = torch.bfloat16 if dtype == "bf16" else torch.float32
    slim = dest / "checkpoints" / ckpt.name
    state = {"model": {PREFIX + k: v.to(cast).contiguous() for k, v in weights.items()}}
    dcp.save(state, checkpoint_id=str(slim), no_dist=True)
    (slim / MARKER).write_text("weights only (mw_pack.py)\n")
    (dest / "checkpoints" / "latest").write_text(ckpt.name)
    rec.update(weights_dtype=dtype, parameters=sum(v.numel() for v in weights.values()),
               checkpoint_bytes=sum(f.stat().st_size for f in slim.iterdir()))
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("pack", type=Path)
    ap.add_argument("--data-path", required=True)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--check", type=int, default=256, help="samples for the bf16 rounding check (0: skip)")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    records = {}
    for run in sorted(p for p in args.runs.iterdir() if p.is_dir()):
        try:
            records[run.name] = pack(run, args.pack / run.name, args.data_path, args.dtype, args.check, device)
        except Exception as err:  # pack the other run anyway; the error goes into pack.json
            records[run.name] = {"run": run.name, "error": f"{type(err).__name__}: {err}"}
    (args.pack / "pack.json").write_text(json.dumps(records, indent=1))
    print(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
