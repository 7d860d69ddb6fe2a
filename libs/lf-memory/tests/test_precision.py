"""PrecisionPolicy and resolve_precision on CPU (CUDA support is faked where needed).

Oracle: the contract in resolve_precision's docstring.
"""

import contextlib

import pytest
import torch

import lf_memory._precision as precision
from lf_memory import PRECISION_CHOICES, PrecisionPolicy, resolve_precision

FP32 = PrecisionPolicy(torch.float32, torch.float32)
BF16 = PrecisionPolicy(torch.float32, torch.bfloat16)


@pytest.mark.parametrize(
    ("requested", "device", "expected"),
    [
        ("fp32", torch.device("cpu"), FP32),
        ("auto", torch.device("cpu"), FP32),  # CPU bf16 is slower on most CPUs
        ("bf16", torch.device("cpu"), BF16),  # allowed when asked for explicitly
        ("bf16", "cpu", BF16),
        ("auto", "meta", FP32),
    ],
)
def test_resolve_on_cpu(requested, device, expected):
    """Oracle: docstring table (auto -> fp32 off CUDA; bf16 allowed on CPU)."""
    assert resolve_precision(requested, device) == expected


@pytest.mark.parametrize(
    ("support", "requested", "expected"),
    [
        ((True, True), "auto", BF16),  # Ampere / Hopper
        ((False, True), "auto", FP32),  # emulated bf16 only: auto avoids it
        ((False, False), "auto", FP32),
        ((False, True), "bf16", BF16),  # explicit request accepts emulation
        ((True, True), "bf16", BF16),
        ((True, True), "fp32", FP32),
    ],
)
def test_resolve_on_cuda_with_faked_support(monkeypatch, support, requested, expected):
    """Oracle: docstring (auto needs native bf16, explicit bf16 needs any support)."""
    seen = []

    def fake_support(device):
        seen.append(device)
        return support

    monkeypatch.setattr(precision, "_cuda_bf16_support", fake_support)
    assert resolve_precision(requested, torch.device("cuda", 1)) == expected
    assert all(device == torch.device("cuda", 1) for device in seen)


def test_bf16_on_cuda_without_support_names_the_device(monkeypatch):
    """Oracle: the contract (ValueError naming the device)."""
    monkeypatch.setattr(precision, "_cuda_bf16_support", lambda device: (False, False))
    with pytest.raises(ValueError, match="device cuda:3 does not support bfloat16"):
        resolve_precision("bf16", "cuda:3")


def test_no_cuda_means_no_support():
    """Oracle: this CPU-only torch build; the real probe reports no bf16 without CUDA."""
    if torch.cuda.is_available():
        pytest.skip("CUDA present; covered by test_memory_gpu.py")
    assert precision._cuda_bf16_support(torch.device("cuda")) == (False, False)
    with pytest.raises(ValueError, match="device cuda does not support"):
        resolve_precision("bf16", "cuda")
    assert resolve_precision("auto", "cuda") == FP32


@pytest.mark.parametrize("requested", ["FP16", "BF16", "", "float32", "fp8"])
def test_unknown_choice_lists_valid_ones(requested):
    """Oracle: the contract (ValueError listing the choices and the value)."""
    with pytest.raises(ValueError) as err:
        resolve_precision(requested, "cpu")
    message = str(err.value)
    assert repr(requested) in message
    for choice in PRECISION_CHOICES:
        assert repr(choice) in message


def test_bf16_autocast_gives_bf16_matmul_on_cpu():
    """Oracle: torch's CPU autocast op list (linear / matmul run in bf16, weights stay fp32)."""
    policy = resolve_precision("bf16", "cpu")
    linear = torch.nn.Linear(8, 4)
    x = torch.randn(2, 8)
    with policy.autocast("cpu"):
        y = linear(x)
        z = x @ x.T
    assert y.dtype == torch.bfloat16 and z.dtype == torch.bfloat16
    assert linear.weight.dtype == policy.param_dtype == torch.float32
    with policy.autocast(torch.device("cpu")):
        assert (x @ x.T).dtype == torch.bfloat16


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_fp16_policy_needs_loss_scaling_and_autocasts_matmul(device):
    """Oracle: the contract (fp16 compute over fp32 weights, loss scaling flagged; only bf16/fp16
    need a loss-scaling decision, and only fp16 says yes) and torch's CPU autocast op list."""
    policy = resolve_precision("fp16", device)
    assert policy == PrecisionPolicy(torch.float32, torch.float16) and policy.needs_loss_scaling
    assert not resolve_precision("bf16", "cpu").needs_loss_scaling
    assert not resolve_precision("fp32", "cpu").needs_loss_scaling
    with policy.autocast("cpu"):
        assert (torch.randn(2, 8) @ torch.randn(8, 3)).dtype == torch.float16


def test_fp32_autocast_is_a_null_context():
    """Oracle: the contract (nullcontext for fp32; matmul stays float32)."""
    policy = resolve_precision("fp32", "cpu")
    context = policy.autocast("cpu")
    assert isinstance(context, contextlib.nullcontext)
    x = torch.randn(2, 8)
    with context:
        assert (x @ x.T).dtype == torch.float32


@pytest.mark.parametrize(
    ("kwargs", "needles"),
    [
        ({"param_dtype": torch.bfloat16, "compute_dtype": torch.bfloat16}, ["param_dtype", "bfloat16"]),
        ({"param_dtype": torch.float32, "compute_dtype": torch.float64}, ["compute_dtype", "float64"]),
    ],
)
def test_policy_validation(kwargs, needles):
    """Oracle: the contract (fp32 master weights; bf16, fp16 or fp32 compute)."""
    with pytest.raises(ValueError) as err:
        PrecisionPolicy(**kwargs)
    for needle in needles:
        assert needle in str(err.value)
