"""apply_activation_checkpointing: same numbers, same keys, recomputation really happens.

Oracle: the same stack of blocks, same weights and inputs, run without
checkpointing (single process, float32 on CPU).
"""

import copy

import pytest
import torch
from torch import nn

from lf_memory import apply_activation_checkpointing
from lf_memory._recompute import _apply

BACKENDS = ["composable", "function"]  # public API uses "function"
DIM, NUM_BLOCKS = 32, 4


class MLPBlock(nn.Module):
    """Residual Linear-GELU-Linear MLP; counts how often its forward runs."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(0.0)
        self.forward_calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forward_calls += 1
        return x + self.drop(self.fc2(self.act(self.fc1(x))))


def _stack(seed: int = 0) -> nn.ModuleList:
    torch.manual_seed(seed)
    return nn.ModuleList(MLPBlock(DIM) for _ in range(NUM_BLOCKS))


def _inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 16, DIM, generator=gen)
    grad_out = torch.randn(8, 16, DIM, generator=gen)
    return x, grad_out


def _step(blocks: nn.ModuleList, x: torch.Tensor, grad_out: torch.Tensor):
    """One forward + backward; returns (output, input grad, {param name: grad})."""
    blocks.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    y = x
    for block in blocks:
        y = block(y)
    y.backward(grad_out)
    return y.detach(), x.grad, {name: p.grad for name, p in blocks.named_parameters()}


PATTERNS = [True, [True, False, True, False], [False, False, False, True], False]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("enabled", PATTERNS)
def test_outputs_grads_and_keys_unchanged(backend, enabled):
    """Oracle: the unmodified stack; outputs and every gradient bitwise equal (torch.equal)."""
    reference = _stack()
    blocks = copy.deepcopy(reference)
    chosen = _apply(blocks, enabled, backend)
    flags = [enabled] * NUM_BLOCKS if isinstance(enabled, bool) else enabled
    assert chosen == [i for i, flag in enumerate(flags) if flag]
    assert list(blocks.state_dict()) == list(reference.state_dict())
    assert [n for n, _ in blocks.named_parameters()] == [n for n, _ in reference.named_parameters()]
    x, grad_out = _inputs()
    y_ref, dx_ref, grads_ref = _step(reference, x, grad_out)
    y, dx, grads = _step(blocks, x, grad_out)
    assert torch.equal(y, y_ref)
    assert torch.equal(dx, dx_ref)
    for name, grad in grads_ref.items():
        assert torch.equal(grads[name], grad), name


@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpointed_blocks_run_forward_twice(backend):
    """Oracle: recomputation semantics; a checkpointed block runs forward once in
    forward and once more in backward (2 calls per step), the others once."""
    blocks = _stack()
    enabled = [True, False, True, False]
    _apply(blocks, enabled, backend)
    x, grad_out = _inputs()
    _step(blocks, x, grad_out)
    assert [block.forward_calls for block in blocks] == [2, 1, 2, 1]
    # Forward alone (no backward) does not recompute.
    with torch.no_grad():
        blocks[0](x)
    assert blocks[0].forward_calls == 3


@pytest.mark.parametrize(("backend", "expected"), [("function", [1, 1, 1, 1]), ("composable", [1, 2, 1, 2])])
def test_forward_pre_hooks_of_a_checkpointed_block(backend, expected):
    """Oracle: module docstring; the default ("function") backend keeps the block's own hooks outside the
    recomputed region (once per step), the composable one re-enters module.__call__ (twice)."""
    blocks = _stack()
    hook_calls = [0] * NUM_BLOCKS
    for index, block in enumerate(blocks):
        block.register_forward_pre_hook(
            lambda *_, i=index: hook_calls.__setitem__(i, hook_calls[i] + 1)
        )
    if backend == "function":
        apply_activation_checkpointing(blocks, [False, True, False, True])  # the public API's default
    else:
        _apply(blocks, [False, True, False, True], backend)
    _step(blocks, *_inputs())
    assert hook_calls == expected


def test_deepcopy_of_a_checkpointed_block_runs_its_own_forward():
    """Oracle: the contract of the default backend; the copy recomputes itself, not the original."""
    blocks = _stack()
    apply_activation_checkpointing(blocks, True)
    copied = copy.deepcopy(blocks)
    _step(copied, *_inputs())
    assert [b.forward_calls for b in copied] == [2] * NUM_BLOCKS
    assert [b.forward_calls for b in blocks] == [0] * NUM_BLOCKS


def _saved_activation_bytes(blocks: nn.ModuleList, x: torch.Tensor) -> int:
    """Bytes of non-parameter tensors autograd saves for backward during one forward."""
    param_storages = {p.untyped_storage().data_ptr() for p in blocks.parameters()}
    saved = [0]

    def pack(tensor):
        if tensor.untyped_storage().data_ptr() not in param_storages:
            saved[0] += tensor.numel() * tensor.element_size()
        return tensor

    x = x.clone().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        y = x
        for block in blocks:
            y = block(y)
    y.sum().backward()
    return saved[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_fewer_bytes_saved_for_backward(backend):
    """Oracle: written arithmetic; a checkpointed block keeps only its input
    (8*16*32 float32 = 16 KiB), an unchecked block keeps its activations
    (measured on the unmodified stack, the same for every block)."""
    x, _ = _inputs()
    input_bytes = x.numel() * x.element_size()
    baseline = _saved_activation_bytes(_stack(), x)
    per_block = baseline // NUM_BLOCKS
    assert per_block * NUM_BLOCKS == baseline and per_block > input_bytes

    every = _stack()
    _apply(every, True, backend)
    assert _saved_activation_bytes(every, x) == NUM_BLOCKS * input_bytes

    half = _stack()
    _apply(half, [True, False, True, False], backend)
    assert _saved_activation_bytes(half, x) == 2 * input_bytes + 2 * per_block


@pytest.mark.parametrize("backend", BACKENDS)
def test_second_application_raises_and_changes_nothing(backend):
    """Oracle: the contract; a block can be checkpointed once, errors leave blocks untouched."""
    blocks = _stack()
    assert _apply(blocks, [True, False, False, False], backend) == [0]
    with pytest.raises(ValueError, match=r"blocks\[0\] \(MLPBlock\) already has"):
        _apply(blocks, [True, True, False, False], backend)
    # blocks[1] was not wrapped by the failed call: it can still be chosen.
    assert _apply(blocks, [False, True, False, False], backend) == [1]


def test_public_api_refuses_a_block_checkpointed_by_either_backend():
    """Oracle: the contract; public API sees both its own and the fallback's mark."""
    blocks = _stack()
    _apply(blocks, [False, True, False, False], "function")
    with pytest.raises(ValueError, match=r"blocks\[1\]"):
        apply_activation_checkpointing(blocks, True)
    assert apply_activation_checkpointing(blocks, [True, False, True, True]) == [0, 2, 3]
    with pytest.raises(ValueError, match=r"blocks\[3\]"):
        apply_activation_checkpointing(blocks, [False, False, False, True])


