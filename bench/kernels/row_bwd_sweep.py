"""Backwards of the reducing row kernels (rms_norm, rms_norm + residual, modulate) per loop-pipelining mode and
persistent grid size, on GPU kernel time, against torch.compile of the reference (issue 7).

Usage:
    python bench/kernels/row_bwd_sweep.py --out bench/results/row_bwd_sweep_h200.json   # on a GPU
    python bench/kernels/row_bwd_sweep.py --dry                                          # CPU interpreter
    python bench/kernels/row_bwd_sweep.py --only rms_norm,modulate --variants plain,tuned --out /tmp/x.json

Shapes and byte counts are ``bench/kernels/fused_ops.py``'s (8192 x 4096 and 32760 x 1536, bf16; the backward
reads ``dy``, ``x`` (and ``d_residual``) and writes ``dx``). Variants pin
``lf_kernels.triton._kernels.tuning.BWD_STAGES`` / ``BWD_PROGRAMS_PER_SM`` and rebuild the autotuners:

- ``plain``: no pipelining (``STAGES = 1``), the loop of the kernels before this rewrite, default grid;
- ``regs``: the next tile prefetched into registers (``STAGES = 0``);
- ``smem2`` / ``smem3``: Triton's loop pipeliner, ``cp.async`` 1 / 2 tiles ahead into shared memory;
- ``tuned``: the library's default, the autotuner picks among all of these; ``tuned_pps{1,2,4}``: same, with
  1 / 2 / 4 persistent programs per SM instead of ``tuning.programs_per_sm``'s rule (skipped where that is
  the rule's count; ``tuned_pps4`` only when asked).

Every variant's gradients are checked against the eager reference's in float32 on the same bf16 inputs and
output gradients (``max_rel_err``, relative to each gradient's largest entry; bf16 outputs: expect < 1e-2).
Per case also the parameter-gradient epilogue on the same partial buffers: the former ``parts.sum(...)`` +
casts against ``sum_partials`` (one launch).
GPU time is the profiler's CUDA kernel time per backward call (median of 3 x 10 calls), the same measure as
``fused_ops.py``'s fractions; the JSON (``--out``) is rewritten after every case, so a run cut short keeps
what it measured; variants run in the outer loop (``tuned`` first), cases inside. Prints one line per (case,
variant): us, GB/s, fraction of 4.2 TB/s, of a same-size copy, and the speedup over torch.compile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fused_ops  # noqa: E402  (sets TRITON_INTERPRET=1 before torch / triton with --dry)
import torch  # noqa: E402

from lf_kernels.triton._dispatch import kernels  # noqa: E402
from lf_kernels.triton._layout import next_pow2  # noqa: E402
from lf_kernels.triton._modulate import _block_d  # noqa: E402
from lf_kernels.triton._partials import sum_partials  # noqa: E402

OPS = ("rms_norm", "rms_norm_residual", "modulate")
VARIANTS = {  # name: (BWD_STAGES, BWD_PROGRAMS_PER_SM); None: the library's default
    "tuned": (None, None), "plain": ((1,), None), "smem2": ((2,), None), "smem3": ((3,), None), "regs": ((0,), None),
    "tuned_pps1": (None, 1), "tuned_pps2": (None, 2), "tuned_pps4": (None, 4),
}
DEFAULT_VARIANTS = "tuned,plain,smem2,smem3,regs,tuned_pps1,tuned_pps2"


DEFAULT_STAGES = kernels("tuning").BWD_STAGES


def set_variant(stages, pps):
    """Pins the tuning knobs and drops the cached autotuners (they keep the best config per hidden size)."""
    tuning = kernels("tuning")
    tuning.BWD_STAGES, tuning.BWD_PROGRAMS_PER_SM = stages or DEFAULT_STAGES, pps
    kernels("rmsnorm").rms_norm_bwd.cache_clear()
    kernels("modulate").modulate_bwd.cache_clear()


def tuner_of(op, hidden):
    """The autotuner the case's backward used (its ``best_config``), or None."""
    if op == "modulate":
        return kernels("modulate").modulate_bwd(_block_d(hidden), False)
    return kernels("rmsnorm").rms_norm_bwd(next_pow2(hidden))


