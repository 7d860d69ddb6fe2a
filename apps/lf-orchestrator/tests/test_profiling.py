"""``train.profile_steps``: the step window's profile files, and the kernel-time arithmetic behind them.

Oracles: interval sums written out by hand for :func:`summarize_kernels`; for the fit loop, the files the
module docstring of :mod:`lf_orchestrator.profiling` promises, holding the profiled step numbers and the
aten ops the scripted steps ran.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_fit_loop import _fit, _Trainer

from lf_orchestrator.config import ConfigError, load_config
from lf_orchestrator.profiling import kernel_category, kernel_intervals, summarize_kernels


def test_kernel_categories():
    """Oracle: the kernel names of an H200 Llama step (nvJet / cuDNN / NCCL / fused Adam / elementwise)."""
    assert kernel_category("nvjet_tst_256x128_64x4_2x1_v_bz_coopA_NNT") == "matmul"
    assert kernel_category("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64") == "matmul"
    assert kernel_category("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16") == "attention"
    assert kernel_category("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>") == "attention"
    assert kernel_category("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "communication"
    assert kernel_category("void at::native::(anonymous namespace)::fused_adam_kernel<float>") == "optimizer"
    assert kernel_category("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>") == "other"


def test_summarize_kernels_by_hand():
    """Oracle: two steps over 10 s of wall time; gemm [0, 4], nccl [3, 6] (1 s overlapped, 2 s exposed),
    attention [7, 8]: busy 7 s, idle 3 s, per step halves of those."""
    kernels = [("nvjet_gemm", 0.0, 4.0), ("ncclDevKernel_AllGather", 3.0, 6.0), ("flash_fwd", 7.0, 8.0)]
    s = summarize_kernels(kernels, steps=2, wall_s=10.0)
    assert s["kernel_s_per_step"] == {"matmul": 2.0, "communication": 1.5, "attention": 0.5}
    assert s["busy_s_per_step"] == pytest.approx(3.5) and s["idle_s_per_step"] == pytest.approx(1.5)
    assert s["exposed_communication_s_per_step"] == pytest.approx(1.0)
    assert s["wall_s_per_step"] == 5.0
    assert [k["name"] for k in s["top_kernels"]] == ["nvjet_gemm", "ncclDevKernel_AllGather", "flash_fwd"]
    assert s["top_kernels"][0]["calls"] == 0  # 1 call over 2 steps rounds down


def test_kernel_intervals_skip_gpu_annotations():
    """Oracle: a kernel and the ``nccl:`` annotation around it (both on the GPU timeline), a CPU op: only the
    kernel is kept, in seconds."""
    from types import SimpleNamespace as NS

    def event(name, start_us, end_us, device, annotation=False):
        return NS(name=name, time_range=NS(start=start_us, end=end_us), device_type=device,
                  is_user_annotation=annotation)

    events = [event("ncclDevKernel_AllGather", 10.0, 30.0, "gpu"), event("nccl:_all_gather_base", 10.0, 30.0, "gpu",
                                                                        True), event("aten::mm", 0.0, 5.0, "cpu")]
    assert kernel_intervals(events, "gpu") == [("ncclDevKernel_AllGather", pytest.approx(1e-5), pytest.approx(3e-5))]


class _MatmulTrainer(_Trainer):
    def train_step(self):
        a = torch.randn(64, 64)
        (a @ a).sum()
        return super().train_step()


def test_fit_loop_profiles_the_window(tmp_path):
    """Steps 2..3 of 5 profiled on the CPU: summary for 2 steps, an op table with aten::mm, a gzipped trace."""
    trainer = _MatmulTrainer(tmp_path, steps=5)
    trainer.cfg.train.profile_steps = [2, 3]
    _fit(trainer, evaluated=[])
    out = tmp_path / "profile"
    summary = json.loads((out / "rank0_summary.json").read_text())
    assert (summary["first_step"], summary["last_step"], summary["steps"]) == (2, 3, 2)
    assert summary["wall_s_per_step"] > 0 and summary["kernel_s_per_step"] == {}  # no GPU kernels on a CPU
    assert summary["gpu"] is False and summary["busy_s_per_step"] is None and summary["idle_s_per_step"] is None
    assert "aten::mm" in (out / "rank0_ops.txt").read_text()
    assert (out / "rank0_trace.json.gz").stat().st_size > 0 and not (out / "rank0_trace.json").exists()


@pytest.mark.parametrize("bad", ["[3]", "[0, 2]", "[5, 4]"])
def test_profile_steps_checked(bad):
    """Oracle: the config check's message names the key and the expected form."""
    with pytest.raises(ConfigError, match=r"train\.profile_steps: expected \[\] or \[first, last\]"):
        load_config(None, [f"train.profile_steps={bad}"])


def test_profile_window_must_end_by_the_last_step():
    """Oracle: the config check names the key and train.steps; a window inside the run passes."""
    with pytest.raises(ConfigError, match=r"train\.profile_steps: expected a window that ends by train\.steps = 4"):
        load_config(None, ["train.steps=4", "train.warmup_steps=1", "train.profile_steps=[3, 6]"])
    cfg = load_config(None, ["train.steps=4", "train.warmup_steps=1", "train.profile_steps=[3, 4]"])
    assert cfg.train.profile_steps == [3, 4]


def test_cli_errors_keep_bracketed_text(tmp_path):
    """Oracle: the message's own text; rich would otherwise read "[first, last]" as markup and drop it."""
    from typer.testing import CliRunner

    from lf_orchestrator.cli import app

    out = CliRunner().invoke(app, ["config", "show", "--set", "train.profile_steps=[0, 1]"])
    assert out.exit_code == 2, out.output
    assert "[first, last]" in " ".join(out.output.split())