def test_bad_enabled_raises():
    """Oracle: the contract (ValueError naming the lengths / entry received)."""
    blocks = _stack()
    with pytest.raises(ValueError, match=r"len\(blocks\)=4.*got 3 entries"):
        apply_activation_checkpointing(blocks, [True, False, True])
    with pytest.raises(ValueError, match=r"enabled\[1\] must be a bool, got 1"):
        apply_activation_checkpointing(blocks, [True, 1, True, True])
    with pytest.raises(ValueError, match="got str"):
        apply_activation_checkpointing(blocks, "all")
    with pytest.raises(TypeError, match="got list"):
        apply_activation_checkpointing(list(blocks), True)
    shared = nn.ModuleList([blocks[0], blocks[0]])
    with pytest.raises(ValueError, match=r"blocks\[1\] is the same module as blocks\[0\]"):
        apply_activation_checkpointing(shared, True)
    assert apply_activation_checkpointing(blocks, False) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_is_replayed_in_recomputation(backend):
    """Oracle: the unmodified stack with dropout 0.1 under the same RNG seed;
    recomputation restores the RNG state, so results stay bitwise equal."""
    reference = _stack()
    for block in reference:
        block.drop.p = 0.1
    blocks = copy.deepcopy(reference)
    _apply(blocks, True, backend)
    x, grad_out = _inputs()
    torch.manual_seed(5)
    y_ref, dx_ref, _ = _step(reference, x, grad_out)
    torch.manual_seed(5)
    y, dx, _ = _step(blocks, x, grad_out)
    assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref)
