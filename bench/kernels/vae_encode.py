"""Wan 2.1 VAE encode: lf's chunked channels-last encode against diffusers' ``AutoencoderKLWan.encode``.

Usage (one H200):  python bench/kernels/vae_encode.py --out bench/results/vae_encode_h200.json
CPU smoke test:    python bench/kernels/vae_encode.py --dry --out /tmp/vae_encode_dry.json

Workload: one clip of 81 frames at 480 x 832 (Wan 2.1 480p), batch 1, inference (``torch.no_grad``),
the published wan2.1 config with diffusers' default random init; lf gets the same weights through
``lf_ir.interop.diffusers_wan_vae``. Both encode the diffusers way (the first frame, then chunks of 4
frames with the feature cache); lf runs in ``channels_last_3d`` (cuDNN's layout) end to end, diffusers
in its default layout. For bf16 and fp32: median milliseconds over ``--iters`` CUDA-event-timed encodes
after ``--warmup``, peak allocated memory (``torch.cuda.max_memory_allocated``, reset before each
side), TFLOP/s from the IR's encode FLOPs (``lf_ir.recipes.wan_vae.encode_flops``), and the largest
difference of lf's latent mean from diffusers' relative to its scale. ``--dry``: tiny config,
5 frames at 16 x 16, on the CPU (perf_counter timing, no memory numbers).
Prints one JSON object and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from lf_ir.interop.diffusers_wan_vae import diffusers_config_from_wan_vae, diffusers_to_lf_state
from lf_ir.recipes.wan_vae import WanVAE, encode_flops, wan_vae_config


def _time_ms(fn, warmup: int, iters: int, cuda: bool) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def _measure(fn, warmup: int, iters: int, cuda: bool) -> dict:
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    ms = _time_ms(fn, warmup, iters, cuda)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    return {"ms": ms, "peak_gib": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--dry", action="store_true", help="tiny config and shapes on the CPU (smoke test)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--dtypes", default="bfloat16,float32")
    args = parser.parse_args()

    from diffusers import AutoencoderKLWan

    cuda = not args.dry
    if cuda and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device (or --dry)")
    device = "cuda" if cuda else "cpu"
    cfg = wan_vae_config("tiny" if args.dry else "wan2.1")
    frames, height, width = (5, 16, 16) if args.dry else (81, 480, 832)
    torch.manual_seed(0)
    peer = AutoencoderKLWan(**{k: v for k, v in diffusers_config_from_wan_vae(cfg).items()
                               if not k.startswith("_")}).eval()
    with torch.device("meta"):
        vae = WanVAE(cfg)
    vae.load_state_dict({k: v.clone() for k, v in diffusers_to_lf_state(peer.state_dict(), cfg).items()},
                        strict=True, assign=True)
    vae.eval()
    flops = encode_flops(cfg, frames, height, width)
    video = torch.rand(1, 3, frames, height, width, generator=torch.Generator().manual_seed(1)) * 2 - 1
    result = {"bench": "vae_encode", "shape": [1, 3, frames, height, width], "dry": args.dry,
              "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
              "torch": torch.__version__, "encode_tflop": flops / 1e12, "runs": []}
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        peer_d = peer.to(device=device, dtype=dtype)
        lf_d = vae.to(device=device, dtype=dtype, memory_format=torch.channels_last_3d)
        x_peer = video.to(device=device, dtype=dtype)
        x_lf = x_peer.contiguous(memory_format=torch.channels_last_3d)
        with torch.no_grad():
            ref = peer_d.encode(x_peer).latent_dist.mean
            mean = lf_d.encode(x_lf, "chunked")[0]
            rel = ((mean.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            runs = {"lf": _measure(lambda m=lf_d, x=x_lf: m.encode(x, "chunked"), args.warmup, args.iters, cuda),
                    "diffusers": _measure(lambda m=peer_d, x=x_peer: m.encode(x), args.warmup, args.iters, cuda)}
        for side in runs.values():
            side["tflops"] = flops / (side["ms"] * 1e-3) / 1e12
        result["runs"].append({"dtype": name, "max_rel_diff_vs_diffusers": rel, **runs,
                               "speedup_lf_over_diffusers": runs["diffusers"]["ms"] / runs["lf"]["ms"]})
        del ref, mean
    text = json.dumps(result, indent=2)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
