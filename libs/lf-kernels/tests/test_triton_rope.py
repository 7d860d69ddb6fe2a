"""apply_rotary and the RoPE table builders.

Oracles: (1) ``rotary_reference`` in float64 for the kernel, forward and
backward, on fresh random inputs (Triton compiled on CUDA, else interpreted on
the CPU with ``TRITON_INTERPRET=1``, and the dispatcher must report "triton");
(2) peer libraries for the tables and conventions: transformers' Llama
``apply_rotary_pos_emb`` and ``Qwen2VLRotaryEmbedding`` (M-RoPE), diffusers'
``WanRotaryPosEmbed`` and Wan's interleaved rotation (3D RoPE).
Tolerance: the kernel rotates in float32 (2e-5); tables agree with the peers
to float32 rounding of cos/sin (1e-6).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from lf_kernels._fused_reference import rotary_reference  # noqa: E402
from lf_kernels.triton._dispatch import kernel_backend  # noqa: E402
from lf_kernels.triton._rope import apply_rotary  # noqa: E402
from lf_kernels.triton._rope_tables import (  # noqa: E402
    mrope_tables,
    rope3d_tables,
    rope_inv_freq,
    rope_tables,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _check_kernel(x64, cos, sin, *, interleaved=False, layout="bhsd", dtype=torch.float32):
    """Kernel output and input grad vs float64 reference (x64 given in (b, h, s, d))."""
    gen = torch.Generator().manual_seed(x64.numel())
    x = x64.detach().to(DEVICE, dtype)
    x = (x if layout == "bhsd" else x.transpose(1, 2).contiguous()).requires_grad_()
    assert kernel_backend(x, cos.to(DEVICE)) == "triton"
    y = apply_rotary(x, cos.to(DEVICE), sin.to(DEVICE), layout=layout, interleaved=interleaved)
    y_bhsd = y if layout == "bhsd" else y.transpose(1, 2)
    grad_y = torch.randn(y_bhsd.shape, generator=gen, dtype=torch.float64).to(dtype).double()
    (gx,) = torch.autograd.grad((y_bhsd.double().cpu() * grad_y).sum(), x)
    gx_bhsd = gx if layout == "bhsd" else gx.transpose(1, 2)
    x64 = x64.detach().to(dtype).double().requires_grad_()
    ref = rotary_reference(x64, cos.double(), sin.double(), interleaved=interleaved)
    (ref_gx,) = torch.autograd.grad((ref * grad_y).sum(), x64)
    tol = 2e-5 if dtype == torch.float32 else 2**-7 * 4
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y_bhsd.double().cpu(), ref.detach(), rtol=tol, atol=tol)
    torch.testing.assert_close(gx_bhsd.double().cpu(), ref_gx, rtol=tol, atol=tol)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize(("head_dim", "rot"), [(80, 80), (96, 64), (130, 130)])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_kernel_matches_reference(interleaved, head_dim, rot, layout):
    """Oracle: float64 rotary_reference; full and partial rotary, both conventions and layouts."""
    gen = torch.Generator().manual_seed(head_dim + rot + interleaved)
    x64 = torch.randn(2, 3, 5, head_dim, generator=gen, dtype=torch.float64)
    positions = torch.randint(0, 4096, (2, 5), generator=gen)
    cos, sin = rope_tables(positions, rope_inv_freq(rot, 10000.0), interleaved=interleaved)
    _check_kernel(x64, cos, sin, interleaved=interleaved, layout=layout)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_shared_table_and_bf16(dtype):
    """Oracle: float64 reference; one (seq, rot) table for the whole batch, 5 heads (a partial head block)."""
    gen = torch.Generator().manual_seed(11)
    x64 = torch.randn(3, 5, 7, 64, generator=gen, dtype=torch.float64)
    cos, sin = rope_tables(torch.arange(7), rope_inv_freq(64))
    _check_kernel(x64, cos, sin, dtype=dtype)
    _check_kernel(x64, cos[None], sin[None], dtype=dtype)


def test_matches_hf_llama_rotary():
    """Oracle: transformers' Llama apply_rotary_pos_emb on the same tables (rotate half)."""
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    gen = torch.Generator().manual_seed(12)
    q, k = torch.randn(2, 4, 9, 32, generator=gen), torch.randn(2, 4, 9, 32, generator=gen)
    cos, sin = rope_tables(torch.arange(9).expand(2, 9), rope_inv_freq(32, 500000.0))
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    torch.testing.assert_close(apply_rotary(q.to(DEVICE), cos.to(DEVICE), sin.to(DEVICE)).cpu(), q_hf)
    torch.testing.assert_close(apply_rotary(k.to(DEVICE), cos.to(DEVICE), sin.to(DEVICE)).cpu(), k_hf)


