"""`lf plan CONFIG` / `lf memory CONFIG` size and plan what the run itself trains (issue 5).

Oracles: the config's own values (clip frames and pixels, micro-batch cap, parallel.spec, memory.recompute)
with hand-computed token counts, the family's own graph (what ``lf run`` builds), the trainer's auto plan
(``families._plan.resolve_plan``) and lf-memory's ``estimate_memory`` on the same graph and plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lf_orchestrator.cli import app

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
GIB = 1024 ** 3
runner = CliRunner()

LLAMA_TINY = """
[model]
recipe = "llama3"
size = "tiny"
overrides = { vocab_size = 1024 }
[corpus]
seq_len = 128
[train]
global_batch = 16
"""


def _config(tmp_path: Path, text: str, name: str = "run.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _json(args: list[str]) -> dict:
    out = runner.invoke(app, args)
    assert out.exit_code == 0, out.output
    return json.loads(out.output)


def test_wan_vae_plan_uses_the_config_clip_not_the_recipe_default():
    """Oracle: video.frames = 9 and data.image_size = 64 of examples/wan_vae.toml (9 x 64 x 64 = 36,864 input
    voxels, not 81 x 480 x 832 = 32,348,160), and the graph the video_vae family builds for `lf run`."""
    from lf_orchestrator.config import load_config
    from lf_orchestrator.families.video_vae import VideoVAEFamily
    from lf_orchestrator.plan_cmd import resolve_model

    path = EXAMPLES / "wan_vae.toml"
    graph, tokens, batch = resolve_model(path, None, None, None)
    assert (tokens, batch) == (9 * 64 * 64, 32)
    assert graph == VideoVAEFamily(load_config(path), Path("unused"), None).graph
    d = _json(["plan", str(path), "--gpus", "1", "--json", "--top", "1"])
    assert d["tokens_per_sample"] == 9 * 64 * 64 and d["plans"][0]["peak_gib"] < 10


def test_wan_t2v_plan_uses_the_config_clip(tmp_path):
    """Oracle, by hand: the Wan VAE keeps 1 + (frames - 1) / 4 latent frames and 1/8 of each side; the DiT's
    patch is (1, 2, 2). examples/wan_t2v.toml: 9 frames at data.image_size 32 -> (3, 4, 4) -> 3 x 2 x 2 = 12
    tokens; a synthetic 17 x 64 x 96 clip -> (5, 8, 12) -> 5 x 4 x 6 = 120 (the recipe default is 45)."""
    from lf_orchestrator.plan_cmd import resolve_model

    graph, tokens, _ = resolve_model(EXAMPLES / "wan_t2v.toml", None, None, None)
    assert tokens == 12 and graph.component("video").seq_len == 12
    text = (EXAMPLES / "wan_t2v.toml").read_text().replace(
        "[video]\nframes = 9", '[video]\nlatents = "synthetic"\nframes = 17\nheight = 64\nwidth = 96')
    _, tokens, _ = resolve_model(_config(tmp_path, text), None, None, None)
    assert tokens == 5 * 4 * 6


def test_plan_caps_micro_batch_like_the_trainer(tmp_path):
    """Oracle: parallel.micro_batch = 2 caps every ranked plan (before: up to 16), and the first runnable plan
    of `lf plan CONFIG` is the one `lf run` (parallel.plan = "auto", resolve_plan) picks on the same GPUs."""
    from lf_orchestrator.config import load_config
    from lf_orchestrator.families._plan import resolve_plan
    from lf_orchestrator.plan_cmd import resolve_model

    path = _config(tmp_path, LLAMA_TINY + "[parallel]\nplan = \"auto\"\nmicro_batch = 2\n")
    d = _json(["plan", str(path), "--gpus", "1", "--gpu", "h100", "--precision", "fp32", "--json", "--top", "50"])
    assert all(p["plan"].count("micro_batch=1 ") + p["plan"].count("micro_batch=2 ") == 1 for p in d["plans"])
    graph, tokens, _ = resolve_model(path, None, None, None)
    plan, info = resolve_plan(load_config(path), graph, world_size=1, device_type="cpu", seq=tokens,
                              precision="fp32")
    first = next(p for p in d["plans"] if p["lf_run"] == "yes")
    assert first["plan"] == plan.describe() and first["recompute"] == info["recompute"]


def test_ranking_uses_unrounded_step_time():
    """Oracle: the cost model's own predictions: the ranking is sorted by them, so on a tiny model (steps of
    ~0.3 ms, equal to 0.1 ms) recompute=none (faster) ranks above full; before, rounding tied them and the
    memory tie-break put full first."""
    d = _json(["plan", "--recipe", "llama3", "--size", "tiny", "--seq", "128", "--gpus", "1", "--gpu", "h100",
               "--global-batch", "16", "--json", "--top", "100"])
    steps = [p["step_s"] for p in d["plans"]]
    assert steps == sorted(steps)
    assert d["plans"][0]["recompute"] == "none"


def test_memory_uses_the_config_plan_and_batch():
    """Oracle: examples/full/llama3_8b.toml's parallel.spec = "dp=2,zero=3" and train.global_batch = 2
    (micro-batch 1), estimated by estimate_memory on the same graph. Before: dp=1, global batch 1."""
    from lf_memory import estimate_memory
    from lf_orchestrator.plan_cmd import resolve_model
    from lf_parallel import parse_plan

    path = EXAMPLES / "full" / "llama3_8b.toml"
    d = _json(["memory", str(path), "--gpu", "h200", "--json"])
    assert d["plan"] == "dp=2 zero_stage=3 precision=bf16 micro_batch=1 grad_accum=1 (global batch 2)"
    graph, tokens, _ = resolve_model(path, None, None, None)
    est = estimate_memory(graph, parse_plan("dp=2,zero=3,mb=1", precision="bf16"), seq=tokens)
    assert d["peak_gib"] == pytest.approx(est.total / GIB) == pytest.approx(d["gib"]["total"])
    kinds = {k: v for k, v in d["gib"].items() if k != "total"}
    assert d["sum_gib"] == pytest.approx(sum(kinds.values())) and d["sum_gib"] > d["peak_gib"]


def test_memory_error_for_wrong_gpu_count_is_readable():
    """Oracle: the config's manual spec is a 2-GPU plan, so --gpus 8 is refused naming parallel.spec and --plan
    (before: "parallel.dp=2 must equal ..." for a field the config does not set, then a garbled "try <error>");
    without a config, --gpus 8 estimates data parallel over 8 GPUs."""
    out = runner.invoke(app, ["memory", str(EXAMPLES / "full" / "llama3_8b.toml"), "--gpus", "8"])
    assert out.exit_code == 2
    text = " ".join(out.output.split())
    assert "parallel.spec 'dp=2,zero=3' is a plan for 2 GPU(s), not --gpus 8: pass --plan" in text, text
    out = runner.invoke(app, ["memory", "--recipe", "llama3", "--size", "tiny", "--gpus", "8", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["plan"].startswith("dp=8"), out.output
    out = runner.invoke(app, ["memory", str(EXAMPLES / "full" / "llama3_8b.toml"), "--gpus", "2", "--plan", "dp=1"])
    assert out.exit_code == 2 and "try dp=2" in out.output


def test_memory_uses_config_recompute(tmp_path):
    """Oracle: estimate_memory with the config's memory.recompute = "full" on the same graph and the plan the
    command reports (its ZeRO stage decides whether the norms read a bf16 or float32 residual stream)."""
    from lf_ir.recipes import llama3
    from lf_memory import estimate_memory
    from lf_parallel import parse_plan

    path = _config(tmp_path, LLAMA_TINY + '[memory]\nrecompute = "full"\n')
    d = _json(["memory", str(path), "--json"])
    assert d["recompute"] == "full"
    graph = llama3.build_graph(llama3.llama3_config("tiny", vocab_size=1024), 128)
    assert d["plan"].startswith("dp=1 zero_stage=3 precision=bf16 micro_batch=16 ")
    est = estimate_memory(graph, parse_plan("zero=3,mb=16", precision="bf16"), seq=128, recompute="full")
    assert d["gib"]["activations"] == pytest.approx(est.activations / GIB)
    assert d["gib"]["activations"] < _json(["memory", str(path), "--recompute", "none", "--json"])["gib"][
        "activations"]


def test_memory_recompute_auto_uses_the_planner(tmp_path):
    """Oracle: lf-memory's planner (plan_recompute) as the trainer calls it: a budget far above the model keeps
    every block (none: activations equal estimate_memory's none); a tight budget recomputes some blocks
    and keeps fewer bytes. Without a run config `--recompute auto` names memory.budget_gib."""
    big = _json(["memory", str(_config(tmp_path, LLAMA_TINY + '[memory]\nrecompute = "auto"\nbudget_gib = 100\n',
                                       "big.toml")), "--json"])
    none = _json(["memory", str(_config(tmp_path, LLAMA_TINY, "none.toml")), "--json"])
    assert big["recompute_blocks"] == {"none": 2}
    assert big["gib"]["activations"] == pytest.approx(none["gib"]["activations"])
    full = _json(["memory", str(_config(tmp_path, LLAMA_TINY, "none.toml")), "--recompute", "full", "--json"])
    fixed = full["peak_gib"] - full["gib"]["activations"]  # all but activations, a recomputed block's included
    budget = fixed + 0.7 * none["gib"]["activations"]
    tight = _json(["memory", str(_config(tmp_path, LLAMA_TINY + f'[memory]\nrecompute = "auto"\n'
                                                                 f'budget_gib = {budget}\n', "tight.toml")), "--json"])
    assert set(tight["recompute_blocks"]) - {"none"} and tight["gib"]["activations"] < 0.7 * none["gib"][
        "activations"] + 1e-9
    assert tight["peak_gib"] <= budget + 1e-9  # the whole predicted peak, not only the activations, fits
    out = runner.invoke(app, ["memory", "--recipe", "llama3", "--size", "tiny", "--recompute", "auto"])
    assert out.exit_code == 2 and "memory.budget_gib" in out.output


def test_memory_table_labels_the_peak():
    """Oracle: the estimate's own numbers: the table shows the sum of the kinds and the peak as two labelled
    rows (no row called "total" that is not the sum)."""
    out = runner.invoke(app, ["memory", "--recipe", "llama3", "--size", "tiny", "--seq", "128"])
    assert out.exit_code == 0, out.output
    assert "sum of the kinds" in out.output and "peak (held at once)" in out.output
    assert "│ total" not in out.output


def test_vlm_seq_applies_to_the_language_model():
    """Oracle: Qwen2-VL's graph edge vision -> text makes text the trunk: --seq 512 sets the text tokens and
    is what `lf plan` reports (before: the 32-block vision tower of 7B was main, its 1,024 patches reported)."""
    from lf_orchestrator.plan_cmd import resolve_model

    graph, tokens, _ = resolve_model(None, "qwen2_vl", "7B", 512)
    assert tokens == 512 and graph.component("text").seq_len == 512


def test_plan_and_memory_need_no_data_on_disk(tmp_path, monkeypatch):
    """Oracle: the config's own sample sizes (no dataset read). From a folder without `.lf-cache/`, `lf plan` and
    `lf memory` on the Qwen2-VL full config answer; loading it for a run still refuses the missing data.path."""
    from lf_orchestrator.config import ConfigError, load_config

    monkeypatch.chdir(tmp_path)
    cfg = EXAMPLES / "full" / "qwen2_vl_7b.toml"
    out = runner.invoke(app, ["plan", str(cfg), "--gpus", "2", "--gpu", "h200", "--json"])
    assert out.exit_code == 0, out.output
    out = runner.invoke(app, ["memory", str(cfg), "--gpus", "2", "--gpu", "h200", "--json"])
    assert out.exit_code == 0, out.output
    with pytest.raises(ConfigError, match="data.path: no LeRobot dataset"):
        load_config(cfg)


@pytest.mark.parametrize("args", [["memory", "--gpus", "0"], ["plan", "--seq", "0", "--gpus", "1"],
                                  ["memory", "--seq", "0"]])
def test_zero_gpus_or_tokens_are_refused_by_name(args):
    """Oracle: the options' documented ranges (>= 1): exit 2 naming the flag (before: --gpus 0 was accepted by
    lf memory and --seq 0 silently meant the recipe's default)."""
    out = runner.invoke(app, [*args, "--recipe", "llama3", "--size", "tiny"])
    assert out.exit_code == 2 and f"'{args[1]}'" in out.output, out.output


def test_memory_auto_recompute_peak_stays_within_the_budget_at_full_size():
    """Wan2.1-1.3B at 81 x 480 x 832 on one H200 (examples/full/wan_1p3b.toml, budget_gib = 120): the peak
    `lf memory` predicts for the auto plan is within memory.budget_gib (it was 121.3 GiB when the planner left out
    the working copies and temporaries), and the plan recomputes some blocks but not all."""
    out = _json(["memory", str(EXAMPLES / "full" / "wan_1p3b.toml"), "--gpus", "1", "--gpu", "h200", "--json"])
    assert out["recompute"] == "auto" and out["peak_gib"] <= 120.0
    assert out["recompute_blocks"].get("none", 0) > 0 and set(out["recompute_blocks"]) - {"none"}
    assert out["peak_gib"] > 100.0  # the budget is used, not wasted on needless recomputation
