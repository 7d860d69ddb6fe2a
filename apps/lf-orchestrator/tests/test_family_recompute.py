"""``memory.recompute = "auto"`` in the recipe trainer: lf-memory's planner per block, for the llm and video families.

One process on the CPU, float32, tiny llama3 and tiny wan_dit examples, a manual plan (dp=1, 2 micro-batches).
The budget ``memory.budget_gib`` is set between what no recomputation and full recomputation keep (the planner's
own totals, plus the weights, gradients and AdamW state the trainer subtracts), so the plan is neither all
``none`` nor all ``full`` (the tiny models get ``selective`` / ``selective_attn`` blocks).
Oracles: the ``memory.recompute = "none"`` run of the same config, bit for bit (recomputation re-runs the same
ops on the same inputs: it changes memory, never numerics); the plan written to ``plan.json`` and printed by
``lf run``; the planner's totals (the chosen plan lies strictly between them and within the budget).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lf_memory import estimate_memory, plan_recompute
from lf_orchestrator.cli import app
from lf_orchestrator.train import Trainer
from lf_parallel import init_distributed, trunk_component

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
STEPS = 4
PLAN = ["parallel.plan='manual'", "parallel.dp=1", "parallel.grad_accum=2", "run.device='cpu'", "run.threads=1",
        "memory.precision='fp32'", f"train.steps={STEPS}", "train.warmup_steps=1", "train.log_every=1",
        "train.ckpt_every=100", "eval.at_end=false"]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run fastest on one thread


def _llm(tmp_path: Path) -> tuple[Path, list[str]]:
    return EXAMPLES / "llama3_pretrain.toml", [
        f"corpus.cache_dir='{tmp_path / 'corpus'}'", "corpus.max_chars=60000", "corpus.seq_len=64",
        "corpus.eval_fraction=0.1", "train.global_batch=8", "parallel.micro_batch=4", *PLAN]


def _video(tmp_path: Path, dataset_dir: Path) -> tuple[Path, list[str]]:
    return EXAMPLES / "wan_t2v.toml", [
        "data.source='lerobot'", f"data.path='{dataset_dir}'", "data.tasks=['reach-v3']", "data.image_size=32",
        "data.max_steps=60", "data.episodes_per_task=3", f"video.cache_dir='{tmp_path / 'latents'}'",
        "train.global_batch=4", "parallel.micro_batch=2", "train.lr=3e-3", *PLAN]


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def _budget_between(trainer: Trainer) -> tuple[float, int, int]:
    """(budget GiB halfway between the planner's none and full totals, none bytes, full bytes)."""
    graph, plan = trainer.family.graph, trainer.plan
    seq = {trunk_component(graph): trainer.family.seq_len}
    none = plan_recompute(graph, 2**62, plan.micro_batch, seq, 4, options=("none", "full")).saved_bytes
    full = plan_recompute(graph, 0, plan.micro_batch, seq, 4).saved_bytes
    states = estimate_memory(graph, plan, seq=trainer.family.seq_len, precision="fp32", recompute="full")
    return (states.backward_peak - states.activations + (none + full) // 2) / 2**30, none, full


def _run_auto_against_none(config: Path, sets: list[str], tmp_path: Path) -> dict:
    from lf_orchestrator.config import load_config

    none_dir = tmp_path / "none"
    trainer = Trainer(load_config(config, sets), none_dir, init_distributed("cpu"))
    trainer.fit()
    budget, none, full = _budget_between(trainer)
    assert full < none
    auto_dir = tmp_path / "auto"
    args = ["run", str(config), "--run-dir", str(auto_dir)]
    for item in [*sets, "memory.recompute='auto'", f"memory.budget_gib={budget!r}"]:
        args += ["--set", item]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    info = json.loads((auto_dir / "plan.json").read_text())
    chosen = info["recompute_plan"]
    assert "recompute (auto):" in result.output
    for comp, options in chosen["options"].items():
        assert f"{comp}: {' '.join(options)}" in result.output
    flat = [o for options in chosen["options"].values() for o in options]
    assert set(flat) != {"none"} and full < chosen["saved_bytes"] <= chosen["budget_bytes"]
    assert chosen["saved_bytes"] < none
    assert info["recomputed_blocks"] == [i for i, o in enumerate(flat) if o != "none"]
    auto, plain = _losses(auto_dir), _losses(none_dir)
    assert sorted(auto) == list(range(1, STEPS + 1)) and all(math.isfinite(v) for v in auto.values())
    assert auto[STEPS] < auto[1]
    assert auto == plain
    return chosen


def test_llm_auto_recompute_plans_blocks_within_the_budget_and_matches_none(tmp_path):
    """Tiny llama3 (2 blocks), 4 steps: a plan under a budget between the none and full totals;
    losses equal the ``recompute = "none"`` run's bit for bit, finite and falling."""
    _run_auto_against_none(*_llm(tmp_path), tmp_path)


def test_video_auto_recompute_plans_blocks_within_the_budget_and_matches_none(dataset_dir, tmp_path):
    """Tiny wan_dit (DiT blocks), 4 steps: as the llm test; the DiT blocks get a plan and train unchanged."""
    chosen = _run_auto_against_none(*_video(tmp_path, dataset_dir), tmp_path)
    assert len([o for options in chosen["options"].values() for o in options]) >= 2


def test_auto_recompute_that_cannot_fit_names_the_budget(tmp_path):
    """A budget below the weights, gradients and optimizer state: `lf run` fails before training, naming the key
    and the optimizer step's bytes."""
    config, sets = _llm(tmp_path)
    args = ["run", str(config), "--run-dir", str(tmp_path / "run")]
    for item in [*sets, "memory.recompute='auto'", "memory.budget_gib=0.001"]:
        args += ["--set", item]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0
    assert "memory.budget_gib: 0.001 GiB" in result.output and "which no recompute mode reduces" in result.output


def test_pipeline_ranks_plan_their_own_blocks_with_the_micro_batches_in_flight():
    """pp=2 under 1F1B with 4 micro-batches: rank 0 (embedding + block 0) keeps 2 micro-batches in flight, rank 1
    (block 1 + norm + head) one. Oracle: the whole graph's no-recompute total (one process) equals rank 0's bytes / 2
    + rank 1's bytes; each rank's plan names only its block, and ``stage_plan`` cuts a plan to given modules."""
    from types import SimpleNamespace

    from torch import nn

    from lf_orchestrator.families._recompute import plan_family_recompute, stage_plan
    from lf_orchestrator.families.recipes import recipe_config
    from lf_parallel import Plan

    _, graph = recipe_config("llama3", "tiny", {})
    plan = Plan(pp=2, micro_batch=4, grad_accum=4, pp_schedule="1f1b")
    family, cfg = SimpleNamespace(graph=graph, seq_len=64), SimpleNamespace(memory=SimpleNamespace(budget_gib=1.0))
    ranks = [plan_family_recompute(cfg, family, plan, 4, pp_rank=r) for r in range(2)]
    assert [r.names for r in ranks] == [{"text": ["layer0"]}, {"text": ["layer1"]}]
    whole = plan_recompute(graph, 2**62, 4, {"text": 64}, 4)
    assert whole.block_options() == ["none", "none"] and all(r.block_options() == ["none"] for r in ranks)
    assert ranks[0].saved_bytes / 2 + ranks[1].saved_bytes == whole.saved_bytes
    blocks = [nn.Module(), nn.Module()]
    for block, node in zip(blocks, graph.component("text").blocks(), strict=True):
        block.lf_node = node
    cut = stage_plan(whole, blocks[1:])
    assert (cut.block_names(), cut.block_options()) == (["layer1"], ["none"])
    with pytest.raises(ValueError, match="not in the recompute plan"):
        stage_plan(ranks[0], blocks[1:])
