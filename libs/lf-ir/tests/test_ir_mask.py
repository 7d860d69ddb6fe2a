"""IR mask kinds. Oracles: a brute-force boolean mask built from each kind's definition in plain Python
(every (query, key) pair tested), lf_kernels' own ``dense_mask`` with ``document_ids`` (an independent
implementation of the same kinds), and saved_tensors_hooks for the dense-mask attention path."""

from __future__ import annotations

import msgspec
import pytest
import torch

from lf_ir._graph import Component, Graph, from_json, to_json
from lf_ir._lower import lower_node, materialize
from lf_ir._mask import Mask, as_mask
from lf_ir._nodes import Attention, IRError, TransformerBlock
from lf_kernels import MaskSpec, dense_mask


def _allowed(m: Mask, i: int, j: int, doc: list[int]) -> bool:
    if doc[i] != doc[j]:
        return False
    if m.kind == "full":
        return True
    if m.kind == "causal":
        return j <= i
    if m.kind == "prefix_lm":
        return j <= i or j < m.prefix_len
    if m.kind == "block_causal":
        return j // m.frame_tokens <= i // m.frame_tokens
    (_, h, w), win = m.grid, m.window
    ci = (i // (h * w), (i // w) % h, i % w)
    cj = (j // (h * w), (j // w) % h, j % w)
    if m.causal_t and cj[0] > ci[0]:
        return False
    return all(abs(a - b) <= k // 2 for a, b, k in zip(ci, cj, win, strict=True))


def _brute(m: Mask, seq: int, doc_lens=None) -> int:
    doc = [d for d, n in enumerate(doc_lens or [seq]) for _ in range(n)]
    return sum(_allowed(m, i, j, doc) for i in range(seq) for j in range(seq))


CASES = [
    (Mask(kind="full"), 13), (Mask(kind="causal"), 13), (Mask(kind="prefix_lm", prefix_len=5), 13),
    (Mask(kind="prefix_lm", prefix_len=0), 9), (Mask(kind="block_causal", frame_tokens=4), 13),
    (Mask(kind="block_causal", frame_tokens=1), 7),
    (Mask(kind="window_3d", grid=(3, 4, 5), window=(3, 3, 5)), 60),
    (Mask(kind="window_3d", grid=(4, 3, 6), window=(3, 1, 3), causal_t=True), 72),
    (Mask(kind="window_3d", grid=(2, 2, 2), window=(9, 9, 9)), 8),
]


@pytest.mark.parametrize(("mask", "seq"), CASES, ids=lambda c: getattr(c, "kind", str(c)))
def test_kept_pairs_exact_against_brute_force(mask, seq):
    """Oracle: every pair tested against the kind's definition."""
    assert mask.kept_pairs(seq) == _brute(mask, seq)
    assert mask.keep_fraction(seq) == _brute(mask, seq) / seq ** 2


@pytest.mark.parametrize(("mask", "seq"), CASES, ids=lambda c: getattr(c, "kind", str(c)))
def test_packed_kept_pairs_against_brute_force_and_lf_kernels(mask, seq):
    """Oracles: the brute force with document ids, and lf_kernels.dense_mask with ``document_ids``."""
    packed = msgspec.structs.replace(mask, packed=True)
    docs = [seq // 3, seq - seq // 3 - 2, 2]
    assert packed.kept_pairs(seq, docs) == _brute(packed, seq, docs)
    ids = torch.tensor([[d for d, n in enumerate(docs) for _ in range(n)]])
    keys = ("prefix_len", "frame_tokens", "grid", "window")
    fields = {k: getattr(mask, k) for k in keys if getattr(mask, k) is not None}
    if mask.causal_t:
        fields["causal_t"] = True
    spec = MaskSpec(mask.kind, **fields)
    assert int(dense_mask(spec, seq, seq, document_ids=ids).sum()) == packed.kept_pairs(seq, docs)
    assert int(dense_mask(spec, seq, seq).sum()) == mask.kept_pairs(seq)


def test_attention_unmasked_flops_use_the_kept_fraction():
    """Oracle: the dense convention times the brute-force kept fraction for the score terms."""
    m = Mask(kind="block_causal", frame_tokens=4)
    att = Attention(name="a", dim=32, heads=4, kv_heads=2, mask=m)
    dense = att.forward_flops(3, 13)
    proj = dense - 4 * 3 * 13 * 13 * 32
    assert att.forward_flops_unmasked(3, 13) == proj + 4 * 3 * 32 * _brute(m, 13)
    assert att.keep_fraction(13) == _brute(m, 13) / 169
    assert Attention(name="f", dim=32, heads=4, kv_heads=4, mask="full").forward_flops_unmasked(2, 5) == \
        Attention(name="f", dim=32, heads=4, kv_heads=4, mask="full").forward_flops(2, 5)


def test_json_round_trip_and_bare_string_compatibility():
    """Oracle: decode(encode(graph)) == graph for every kind; bare kind strings still decode."""
    nodes = [Attention(name=f"a{i}", dim=16, heads=2, kv_heads=2, mask=m) for i, (m, _) in enumerate(CASES)]
    nodes += [Attention(name="s", dim=16, heads=2, kv_heads=2, mask="causal"),
              Attention(name="p", dim=16, heads=2, kv_heads=2, mask=Mask(kind="causal", packed=True))]
    g = Graph(name="g", recipe="t", components=[Component(name="c", modality="sequence", seq_len=8, nodes=nodes)])
    data = to_json(g)
    assert from_json(data) == g
    assert b'"mask":"causal"' in data and b'"grid":[3,4,5]' in data
    assert as_mask("prefix_lm") == Mask(kind="prefix_lm", prefix_len=0)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(mask="sliding"), r"node 'attn' \(Attention\): unknown mask kind 'sliding'"),
    (dict(mask="block_causal"), r"'attn'.*mask kind 'block_causal' has parameters"),
    (dict(mask=Mask(kind="block_causal")), r"'attn'.*mask: mask kind 'block_causal' needs frame_tokens"),
    (dict(mask=Mask(kind="block_causal", frame_tokens=0)), r"frame_tokens must be a positive int, got 0"),
    (dict(mask=Mask(kind="window_3d", grid=(2, 3, 4), window=(3, 2, 3))), r"window must be three positive odd"),
    (dict(mask=Mask(kind="causal", frame_tokens=4)), r"frame_tokens is only for"),
    (dict(mask=Mask(kind="prefix_lm", prefix_len=-1)), r"prefix_len must be an int >= 0, got -1"),
    (dict(mask=Mask(kind="causal", causal_t=True)), r"causal_t is only for mask kind 'window_3d'"),
])
def test_invalid_masks_fail_naming_the_node(kwargs, message):
    with pytest.raises(IRError, match=message):
        Attention(name="attn", dim=16, heads=2, kv_heads=2, **kwargs)


def test_kept_pairs_argument_errors():
    m = Mask(kind="window_3d", grid=(2, 2, 2), window=(1, 1, 1))
    with pytest.raises(ValueError, match=r"seq 9 is not the grid size 2x2x2"):
        m.kept_pairs(9)
    with pytest.raises(ValueError, match="not packed"):
        m.kept_pairs(8, [4, 4])
    with pytest.raises(ValueError, match=r"summing to seq=8, got \[4, 3\]"):
        Mask(kind="causal", packed=True).kept_pairs(8, [4, 3])


@pytest.mark.parametrize("mask", [Mask(kind="block_causal", frame_tokens=4),
                                  Mask(kind="window_3d", grid=(3, 2, 2), window=(1, 3, 3)),
                                  Mask(kind="block_causal", frame_tokens=1)], ids=["frames", "window", "as_causal"])
def test_dense_mask_kinds_saved_bytes_match_autograd(mask):
    """Oracle: saved_tensors_hooks on a lowered block through lf_kernels.attention (dense-mask CPU path, or
    the causal flash path for one token per frame)."""
    from test_ir_bytes import measure_saved

    from lf_ir._nodes import MLP, Norm
    node = TransformerBlock(name="b", attn_norm=Norm(name="n1", dim=16),
                            attention=Attention(name="a", dim=16, heads=4, kv_heads=2, mask=mask),
                            mlp_norm=Norm(name="n2", dim=16, kind="rms"), mlp=MLP(name="m", dim=16, hidden=24))
    with torch.device("meta"):
        module = lower_node(node)
    module = materialize(module, "cpu", 0)
    fields = {k: getattr(mask, k) for k in ("frame_tokens", "grid", "window") if getattr(mask, k) is not None}
    x = torch.randn(2, 12, 16, requires_grad=True)
    measured = measure_saved(lambda: module(x, MaskSpec(mask.kind, **fields)), module)
    assert abs(node.saved_bytes(2, 12, 4) - measured) <= 0.05 * measured
