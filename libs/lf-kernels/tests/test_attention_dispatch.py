"""The dispatcher's choices, and the CUDA-only backends' logic run on the CPU.

Oracles: the dispatch order written in ``lf_kernels._dispatch``'s docstring
(asked for CUDA from a CPU machine); ``attention_reference`` in float64 for the
per-frame SDPA decomposition, the FlexAttention ``mask_mod`` (eager forward,
which runs on the CPU) and the flash_attn varlen plumbing (driven through a
stand-in ``flash_attn`` module that computes each segment with the reference).
"""

import sys
import types
import zlib

import pytest
import torch

from lf_kernels._attention import _sdpa_frames, attention
from lf_kernels._dispatch import canonical_mask, choose_backend, select_backend
from lf_kernels._mask import MaskSpec
from lf_kernels._reference import attention_reference
from lf_kernels._varlen import document_segments

F64_TOL = {"rtol": 1e-10, "atol": 1e-10}
BC = MaskSpec("block_causal", frame_tokens=1560)
WIN = MaskSpec("window_3d", grid=(21, 30, 52), window=(3, 9, 9))
S_BC, S_WIN = 32760, 21 * 30 * 52


@pytest.mark.parametrize(
    ("mask", "seqs", "facts", "expected"),
    [
        (MaskSpec("full"), (8192, 8192), {}, "sdpa"),
        (MaskSpec("causal"), (8192, 8192), {}, "sdpa_causal"),
        (MaskSpec("block_causal", frame_tokens=1), (500, 500), {}, "sdpa_causal"),
        (MaskSpec("window_3d", grid=(2, 3, 4), window=(3, 5, 7)), (24, 24), {}, "sdpa"),
        (MaskSpec("causal"), (4096, 4096), {"has_documents": True}, "flex"),
        (MaskSpec("causal"), (4096, 4096), {"has_documents": True, "flex": False}, "flash_varlen"),
        (MaskSpec("full"), (4096, 4096), {"has_documents": True, "flex": False}, "flash_varlen"),
        (MaskSpec("causal"), (4096, 4096), {"has_documents": True, "flash_attn": False}, "flex"),
        (MaskSpec("causal"), (4096, 4096), {"has_documents": True, "flash_attn": False, "flex": False}, "sdpa_mask"),
        (MaskSpec("causal"), (4096, 4096), {"has_documents": True, "return_lse": True}, "flex"),
        (MaskSpec("causal"), (4096, 4096), {"has_documents": True, "dtype": torch.float32}, "flex"),
        (MaskSpec("causal"), (4096, 4096), {"has_documents": True, "has_key_padding": True}, "flex"),
        (BC, (S_BC, S_BC), {}, "sdpa_split"),
        (BC, (S_BC, S_BC), {"return_lse": True}, "sdpa_split"),
        (BC, (S_BC, S_BC), {"dtype": torch.float16, "flex": False}, "sdpa_split"),
        (BC, (S_BC, S_BC), {"split": False}, "flex"),
        (BC, (S_BC, S_BC), {"return_lse": True, "split": False}, "flex"),
        (BC, (S_BC, S_BC), {"dtype": torch.float32}, "flex"),
        (BC, (S_BC, S_BC), {"has_key_padding": True}, "flex"),
        (BC, (4096, S_BC), {}, "flex"),  # q_len != kv_len
        (BC, (S_BC, S_BC), {"flex": False, "split": False}, "sdpa_frames"),
        (BC, (S_BC, S_BC), {"flex": False, "has_documents": True}, "sdpa_mask"),
        (BC, (S_BC, S_BC), {"has_documents": True}, "flex"),
        (MaskSpec("block_causal", frame_tokens=100), (S_BC, S_BC), {"flex": False, "split": False},
         "sdpa_mask"),  # > MAX_FRAMES
        (WIN, (S_WIN, S_WIN), {}, "flex_tiles"),
        (WIN, (S_WIN, S_WIN), {"has_key_padding": True}, "flex"),
        (WIN, (S_WIN, S_WIN), {"return_lse": True}, "flex_tiles"),
        (WIN, (S_WIN, S_WIN), {"dtype": torch.float32}, "flex_tiles"),
        (MaskSpec("window_3d", grid=(4, 6, 10), window=(3, 3, 5)), (240, 240), {}, "flex"),  # tiles gain < 15%
        (WIN, (S_WIN, S_WIN), {"has_documents": True}, "flex"),
        (MaskSpec("prefix_lm", prefix_len=300), (4096, 4096), {}, "flex"),
        (MaskSpec("causal"), (1, 4096), {}, "sdpa_mask"),  # decoding: below FLEX_MIN_Q
        (MaskSpec("causal"), (1, 4096), {"return_lse": True}, "math"),
        (MaskSpec("causal"), (4096, 4096), {"return_lse": True}, "flex"),
        (WIN, (S_WIN, S_WIN), {"flex": False}, "sdpa_mask"),
        (WIN, (S_WIN, S_WIN), {"flex": False, "return_lse": True}, "math"),
        (WIN, (S_WIN, S_WIN), {"dtype": torch.float64}, "sdpa_mask"),
    ],
)
def test_cuda_dispatch_table(mask, seqs, facts, expected):
    """Oracle: the dispatch order in lf_kernels._dispatch's docstring (bf16 on CUDA; flash_attn, Flex, split ops)."""
    kwargs = {"device": "cuda", "dtype": torch.bfloat16, "flash_attn": True, "flex": True, "split": True, **facts}
    assert choose_backend(mask, *seqs, **kwargs) == expected


