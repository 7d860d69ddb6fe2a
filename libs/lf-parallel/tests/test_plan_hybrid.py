"""Hybrid plans: parsing, describing, validation against the IR graph, mesh shapes, and the TP plan
derived from the IR annotations. Oracle: hand-derived plans and the constraint each must meet."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

from lf_ir.recipes import llama3, vla
from lf_parallel._mesh import mesh_shape
from lf_parallel._plan import ComponentPlan, Plan, PlanError, check_plan, parse_plan
from lf_parallel._tensor_parallel import tensor_parallel_styles

LLAMA = llama3.build_graph(llama3.llama3_config("tiny"), 16)  # heads 4, kv_heads 2, ffn 160, vocab 256, 2 blocks
VLA = vla.build_graph(vla.vla_config("tiny"))  # vision heads 2, backbone heads 4 / kv 2


def test_parse_and_describe_round_trip():
    plan = parse_plan("tp=2,sp=true,dp_replicate=2,dp_shard=2,zero=3,vision.tp=1,mb=2,grad_accum=2")
    assert plan == Plan(tp=2, sp=True, dp=4, dp_replicate=2, zero_stage=3, micro_batch=2, grad_accum=2,
                        components={"vision": ComponentPlan(tp=1)})
    assert plan.dp_shard == 2 and plan.world_size == 8
    assert plan.describe() == ("dp=4 dp_replicate=2 zero_stage=3 tp=2 sp=true vision.tp=1 micro_batch=2 "
                               "grad_accum=2 (global batch 16)")
    assert parse_plan(plan.describe().split(" (")[0].replace(" ", ",")) == plan
    assert Plan(dp=2, micro_batch=16, grad_accum=2).describe() == "dp=2 micro_batch=16 grad_accum=2 (global batch 64)"


@pytest.mark.parametrize("text,message", [
    ("tp=2,foo=3", "unknown key 'foo'"),
    ("tp=two", "tp must be an integer, got 'two'"),
    ("tp=2,tp=4", "key 'tp' given twice"),
    ("sp=maybe", "sp must be true/false, got 'maybe'"),
    ("vision.pp=2", "unknown component key 'vision.pp'"),
    ("pp=2,pp_schedule=round_robin", "pp_schedule"),
    ("tp", "item 'tp' is not key=value"),
])
def test_parse_errors_name_the_key(text, message):
    with pytest.raises(PlanError, match=message):
        parse_plan(text)


def test_parse_misspelled_key_suggests_the_close_one():
    """Oracle: the plan's key names; a near miss of one is named as a suggestion (as config keys are)."""
    with pytest.raises(PlanError, match=r"unknown key 'zer'; did you mean 'zero'\?"):
        parse_plan("dp=1,zer=3")
    with pytest.raises(PlanError) as err:  # nothing close: no suggestion
        parse_plan("tp=2,foo=3")
    assert "did you mean" not in str(err.value)


@pytest.mark.parametrize("plan,world,graph,message,nearby", [
    (Plan(dp=2, tp=2, zero_stage=3, micro_batch=2), 8, LLAMA,
     r"dp\*tp\*pp\*cp = 2\*2\*1\*1 = 4 must equal the number of processes \(8\)", "dp=4 zero_stage=3 tp=2"),
    (Plan(tp=8, micro_batch=4), 8, LLAMA, "parallel.tp=8 does not divide heads=4 of node 'layer0.attention'", "tp=2"),
    (Plan(tp=4, micro_batch=4), 4, LLAMA, "parallel.tp=4 does not divide kv_heads=2 of node 'layer0.attention'",
     "dp=2 zero_stage=3 tp=2"),
    (Plan(tp=2, micro_batch=4), 2, llama3.build_graph(llama3.llama3_config("tiny", ffn_hidden=161), 16),
     "parallel.tp=2 does not divide up.weight dim 0 = 161 of node 'layer0.mlp'", "dp=2"),
    (Plan(tp=2, micro_batch=4), 2, llama3.build_graph(llama3.llama3_config("tiny", vocab_size=255), 16),
     "parallel.tp=2 does not divide weight dim 0 = 255 of node 'head'", "dp=2"),
    (Plan(pp=4, grad_accum=4), 4, LLAMA, r"pp\*pp_virtual_stages = 4\*1 = 4 pipeline stages but .* only 2 "
                                         r"transformer blocks", "pp=2"),
    (Plan(cp=4, cp_kind="ulysses", micro_batch=4), 4, LLAMA,
     "parallel.cp=4 \\(ulysses\\) does not divide the 2 local kv_heads", "cp=2"),
    (Plan(tp=2, dp=2, micro_batch=2), 4, LLAMA, "DDP cannot wrap tensor-parallel", "dp=2 zero_stage=3 tp=2"),
    (Plan(tp=2, micro_batch=4, components={"vision": ComponentPlan(tp=1)}), 2, LLAMA,
     "parallel.components.vision: graph 'llama3' has no such component", "tp=2"),
    (Plan(dp=2, dp_replicate=2, micro_batch=2), 2, None, "dp_replicate=2 needs zero_stage 2 or 3", "dp=2"),
    (Plan(sp=True, micro_batch=4), 1, None, "sp=true needs tp > 1", "dp=1"),
    (Plan(dp=2, micro_batch=1), 2, None, r"dp\*micro_batch\*grad_accum = 2 but train.global_batch = 4", "dp=2"),
])
def test_invalid_plans_fail_before_launch_with_a_valid_nearby_plan(plan, world, graph, message, nearby):
    with pytest.raises(PlanError, match=message) as info:
        check_plan(plan, world_size=world, global_batch=4, graph=graph)
    suggestion = str(info.value).split("; try ")[-1]
    assert nearby in suggestion
    fixed = parse_plan(suggestion.split(" (")[0].replace(" ", ","))
    assert check_plan(fixed, world_size=world, global_batch=4, graph=graph) is fixed


