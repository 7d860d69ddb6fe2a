"""apply_recompute on the lowered tiny VLA and Llama 3: exact numbers, the right ops re-run.

Oracle: the same model (same weights, same inputs) without recomputation,
float32 on CPU; outputs, loss and every parameter gradient must be bitwise
equal (``torch.equal``): recomputation replays the same kernels on the same inputs.
"""

from __future__ import annotations

import collections

import pytest
import torch
from lfm_models import llama_inputs, tiny_llama, tiny_vla, vla_inputs
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from lf_ir import next_token_loss
from lf_memory import RECOMPUTE_MODES, apply_recompute, recompute_flags
from lf_memory._recompute_modes import _apply_mode


def _vla_step(model):
    logits = model(*vla_inputs(model))
    loss = logits.float().square().mean()
    loss.backward()
    return logits.detach(), loss.detach()


def _llama_step(model):
    ids = llama_inputs()
    logits = model(ids)
    loss = next_token_loss(logits, ids)
    loss.backward()
    return logits.detach(), loss.detach()


MODELS = {"vla": (tiny_vla, _vla_step), "llama3": (tiny_llama, _llama_step)}


@pytest.mark.parametrize(("mode", "backend"), [("full", "composable"), ("selective", "composable"),
                                               ("selective", "function"), ("every_k", "composable")])
@pytest.mark.parametrize("recipe", sorted(MODELS))
def test_outputs_and_grads_bitwise_equal(recipe, mode, backend):
    """Oracle: the model without recomputation; torch.equal on logits, loss and all grads."""
    build, step = MODELS[recipe]
    reference, model = build(), build()
    keys = list(model.state_dict())
    chosen = _apply_mode(model.blocks, mode, 2, backend)
    assert chosen == [i for i, f in enumerate(recompute_flags(len(model.blocks), mode)) if f]
    assert list(model.state_dict()) == keys
    (y_ref, loss_ref), (y, loss) = step(reference), step(model)
    assert torch.equal(y, y_ref) and torch.equal(loss, loss_ref)
    grads_ref = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        assert torch.equal(param.grad, grads_ref[name].grad), name


class _OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


def _count_ops(mode: str) -> collections.Counter:
    model = tiny_llama()
    apply_recompute(model.blocks, mode)
    ids = llama_inputs()
    with _OpCounter() as counter:
        next_token_loss(model(ids), ids).backward()
    return counter.counts


def test_selective_reruns_norms_but_not_matmuls():
    """Oracle: SAC semantics on tiny Llama 3 (2 blocks, 7 projections each, SDPA, RMSNorm).
    Matmuls (mm) and the CPU flash-attention forward run as often as without recompute under
    "selective"; under "full" 6 more times per block (not the last, down projection: its output
    is not needed for backward and the non-reentrant checkpoint stops early); rsqrt (RMSNorm, 2 per block + final norm)
    runs again in backward for each checkpointed block under both."""
    none, selective, full = (_count_ops(m) for m in ("none", "selective", "full"))
    sdpa = "_scaled_dot_product_flash_attention_for_cpu"
    assert selective["mm"] == none["mm"] and selective[sdpa] == none[sdpa] == 2
    assert full["mm"] == none["mm"] + 2 * 6 and full[sdpa] == 4
    assert none["rsqrt"] == 5 and selective["rsqrt"] == full["rsqrt"] == 5 + 4


def test_every_k_choice_and_errors():
    """Oracle: the contract (i % every == 0 recomputed; errors name the option and the value)."""
    assert recompute_flags(5, "every_k", every=2) == [True, False, True, False, True]
    assert recompute_flags(4, "every_k", every=3) == [True, False, False, True]
    assert recompute_flags(3, "every_k", every=1) == recompute_flags(3, "full") == [True] * 3
    assert recompute_flags(3, "none") == [False] * 3 and recompute_flags(2, "selective") == [True] * 2
    assert RECOMPUTE_MODES == ("none", "full", "selective", "every_k")
    with pytest.raises(ValueError, match=r"memory.recompute must be one of .*got 'auto'"):
        recompute_flags(2, "auto")
    with pytest.raises(ValueError, match="recompute_every must be an int >= 1, got 0"):
        apply_recompute(nn.ModuleList([nn.Linear(2, 2)]), "every_k", every=0)
    with pytest.raises(TypeError, match="got Linear"):
        apply_recompute(nn.Linear(2, 2), "full")
    blocks = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))
    assert apply_recompute(blocks, "every_k", every=2) == [0, 2]
    with pytest.raises(ValueError, match=r"blocks\[0\] \(Linear\) already has"):
        apply_recompute(blocks, "selective")
    assert apply_recompute(blocks, "none") == []


@pytest.mark.parametrize(("backend", "calls"), [(None, 1), ("function", 1), ("composable", 2)])
def test_apply_recompute_backend_choice(backend, calls):
    """Oracle: lf_memory._recompute's module docstring: the "function" backend (the default) runs a checkpointed
    block's forward pre-hooks once per step, the "composable" one again when it recomputes (twice)."""
    model = tiny_llama()
    count = [0]
    model.blocks[0].register_forward_pre_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    apply_recompute(model.blocks, "full", backend=backend)
    _llama_step(model)
    assert count[0] == calls


def test_apply_recompute_refuses_an_unknown_backend():
    """A backend lf-memory does not have is refused by name, nothing checkpointed."""
    blocks = nn.ModuleList([nn.Linear(2, 2)])
    with pytest.raises(ValueError, match="backend: expected 'function' or 'composable', got 'fsdp'"):
        apply_recompute(blocks, "full", backend="fsdp")
    assert apply_recompute(blocks, "full") == [0]
