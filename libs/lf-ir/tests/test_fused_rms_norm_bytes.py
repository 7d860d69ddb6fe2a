"""The CUDA RMSNorm rule (``kernels="cuda"``): what ``aten::_fused_rms_norm``'s autograd node keeps for backward.

Oracle: ``saved_tensors_hooks`` (storages deduplicated, parameters excluded) with the CPU sent down CUDA's
autograd route. On the CPU ``_fused_rms_norm`` has no backend kernel, so ``torch.rms_norm`` runs the composite
(what the CPU rule counts); the fixture registers torch's own decomposition of the op
(``torch._decomp.decompositions._fused_rms_norm``, run below autograd) as its CPU kernel, so autograd records the
op's ``FusedRmsNormBackward0`` node, which saves ``input``, ``weight`` and ``rstd`` as it does on CUDA. The CPU
rule itself is checked by ``test_ir_bytes.py`` / ``test_ir_bytes_families.py`` (unchanged).
"""

from __future__ import annotations

import pytest
import torch
from _saved_bytes import measure_saved
from torch._decomp import decompositions

from lf_ir import RMSNormModule, _lower_video  # noqa: F401  (register the DiT lowerings)
from lf_ir._bytes import fused_rms_norm_saved, norm_saved
from lf_ir._lower import lower_node, materialize
from lf_ir._nodes import Norm
from lf_ir._rope3d_torch import rope3d_cos_sin
from lf_ir.recipes import wan_dit

B, S, D = 2, 12, 16


@pytest.fixture
def cuda_route():
    """``aten::_fused_rms_norm`` and its backward get CPU kernels (torch's decompositions) for the test only."""
    lib = torch.library.Library("aten", "IMPL")

    def forward(*args):
        with torch._C._AutoDispatchBelowAutograd():
            return decompositions._fused_rms_norm(*args)

    def backward(*args):
        with torch._C._AutoDispatchBelowAutograd():
            return decompositions._fused_rms_norm_backward(*args)

    lib.impl("_fused_rms_norm", forward, "CPU")
    lib.impl("_fused_rms_norm_backward", backward, "CPU")
    yield
    lib._destroy()


@pytest.mark.parametrize(("dtype", "nbytes"), [(torch.float32, 4), (torch.bfloat16, 2)], ids=["f32", "bf16"])
def test_rms_norm_module_cuda_route_saves_input_and_rstd(cuda_route, dtype, nbytes):
    """Oracle: saved_tensors_hooks on RMSNormModule (float32 weight, as autocast over float32 master weights) on
    CUDA's autograd route. A float32 input (a decoder's residual stream) keeps itself and rstd; a bf16 one also
    keeps the module's bf16 cast of the weight (``D * 2`` bytes, not counted by the rule)."""
    norm = RMSNormModule(D, eps=1e-6)
    x = torch.randn(B, S, D, dtype=dtype, requires_grad=True)
    measured, grad_fn = measure_saved(lambda: norm(x), norm, with_grad_fn=True)
    assert grad_fn == "FusedRmsNormBackward0"
    weight_cast = 0 if dtype == torch.float32 else D * nbytes
    input_bytes, rstd_bytes = x.untyped_storage().nbytes(), B * S * torch.finfo(torch.float32).bits // 8
    assert measured == input_bytes + rstd_bytes + weight_cast
    assert Norm(name="n", dim=D, kind="rms").saved_bytes(B, S, nbytes, kernels="cuda") == input_bytes + rstd_bytes


@pytest.mark.parametrize(("dtype", "nbytes"), [(torch.float32, 4), (torch.bfloat16, 2)], ids=["f32", "bf16"])
def test_dit_nodes_cuda_rule_exact(cuda_route, dtype, nbytes):
    """Oracle: saved_tensors_hooks on the tiny Wan DiT's self-attention, cross-attention and block (modules in
    ``dtype``, 45 tokens, 7 text tokens) on CUDA's RMSNorm route: ``saved_bytes(..., kernels="cuda")`` exactly."""
    cfg = wan_dit.wan_dit_config("tiny")
    block = {n.name: n for n in wan_dit.build_graph(cfg).component("video").nodes}["block0"]
    grid, seq, d = (3, 3, 5), 45, cfg.dim
    rope = rope3d_cos_sin(cfg.rope(), cfg.head_dim, grid)
    ctx = torch.randn(B, cfg.text_len, d, dtype=dtype, requires_grad=True)
    x = torch.randn(B, seq, d, dtype=dtype, requires_grad=True)
    emb = torch.randn(B, 6, d, dtype=dtype, requires_grad=True)
    for node, call in ((block.self_attn, lambda m: m(x, rope=rope)), (block.cross_attn, lambda m: m(x, context=ctx)),
                       (block, lambda m: m(x, ctx, emb, rope))):
        with torch.device("meta"):
            module = lower_node(node)
        module = materialize(module, "cpu", 0).to(dtype)
        measured, _ = measure_saved(lambda m=module, c=call: c(m), module, (*rope, ctx), with_grad_fn=True)
        assert measured == node.saved_bytes(B, seq, nbytes, kernels="cuda"), node.name
        assert measured < node.saved_bytes(B, seq, nbytes), node.name


def test_real_shapes_cuda_and_cpu_values():
    """Oracle: the bytes of the tensors each path keeps, as ``torch.empty`` on meta sizes them (Wan2.1-1.3B's q
    norm over 2 x 32,760 tokens in bf16; a Llama-3-8B decoder norm over 2 x 8,192 tokens of the float32 stream)."""
    def nbytes(shape, dtype):
        return torch.empty(shape, dtype=dtype, device="meta").untyped_storage().nbytes()

    for tokens, dim, dtype, db in ((65_520, 1536, torch.bfloat16, 2), (16_384, 4096, torch.float32, 4)):
        cuda = nbytes((tokens, dim), dtype) + nbytes((tokens, 1), torch.float32)  # input, rstd
        cpu = 2 * nbytes((tokens, dim), torch.float32) + nbytes((tokens, 1), torch.float32)  # f32 x, x * rstd, rstd
        assert norm_saved("rms", tokens, dim, db, kernels="cuda") == fused_rms_norm_saved(tokens, dim, db) == cuda
        assert norm_saved("rms", tokens, dim, db) == norm_saved("rms", tokens, dim, db, kernels="cpu") == cpu
    assert norm_saved("rms", 65_520, 1536, 2, kernels="cuda") == 201_539_520
    assert norm_saved("rms", 65_520, 1536, 2) == 805_371_840
    assert norm_saved("layer", 10, 8, 2, kernels="cuda") == norm_saved("layer", 10, 8, 2) == (10 * 8 + 20) * 2
    with pytest.raises(ValueError, match="kernels"):
        norm_saved("rms", 10, 8, 2, kernels="tpu")