def gpu_us(fn, device, repeats=3):
    """Median over ``repeats`` of the profiler's kernel time per call (us); event time on the CPU."""
    if device != "cuda":
        return fused_ops.timer(device)(fn, 1, warmup=0) * 1e6
    return statistics.median(fused_ops.kernel_ms(fn, device) * 1e3 for _ in range(repeats))


def backward_of(fn, make, n_diff, seed, dtype=None):
    """A closure returning the input grads of ``fn`` on fresh inputs (seeded; cast to ``dtype`` if given): one
    forward, fixed output gradients, ``retain_graph`` so it can be called again."""
    torch.manual_seed(seed)
    inputs = [t.to(dtype) if dtype is not None else t for t in make()]
    diff = [t.requires_grad_() for t in inputs[:n_diff]]
    out = fn(*inputs)
    outs = list(out) if isinstance(out, tuple) else [out]
    torch.manual_seed(seed + 1)
    grads = [torch.randn(o.shape, device=o.device).to(torch.bfloat16).to(o.dtype) for o in outs]

    def bwd():
        return torch.autograd.grad(outs, diff, grads, retain_graph=True)
    return bwd


def max_rel_err(got, want):
    return max(float((g.float() - w.float()).abs().max() / w.float().abs().max().clamp_min(1e-30))
               for g, w in zip(got, want, strict=True))


