"""DCP checkpoints of VLA runs (`lf run`): layout, keep-last-k, async, exact resume, resharding dp=2 -> 1,
and old full-state checkpoints.

Oracles: the uninterrupted run of the same plan (a resumed run logs its float32 losses bit for bit: same
batches, same updates, same schedule, deterministic gloo reductions), and for a dp=2 checkpoint resumed on one
process the dp=2 run's next-step loss (same weights, same 8 samples, float32 sums in another order: 1e-6
relative). A "stopped" run is a copy of the uninterrupted run's folder without the checkpoints after step 3
and the log lines after it (all a process stopped after step 3 leaves behind).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lf_orchestrator.config import load_config

STOP = 3


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows}


def _stopped_copy(src: Path, dst: Path) -> Path:
    """``src`` as it was right after step ``STOP``'s checkpoint."""
    shutil.copytree(src, dst)
    for ckpt in (dst / "checkpoints").glob("step-*"):
        if int(ckpt.name.removeprefix("step-")) > STOP:
            shutil.rmtree(ckpt)
    rows = (dst / "metrics.jsonl").read_text().splitlines()
    (dst / "metrics.jsonl").write_text("".join(r + "\n" for r in rows if json.loads(r)["step"] <= STOP))
    return dst


def _trainer(cfg, run_dir, **kw):
    from lf_orchestrator.train import Trainer
    from lf_parallel import init_distributed

    return Trainer(cfg, run_dir, init_distributed("cpu"), **kw)


def test_dcp_layout_keep_last_k_and_async_resume_exactly(tiny_config, tmp_path):
    """One process, asynchronous saves every step, keep 4: the folder holds steps 3..6 only, each a DCP
    folder with its marker (no single-file state); a run stopped after step 3 and resumed logs steps 4..6
    bit for bit as the uninterrupted run, and ``lf eval``'s loader reads the final weights exactly."""
    from lf_orchestrator.checkpoint import latest_checkpoint, load_weights

    cfg = load_config(tiny_config, ["eval.at_end=false", "train.ckpt_every=1", "train.async_checkpoint=true",
                                    "train.keep_checkpoints=4"])
    full = tmp_path / "full"
    full.mkdir()
    trainer = _trainer(cfg, full)
    trainer.fit()
    root = full / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", *(f"step-{s:08d}" for s in range(3, 7))]
    last = latest_checkpoint(full)
    assert last.name == (root / "latest").read_text() == "step-00000006"
    assert {".lf_complete", ".metadata", "train_state.pt"} <= {p.name for p in last.iterdir()}
    assert not (last / "model.safetensors").exists() and not (last / "state.pt").exists()
    weights = load_weights(last)
    assert weights.keys() == trainer.model.state_dict().keys()
    assert all(torch.equal(weights[k], v) for k, v in trainer.model.state_dict().items())

    cut = _stopped_copy(full, tmp_path / "cut")
    resumed = _trainer(cfg, cut, resume=True)
    assert resumed.step == STOP and resumed.resharded is None
    resumed.fit()
    assert _losses(cut) == _losses(full)


def test_step_zero_checkpoint_leaves_the_run_unchanged(tiny_config, tmp_path):
    """``on_nonfinite = "rollback"`` saves step 0 before training; DCP fills an empty optimizer state with a
    zero-LR step to save it. Oracle: the same run without rollback, bit for bit; the step-0 folder loads back
    an empty optimizer state."""
    base = ["eval.at_end=false", "train.steps=3", "train.warmup_steps=1", "train.keep_checkpoints=5"]
    runs = {}
    for policy in ("stop", "rollback"):
        run_dir = tmp_path / policy
        run_dir.mkdir()
        _trainer(load_config(tiny_config, [*base, f"train.on_nonfinite='{policy}'"]), run_dir).fit()
        runs[policy] = _losses(run_dir)
    assert runs["stop"] == runs["rollback"]
    assert (tmp_path / "rollback" / "checkpoints" / "step-00000000").is_dir()
    (tmp_path / "fresh").mkdir()
    trainer = _trainer(load_config(tiny_config, base), tmp_path / "fresh")
    trainer._restore(tmp_path / "rollback" / "checkpoints" / "step-00000000")
    assert trainer.step == 0 and not trainer.optimizer.state


