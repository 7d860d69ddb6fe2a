"""``use_fused_ops``: lowered models with lf-kernels' fused ops equal the plain PyTorch models.

Oracle: the same model (same seed, so the same weights) with the switch off, i.e. the
plain PyTorch code (``silu(gate) * up``, ``nn.RMSNorm``, ``apply_rope`` / ``apply_rope3d``,
``norm(x) * (1 + scale) + shift``), forward output and every parameter gradient.

The models run on the CPU, and the fused ops there run their Triton kernels under
Triton's interpreter (``TRITON_INTERPRET=1``, set here at import on machines without
CUDA, as lf-kernels' tests do: it must be set before anything imports ``triton``, and
building a model already does, through ``torch._dynamo``); each test then also checks,
from the autograd graph, that the kernels' autograd functions ran. Without Triton in
the environment (or on a CUDA machine, where the variable is not set) the ops take
their PyTorch references and the tests check that dispatch path (same equalities, no
graph check). A semantic error (wrong rotation pairing, a missing
eps, ``scale`` instead of ``1 + scale``) moves outputs by 1e-2 or more.

Tolerance: float32 everywhere; kernel and plain code do the same float32 math in a
different order (fused multiply-adds, rsqrt vs division, reduction order), about one
float32 ulp per op. Over the tiny models' two layers the observed differences are
<= 1.1e-6 of each tensor's largest entry; we allow 1e-5 of it.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from lf_ir import (  # noqa: E402
    Llama3Model,
    Qwen2VLModel,
    RMSNormModule,
    WanDiTModel,
    llama3_config,
    materialize,
    next_token_loss,
    qwen2_vl_config,
    use_fused_ops,
    wan_dit_config,
)
from lf_kernels import kernel_backend  # noqa: E402

REL_TOL = 1e-5


@pytest.fixture
def interpreter():
    """Whether the fused ops take Triton for the CPU models here (the interpreter); else their PyTorch references."""
    return kernel_backend(torch.zeros(1)) == "triton"


def _build(cls, cfg, fused: bool):
    with torch.device("meta"):
        model = cls(cfg)
    model = materialize(model, "cpu", seed=0)
    return model, (use_fused_ops(model) if fused else 0)


def _autograd_fns(out: torch.Tensor) -> set[str]:
    """Names of the custom autograd functions (``...FnBackward``) in the graph of ``out``."""
    names, seen, stack = set(), set(), [out.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.add(type(fn).__name__)
        stack.extend(f for f, _ in fn.next_functions)
    return {n for n in names if n.endswith("FnBackward")}


def _close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    scale = expected.abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=0, atol=REL_TOL * max(scale, 1e-30), msg=what)


def _compare(plain, fused, run, *, every_param: bool = True) -> torch.Tensor:
    """Forward ``run(model)`` -> scalar loss on both, backward; outputs and all grads must match
    (``every_param=False``: parameters the loss does not reach have no grad in either model)."""
    assert list(plain.state_dict()) == list(fused.state_dict())
    loss_plain, loss_fused = run(plain), run(fused)
    loss_plain.backward()
    loss_fused.backward()
    _close(loss_fused.detach(), loss_plain.detach(), "loss")
    grads_plain = dict(plain.named_parameters())
    for name, p in fused.named_parameters():
        expected = grads_plain[name].grad
        assert (p.grad is None) == (expected is None), name
        assert p.grad is not None or not every_param, name
        if expected is not None:
            _close(p.grad, expected, name)
    return loss_fused


def test_llama3_fused_equals_plain_forward_and_grads(interpreter):
    cfg = llama3_config("tiny")
    plain, _ = _build(Llama3Model, cfg, fused=False)
    fused, count = _build(Llama3Model, cfg, fused=True)
    assert count == 4 * cfg.layers + 1  # 2 norms, attention and MLP per block; the final norm
    ids = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    loss = _compare(plain, fused, lambda m: next_token_loss(m(ids), ids))
    if interpreter:
        assert _autograd_fns(loss) == {"_RMSNormFnBackward", "_RotaryFnBackward", "_SwiGLUFnBackward"}
    # Switching off restores the plain path: bit-identical logits, no fused autograd function.
    assert use_fused_ops(fused, enabled=False) == count
    with torch.no_grad():
        torch.testing.assert_close(fused(ids), plain(ids), rtol=0, atol=0)
    assert not _autograd_fns(next_token_loss(fused(ids), ids))


def test_gemma_keeps_the_plain_path_where_no_fused_op_fits(interpreter):
    """GeGLU and the zero-centered ``1 + w`` RMSNorm have no fused op: ``use_fused_ops`` switches only the
    attention modules (RoPE) of a gemma model, and its GeGLU / norm outputs stay bit-identical to the plain ones."""
    from lf_ir._lower import MLPModule, ZeroCenteredRMSNormModule
    from lf_ir.recipes.gemma import GemmaModel, gemma_config

    cfg = gemma_config("tiny")
    plain, _ = _build(GemmaModel, cfg, fused=False)
    fused, count = _build(GemmaModel, cfg, fused=True)
    assert count == cfg.layers  # one attention per block; no MLP, no norm
    assert not any(m.fused for m in fused.modules() if isinstance(m, MLPModule))
    assert not any(hasattr(m, "fused") for m in fused.modules() if isinstance(m, ZeroCenteredRMSNormModule))
    ids = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    loss = _compare(plain, fused, lambda m: next_token_loss(m(ids), ids))
    if interpreter:
        assert _autograd_fns(loss) == {"_RotaryFnBackward"}
    x = torch.randn(2, 5, cfg.dim, generator=torch.Generator().manual_seed(2))
    block_plain, block_fused = plain.blocks[0], fused.blocks[0]
    with torch.no_grad():
        assert torch.equal(block_fused.mlp(x), block_plain.mlp(x))
        assert torch.equal(block_fused.mlp_norm(x), block_plain.mlp_norm(x))


def test_wan_dit_fused_equals_plain_forward_and_grads(interpreter):
    cfg = wan_dit_config("tiny")
    plain, _ = _build(WanDiTModel, cfg, fused=False)
    fused, count = _build(WanDiTModel, cfg, fused=True)
    # per block: the block (modulate), self- and cross-attention (3D RoPE), their q/k RMSNorms; the head
    assert count == 7 * cfg.layers + 1
    gen = torch.Generator().manual_seed(2)
    x, t, text = torch.randn(2, 4, 3, 6, 10, generator=gen), torch.tensor([10.0, 900.0]), torch.randn(2, 7, 32)
    loss = _compare(plain, fused, lambda m: m(x, t, text).square().mean())
    if interpreter:
        assert _autograd_fns(loss) == {"_ModulateFnBackward", "_RMSNormFnBackward", "_RotaryFnBackward"}


def test_qwen2_vl_text_mrope_fused_equals_plain(interpreter):
    cfg = qwen2_vl_config("tiny")
    plain, _ = _build(Qwen2VLModel, cfg, fused=False)
    fused, count = _build(Qwen2VLModel, cfg, fused=True)
    assert count > 0
    ids = torch.randint(0, 400, (2, 12), generator=torch.Generator().manual_seed(3))
    pos = torch.stack([torch.arange(12), torch.arange(12) // 3, torch.arange(12) % 5])[:, None].expand(3, 2, 12)
    loss = _compare(plain, fused, lambda m: next_token_loss(m(ids, position_ids=pos), ids), every_param=False)
    if interpreter:
        assert "_RotaryFnBackward" in _autograd_fns(loss)


def test_rms_norm_module_keeps_nn_rmsnorm_state_and_falls_back(interpreter):
    """State dict of ``nn.RMSNorm``; a norm the fused op cannot take (2-D normalized shape) keeps the plain path."""
    ref = torch.nn.RMSNorm(8, eps=1e-5)
    norm = RMSNormModule(8, eps=1e-5)
    assert norm.state_dict().keys() == ref.state_dict().keys()
    norm.load_state_dict({"weight": torch.linspace(0.5, 2.0, 8)})
    ref.load_state_dict(norm.state_dict())
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(4))
    assert use_fused_ops(norm) == 1 and norm.fused
    _close(norm(x), ref(x), "rms_norm")
    wide = RMSNormModule((4, 8))
    use_fused_ops(wide)
    torch.testing.assert_close(wide(x[:, :4]), torch.nn.RMSNorm((4, 8))(x[:, :4]), rtol=0, atol=0)


def test_use_fused_ops_rejects_bad_arguments():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        use_fused_ops("llama3")
    with pytest.raises(TypeError, match="enabled must be a bool"):
        use_fused_ops(RMSNormModule(4), enabled=1)


def test_dtensor_inputs_keep_the_plain_path(tmp_path):
    """Tensor-parallel inputs (DTensor, here a world of one) never reach the fused ops: the norm's output is
    ``nn.RMSNorm``'s DTensor, and the rotary / modulate guards refuse them."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    from lf_ir._fused import fusable, modulate_fits, rotary_fits

    if dist.is_initialized():
        pytest.skip("a process group already exists in this test process")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(5))
        ref = torch.nn.RMSNorm(8, eps=1e-5)
        norm = RMSNormModule(8, eps=1e-5)
        norm.weight = torch.nn.Parameter(distribute_tensor(norm.weight.data, mesh, [Replicate()]))
        use_fused_ops(norm)
        x_dt = distribute_tensor(x, mesh, [Replicate()])
        out = norm(x_dt)
        assert isinstance(out, DTensor)
        torch.testing.assert_close(out.full_tensor(), ref(x), rtol=0, atol=0)
        q_dt = distribute_tensor(torch.randn(2, 3, 5, 8), mesh, [Replicate()])
        cos = torch.ones(2, 5, 8)
        assert not fusable(x_dt) and fusable(x, None)
        assert rotary_fits(q_dt.to_local(), cos, cos) and not rotary_fits(q_dt, cos, cos)
        shift = torch.zeros(2, 1, 8)
        assert modulate_fits(x, shift, shift) and not modulate_fits(x_dt, shift, shift)
    finally:
        dist.destroy_process_group()