@pytest.mark.parametrize(
    ("mask", "facts", "expected"),
    [
        (BC, {}, "sdpa_mask"),
        (WIN, {"return_lse": True}, "math"),
        (MaskSpec("causal"), {"has_documents": True}, "sdpa_mask"),
        (MaskSpec("causal"), {}, "sdpa_causal"),
    ],
)
def test_cpu_dispatch_never_flex(mask, facts, expected):
    """Oracle: docstring; FlexAttention has no CPU backward, flash_attn is CUDA-only."""
    seq = S_WIN if mask.kind == "window_3d" else S_BC
    got = choose_backend(mask, seq, seq, device="cpu", dtype=torch.bfloat16, flash_attn=True, flex=True, **facts)
    assert got == expected
    legacy = select_backend(mask, seq, seq, has_key_padding=False, return_lse=facts.get("return_lse", False),
                            has_documents=facts.get("has_documents", False))
    assert legacy == expected


def test_canonical_mask():
    """Oracle: the equivalences in canonical_mask's docstring, checked on the dense masks too."""
    from lf_kernels._mask import dense_mask

    cases = [
        (MaskSpec("block_causal", frame_tokens=1), 9, 9, "causal"),
        (MaskSpec("block_causal", frame_tokens=9), 9, 9, "full"),
        (MaskSpec("block_causal", frame_tokens=9), 12, 9, "block_causal"),  # negative positions stay masked
        (MaskSpec("prefix_lm", prefix_len=0), 9, 9, "causal"),
        (MaskSpec("window_3d", grid=(2, 3, 4), window=(3, 5, 7)), 24, 24, "full"),
        (MaskSpec("window_3d", grid=(2, 3, 4), window=(3, 5, 7), causal_t=True), 24, 24, "window_3d"),
    ]
    for mask, seq_q, seq_kv, kind in cases:
        canon = canonical_mask(mask, seq_q, seq_kv)
        assert canon.kind == kind
        assert torch.equal(dense_mask(canon, seq_q, seq_kv), dense_mask(mask, seq_q, seq_kv))


def _qkv(seed, heads_q, heads_kv, seq_q, seq_kv, head_dim, batch=2):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, h, s, head_dim, generator=gen, dtype=torch.float64).requires_grad_()
            for h, s in ((heads_q, seq_q), (heads_kv, seq_kv), (heads_kv, seq_kv))]


@pytest.mark.parametrize("frame_tokens", [1, 7, 13, 50, 60])
def test_sdpa_frames_matches_reference(frame_tokens):
    """Oracle: float64 reference with the block_causal mask; forward and grads of q, k, v."""
    q, k, v = _qkv(frame_tokens, 8, 2, 50, 50, 32)
    out = _sdpa_frames(q, k, v, frame_tokens, scale=32**-0.5)
    ref, _ = attention_reference(q, k, v, MaskSpec("block_causal", frame_tokens=frame_tokens))
    torch.testing.assert_close(out, ref, **F64_TOL)
    grad = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad),
                         strict=True):
        torch.testing.assert_close(got, want, **F64_TOL)


FLEX_MASKS = [
    MaskSpec("block_causal", frame_tokens=13),
    MaskSpec("window_3d", grid=(3, 5, 7), window=(3, 3, 5)),
    MaskSpec("window_3d", grid=(3, 5, 7), window=(1, 5, 3), causal_t=True),
    MaskSpec("prefix_lm", prefix_len=9),
]


