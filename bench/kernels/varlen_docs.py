"""Packed-document attention: the dispatcher's varlen path against FlexAttention's document mask.

Usage (one H200):  python bench/kernels/varlen_docs.py --out bench/results/varlen_docs_h200.json
CPU smoke test:    python bench/kernels/varlen_docs.py --dry --out /tmp/varlen_dry.json

`lf run`'s llm family packs documents back to back into 8,192-token rows and masks attention to each
document (``document_ids``); the vlm family's vision tower packs images the same way (full attention per
image). Cases (bf16, batch 1, forward + backward):

(d) causal documents, S = 8,192, 32 query / 8 kv heads x 128 (Llama-3-8B), document lengths drawn from a
    geometric distribution of mean 88 tokens (the stdlib-docstring corpus of ``examples/full/llama3_8b.toml``:
    3,433 documents over 37 rows) and of mean 1,024;
(e) full attention per image, 8 images x 1,024 patches, 16 heads x 80 (Qwen2-VL's vision tower at 448 px).

Contenders: ``dispatcher`` (``attention(..., document_ids=...)``; its backend is recorded per case: the
committed H200 file was measured when the dispatcher preferred ``flash_varlen``, now it takes Flex with the
cached block mask), ``varlen`` (the varlen kernel called directly), ``flex_per_call`` (FlexAttention with the
block mask built on every call, as each layer did before lf-kernels 0.4), ``flex_cached`` (block mask built
once, outside the timing), and ``sdpa_row`` (one cuDNN causal / full call over the whole row, ignoring the
documents: the cost the benchmark's unpacked rows pay, not the same result).
TFLOP/s count the kept entries only (per document ``L (L + 1) / 2`` causal, ``L^2``
full), forward ``4 * heads * kept * head_dim``, backward 2.5x. Times: median of ``--iters`` CUDA-event-timed
steps after ``--warmup`` (``attention.py``'s loop).
"""

from __future__ import annotations

import argparse
import json
import platform

import torch
from attention import _fwd_bwd, _sdpa_with, _time_steps

from lf_kernels import MaskSpec, attention, choose_backend


def document_ids(seq: int, mean_len: float, seed: int) -> torch.Tensor:
    """``(1, seq)`` int64 ids of back-to-back documents with geometric lengths of mean ``mean_len``."""
    gen = torch.Generator().manual_seed(seed)
    starts = (torch.rand(seq, generator=gen) < 1.0 / mean_len).long()
    starts[0] = 0
    return torch.cumsum(starts, 0)[None]


def kept(ids: torch.Tensor, causal: bool) -> int:
    lengths = torch.unique_consecutive(ids[0], return_counts=True)[1].double()
    return int((lengths * (lengths + 1) / 2).sum() if causal else (lengths**2).sum())


def run_case(name, causal, ids, heads_q, heads_kv, head_dim, args, device, dtype):
    seq = ids.shape[1]
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(1, heads_q, seq, head_dim, device=device, dtype=dtype, generator=gen).requires_grad_()
    k, v = (torch.randn(1, heads_kv, seq, head_dim, device=device, dtype=dtype, generator=gen).requires_grad_()
            for _ in range(2))
    grad = torch.randn_like(q)
    ids = ids.to(device)
    mask = MaskSpec("causal" if causal else "full")
    contenders = {"dispatcher": lambda q, k, v: attention(q, k, v, mask, document_ids=ids)}
    if not args.dry:
        from torch.nn.attention.flex_attention import create_block_mask

        from lf_kernels._flex import _compiled_flex, _mask_mod, attention_flex

        scale = head_dim**-0.5
        contenders["flex_per_call"] = lambda q, k, v: attention_flex(q, k, v, mask, scale,
                                                                     document_ids=ids.clone())[0]
        block = create_block_mask(_mask_mod(mask, 0, None, ids), 1, None, seq, seq, device=device)
        contenders["flex_cached"] = lambda q, k, v: _compiled_flex()(q, k, v, block_mask=block, scale=scale,
                                                                     enable_gqa=heads_q != heads_kv)
        contenders["sdpa_row"] = _sdpa_with("CUDNN_ATTENTION", causal=causal)
        from lf_kernels._varlen import attention_flash_varlen, document_segments, varlen_available

        if varlen_available():  # the varlen kernel called directly, whatever the dispatcher prefers
            segments = document_segments(ids)
            contenders["varlen"] = lambda q, k, v: attention_flash_varlen(q, k, v, segments, causal=causal,
                                                                          scale=scale)
    flops = 3.5 * 4 * heads_q * kept(ids.cpu(), causal) * head_dim
    rows = {}
    for label, fn in contenders.items():
        try:
            ms = _time_steps(_fwd_bwd(fn, q, k, v, grad), args.warmup, args.iters, device)
            rows[label] = {"ms": round(ms, 4), "tflops_kept": round(flops / ms / 1e9, 2)}
        except Exception as err:  # reported, not fatal
            rows[label] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
    base = rows.get("flex_per_call", {}).get("ms")
    for row in rows.values():
        if base and "ms" in row:
            row["speedup_vs_flex_per_call"] = round(base / row["ms"], 3)
    docs = int(ids.max()) + 1
    return {"case": name, "mask": repr(mask), "seq": seq, "documents": docs, "mean_doc_len": seq / docs,
            "heads_q": heads_q, "heads_kv": heads_kv, "head_dim": head_dim,
            "dispatcher_backend": choose_backend(mask, seq, seq, device=device, dtype=dtype, has_documents=True),
            "results": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--dry", action="store_true", help="tiny shapes on the CPU, dispatcher only (smoke test)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    device = "cpu" if args.dry else "cuda"
    dtype = torch.float32 if args.dry else torch.bfloat16
    seq, image = (256, 32) if args.dry else (8192, 1024)
    if args.dry:
        args.warmup, args.iters = 1, 2
    report = {"torch": torch.__version__, "python": platform.python_version(), "dry": args.dry,
              "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor(), "cases": []}
    heads = (4, 1, 32) if args.dry else (32, 8, 128)
    for mean in (88, 1024):
        report["cases"].append(run_case(f"d_causal_docs_mean{mean}", True, document_ids(seq, mean, seed=mean),
                                        *heads, args, device, dtype))
    images = torch.arange(seq // image).repeat_interleave(image)[None]
    report["cases"].append(run_case("e_vision_images", False, images, *((2, 2, 16) if args.dry else (16, 16, 80)),
                                    args, device, dtype))
    text = json.dumps(report, indent=2)
    print(text)
    with open(args.out, "w") as handle:
        handle.write(text + "\n")


if __name__ == "__main__":
    main()