def epilogue(op, n, d, device):
    """GPU us of the former torch epilogue and of ``sum_partials`` on the default grid's partial buffer."""
    tuning = kernels("tuning")
    sms = tuning.sm_count(torch.device(device))
    if op == "modulate":
        programs = sms * tuning.programs_per_sm(_block_d(d), partials=2)
        splits = tuning.persistent_split(n, -(-programs // -(-d // _block_d(d))))[0]
        parts = torch.randn(2, 1, 1, splits, d, device=device)
        out = torch.empty(2, d, device=device, dtype=torch.bfloat16)

        def old():
            s = parts.sum(3)
            return s[0].to(torch.bfloat16), s[1].to(torch.bfloat16)

        def new():
            sum_partials(parts.view(2, splits, d), out[:1], out[1:])
    else:
        programs = tuning.persistent_split(n, sms * tuning.programs_per_sm(next_pow2(d)))[0]
        parts = torch.randn(programs, d, device=device)
        out = torch.empty(1, d, device=device, dtype=torch.bfloat16)

        def old():
            return parts.sum(0).to(torch.bfloat16)

        def new():
            sum_partials(parts.view(1, programs, d), out)
    for f in (old, new):
        f()
    return {"partial_rows": int(parts.numel() // d), "old_torch_us": gpu_us(old, device),
            "sum_partials_us": gpu_us(new, device)}


def prepare(name, make, n_diff, impls, nbytes, args, device):
    """Per case, once: the copy ceiling, the float32 reference grads, the torch.compile peer, the epilogues."""
    op = name.split("/")[0]
    x = make()[0]
    d, n = x.shape[-1], x.numel() // x.shape[-1]
    row = {"bytes_bwd": nbytes, "copy_GBps": fused_ops.copy_GBps(nbytes, device, fused_ops.timer(device), 5)}
    ref_grads = backward_of(impls["eager"], make, n_diff, 0, torch.float32)()  # same bf16 values, float32 math
    if not args.dry and not args.no_compile:
        bwd = backward_of(torch.compile(impls["eager"], dynamic=False), make, n_diff, 0)
        for _ in range(10):
            bwd()
        row["compile_us"] = gpu_us(bwd, device)
    set_variant(None, None)
    row["epilogue"] = epilogue(op, n, d, device)
    log(name, "peer", f"compile {row.get('compile_us', float('nan')):.1f} us  copy {row['copy_GBps']:.0f} GB/s  "
        f"epilogue {json.dumps(row['epilogue'])}")
    return row, ref_grads, (op, n, d)


def default_pps(op, d):
    tuning = kernels("tuning")
    return tuning.programs_per_sm(_block_d(d), partials=2) if op == "modulate" else tuning.programs_per_sm(
        next_pow2(d))


def measure(variant, name, make, n_diff, impls, row, ref_grads, shape, args, device):
    """One (case, variant): GPU us of the backward, its fractions and speedup, max error, the tuner's pick."""
    op, _, d = shape
    stages, pps = VARIANTS[variant]
    if pps is not None and pps == default_pps(op, d):
        row[variant] = {"same_as": "tuned"}
        return
    set_variant(stages, pps)
    try:
        bwd = backward_of(impls["triton"], make, n_diff, 0)
        err = max_rel_err(bwd(), ref_grads)  # the first call autotunes
        for _ in range(1 if args.dry else 10):
            bwd()
        us = gpu_us(bwd, device)
    except Exception as e:  # one mode failing to compile must not lose the others' numbers
        row[variant] = {"error": repr(e)[:500]}
        log(name, variant, f"ERROR {e!r:.300}")
        return
    nbytes = row["bytes_bwd"]
    res = {"us": us, "GBps": nbytes / us / 1e3, "fraction_of_peak": nbytes / us / 1e3 / fused_ops.PEAK_GBPS,
           "fraction_of_copy": nbytes / us / 1e3 / row["copy_GBps"], "max_rel_err": err,
           "best_config": str(getattr(tuner_of(op, d), "best_config", None))}
    if "compile_us" in row:
        res["speedup_vs_compile"] = row["compile_us"] / us
    row[variant] = res
    log(name, variant, f"{us:8.1f} us {res['GBps']:7.0f} GB/s  peak {res['fraction_of_peak']:.3f}  copy "
        f"{res['fraction_of_copy']:.3f}  vs compile {res.get('speedup_vs_compile', float('nan')):.3f}  err {err:.1e}"
        f"  {res['best_config']}")


_T0 = time.monotonic()


def log(name, variant, text):
    print(f"[{time.monotonic() - _T0:5.0f} s] {name:24s} {variant:11s} {text}", file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="also write the JSON here (rewritten after every measurement)")
    ap.add_argument("--dry", action="store_true", help="tiny shapes on the CPU under TRITON_INTERPRET=1")
    ap.add_argument("--only", default=",".join(OPS), help=f"comma list of ops: {', '.join(OPS)}")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma list of: {', '.join(VARIANTS)}")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    args = ap.parse_args()
    only = [o for o in args.only.split(",") if o]
    args.variants = [v for v in args.variants.split(",") if v]
    bad = sorted(set(only) - set(OPS)) + sorted(set(args.variants) - set(VARIANTS))
    if bad:
        raise SystemExit(f"row_bwd_sweep: unknown --only / --variants entries {bad}")
    device = "cpu" if args.dry else "cuda"
    result = {"torch": torch.__version__, "dry": args.dry, "peak_GBps_assumed": fused_ops.PEAK_GBPS,
              "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "cases": {}}
    try:
        import triton

        result["triton"] = triton.__version__
    except ImportError:
        result["triton"] = None
    cases = [c for c in fused_ops.elementwise_cases(args.dry, device, torch.bfloat16) if c[0].split("/")[0] in only]
    prepared = {}
    for variant in args.variants:  # variant-major: a run cut short still has the first variants of every case
        for name, make, n_diff, impls, _, nbytes in cases:
            if name not in prepared:
                prepared[name] = prepare(name, make, n_diff, impls, nbytes, args, device)
                result["cases"][name] = prepared[name][0]
            row, ref_grads, shape = prepared[name]
            measure(variant, name, make, n_diff, impls, row, ref_grads, shape, args, device)
            if args.out:
                Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
