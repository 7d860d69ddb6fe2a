"""The plan matrix of `lf parallel check` through the trainer: llama3, qwen2_vl, wan_dit and the VLA at 2, 4 and 8
CPU processes. Too long for CI's budget (about 20 minutes on 2 cores): runs with ``LF_PARALLEL_MATRIX=1``
(``LF_PARALLEL_MATRIX=1 pytest apps/lf-orchestrator/tests/test_parallel_matrix.py``); CI runs one case of each
kind in ``test_parallel_cmd.py``, ``test_family_pipeline.py`` and ``test_vla_parallel.py``.

Oracle: the single-process `lf run` of the same config (`lf parallel check`): per-step losses and gradient norms
and the final parameters (the model's 1-norm) within 1e-5 relative, every step clipping.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lf_orchestrator.cli import app

pytestmark = pytest.mark.skipif(os.environ.get("LF_PARALLEL_MATRIX") != "1",
                                reason="the plan matrix takes ~20 minutes: set LF_PARALLEL_MATRIX=1")

FOUR_LAYERS = ("--set", "model.overrides.layers=4")
"""The tiny llama3 has 2 blocks; the interleaved schedules need one per virtual stage."""
CASES = [
    # every pipeline schedule with dp and with ZeRO-1/2/3, gradient accumulation > 1
    ("llama3", "pp=2,pp_schedule=gpipe,dp=2,zero=1,grad_accum=2", 4, ()),
    ("llama3", "pp=2,pp_schedule=1f1b,dp=2,zero=2,grad_accum=2", 4, ()),
    ("llama3", "pp=2,pp_schedule=interleaved_1f1b,pp_virtual_stages=2,dp=2,zero=3,grad_accum=4", 4, FOUR_LAYERS),
    ("llama3", "pp=2,pp_schedule=zero_bubble,dp=2,zero=3,grad_accum=2", 4, ()),
    ("llama3", "pp=2,pp_schedule=zero_bubble,pp_virtual_stages=2,dp=2,zero=1,grad_accum=4", 4, FOUR_LAYERS),
    # tensor parallel x ZeRO-3, with and without pipeline stages
    ("llama3", "tp=2,sp=1,dp=2,zero=3", 4, ()),
    ("llama3", "tp=2,pp=2,dp=2,zero=3,grad_accum=2", 8, ()),
    # context parallel ring / Ulysses x ZeRO-3
    ("llama3", "cp=2,cp_kind=ring,dp=2,zero=3", 4, ()),
    ("wan_dit", "cp=2,cp_kind=ulysses,dp=2,zero=3", 4, ()),
    ("wan_dit", "cp=2,cp_kind=ring,zero=3", 2, ()),
    # a heterogeneous VLM plan: the vision tower replicated, the text model tensor parallel
    ("qwen2_vl", "tp=2,vision.tp=1,dp=2,zero=3", 4, ()),
    ("qwen2_vl", "dp=2,zero=2,grad_accum=2", 2, ()),
    # the VLA on the same trainer
    ("vla", "pp=2,pp_schedule=1f1b,dp=2,zero=3,grad_accum=2", 4, ()),
    ("vla", "tp=2,sp=1,dp=2,zero=3", 4, ()),
    ("vla_flow", "tp=2,dp=2,zero=2", 4, ()),
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("matrix")


@pytest.mark.parametrize("recipe,plan,nproc,extra", CASES, ids=[f"{r}-{p}" for r, p, _, _ in CASES])
def test_plan_equals_one_process(cache, recipe, plan, nproc, extra):
    work = cache / re.sub(r"[^a-z0-9]+", "_", f"{recipe}_{plan}")
    out = CliRunner().invoke(app, ["parallel", "check", "--recipe", recipe, "--plan", plan, "--nproc", str(nproc),
                                   *extra, "--cache-dir", str(cache / "data"), "--work-dir", str(work)])
    text = " ".join(out.output.split())
    assert out.exit_code == 0, text[-4000:]
    found = re.search(r"max_rel_loss=(\S+) max_rel_grad_norm=(\S+) max_rel_param=(\S+)", text)
    assert found and max(float(x) for x in found.groups()) <= 1e-5, text[-2000:]