def _torchrun(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "lf_orchestrator", "run", *args], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def test_dp2_resume_is_exact_and_reshards_to_one_process(tiny_config, tmp_path):
    """2 gloo processes (the auto plan: dp=2, micro-batch 4): stopped after step 3 and resumed under dp=2, steps
    4..6 equal the uninterrupted dp=2 run bit for bit; the same checkpoint resumed on one process (dp=1,
    grad_accum=2: the same 8 samples per step) gives the dp=2 run's step-4 loss within 1e-6 and says that it
    resharded."""
    full = tmp_path / "full"
    common = ["--set", "eval.at_end=false", "--set", "run.threads=1"]
    _torchrun(tmp_path, str(tiny_config), "--run-dir", str(full), *common)
    plan = json.loads((full / "plan.json").read_text())["plan"]  # the auto-tuner's dp=2 plan (ZeRO as it ranks)
    assert plan.startswith("dp=2 ") and "micro_batch=4 grad_accum=1" in plan
    ref = _losses(full)
    assert sorted(ref) == list(range(1, 7))

    cut = _stopped_copy(full, tmp_path / "cut")
    _torchrun(tmp_path, "--resume", str(cut))
    assert _losses(cut) == ref

    one = _stopped_copy(full, tmp_path / "one")
    cfg = load_config(one / "config.toml", ["eval.at_end=false"])
    trainer = _trainer(cfg, one, resume=True)
    assert trainer.step == STOP and trainer.plan.dp == 1 and trainer.plan.grad_accum == 2
    assert "on 2 processes" in trainer.resharded and "on 1 processes" in trainer.resharded
    got = trainer.train_step()["train/loss"]
    assert abs(got - ref[STOP + 1]) <= 1e-6 * abs(ref[STOP + 1]), (got, ref[STOP + 1])


def test_legacy_full_state_checkpoint_resumes(tiny_config, tmp_path):
    """A folder in the layout of lf-orchestrator 0.3 (``model.safetensors`` + ``state.pt``, written here from a
    trainer's state as that version did) resumes: the next step's loss equals the DCP-resumed run's, bit for bit,
    and ``lf eval``'s loader reads its weights."""
    from safetensors.torch import save_file

    from lf_orchestrator.checkpoint import latest_checkpoint, load_weights

    cfg = load_config(tiny_config, ["eval.at_end=false"])
    run = tmp_path / "run"
    run.mkdir()
    trainer = _trainer(cfg, run)

    class Stop(Exception):
        pass

    def stop_at_3(step, _):
        if step == STOP:
            raise Stop

    with pytest.raises(Stop):
        trainer.fit(stop_at_3)  # before step 3's checkpoint: write it in both layouts from this state
    trainer.save()
    legacy = tmp_path / "legacy"
    shutil.copytree(run, legacy)
    shutil.rmtree(legacy / "checkpoints" / "step-00000003")
    folder = legacy / "checkpoints" / "step-00000003"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in trainer.model.state_dict().items()}, str(folder / "model.safetensors"))
    torch.save({"step": 3, "optimizer": trainer.optimizer.state_dict(), "scheduler": trainer.scheduler.state_dict(),
                "sampler": trainer.sampler.state_dict(), "rng_cpu": torch.get_rng_state(),
                "plan": trainer.plan.describe(), "scaler": trainer.scaler.state_dict()}, folder / "state.pt")
    assert latest_checkpoint(legacy) == folder
    assert load_weights(folder).keys() == trainer.model.state_dict().keys()
    losses = []
    for run_dir in (run, legacy):  # one after the other: each restores the global RNG
        resumed = _trainer(cfg, run_dir, resume=True)
        assert resumed.step == STOP
        losses.append(resumed.train_step()["train/loss"])
    assert losses[0] == losses[1]
