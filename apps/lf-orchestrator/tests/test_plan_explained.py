"""What `lf plan` / `lf memory` print about their own numbers (issue 25): the tokens per sample they used and where
from (`--recipe llama3` without --seq took the model's 131,072-token maximum silently), what the plan keys mean
(dp = dp_replicate x dp_shard) and which "stage" `lf memory` reports (a pipeline stage, and the ZeRO stage
spelled out). Oracles: `lf ir show`'s default for the same recipe (ir_cmd.default_seq), the explicit --seq run,
and lf_parallel.Plan's own definitions (dp_shard = dp / dp_replicate, ZeRO-0 = every rank holds everything)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from lf_orchestrator.cli import app

runner = CliRunner()


def _run(args: list[str]) -> str:
    result = runner.invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code in (0, 1), result.output  # lf memory exits 1 when the plan does not fit
    return result.output


def test_plan_and_memory_default_to_the_typical_training_length_and_say_so():
    """Without --seq, llama3 is planned at 8,192 tokens per sample (as `lf ir show`), the same numbers as --seq 8192,
    and the output names where the length came from; --seq is reported as --seq."""
    base = ["plan", "--recipe", "llama3", "--size", "1B", "--gpus", "8", "--top", "1", "--json"]
    default, explicit = json.loads(_run(base)), json.loads(_run([*base, "--seq", "8192"]))
    assert default["tokens_per_sample"] == 8192
    assert default["tokens_per_sample_from"].startswith("llama3's typical training length")
    assert explicit["tokens_per_sample_from"] == "--seq"
    assert default["plans"][0]["step_s"] == explicit["plans"][0]["step_s"]
    mem = json.loads(_run(["memory", "--recipe", "llama3", "--size", "1B", "--json"]))
    assert (mem["tokens_per_sample"], mem["tokens_per_sample_from"][:6]) == (8192, "llama3")


def test_plan_output_explains_dp_and_its_split():
    """The footer says where the tokens per sample came from, defines dp as the total data-parallel degree =
    dp_replicate x dp_shard, and ZeRO-0 for plans that leave zero_stage out; an HSDP plan gets its split worked out
    (64 = 32 replicas x 2-way sharding)."""
    text = _run(["plan", "--recipe", "llama3", "--size", "1B", "--gpus", "8", "--top", "3"])
    assert "tokens per sample: 8,192, from llama3's typical training length; the model allows up to 131,072 " \
           "(--seq to change)" in text
    assert "plan keys:" in text
    assert "dp: data-parallel degree, in total: ranks that each train on a different slice of the batch; " \
           "dp = dp_replicate x dp_shard" in text
    assert "zero_stage: ZeRO stage; left out = 0, no sharding" in text
    from lf_orchestrator._plan_legend import plan_legend

    lines = plan_legend(["dp=64 dp_replicate=32 zero_stage=3 micro_batch=1 grad_accum=1 (global batch 64)"])
    assert any(line.startswith("dp_replicate: HSDP replicas") and "dp_shard = dp / dp_replicate" in line
               for line in lines)
    assert lines[-1] == "e.g. dp=64 dp_replicate=32: 32 HSDP replicas x 2-way sharding (ZeRO-3) = 64-way data parallel"


def test_memory_names_the_pipeline_stage_and_spells_out_the_zero_stage():
    """`lf memory` said "stage 0" (the pipeline stage with the highest peak), easily read as ZeRO stage 0: the title
    says "pipeline stage 0 of 1" and the footer spells out both stages."""
    hsdp = "dp=4,dp_replicate=2,zero=3"
    text = _run(["memory", "--recipe", "llama3", "--size", "1B", "--seq", "1024", "--plan", hsdp, "--gpus", "4"])
    flat = " ".join(text.replace("│", " ").split())
    assert "pipeline stage 0 of 1" in flat
    assert "ZeRO stage 3 (parameters, gradients and optimizer state all sharded over the data-parallel ranks" in text
    assert "pipeline stage 0 of 1: the figures are for the pipeline stage with the highest peak" in text
    assert "e.g. dp=4 dp_replicate=2: 2 HSDP replicas x 2-way sharding (ZeRO-3) = 4-way data parallel" in text
    ddp = _run(["memory", "--recipe", "llama3", "--size", "1B", "--seq", "1024", "--plan", "dp=2", "--gpus", "2"])
    assert "ZeRO stage 0 (no sharding: every data-parallel rank holds the full parameters, gradients and " \
           "optimizer state, as DDP)" in ddp
