"""Forwards of the memory-bound fused ops (modulate, SwiGLU, RMSNorm with and without residual) per launch shape,
masks and cache policy, on GPU kernel time, against torch.compile of the reference (issue 7: "faster than
torch.compile").

Usage:
    python bench/kernels/fwd_sweep.py --out bench/results/fwd_sweep_h200.json --code-dir /tmp/inductor   # GPU
    python bench/kernels/fwd_sweep.py --dry --out /tmp/fwd_dry.json   # tiny shapes, CPU interpreter, vs eager

Shapes and byte counts are ``bench/kernels/fused_ops.py``'s (8192 x 4096 and 32760 x 1536, bf16, modulation
broadcast over the tokens). Variants per op:

- ``lib``: the library's entry point (autotuned, unmasked when the blocks divide the tensor);
- ``tile_r{R}w{W}``: the library's ``(BLOCK_R, BLOCK_D)`` tile kernel pinned to one config; ``_masked``: with
  the masks the kernel keeps for sizes the tiles do not divide; ``_s1``: built with ``num_stages=1`` (inductor's
  setting for point-wise kernels; Triton's default is 3). For modulate these are the per-frame / per-token kernel
  run with one group;
- ``flat{B}w{W}`` (modulate): the library's per-sample kernel (``_modulate_fwd_flat``, inductor's 1-D layout:
  ``B`` elements a program, int32 offsets, the feature index a modulo by a constant) pinned to one config;
- ``evict_first_r{R}w{W}`` (RMSNorm): the forward as it was before this sweep (masked, ``evict_first`` loads);
- ``compile``: ``torch.compile(reference, dynamic=False)``; ``--code-dir`` keeps its generated kernels.

Every variant's output is checked against the eager reference (``max_abs_err``; ``valid``: within 2**-6 of the
largest output, a couple of bf16 ulps). The time is the profiler's CUDA
kernel time per call, median over ``--rounds`` rounds of 20 calls, the variants interleaved within a round (in a
shuffled order) so that clock drift hits all alike. The JSON (``--out``) is rewritten after every case.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fused_ops  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from lf_kernels import _fused_reference as ref  # noqa: E402
from lf_kernels.triton import modulate, rms_norm, swiglu  # noqa: E402
from lf_kernels.triton._dispatch import kernels  # noqa: E402
from lf_kernels.triton._layout import cdiv, next_pow2  # noqa: E402
from lf_kernels.triton._modulate import _block_d  # noqa: E402
from lf_kernels.triton._swiglu import _col_block  # noqa: E402


@triton.jit
def _rms_fwd_evict_first(X, R, W, Y, H, RSTD, n_rows, n_cols, eps, HAS_RES: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_R: tl.constexpr):
    """The library's forward before the sweep: masked, ``evict_first`` on ``x`` / ``residual``."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_D)
    r_mask = rows < n_rows
    c_mask = cols < n_cols
    mask = r_mask[:, None] & c_mask[None, :]
    offs = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(X + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    if HAS_RES:
        x += tl.load(R + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        h = x.to(H.dtype.element_ty)
        tl.store(H + offs, h, mask=mask)
        x = h.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    w = tl.load(W + cols, mask=c_mask, other=0.0).to(tl.float32)
    tl.store(Y + offs, (x * rstd[:, None] * w[None, :]).to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=r_mask)


def _modes(divides: bool) -> tuple[tuple[bool, int], ...]:
    """(unmasked, num_stages) pairs to build: the unmasked kernel only where its blocks divide the tensor (else
    it would read and write past the rows)."""
    return ((True, 3), (False, 3), (True, 1)) if divides else ((False, 3), (False, 1))


def _suffix(even: bool, stages: int) -> str:
    return ("" if even else "_masked") + ("_s1" if stages == 1 else "")


def _tile_pairs(block_d, rows, warps, max_elems=32):
    if fused_ops.DRY:  # the interpreter: one tile shape, so that the dry run covers each kernel once
        return [(4, 4)]
    return [(r, w) for r in rows for w in warps if 8 <= r * block_d / (32 * w) <= max_elems]


def modulate_variants(x, shift, scale):
    n, d = x.shape[1], x.shape[2]
    y = torch.empty_like(x)
    bd = _block_d(d)
    mod = kernels("modulate")
    out = {"lib": lambda: modulate(x, shift, scale, backend="triton")}
    for r, w in _tile_pairs(bd, (1, 2, 4, 8), (4, 8)):
        divides = mod._even_fwd({"tokens_per_group": n, "BLOCK_R": r, "hidden": d, "BLOCK_D": bd})
        for even, stages in _modes(divides):
            def tile(r=r, w=w, even=even, stages=stages):
                mod._modulate_fwd[(cdiv(n, r) * cdiv(d, bd), 1)](
                    x, shift, scale, y, 1, n, d, 0, d, 0, d, BLOCK_D=bd, BLOCK_R=r, D_BLOCKS=cdiv(d, bd),
                    BG_AXIS=1, EVEN=even, num_warps=w, num_stages=stages)
                return y
            out[f"tile_r{r}w{w}{_suffix(even, stages)}"] = tile
    for block, w in ((128, 4),) if fused_ops.DRY else ((1024, 4), (2048, 4), (2048, 8)):
        for even, stages in _modes(mod._even_flat({"per_sample": n * d, "BLOCK": block})):
            def flat(block=block, w=w, even=even, stages=stages):
                mod._modulate_fwd_flat[(cdiv(n * d, block), 1)](
                    x, shift, scale, y, n * d, 0, 0, HIDDEN=d, BLOCK=block, BG_AXIS=1, WIDE=False, EVEN=even,
                    num_warps=w, num_stages=stages)
                return y
            out[f"flat{block}w{w}{_suffix(even, stages)}"] = flat
    return out


def swiglu_variants(g, u):
    n, d = g.shape
    y = torch.empty_like(g)
    bd = _col_block(d)
    sw = kernels("swiglu")
    out = {"lib": lambda: swiglu(g, u, backend="triton")}
    for r, w in _tile_pairs(bd, (1, 2, 4, 8), (4, 8)):
        for even, stages in _modes(sw._even({"n_rows": n, "BLOCK_R": r, "n_cols": d, "BLOCK_D": bd})):
            def tile(r=r, w=w, even=even, stages=stages):
                sw._swiglu_fwd[(cdiv(n, r) * cdiv(d, bd),)](g, u, y, d, d, d, n, d, COL_BLOCKS=cdiv(d, bd),
                                                             BLOCK_D=bd, BLOCK_R=r, EVEN=even, num_warps=w,
                                                             num_stages=stages)
                return y
            out[f"tile_r{r}w{w}{_suffix(even, stages)}"] = tile
    return out


def rms_variants(x, w_, r_):
    n, d = x.shape
    has_res = r_ is not None
    bd = next_pow2(d)
    y, h = torch.empty_like(x), torch.empty_like(x)
    rstd = torch.empty(n, dtype=torch.float32, device=x.device)
    rk = kernels("rmsnorm")
    out = {"lib": lambda: rms_norm(x, w_, 1e-6, residual=r_, backend="triton")}
    r_arg = r_ if has_res else x
    for r, w in _tile_pairs(bd, (1, 2, 4, 8), (4, 8, 16)):
        divides = rk._even_fwd({"n_rows": n, "BLOCK_R": r, "n_cols": d, "BLOCK_D": bd})
        for even in (True, False) if divides else (False,):
            def tile(r=r, w=w, even=even):
                rk._rms_norm_fwd[(cdiv(n, r),)](x, r_arg, w_, y, h, rstd, d, d, d, d, n, d, 1e-6, HAS_RES=has_res,
                                                BLOCK_D=bd, BLOCK_R=r, EVEN=even, num_warps=w)
                return (y, h) if has_res else y
            out[f"tile_r{r}w{w}{'' if even else '_masked'}"] = tile

        def evict_first(r=r, w=w):
            _rms_fwd_evict_first[(cdiv(n, r),)](x, r_arg, w_, y, h, rstd, n, d, 1e-6, HAS_RES=has_res, BLOCK_D=bd,
                                                BLOCK_R=r, num_warps=w)
            return (y, h) if has_res else y
        out[f"evict_first_r{r}w{w}"] = evict_first
    return out


def cases(dtype, dry: bool):
    dev = "cpu" if dry else "cuda"
    shapes = {"llm": (64, 256), "dit": (48, 96)} if dry else {"llm": (8192, 4096), "dit": (32760, 1536)}
    for tag, (n, d) in shapes.items():
        es = torch.finfo(dtype).bits // 8
        x = torch.randn(1, n, d, device=dev, dtype=dtype)
        sh, sc = (torch.randn(1, 1, d, device=dev, dtype=dtype) for _ in range(2))
        yield f"modulate/{tag}", modulate_variants(x, sh, sc), (ref.modulate_reference, (x, sh, sc)), 2 * n * d * es
        g, u = (torch.randn(n, d, device=dev, dtype=dtype) for _ in range(2))
        yield f"swiglu/{tag}", swiglu_variants(g, u), (ref.swiglu_reference, (g, u)), 3 * n * d * es
        x2, r2 = (torch.randn(n, d, device=dev, dtype=dtype) for _ in range(2))
        w2 = torch.rand(d, device=dev, dtype=dtype)
        yield (f"rms_norm/{tag}", rms_variants(x2, w2, None),
               (lambda a, b: ref.rms_norm_reference(a, b, 1e-6), (x2, w2)), 2 * n * d * es)
        yield (f"rms_norm_residual/{tag}", rms_variants(x2, w2, r2),
               (lambda a, b, c: ref.rms_norm_reference(a, b, 1e-6, c), (x2, w2, r2)), 4 * n * d * es)


def max_abs(want):
    return max(w.float().abs().max().item() for w in (want if isinstance(want, tuple) else (want,)))


def max_err(out, want):
    outs = out if isinstance(out, tuple) else (out,)
    wants = want if isinstance(want, tuple) else (want,)
    return max((a.float() - b.float()).abs().max().item() for a, b in zip(outs, wants, strict=True))


def gpu_us(fn, dry: bool) -> float:
    """Microseconds per call: the profiler's CUDA kernel time over 20 calls, or wall time under ``--dry``."""
    if dry:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    return fused_ops.kernel_ms(fn, "cuda", calls=20) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--code-dir", type=Path)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--dry", action="store_true", help="tiny shapes on the CPU under TRITON_INTERPRET=1, vs eager")
    args = p.parse_args()
    base = "eager" if args.dry else "compile"  # no inductor kernels to compare with on the CPU run
    results = {"torch": torch.__version__, "triton": triton.__version__, "dry": args.dry, "baseline": base,
               "device": platform.machine() if args.dry else torch.cuda.get_device_name(), "cases": {}}
    for name, variants, (reference, inputs), nbytes in cases(torch.bfloat16, args.dry):
        want = reference(*inputs)
        peer = reference
        if not args.dry:
            from torch._inductor.utils import run_and_get_code

            peer = torch.compile(reference, dynamic=False)
            _, code = run_and_get_code(peer, *inputs)
            if args.code_dir:
                args.code_dir.mkdir(parents=True, exist_ok=True)
                (args.code_dir / f"{name.replace('/', '_')}.py").write_text("\n\n".join(code))
        variants = {**variants, base: lambda c=peer, i=inputs: c(*i)}
        errs = {}
        for v, fn in variants.items():
            for _ in range(1 if args.dry else 3):
                out = fn()
            if not args.dry:
                torch.cuda.synchronize()
            errs[v] = max_err(out, want)
        times = {v: [] for v in variants}
        order = list(variants)
        for r in range(1 if args.dry else args.rounds):
            random.Random(r).shuffle(order)  # no variant always runs first or right after the same one
            for v in order:
                times[v].append(gpu_us(variants[v], args.dry))
        tol = 2**-6 * max_abs(want) + 1e-3  # a couple of bf16 ulps of the largest output
        row = {v: {"us": statistics.median(t), "min_us": min(t), "GBps": nbytes / statistics.median(t) / 1e3,
                   "max_abs_err": errs[v], "valid": errs[v] <= tol} for v, t in times.items()}
        if not all(r["valid"] for r in row.values()):
            print(f"{name}: outputs off the reference: {[v for v in row if not row[v]['valid']]}", file=sys.stderr)
        for v in row:
            row[v][f"speedup_vs_{base}"] = row[base]["us"] / row[v]["us"]
        results["cases"][name] = {"bytes": nbytes, "variants": row}
        best = sorted(row, key=lambda v: row[v]["us"])
        print(name, " ".join(f"{v}={row[v]['us']:.1f}" for v in best), file=sys.stderr)
        if args.out:
            args.out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results)[:2000])


if __name__ == "__main__":
    main()
