"""`lf plan` with the calibration cache and `--calibrate`. Oracles: a cache file written here by hand for a fake
H200 device name (the machine's GPU is faked by patching ``torch.cuda``'s name query; no CUDA runs), and
``search_plans`` called directly with that entry's rates."""

from __future__ import annotations

import json

import msgspec
import pytest
import torch
from typer.testing import CliRunner

from lf_ir.recipes import llama3
from lf_orchestrator.cli import app
from lf_parallel import default_calibration, gpu_spec, make_cluster, search_plans

runner = CliRunner()
DEVICE = "Fake H200 Test"
ARGS = ["plan", "--recipe", "llama3", "--size", "8B", "--seq", "2048", "--gpus", "2", "--global-batch", "2",
        "--top", "1", "--json"]


@pytest.fixture
def cached(tmp_path, monkeypatch):
    """A cache entry for DEVICE at half the default matmul rate; this machine's GPU reported as DEVICE."""
    monkeypatch.setenv("LF_CACHE_DIR", str(tmp_path))
    base = default_calibration(gpu_spec("h200"))
    cal = msgspec.structs.replace(base, matmul_tflops=base.matmul_tflops / 2,
                                  source=f"measured {DEVICE}, torch {torch.__version__}")
    (tmp_path / "calibration.json").write_text(json.dumps({f"{DEVICE} | torch {torch.__version__}":
                                                           msgspec.to_builtins(cal)}))
    return cal


def _plan(gpu: str) -> dict:
    out = runner.invoke(app, [*ARGS, "--gpu", gpu])
    assert out.exit_code == 0, out.output
    return json.loads(out.output)


def test_plan_reports_defaults_without_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("LF_CACHE_DIR", str(tmp_path))
    assert _plan("h200")["calibration"] == "defaults"


def test_plan_uses_the_cache_of_this_gpu_model_only(cached, monkeypatch):
    default_step = _plan("h200")["plans"][0]["step_s"]  # no CUDA here: the defaults
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: DEVICE)
    d = _plan("h200")
    assert d["calibration"] == cached.source == f"measured {DEVICE}, torch {torch.__version__}"
    graph = llama3.build_graph(llama3.llama3_config("8B"), 2048)
    expect = search_plans(graph, make_cluster(gpus=2, gpu="h200"), global_batch=2, seq=2048, top=1,
                          calibration=cached).ranked[0]
    assert d["plans"][0]["step_s"] == pytest.approx(expect.cost.step_s, rel=1e-12)
    assert d["plans"][0]["step_s"] > default_step  # half the matmul rate: a slower step
    # Planning ahead for A100s on this "H200": the A100's defaults, not the H200's measurement.
    assert _plan("a100-80g")["calibration"] == "defaults"


def test_plan_table_footer_names_the_rates(tmp_path, monkeypatch):
    monkeypatch.setenv("LF_CACHE_DIR", str(tmp_path))
    out = runner.invoke(app, ["plan", "--recipe", "llama3", "--size", "tiny", "--seq", "256", "--gpus", "2",
                              "--gpu", "h200", "--top", "1"])
    assert out.exit_code == 0, out.output
    assert "rates: defaults" in out.output


def test_calibrate_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: --calibrate would run")
    out = runner.invoke(app, [*ARGS, "--gpu", "h200", "--calibrate"])
    assert out.exit_code == 2
    assert "--calibrate needs a CUDA GPU" in out.output


@pytest.fixture
def fake_calibrate(tmp_path, monkeypatch):
    """``lf_parallel.calibrate`` replaced by one that caches a half-rate entry for DEVICE (no CUDA runs); this
    machine's GPU reported as DEVICE. Returns the list of calls."""
    import lf_parallel

    monkeypatch.setenv("LF_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: DEVICE)
    calls = []

    def calibrate(*, save=True, **_):
        base = default_calibration(gpu_spec("h200"))
        cal = msgspec.structs.replace(base, matmul_tflops=base.matmul_tflops / 2,
                                      source=f"measured {DEVICE}, torch {torch.__version__}")
        (tmp_path / "calibration.json").write_text(json.dumps({f"{DEVICE} | torch {torch.__version__}":
                                                               msgspec.to_builtins(cal)}))
        calls.append(save)
        return cal

    monkeypatch.setattr(lf_parallel, "calibrate", calibrate)
    return calls


def test_calibrate_then_plan_uses_the_measurement(fake_calibrate):
    out = runner.invoke(app, [*ARGS, "--gpu", "h200", "--calibrate"])
    assert out.exit_code == 0, out.output
    assert fake_calibrate == [True]
    assert "warning" not in out.stderr
    assert json.loads(out.stdout)["calibration"] == f"measured {DEVICE}, torch {torch.__version__}"


def test_calibrate_warns_when_the_plan_is_for_another_gpu(fake_calibrate):
    out = runner.invoke(app, [*ARGS, "--gpu", "a100-80g", "--calibrate"])
    assert out.exit_code == 0, out.output
    assert "plan is for a100-80g (--gpu), so its rates come from: defaults" in out.stderr
    assert json.loads(out.stdout)["calibration"] == "defaults"  # stdout stays JSON


def test_calibrate_runs_after_the_arguments_are_checked(fake_calibrate):
    out = runner.invoke(app, ["plan", "--recipe", "llama3", "--size", "9000B", "--gpus", "2", "--calibrate"])
    assert out.exit_code == 2
    assert fake_calibrate == []  # the bad --size failed first: nothing measured
