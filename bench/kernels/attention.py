"""Attention speed: lf_kernels.attention's dispatcher against SDPA-cuDNN and compiled FlexAttention.

Usage (one H200):  python bench/kernels/attention.py --out bench/results/attention_h200.json
CPU smoke test:    python bench/kernels/attention.py --dry --out /tmp/attention_dry.json

Cases (bf16, batch 1, forward + backward, one ``out.backward(grad)`` per step):

(a) causal, S = 8,192, 32 heads x 128: ``attention(..., MaskSpec("causal"))``
    (backend ``sdpa_causal``) vs SDPA forced to cuDNN (target >= 95 %); SDPA
    forced to flash is listed for reference.
(b) block-causal by frame, 21 frames x 1,560 tokens (S = 32,760), 12 heads x 128:
    our dispatcher (``sdpa_split``: one causal cuDNN call over the sequence plus one
    batched causal call on the frame-reversed in-frame upper triangles, merged by
    log-sum-exp), ``ours_split`` (the same, called directly), ``ours_flex``
    (FlexAttention with our cached block mask), ``sdpa_frames`` (one mask-free cuDNN
    SDPA call per frame) vs FlexAttention compiled on the same mask (block mask built
    once, outside the timing). Target >= 1.2x Flex.
(c) 3D window on a 21 x 30 x 52 latent grid (Wan 2.1 480p: 81 frames / 4 + 1,
    480 / 16, 832 / 16), window (3, 9, 9) tokens: +-1 latent frame, +-4 rows and
    columns; 12 heads x 128. Our dispatcher (``flex_tiles``: FlexAttention on the tokens
    reordered into 1 x 32 x 4 tiles, one 128-token block each, :mod:`lf_kernels._window_tiles`),
    ``ours_flex`` (FlexAttention with our cached block mask in the raster order),
    ``ours_halo*`` (the exact tile + key-halo layout, one batched SDPA call over
    1 x a x b query tiles and their key halos: default tile, 8 x 8, 16 x 8, and
    FlexAttention on the tiles) vs FlexAttention compiled on the same mask. Target >= 1.2x Flex.
    The case's ``work`` entry gives computed / kept score entries of the tile order, the halo
    layout and of Flex's raster block mask, and the bytes of the halo buffers.

TFLOP/s count only the kept (unmasked) score entries (``lf_kernels._keep.kept_entries``):
forward ``4 * heads * kept * head_dim`` (QK^T and PV), backward 2.5x the forward
(FlashAttention-2 convention: five matmuls incl. the recomputed QK^T). Time per
step is the median over ``--iters`` CUDA-event-timed steps after ``--warmup``.
Prints one JSON object and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys

import torch
import torch.nn.functional as F

from lf_kernels import MaskSpec, attention, choose_backend, kept_entries


def _time_steps(step, warmup: int, iters: int, device: str) -> float:
    """Median milliseconds of ``step()`` (CUDA events on GPU, perf_counter on CPU)."""
    import time

    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        if device == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            stop.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(stop))
        else:
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _fwd_bwd(fn, q, k, v, grad):
    def step():
        for t in (q, k, v):
            t.grad = None
        fn(q, k, v).backward(grad)

    return step


def _flex_on(mask: MaskSpec, seq: int, device: str):
    """FlexAttention compiled, with a plain mask_mod of the same rule, block mask built once."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from lf_kernels import mask_predicate

    def mask_mod(b, h, q_idx, kv_idx):
        return mask_predicate(mask, q_idx, kv_idx)

    block_mask = create_block_mask(mask_mod, None, None, seq, seq, device=device)
    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask)


def _halo_contenders(mask: MaskSpec, dry: bool) -> dict:
    """Rows for the tile + halo path called directly (default tile, fixed tiles, flex kernel on the tiles)."""
    from lf_kernels._window_halo import attention_window_halo

    def halo(**kwargs):
        return lambda q, k, v: attention_window_halo(q, k, v, mask, q.shape[-1] ** -0.5, **kwargs)

    rows = {"ours_halo": halo()}
    if not dry:
        rows |= {"ours_halo_8x8": halo(tile=(8, 8)), "ours_halo_16x8": halo(tile=(16, 8)),
                 "ours_halo_flex": halo(kernel="flex")}
    return rows


def _halo_work(mask: MaskSpec, seq: int, heads: int, head_dim: int, device: str) -> dict:
    """Computed / kept score entries of the halo layout and of Flex's block mask; halo buffer bytes (bf16)."""
    from lf_kernels._flex import block_mask_for
    from lf_kernels._halo_layout import choose_tile, halo_entries, halo_layout
    from lf_kernels._window_tiles import BLOCK, tile_order

    kept = kept_entries(mask, seq)
    order = tile_order(mask)
    tile = choose_tile(mask)
    layout = halo_layout(mask, tile, device)
    queries = layout.n_tiles * tile[0] * tile[1]
    block_mask = block_mask_for(mask, seq, seq, device)
    blocks = int(block_mask.kv_num_blocks.sum()) + int(block_mask.full_kv_num_blocks.sum())
    flex_entries = blocks * block_mask.BLOCK_SIZE[0] * block_mask.BLOCK_SIZE[1]
    item = 2  # bf16
    return {
        "tiles_tile": list(order.tile) if order.tile else None, "tiles_blocks": order.blocks,
        "tiles_padded_tokens": order.length, "tiles_block_work_ratio": round(order.blocks * BLOCK * BLOCK / kept, 3),
        "halo_tile": list(tile), "halo_tiles": layout.n_tiles, "halo_keys_per_tile": layout.halo,
        "halo_dense_work_ratio": round(halo_entries(mask, tile) / kept, 3),
        "flex_block_work_ratio": round(flex_entries / kept, 3),
        "flex_partial_blocks": int(block_mask.kv_num_blocks.sum()),
        "flex_full_blocks": int(block_mask.full_kv_num_blocks.sum()),
        "halo_buffer_bytes": {
            "q_tiles": queries * heads * head_dim * item, "out_tiles": queries * heads * head_dim * item,
            "k_halos": layout.n_tiles * layout.halo * heads * head_dim * item,
            "v_halos": layout.n_tiles * layout.halo * heads * head_dim * item,
            "bias": queries * layout.halo * item,
        },
    }


