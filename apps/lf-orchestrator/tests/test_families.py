"""The llm / vlm / video families under the recipe trainer, from the example configs, tiny on the CPU.

Oracles: held-out metrics at fixed inputs before and after training (a falling loss; per-step losses of a few
steps are too noisy), the uninterrupted run's logged losses (a resumed run must repeat them exactly), the
parameters before training (what LoRA / freezing may change), the written files read back (mp4 decoded with
PyAV), and the plan checker's messages.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lf_orchestrator.cli import app
from lf_orchestrator.config import load_config, to_toml
from lf_orchestrator.train import Trainer
from lf_parallel import init_distributed

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run fastest on one thread


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("corpus")


def _llm(corpus_dir: Path, *extra: str):
    return load_config(EXAMPLES / "llama3_pretrain.toml", [
        f"corpus.cache_dir='{corpus_dir}'", "corpus.max_chars=60000", "corpus.seq_len=64", "corpus.eval_fraction=0.1",
        "train.global_batch=8", "parallel.micro_batch=4", "train.warmup_steps=2", "train.log_every=1",
        "run.threads=1", *extra])


def _vision(example: str, dataset_dir: Path, *extra: str):
    return load_config(EXAMPLES / example, [
        "data.source='lerobot'", f"data.path='{dataset_dir}'", "data.tasks=['reach-v3']", "data.image_size=32",
        "data.max_steps=60", "train.warmup_steps=2", "train.log_every=1", "run.threads=1", *extra])


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def test_llm_example_trains_and_perplexity_falls(corpus_dir, tmp_path):
    """The llama3 example (tiny, 16 steps): finite losses, held-out perplexity below the initial one, files."""
    cfg = _llm(corpus_dir, "train.steps=16", "train.ckpt_every=8", "train.lr=5e-3")
    trainer = Trainer(cfg, tmp_path, init_distributed("cpu"))
    before = trainer.evaluate()["eval/perplexity"]
    summary = trainer.fit()
    after = summary["eval"]["eval/perplexity"]
    losses = _losses(tmp_path)
    assert sorted(losses) == list(range(1, 17)) and all(math.isfinite(v) for v in losses.values())
    assert before > 500 and after < 0.75 * before, (before, after)  # ln(1024) = 6.9 nats at init
    assert (tmp_path / "tokenizer.json").is_file() and (tmp_path / "checkpoints" / "latest").is_file()
    meta = json.loads((tmp_path / "corpus.json").read_text())
    assert meta["train_rows"] == trainer.family.num_samples and meta["eval_documents"] > 0


class _Crash(Exception):
    pass


def test_llm_resume_is_exact(corpus_dir, tmp_path):
    """Crash during step 6 (checkpoint at 4, step 5 already logged), resume: steps 1..8 log the uninterrupted
    run's losses exactly (same batches, same updates, same schedule)."""
    ctx = init_distributed("cpu")
    cfg = _llm(corpus_dir, "train.steps=8", "train.ckpt_every=4", "eval.at_end=false")
    Trainer(cfg, tmp_path / "full", ctx).fit()

    def crash(step: int, _scalars: dict) -> None:
        if step == 5:
            raise _Crash

    with pytest.raises(_Crash):
        Trainer(cfg, tmp_path / "part", ctx).fit(crash)
    resumed = Trainer(cfg, tmp_path / "part", ctx, resume=True)
    assert resumed.step == 4
    resumed.fit()
    full, part = _losses(tmp_path / "full"), _losses(tmp_path / "part")
    assert sorted(part) == list(range(1, 9))
    assert [part[s] for s in range(1, 9)] == [full[s] for s in range(1, 9)]


