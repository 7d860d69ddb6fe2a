"""CPU offload of saved activations, and the FP8 layer choice.

Oracles: the tiny Llama 3 without offload (``torch.equal`` on logits, loss and every
gradient), a saved-tensor hook that sees where packed tensors live, and the GEMM
shape rule written out for Llama-3-8B's linears (hand-listed).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from lfm_models import llama_inputs, tiny_llama
from torch import nn

from lf_ir import Llama3Model, llama3_config, next_token_loss
from lf_memory._fp8 import apply_fp8, fp8_filter, fp8_linear_names, fp8_supported
from lf_memory._offload import offload_activations
from lf_memory._recompute_modes import apply_recompute


def _step(model, offload: bool):
    ids = llama_inputs()
    with offload_activations("cpu", enabled=offload):
        logits = model(ids)
    loss = next_token_loss(logits, ids)
    loss.backward()
    return logits.detach(), loss.detach()


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_offload_outputs_and_grads_unchanged(recompute):
    """Oracle: the same model without offload; torch.equal on logits, loss and all gradients."""
    reference, model = tiny_llama(), tiny_llama()
    apply_recompute(model.blocks, recompute)
    (y_ref, loss_ref), (y, loss) = _step(reference, False), _step(model, True)
    assert torch.equal(y, y_ref) and torch.equal(loss, loss_ref)
    grads = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        assert torch.equal(param.grad, grads[name].grad), name


def test_offload_packs_copies_on_the_host():
    """Oracle: inside the context a saved tensor is packed as a CPU copy (a new storage), not the original."""
    lin = nn.Linear(4, 3)
    x = torch.randn(2, 4, requires_grad=True)
    with offload_activations("cpu"):
        y = lin(x * 2)
    packed = y.grad_fn._saved_mat1 if hasattr(y.grad_fn, "_saved_mat1") else None
    assert packed is not None and packed.device.type == "cpu" and torch.equal(packed, (x * 2).detach())
    assert isinstance(offload_activations("cpu", enabled=False), type(__import__("contextlib").nullcontext()))


def test_fp8_filter_keeps_small_gemms_in_bf16():
    """Oracle: hand list for a 2-layer Llama-3-8B on the meta device with min_features=1024 and 4096 tokens:
    every q/k/v/o/gate/up/down linear (k and v are 4096 -> 1024) is converted; with 64 tokens the
    GEMM-size rule keeps all of them in bf16; with min_features=2048 k and v stay bf16."""
    with torch.device("meta"):
        model = Llama3Model(llama3_config("8B", layers=2))
    names = fp8_linear_names(model, fp8_filter(min_features=1024, tokens=4096))
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert names == linears and len(names) == 2 * 7
    assert fp8_linear_names(model, fp8_filter(tokens=64)) == []
    wide = fp8_linear_names(model, fp8_filter(min_features=2048))
    assert len(wide) == 2 * 5 and not any(n.endswith((".k", ".v")) for n in wide)
    keep = fp8_filter(min_features=16)
    assert keep(nn.Linear(32, 48), "a.b") and not keep(nn.Linear(32, 40), "a.b")  # 40 % 16 != 0
    assert not keep(nn.Linear(32, 32), "model.head") and keep(nn.ReLU(), "act")
    with pytest.raises(ValueError, match="min_features must be >= 1, got 0"):
        fp8_filter(min_features=0)


def test_apply_fp8_errors_on_cpu():
    """Oracle: the contract: a bad recipe and a device without FP8 raise ValueError naming them."""
    model = nn.Linear(32, 32)
    assert not fp8_supported("cpu")
    with pytest.raises(ValueError, match="must be one of \\['tensorwise', 'rowwise'\\], got 'delayed'"):
        apply_fp8(model, "delayed")
    with pytest.raises(ValueError, match="capability >= 8.9; got device 'cpu'"):
        apply_fp8(model)


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="needs torchao")
def test_apply_fp8_converts_and_trains_close_to_bf16():
    """Oracle: the bf16 model on the same weights; FP8 logits within 10% relative error (e4m3 has 3 mantissa
    bits; tensorwise scaling)."""
    if not fp8_supported("cuda"):
        pytest.skip("GPU without FP8 tensor cores")
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(1024, 2048), nn.GELU(), nn.Linear(2048, 1024)).cuda().bfloat16()
    model = nn.Sequential(nn.Linear(1024, 2048), nn.GELU(), nn.Linear(2048, 1024)).cuda().bfloat16()
    model.load_state_dict(ref.state_dict())
    names = apply_fp8(model, "tensorwise", module_filter=fp8_filter(min_features=1024))
    assert names == ["0", "2"] and type(model[0]).__name__ == "Float8Linear"
    x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
    y, y_ref = model(x), ref(x)
    assert ((y - y_ref).float().norm() / y_ref.float().norm()) < 0.1
    y.float().square().mean().backward()
    assert model[0].weight.grad is not None
