"""attention_reference against a literal Python-loop softmax."""

import math

import torch

from lf_kernels import MaskSpec, attention_reference


def _loop_attention(q, k, v, allowed, scale):
    """Textbook attention with Python floats: one query row, one key at a time."""
    batch, heads_q, seq_q, head_dim = q.shape
    heads_kv, seq_kv = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    out = [[[[0.0] * v.shape[3] for _ in range(seq_q)] for _ in range(heads_q)] for _ in range(batch)]
    lse = [[[float("-inf")] * seq_q for _ in range(heads_q)] for _ in range(batch)]
    for b in range(batch):
        for h in range(heads_q):
            hk = h // group
            for i in range(seq_q):
                keys = [j for j in range(seq_kv) if allowed(b, i, j)]
                if not keys:
                    continue
                scores = {
                    j: scale * sum(q[b, h, i, d].item() * k[b, hk, j, d].item() for d in range(head_dim))
                    for j in keys
                }
                denom = sum(math.exp(s) for s in scores.values())
                lse[b][h][i] = math.log(denom)
                for d in range(v.shape[3]):
                    out[b][h][i][d] = sum(
                        math.exp(scores[j]) / denom * v[b, hk, j, d].item() for j in keys
                    )
    return torch.tensor(out, dtype=torch.float64), torch.tensor(lse, dtype=torch.float64)


def test_reference_matches_python_loop_softmax():
    """Oracle: a literal loop softmax with Python floats (math.exp / math.log).

    Tiny case: GQA ratio 2, seq_q=3 < seq_kv=4 (end-aligned causal), batch
    element 1 has one padded key, batch element 0 none.
    """
    torch.manual_seed(0)
    q = torch.randn(2, 2, 3, 3, dtype=torch.float64)
    k = torch.randn(2, 1, 4, 3, dtype=torch.float64)
    v = torch.randn(2, 1, 4, 2, dtype=torch.float64)
    key_padding = torch.tensor([[True, True, True, True], [True, False, True, True]])
    scale = 1 / math.sqrt(3)

    def allowed(b, i, j):
        position = 4 - 3 + i
        return j <= position and bool(key_padding[b, j])

    want_out, want_lse = _loop_attention(q, k, v, allowed, scale)
    out, lse = attention_reference(q, k, v, MaskSpec("causal"), key_padding=key_padding)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)


def test_reference_prefix_lm_and_empty_rows_match_loop():
    """Oracle: the loop softmax with the prefix-LM rule written out; empty rows -> 0, -inf."""
    torch.manual_seed(1)
    q = torch.randn(1, 1, 4, 2, dtype=torch.float64)
    k = torch.randn(1, 1, 3, 2, dtype=torch.float64)
    v = torch.randn(1, 1, 3, 2, dtype=torch.float64)

    def allowed(b, i, j):
        position = 3 - 4 + i  # query 0 sits at position -1: no key
        return position >= 0 and (j <= position or j < 2)

    want_out, want_lse = _loop_attention(q, k, v, allowed, 0.5)
    out, lse = attention_reference(q, k, v, MaskSpec("prefix_lm", prefix_len=2), scale=0.5)
    assert torch.isneginf(lse[0, 0, 0]) and torch.equal(out[0, 0, 0], torch.zeros(2, dtype=torch.float64))
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)