def test_valid_hybrid_plans_pass():
    for text, world in [("tp=2,sp=1,dp=2,zero=3,mb=2", 4), ("pp=2,schedule=gpipe,dp=2,mb=2", 4),
                        ("cp=2,cp_kind=ring,tp=2,mb=4", 4), ("tp=2,dp=2,zero=2,vision.tp=1,mb=2", 4)]:
        plan = parse_plan(text)
        assert check_plan(plan, world_size=world, global_batch=4, graph=VLA) is plan


def test_mesh_shape_per_zero_stage():
    assert mesh_shape(Plan(dp=4)) == {"pp": 1, "dp_replicate": 4, "dp_shard": 1, "cp": 1, "tp": 1}
    assert mesh_shape(Plan(dp=4, zero_stage=3)) == {"pp": 1, "dp_replicate": 1, "dp_shard": 4, "cp": 1, "tp": 1}
    assert mesh_shape(parse_plan("pp=2,dp_replicate=2,dp_shard=2,zero=2,cp=2,tp=2")) == {
        "pp": 2, "dp_replicate": 2, "dp_shard": 2, "cp": 2, "tp": 2}


def _styles(model, text):
    return tensor_parallel_styles(model, parse_plan(text))


def test_tp_plan_is_read_from_the_ir_annotations():
    """Column linears -> Colwise, row -> Rowwise, norms -> SequenceParallel (SP), heads vocab-parallel."""
    with torch.device("meta"):
        model = llama3.Llama3Model(llama3.llama3_config("tiny"))
    plain, sp = _styles(model, "tp=2"), _styles(model, "tp=2,sp=1")
    block = "components.text.layers.1"
    assert {k.removeprefix(block + ".") for k in plain if k.startswith(block)} == {
        "attention.q", "attention.k", "attention.v", "attention.o", "mlp.gate", "mlp.up", "mlp.down"}
    assert type(plain[f"{block}.attention.q"]) is ColwiseParallel
    assert type(plain[f"{block}.mlp.down"]) is RowwiseParallel
    assert plain[f"{block}.mlp.down"].output_layouts == (Replicate(),)
    head = plain["components.text.layers.4"]  # column-parallel head: vocab-sharded DTensor logits
    assert head.output_layouts == (Shard(-1),) and not head.use_local_output
    assert "components.text.layers.0" not in plain  # the embedding is annotated tp="replicate"
    # SP: norms sequence-parallel, row outputs reduce-scattered, seq split on entry, head gathers seq
    assert isinstance(sp[f"{block}.attn_norm"], SequenceParallel)
    assert sp[f"{block}.mlp.down"].output_layouts == (Shard(1),)
    assert type(sp["components.text.layers.1"]).__name__ == "_SeqBoundary"  # scatter into the first block
    assert isinstance(sp["components.text.layers.3"], SequenceParallel)  # final norm
    assert sp["components.text.layers.4"].input_layouts == (Shard(1),)


def test_vocab_parallel_embedding_and_component_override():
    with torch.device("meta"):
        from lf_parallel._harness_recipes import HARNESS_RECIPES

        tied = HARNESS_RECIPES["llama3_tied_vocab_parallel"].build("tiny")
        vla_model = vla.VLAModel(vla.vla_config("tiny"))
    styles = _styles(tied, "tp=2,sp=1")
    embed = styles["components.text.layers.0"]
    assert type(embed) is RowwiseParallel and embed.output_layouts == (Shard(1),)  # reduce-scatter into SP
    assert "components.text.layers.1" not in styles  # no separate split: the embedding already did it
    hetero = _styles(vla_model, "tp=2,vision.tp=1")
    assert not any(k.startswith("components.vision") for k in hetero)
    assert any(k.startswith("components.backbone.layers.1.attention") for k in hetero)
    assert any(k.startswith("components.vision") for k in _styles(vla_model, "tp=2"))