def _sdpa_with(backend_name: str, *, causal: bool = True):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run(q, k, v):
        with sdpa_kernel([getattr(SDPBackend, backend_name)]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])

    return run


def run_case(name, mask, seq, heads, head_dim, contenders, baseline, args, device, dtype):
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v, grad = (torch.randn(1, heads, seq, head_dim, device=device, dtype=dtype, generator=gen)
                     for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    kept = kept_entries(mask, seq)
    flops = 3.5 * 4 * heads * kept * head_dim  # forward + 2.5x backward
    rows = {}
    for label, fn in contenders.items():
        try:
            ms = _time_steps(_fwd_bwd(fn, q, k, v, grad), args.warmup, args.iters, device)
            rows[label] = {"ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 2)}
        except Exception as err:  # a contender that cannot run here is reported, not fatal
            rows[label] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
    base_ms = rows.get(baseline, {}).get("ms")
    for row in rows.values():
        if base_ms and "ms" in row:
            row[f"speedup_vs_{baseline}"] = round(base_ms / row["ms"], 3)
    backend = choose_backend(mask, seq, seq, device=device, dtype=dtype)
    return {"case": name, "mask": repr(mask), "seq": seq, "heads": heads, "head_dim": head_dim,
            "keep_fraction": kept / seq**2, "dispatcher_backend": backend, "baseline": baseline, "results": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--dry", action="store_true", help="tiny shapes on the CPU, flex omitted (smoke test)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--cases", default="a,b,c", help="comma-separated subset of a, b, c")
    args = parser.parse_args()
    device = "cpu" if args.dry else "cuda"
    dtype = torch.float32 if args.dry else torch.bfloat16
    if args.dry:
        args.warmup, args.iters = 1, 2
        sizes = {"a": (256, 2, 32), "b": ((4, 3, 5), 2, 32), "c": ((4, 3, 5), (3, 1, 3), 2, 32)}
    else:
        sizes = {"a": (8192, 32, 128), "b": ((21, 30, 52), 12, 128), "c": ((21, 30, 52), (3, 9, 9), 12, 128)}

    def ours(mask):
        return lambda q, k, v: attention(q, k, v, mask)

    def ours_flex(mask):
        from lf_kernels._flex import attention_flex

        return lambda q, k, v: attention_flex(q, k, v, mask, q.shape[-1] ** -0.5)[0]

    report = {"torch": torch.__version__, "python": platform.python_version(), "dry": args.dry,
              "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor(), "cases": []}
    selected = set(args.cases.split(","))
    if "a" in selected:
        seq, heads, head_dim = sizes["a"]
        mask = MaskSpec("causal")
        contenders = {"dispatcher": ours(mask)}
        if not args.dry:
            contenders |= {"sdpa_cudnn": _sdpa_with("CUDNN_ATTENTION"), "sdpa_flash": _sdpa_with("FLASH_ATTENTION")}
        report["cases"].append(run_case("a_causal", mask, seq, heads, head_dim, contenders,
                                        "sdpa_cudnn" if not args.dry else "dispatcher", args, device, dtype))
    for key, case in (("b", "b_block_causal"), ("c", "c_window_3d")):
        if key not in selected:
            continue
        if key == "b":
            grid, heads, head_dim = sizes["b"]
            mask = MaskSpec("block_causal", frame_tokens=grid[1] * grid[2])
        else:
            grid, window, heads, head_dim = sizes["c"]
            mask = MaskSpec("window_3d", grid=grid, window=window)
        seq = grid[0] * grid[1] * grid[2]
        contenders = {"dispatcher": ours(mask)}
        if key == "b":
            from lf_kernels import attention_split

            contenders["ours_split"] = lambda q, k, v, f=mask.frame_tokens: attention_split(q, k, v, f)[0]
        if key == "c":
            contenders |= _halo_contenders(mask, args.dry)
        if not args.dry:
            contenders |= {"ours_flex": ours_flex(mask), "flex": _flex_on(mask, seq, device)}
            if key == "b":
                from lf_kernels._attention import _sdpa_frames

                frames = mask.frame_tokens
                contenders["sdpa_frames"] = lambda q, k, v, f=frames: _sdpa_frames(q, k, v, f, q.shape[-1] ** -0.5)
        report["cases"].append(run_case(case, mask, seq, heads, head_dim, contenders,
                                        "flex" if not args.dry else "dispatcher", args, device, dtype))
        if key == "c":
            report["cases"][-1]["work"] = _halo_work(mask, seq, heads, head_dim, device)
    text = json.dumps(report, indent=2)
    print(text)
    with open(args.out, "w") as handle:
        handle.write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
