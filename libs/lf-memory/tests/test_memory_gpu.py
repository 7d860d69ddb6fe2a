"""resolve_precision and checkpointing on a CUDA device (``@pytest.mark.gpu``)."""

import copy

import pytest
import torch
from torch import nn

from lf_memory import PrecisionPolicy, apply_activation_checkpointing, resolve_precision

pytestmark = pytest.mark.gpu


def test_auto_picks_bf16_on_ampere_or_later():
    """Oracle: the device's compute capability (native bf16 from sm_80)."""
    device = torch.device("cuda", 0)
    native = torch.cuda.get_device_capability(device)[0] >= 8
    expected = torch.bfloat16 if native else torch.float32
    assert resolve_precision("auto", device).compute_dtype == expected
    policy = resolve_precision("bf16", "cuda")
    assert policy == PrecisionPolicy(torch.float32, torch.bfloat16)
    x = torch.randn(4, 8, device=device)
    with policy.autocast("cuda"):
        assert (x @ x.T).dtype == torch.bfloat16


def test_checkpointing_is_bitwise_equal_on_cuda():
    """Oracle: the same stack without checkpointing on the same GPU."""
    torch.manual_seed(0)
    reference = nn.ModuleList(
        nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)) for _ in range(3)
    ).cuda()
    blocks = copy.deepcopy(reference)
    assert apply_activation_checkpointing(blocks, [True, False, True]) == [0, 2]
    x = torch.randn(8, 64, device="cuda")
    results = []
    for stack in (reference, blocks):
        inp = x.clone().requires_grad_()
        y = inp
        for block in stack:
            y = block(y)
        y.square().sum().backward()
        results.append((y.detach(), inp.grad, [p.grad for p in stack.parameters()]))
    (y_ref, dx_ref, g_ref), (y, dx, g) = results
    assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref)
    assert all(torch.equal(a, b) for a, b in zip(g, g_ref, strict=True))