def test_guards_refuse_what_the_fused_ops_cannot_take():
    """Oracle: the shape rules of ``lf_kernels.apply_rotary`` / ``modulate`` docstrings."""
    from lf_ir._fused import modulate_fits, rotary_fits

    q = torch.zeros(2, 3, 5, 8)
    assert rotary_fits(q, torch.ones(5, 8), torch.ones(5, 8))
    assert rotary_fits(q, torch.ones(1, 5, 6), torch.ones(1, 5, 6))  # partial rotary, broadcast batch
    assert not rotary_fits(q, torch.ones(5, 7), torch.ones(5, 7))  # odd rot
    assert not rotary_fits(q, torch.ones(5, 10), torch.ones(5, 10))  # rot > head_dim
    assert not rotary_fits(q, torch.ones(3, 5, 8), torch.ones(3, 5, 8))  # batch 3 vs 2
    assert not rotary_fits(q, torch.ones(4, 8), torch.ones(4, 8))  # seq 4 vs 5
    x = torch.zeros(2, 6, 4)
    assert modulate_fits(x, torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))  # per frame: 3 frames of 2 tokens
    assert not modulate_fits(x, torch.zeros(2, 4, 4), torch.zeros(2, 4, 4))  # 6 tokens not in 4 groups
    assert not modulate_fits(x, torch.zeros(2, 1, 4), torch.zeros(2, 1, 5))  # shapes differ
