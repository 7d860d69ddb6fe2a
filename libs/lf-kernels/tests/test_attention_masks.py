"""attention() with block_causal / window_3d / packed documents against attention_reference (float64).

Oracle everywhere: ``attention_reference`` in float64 on the same fresh random
inputs (its dense mask is itself checked against a Python loop in
test_mask_kinds.py); outputs, the log-sum-exp and the gradients of q, k, v.
"""

import zlib

import pytest
import torch

from lf_kernels._attention import attention
from lf_kernels._mask import MaskSpec
from lf_kernels._reference import attention_reference

# Both sides compute the same maths in double precision; only summation order differs.
F64_TOL = {"rtol": 1e-10, "atol": 1e-10}

# (heads_q, heads_kv, head_dim, grid): GQA ratios 1 / 4 / 8, head dims 64 / 80 / 128,
# sequence lengths 105 / 231 / 143 (odd, not multiples of 128), each a window_3d grid.
CONFIGS = [(2, 2, 64, (3, 5, 7)), (4, 1, 80, (3, 7, 11)), (8, 1, 128, (1, 11, 13))]


def _masks(grid):
    seq = grid[0] * grid[1] * grid[2]
    return {
        "full": MaskSpec("full"),
        "causal": MaskSpec("causal"),
        "prefix_lm": MaskSpec("prefix_lm", prefix_len=seq // 3),
        "block_causal": MaskSpec("block_causal", frame_tokens=grid[1] * grid[2]),
        "block_causal_odd": MaskSpec("block_causal", frame_tokens=17),
        "window_3d": MaskSpec("window_3d", grid=grid, window=(3, 3, 5)),
        "window_3d_causal_t": MaskSpec("window_3d", grid=grid, window=(3, 5, 3), causal_t=True),
    }


def _inputs(params, heads_q, heads_kv, seq_q, seq_kv, head_dim, batch=2):
    gen = torch.Generator().manual_seed(zlib.crc32(repr(params).encode()))

    def randn(*size):
        return torch.randn(*size, generator=gen, dtype=torch.float64).requires_grad_()

    q = randn(batch, heads_q, seq_q, head_dim)
    k = randn(batch, heads_kv, seq_kv, head_dim)
    v = randn(batch, heads_kv, seq_kv, head_dim)
    # Packed documents: random cut points per row, ids increasing (0, 0, 1, 1, 1, 2, ...).
    cuts = torch.rand(batch, seq_kv, generator=gen) < 4 / seq_kv
    document_ids = torch.cumsum(cuts.long(), dim=1)
    grad_out = torch.randn(batch, heads_q, seq_q, head_dim, generator=gen, dtype=torch.float64)
    grad_lse = torch.randn(batch, heads_q, seq_q, generator=gen, dtype=torch.float64)
    return q, k, v, document_ids, grad_out, grad_lse


def _check(q, k, v, mask, grad_out, grad_lse, return_lse, **extra):
    ref_out, ref_lse = attention_reference(q, k, v, mask, **extra)
    result = attention(q, k, v, mask, return_lse=return_lse, **extra)
    if return_lse:
        out, lse = result
        assert lse.dtype == torch.float64
        torch.testing.assert_close(lse, ref_lse, **F64_TOL)
        outputs, ref_outputs, grads_up = (out, lse), (ref_out, ref_lse), (grad_out, grad_lse)
    else:
        out = result
        outputs, ref_outputs, grads_up = (out,), (ref_out,), (grad_out,)
    torch.testing.assert_close(out, ref_out, **F64_TOL)
    grads = torch.autograd.grad(outputs, (q, k, v), grads_up)
    ref_grads = torch.autograd.grad(ref_outputs, (q, k, v), grads_up)
    for name, got, want in zip("qkv", grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, **F64_TOL, msg=lambda m, n=name: f"d{n}: {m}")


@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("documents", [False, True])
@pytest.mark.parametrize("kind", list(_masks((1, 1, 1))))
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"gqa{c[0] // c[1]}-d{c[2]}-s{c[3][0] * c[3][1] * c[3][2]}")
def test_matches_reference_float64(config, kind, documents, return_lse):
    """Oracle: attention_reference in float64; out, lse and grads of q, k, v, every kind x documents."""
    heads_q, heads_kv, head_dim, grid = config
    seq = grid[0] * grid[1] * grid[2]
    mask = _masks(grid)[kind]
    q, k, v, document_ids, grad_out, grad_lse = _inputs(
        (config, kind, documents, return_lse), heads_q, heads_kv, seq, seq, head_dim
    )
    extra = {"document_ids": document_ids} if documents else {}
    _check(q, k, v, mask, grad_out, grad_lse, return_lse, **extra)


@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("kind", ["block_causal", "window_3d_causal_t", "causal"])
def test_chunk_of_queries_with_documents_and_padding(kind, return_lse):
    """Oracle: float64 reference; the last 40 of 105 queries (end-aligned), documents and key padding together."""
    grid = (3, 5, 7)
    q, k, v, document_ids, grad_out, grad_lse = _inputs(("chunk", kind, return_lse), 4, 2, 40, 105, 64)
    key_padding = torch.ones(2, 105, dtype=torch.bool)
    key_padding[1, 90:] = False
    _check(q, k, v, _masks(grid)[kind], grad_out, grad_lse, return_lse,
           document_ids=document_ids, key_padding=key_padding)


def test_math_path_query_chunking_matches_reference(monkeypatch):
    """Oracle: float64 reference; a tiny score budget forces the chunked, checkpointed math path."""
    import lf_kernels._math as math_module

    real = math_module.attention_math
    monkeypatch.setattr(
        "lf_kernels._attention.attention_math",
        lambda *args, **kwargs: real(*args, max_score_bytes=2 * 2 * 105 * 8 * 16, **kwargs),
    )
    grid = (3, 5, 7)
    q, k, v, document_ids, grad_out, grad_lse = _inputs(("chunked",), 2, 2, 105, 105, 64)
    _check(q, k, v, _masks(grid)["window_3d"], grad_out, grad_lse, True, document_ids=document_ids)


def test_packed_documents_equal_separate_sequences():
    """Oracle: each document run alone through the reference (causal), concatenated."""
    q, k, v, _, _, _ = _inputs(("separate",), 4, 2, 30, 30, 16, batch=1)
    document_ids = torch.tensor([[0] * 7 + [1] * 15 + [2] * 8])
    out = attention(q, k, v, MaskSpec("causal"), document_ids=document_ids)
    pieces = [attention_reference(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], MaskSpec("causal"))[0]
              for a, b in ((0, 7), (7, 22), (22, 30))]
    torch.testing.assert_close(out, torch.cat(pieces, dim=2), **F64_TOL)


def test_fully_masked_rows_with_documents():
    """Oracle: the contract; a query whose document's keys are all padded gets out 0, lse -inf, finite grads."""
    q, k, v, _, grad_out, grad_lse = _inputs(("empty",), 2, 2, 6, 6, 16, batch=1)
    document_ids = torch.tensor([[0, 0, 0, 1, 1, 1]])
    key_padding = torch.tensor([[True, True, True, False, False, False]])
    out, lse = attention(q, k, v, MaskSpec("full"), document_ids=document_ids, key_padding=key_padding,
                         return_lse=True)
    assert torch.equal(out[:, :, 3:], torch.zeros_like(out[:, :, 3:]))
    assert torch.isneginf(lse[:, :, 3:]).all() and torch.isfinite(lse[:, :, :3]).all()
    for grad in torch.autograd.grad((out, lse), (q, k, v), (grad_out, grad_lse)):
        assert torch.isfinite(grad).all()
