"""``lf ir show`` on the ~3B VLA sizes. Oracle: the lowered model's parameter count on the meta device."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from lf_orchestrator.cli import app


@pytest.mark.parametrize("recipe", ["vla", "vla_flow"])
def test_ir_show_vla_3b(recipe):
    from lf_ir.recipes.vla import VLAModel, vla_config
    from lf_ir.recipes.vla_flow import VLAFlowModel, vla_flow_config

    out = CliRunner().invoke(app, ["ir", "show", "--recipe", recipe, "--size", "3B", "--json"])
    assert out.exit_code == 0, out.output
    d = json.loads(out.output)
    with torch.device("meta"):
        model = VLAModel(vla_config("3B")) if recipe == "vla" else VLAFlowModel(vla_flow_config("3B"))
    assert d["params"] == sum(p.numel() for p in model.parameters()) > 3.0e9
    assert d["config"]["image_size"] == 224 and d["train_flops_per_sample"] > 0