@pytest.mark.parametrize("mask", FLEX_MASKS)
@pytest.mark.parametrize("extras", ["none", "documents+padding"])
@pytest.mark.parametrize("seq_q", [105, 40])
def test_flex_mask_mod_matches_reference(mask, extras, seq_q):
    """Oracle: float64 reference; FlexAttention's eager CPU forward on our block mask (out and lse).

    Checks the mask_mod (offsets, documents, padding, GQA) on the CPU; the compiled
    CUDA kernels and their backward are covered by the GPU tests.
    """
    pytest.importorskip("torch.nn.attention.flex_attention")
    from torch.nn.attention.flex_attention import flex_attention

    from lf_kernels._flex import block_mask_for

    q, k, v = (t.detach() for t in _qkv(zlib.crc32(repr((mask, extras, seq_q)).encode()), 4, 2, seq_q, 105, 16))
    extra = {}
    if extras != "none":
        gen = torch.Generator().manual_seed(seq_q)
        extra["document_ids"] = torch.cumsum((torch.rand(2, 105, generator=gen) < 0.05).long(), dim=1)
        extra["key_padding"] = torch.rand(2, 105, generator=gen) > 0.2
    block_mask = block_mask_for(mask, seq_q, 105, "cpu", **extra)
    out, lse = flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True, return_lse=True)
    ref_out, ref_lse = attention_reference(q, k, v, mask, **extra)
    has_key = torch.isfinite(ref_lse)
    torch.testing.assert_close(out[has_key], ref_out[has_key], **F64_TOL)
    torch.testing.assert_close(lse[has_key], ref_lse[has_key], **F64_TOL)
    assert not torch.isfinite(lse[~has_key]).any()


def test_document_segments():
    """Oracle: hand-computed cumulative boundaries; a non-contiguous id gives None."""
    ids = torch.tensor([[0, 0, 1, 1, 1], [5, 5, 5, 5, 5]])
    cu_seqlens, max_seqlen = document_segments(ids)
    assert cu_seqlens.tolist() == [0, 2, 5, 10] and cu_seqlens.dtype == torch.int32
    assert max_seqlen == 5
    assert document_segments(torch.tensor([[0, 1, 0]])) is None


def _fake_flash_attn(calls):
    """A stand-in flash_attn: flash_attn_varlen_func computed per segment by the reference."""

    def flash_attn_varlen_func(q_thd, k_thd, v_thd, cu_q, cu_k, max_q, max_k, *, dropout_p, softmax_scale, causal):
        calls.append((cu_q.tolist(), max_q, causal))
        assert torch.equal(cu_q, cu_k) and dropout_p == 0.0
        outs = []
        for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True):
            seg = [t[a:b].transpose(0, 1)[None] for t in (q_thd, k_thd, v_thd)]
            mask = MaskSpec("causal" if causal else "full")
            outs.append(attention_reference(*seg, mask, scale=softmax_scale)[0][0].transpose(0, 1))
        return torch.cat(outs)

    return types.SimpleNamespace(flash_attn_varlen_func=flash_attn_varlen_func)


@pytest.mark.parametrize("kind", ["causal", "full"])
def test_flash_varlen_plumbing(monkeypatch, kind):
    """Oracle: float64 reference with document_ids; attention() routed to flash_varlen with a stand-in flash_attn."""
    import lf_kernels._attention as attention_module

    calls = []
    monkeypatch.setitem(sys.modules, "flash_attn", _fake_flash_attn(calls))

    def on_cuda(*args, **kwargs):
        return choose_backend(*args, **{**kwargs, "device": "cuda", "dtype": torch.bfloat16, "flash_attn":
                                        kwargs.get("flash_attn", True), "flex": False})

    monkeypatch.setattr(attention_module, "choose_backend", on_cuda)
    q, k, v = _qkv(3, 8, 2, 30, 30, 16)
    ids = torch.tensor([[0] * 7 + [1] * 15 + [2] * 8, [4] * 30])
    out = attention(q, k, v, MaskSpec(kind), document_ids=ids)
    assert calls == [([0, 7, 22, 30, 60], 30, kind == "causal")]
    ref, _ = attention_reference(q, k, v, MaskSpec(kind), document_ids=ids)
    torch.testing.assert_close(out, ref, **F64_TOL)
    # Non-contiguous ids: flash_attn is not called, the general path answers.
    ids_split = torch.tensor([[0] * 7 + [1] * 15 + [0] * 8, [4] * 30])
    out = attention(q, k, v, MaskSpec(kind), document_ids=ids_split)
    assert len(calls) == 1
    torch.testing.assert_close(out, attention_reference(q, k, v, MaskSpec(kind), document_ids=ids_split)[0],
                               **F64_TOL)