def test_mrope_tables_match_qwen2_vl():
    """Oracle: transformers' Qwen2VLRotaryEmbedding (cos/sin) and apply_multimodal_rotary_pos_emb."""
    pytest.importorskip("transformers")
    from transformers.models.qwen2_vl import modeling_qwen2_vl as qwen
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig

    cfg = Qwen2VLTextConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=2,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]})
    gen = torch.Generator().manual_seed(13)
    # 4 text tokens (t = h = w), then a 2x3 image grid at t = 4, then text again.
    t = torch.tensor([0, 1, 2, 3] + [4] * 6 + [6, 7])
    h = torch.tensor([0, 1, 2, 3] + [4, 4, 4, 5, 5, 5] + [6, 7])
    w = torch.tensor([0, 1, 2, 3] + [4, 5, 6, 4, 5, 6] + [6, 7])
    position_ids = torch.stack([t, h, w])[:, None].expand(3, 2, 12)
    x = torch.randn(2, 12, 64, generator=gen)
    cos_hf, sin_hf = qwen.Qwen2VLRotaryEmbedding(cfg)(x, position_ids)
    cos, sin = mrope_tables(position_ids, head_dim=32, sections=(4, 6, 6))
    torch.testing.assert_close(cos, cos_hf, rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, sin_hf, rtol=0, atol=1e-6)
    q = torch.randn(2, 2, 12, 32, generator=gen)
    q_hf, _ = qwen.apply_rotary_pos_emb(q, q, cos_hf, sin_hf)
    torch.testing.assert_close(apply_rotary(q.to(DEVICE), cos.to(DEVICE), sin.to(DEVICE)).cpu(), q_hf,
                               rtol=1e-5, atol=1e-5)
    # Text tokens only: M-RoPE is 1D RoPE.
    cos_1d, _ = rope_tables(t[:4], rope_inv_freq(32))
    torch.testing.assert_close(cos[0, :4], cos_1d)


def test_rope3d_tables_match_wan():
    """Oracle: diffusers' WanRotaryPosEmbed tables and Wan's interleaved rotation (bshd layout)."""
    pytest.importorskip("diffusers")
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    frames, height, width, head_dim = 3, 4, 2, 20  # head_dim // 6 = 3: t gets 8 features, h and w 6 each
    wan = WanRotaryPosEmbed(head_dim, patch_size=(1, 2, 2), max_seq_len=64)
    cos_wan, sin_wan = wan(torch.zeros(1, 16, frames, 2 * height, 2 * width))
    cos, sin = rope3d_tables(frames, height, width, head_dim)
    torch.testing.assert_close(cos, cos_wan[0, :, 0].float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, sin_wan[0, :, 0].float(), rtol=0, atol=1e-6)
    gen = torch.Generator().manual_seed(14)
    x_bshd = torch.randn(1, frames * height * width, 2, head_dim, generator=gen)
    x1, x2 = x_bshd.unflatten(-1, (-1, 2)).unbind(-1)
    ref = torch.empty_like(x_bshd)  # diffusers' WanAttnProcessor rotation, written out
    ref[..., 0::2] = x1 * cos_wan[..., 0::2] - x2 * sin_wan[..., 1::2]
    ref[..., 1::2] = x1 * sin_wan[..., 1::2] + x2 * cos_wan[..., 0::2]
    out = apply_rotary(x_bshd.to(DEVICE), cos.to(DEVICE), sin.to(DEVICE), layout="bshd", interleaved=True)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)


def test_rope3d_rotate_half_is_a_feature_permutation_of_interleaved():
    """Oracle: the interleaved result with features reordered (evens then odds) equals rotate-half on reordered x."""
    gen = torch.Generator().manual_seed(15)
    x = torch.randn(1, 2, 12, 12, generator=gen, dtype=torch.float64)
    perm = torch.cat((torch.arange(0, 12, 2), torch.arange(1, 12, 2)))
    cos_i, sin_i = rope3d_tables(2, 3, 2, 12, interleaved=True, dtype=torch.float64)
    cos_h, sin_h = rope3d_tables(2, 3, 2, 12, interleaved=False, dtype=torch.float64)
    y_inter = rotary_reference(x, cos_i, sin_i, interleaved=True)[..., perm]
    torch.testing.assert_close(rotary_reference(x[..., perm], cos_h, sin_h), y_inter)


def test_errors_name_the_value():
    """Oracle: the documented ValueErrors."""
    cos, sin = rope_tables(torch.arange(5), rope_inv_freq(8))
    with pytest.raises(ValueError, match=r"got \(5, 8\)"):
        apply_rotary(torch.zeros(1, 2, 6, 8), cos, sin)
    with pytest.raises(ValueError, match="layout"):
        apply_rotary(torch.zeros(1, 2, 5, 8), cos, sin, layout="sbhd")
    with pytest.raises(ValueError, match="sum to head_dim // 2 = 16"):
        mrope_tables(torch.zeros(3, 1, 4, dtype=torch.long), 32, sections=(4, 4, 4))
    with pytest.raises(ValueError, match="dim must be a positive even number, got 7"):
        rope_inv_freq(7)