def _lrs(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/lr"] for r in rows if "train/lr" in r}


def test_resume_with_more_steps_follows_the_new_schedule(corpus_dir, tmp_path):
    """Oracle: a fresh 8-step run's learning rates. A 4-step run resumed with train.steps=8 uses the 8-step cosine
    schedule from step 5 on (before: step 5 took the 4-step schedule's floor)."""
    ctx = init_distributed("cpu")
    Trainer(_llm(corpus_dir, "train.steps=8", "train.ckpt_every=4", "eval.at_end=false"), tmp_path / "full",
                  ctx).fit()
    Trainer(_llm(corpus_dir, "train.steps=4", "train.ckpt_every=4", "eval.at_end=false"), tmp_path / "part",
                  ctx).fit()
    resumed = Trainer(_llm(corpus_dir, "train.steps=8", "train.ckpt_every=4", "eval.at_end=false"),
                            tmp_path / "part", ctx, resume=True)
    resumed.fit()
    full, part = _lrs(tmp_path / "full"), _lrs(tmp_path / "part")
    assert sorted(part) == list(range(1, 9))
    assert [part[s] for s in range(5, 9)] == pytest.approx([full[s] for s in range(5, 9)], rel=1e-12)
    assert part[5] > part[4]  # the 4-step run had decayed to its floor; the 8-step schedule is mid-way


def test_lora_changes_only_adapters(corpus_dir, tmp_path):
    """train.lora_rank = 4 on q and v: after 3 steps every base weight equals its initial value, every
    lora_a / lora_b of the wrapped linears moved (lora_b starts at zero)."""
    cfg = _llm(corpus_dir, "train.steps=3", "train.lora_rank=4", "train.lora_targets=['*.q', '*.v']",
               "eval.at_end=false", "train.ckpt_every=3", "train.weight_decay=0.0")
    trainer = Trainer(cfg, tmp_path, init_distributed("cpu"))
    start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    assert len(trainer.plan_info["lora_modules"]) == 4  # tiny llama3: 2 blocks x (q, v)
    trainer.fit()
    end = trainer.model.state_dict()
    changed = {k for k in start if not torch.equal(start[k], end[k])}
    lora = {k for k in start if ".lora_" in k}
    assert changed == lora and len(lora) == 8


def test_manual_plan_is_checked_before_launch(tmp_path, corpus_dir):
    """A parallel.spec that does not fit the job fails with the checker's message, before any training."""
    cfg_path = tmp_path / "bad.toml"
    cfg_path.write_text((EXAMPLES / "llama3_pretrain.toml").read_text())
    result = CliRunner().invoke(app, ["run", str(cfg_path), "--set", "parallel.plan='manual'",
                                      "--set", "parallel.spec='tp=2'", "--set", f"run.out_dir='{tmp_path}/runs'",
                                      "--set", f"corpus.cache_dir='{corpus_dir}'", "--set", "corpus.max_chars=60000",
                                      "--set", "corpus.seq_len=64", "--set", "run.device='cpu'"])
    assert result.exit_code == 2
    assert "must equal the number of processes (1)" in result.output
    assert not (tmp_path / "runs").exists()  # no run folder, and not the runs/ made for it either


def test_vlm_example_trains_on_answers_with_frozen_vision(dataset_dir, tmp_path):
    """The qwen2_vl example: labels exist on the answer (instruction + <im_end>) only; the frozen vision tower is
    unchanged and the text decoder moved; held-out answer cross-entropy falls."""
    cfg = _vision("qwen2_vl_sft.toml", dataset_dir, "train.steps=12", "train.ckpt_every=12",
                  "vlm.eval_fraction=0.5", "train.global_batch=4", "parallel.micro_batch=4")
    trainer = Trainer(cfg, tmp_path, init_distributed("cpu"))
    fam = trainer.family
    batch = fam.collate([0, 1], 0)
    answer = len(fam._words(fam.dataset.tasks[0])) + 1
    assert ((batch["labels"] != -100).sum(1) == answer).all()
    assert batch["pixel_values"].shape == (2 * 16, 3 * 2 * 14 * 14)  # 56 px: 4 x 4 patches of 14 px, 2 frames
    assert batch["image_grid_thw"].tolist() == [[1, 4, 4]] * 2
    start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    before = trainer.evaluate()["eval/cross_entropy"]
    summary = trainer.fit()
    end = trainer.model.state_dict()
    assert all(torch.equal(start[k], end[k]) for k in start if k.startswith("components.vision."))
    assert not torch.equal(start["components.text.layers.0.weight"], end["components.text.layers.0.weight"])
    assert summary["eval"]["eval/cross_entropy"] < 0.8 * before


def test_video_example_trains_and_lf_sample_writes_mp4(dataset_dir, tmp_path):
    """The wan_t2v example (VAE latents cached once): the fixed-noise velocity MSE falls; `lf sample` writes an mp4
    that PyAV decodes to the requested frame count (9 and 5) at the data's image size."""
    import av

    cfg = _vision("wan_t2v.toml", dataset_dir, "train.steps=30", "train.ckpt_every=30", "train.lr=3e-3",
                  f"video.cache_dir='{tmp_path / 'latents'}'", "data.episodes_per_task=3")
    run_dir = tmp_path / "run"
    trainer = Trainer(cfg, run_dir, init_distributed("cpu"))
    before = trainer.evaluate()["eval/flow_loss"]
    cached = list((tmp_path / "latents").glob("*/latents.safetensors"))
    assert len(cached) == 1
    summary = trainer.fit()
    assert summary["eval"]["eval/flow_loss"] < 0.9 * before
    (run_dir / "config.toml").write_text(to_toml(cfg))  # what `lf run` writes
    from lf_data import METAWORLD_INSTRUCTIONS

    assert json.loads((run_dir / "trained_instructions.json").read_text()) == [METAWORLD_INSTRUCTIONS["reach-v3"]]
    for frames in (9, 5):
        out = tmp_path / f"clip{frames}.mp4"
        result = CliRunner().invoke(app, ["sample", str(run_dir), "--prompt", "reach the red goal position",
                                          "--frames", str(frames), "--steps", "3", "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert "none of the" not in result.output  # the trained instruction: no warning
        with av.open(str(out)) as c:
            decoded = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
        assert len(decoded) == frames and decoded[0].shape == (32, 32, 3)


def test_lf_eval_refuses_a_non_vla_run_naming_the_recipe(tmp_path):
    """Oracle: the contract of `lf eval` (Meta-World closed loop is for VLA runs only): exit 2 (usage), and the
    message names the config file, the recipe and where the family's evaluation is."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(to_toml(load_config(EXAMPLES / "llama3_pretrain.toml")))
    out = CliRunner().invoke(app, ["eval", str(run)])
    assert out.exit_code == 2
    assert "model.recipe = 'llama3'" in out.output and "metrics.jsonl" in out.output
