"""torch's ``varlen_attn`` as the packed-document backend, and the tensor-keyed cache, run on the CPU.

Oracles: ``attention_reference`` in float64 with ``document_ids`` (forward and the q / k / v gradients), with
torch's CUDA-only ``varlen_attn`` replaced by a stand-in that computes each segment by the reference under
either keyword set (newer torch: ``scale`` / ``window_size`` / ``enable_gqa``; older: ``is_causal`` only).
The stand-in asserts what the plumbing passes (one kv head per q head where ``enable_gqa`` is missing).
"""

import math
import sys

import pytest
import torch

import lf_kernels._attention as attention_module
import lf_kernels._varlen as varlen_module
from lf_kernels._attention import attention
from lf_kernels._dispatch import choose_backend
from lf_kernels._mask import MaskSpec
from lf_kernels._reference import attention_reference
from lf_kernels._tensor_cache import TensorKeyedCache
from lf_kernels._varlen import document_segments, document_segments_cached

F64_TOL = {"rtol": 1e-10, "atol": 1e-10}
NEW = frozenset({"query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k", "return_aux", "scale",
                 "window_size", "enable_gqa"})
OLD = frozenset({"query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k", "is_causal", "return_aux"})


def _fake_varlen(calls, params):
    def varlen_attn(q_thd, k_thd, v_thd, cu_q, cu_k, max_q, max_k, **kw):
        assert set(kw) <= params, f"passed {set(kw) - params} that this torch lacks"
        assert torch.equal(cu_q, cu_k) and max_q == max_k
        causal = kw["window_size"] == (-1, 0) if "window_size" in kw else kw["is_causal"]
        scale = kw.get("scale", 1.0 / math.sqrt(q_thd.shape[-1]))
        if not kw.get("enable_gqa", False):
            assert k_thd.shape[1] == q_thd.shape[1]
        calls.append((cu_q.tolist(), max_q, causal, k_thd.shape[1]))
        outs = []
        for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True):
            seg = [t[a:b].transpose(0, 1)[None] for t in (q_thd, k_thd, v_thd)]
            outs.append(attention_reference(*seg, MaskSpec("causal" if causal else "full"),
                                            scale=scale)[0][0].transpose(0, 1))
        return torch.cat(outs)

    return varlen_attn


@pytest.mark.parametrize(("params", "kind", "scale"), [(NEW, "causal", None), (NEW, "full", 0.3),
                                                       (OLD, "causal", 0.3), (OLD, "full", None)])
def test_torch_varlen_plumbing(monkeypatch, params, kind, scale):
    """Oracle: float64 reference with document_ids, forward and grads; GQA 8:2 either natively or expanded."""
    from torch.nn.attention import varlen

    calls = []
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # not installed: torch's kernel serves
    monkeypatch.setattr(varlen, "varlen_attn", _fake_varlen(calls, params), raising=False)
    monkeypatch.setattr(varlen_module, "_torch_varlen_params", lambda: params)

    def on_cuda(*args, **kwargs):
        return choose_backend(*args, **{**kwargs, "device": "cuda", "dtype": torch.bfloat16, "flash_attn":
                                        kwargs.get("flash_attn", True), "flex": False})

    monkeypatch.setattr(attention_module, "choose_backend", on_cuda)
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, h, 30, 16, generator=gen, dtype=torch.float64).requires_grad_() for h in (8, 2, 2))
    ids = torch.tensor([[0] * 7 + [1] * 15 + [2] * 8, [4] * 30])
    out = attention(q, k, v, MaskSpec(kind), document_ids=ids, scale=scale)
    assert calls == [([0, 7, 22, 30, 60], 30, kind == "causal", 2 if "enable_gqa" in params else 8)]
    ref, _ = attention_reference(q, k, v, MaskSpec(kind), document_ids=ids, scale=scale)
    torch.testing.assert_close(out, ref, **F64_TOL)
    grad = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **F64_TOL)


def test_head_dim_outside_flash_limits_falls_back(monkeypatch):
    """Oracle: float64 reference; head dim 12 (not a multiple of 8) never reaches the varlen kernel."""
    calls = []
    from torch.nn.attention import varlen

    monkeypatch.setitem(sys.modules, "flash_attn", None)
    monkeypatch.setattr(varlen, "varlen_attn", _fake_varlen(calls, NEW), raising=False)
    monkeypatch.setattr(varlen_module, "_torch_varlen_params", lambda: NEW)
    monkeypatch.setattr(attention_module, "choose_backend", lambda *a, **kw: choose_backend(
        *a, **{**kw, "device": "cuda", "dtype": torch.bfloat16, "flash_attn": kw.get("flash_attn", True),
               "flex": False}))
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 20, 12, generator=gen, dtype=torch.float64) for _ in range(3))
    ids = torch.tensor([[0] * 9 + [1] * 11])
    out = attention(q, k, v, MaskSpec("causal"), document_ids=ids)
    assert calls == []
    torch.testing.assert_close(out, attention_reference(q, k, v, MaskSpec("causal"), document_ids=ids)[0],
                               **F64_TOL)


def test_document_segments_cached_per_tensor_and_version():
    """Oracle: document_segments on the same data; a new tensor or an in-place edit recomputes."""
    ids = torch.tensor([[0, 0, 1, 1, 1], [5, 5, 5, 5, 5]])
    first = document_segments_cached(ids)
    assert first[0].tolist() == [0, 2, 5, 10] and first[1] == 5
    assert document_segments_cached(ids) is first
    ids[1, 3:] = 6  # in place: the version moves on
    again = document_segments_cached(ids)
    assert again is not first and again[0].tolist() == document_segments(ids)[0].tolist() == [0, 2, 5, 8, 10]
    assert document_segments_cached(ids.clone()) is not again


def test_tensor_keyed_cache_evicts_and_never_confuses_freed_tensors():
    """Oracle: build counts; a freed tensor's id reused by a new tensor misses (weak reference check)."""
    cache, builds = TensorKeyedCache(size=2), []

    def build(tag):
        builds.append(tag)
        return tag

    a, b, c = (torch.zeros(3) for _ in range(3))
    assert cache.get((a,), 1, lambda: build("a")) == "a"
    assert cache.get((a,), 1, lambda: build("a2")) == "a" and builds == ["a"]
    assert cache.get((a,), 2, lambda: build("a-static2")) == "a-static2"  # static key differs
    cache.get((b,), 1, lambda: build("b"))
    assert cache.get((a,), 1, lambda: build("a3")) == "a3"  # evicted (size 2)
    assert cache.get((None, c), 1, lambda: build("c")) == "c" and cache.get((None, c), 1, lambda: "x") == "c"
    with pytest.raises(ValueError, match="size must be > 0"):
        TensorKeyedCache(size=0)
