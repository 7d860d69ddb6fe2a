"""Generate BENCHMARKS.md from the committed JSON results in ``bench/results/``.

    python bench/report.py            # writes BENCHMARKS.md at the repository root
    python bench/report.py --check    # exits 1 if BENCHMARKS.md is not what the results give

Every table is computed from the files; nothing is typed in by hand. A result file
is rendered by the renderer named after its benchmark (file-name prefix); a file
without one is listed with its metadata so that nothing is silently dropped.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
OUT = ROOT / "BENCHMARKS.md"


def _table(header: list[str], rows: list[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines + [""]


def _meta(d: dict) -> str:
    keys = ("device", "torch", "triton", "commit")
    return ", ".join(f"{k} {d[k]}" for k in keys if d.get(k)) or "no metadata"


def _llama3_parallel(d: dict) -> list[str]:
    rows = []
    for name, r in d["plans"].items():
        rows.append([f"lf `{name}`", r["recompute"], f"{r['tokens_per_s_per_gpu']:,.0f}", f"{r['tflops_per_gpu']:.0f}",
                     f"{100 * r['mfu']:.1f}%", f"{r['peak_mem_gib']:.1f}", r["loss_falling"]])
    for name, r in d.get("peer", {}).items():
        rows.append([f"peer: plain {name}", "-", f"{r['tokens_per_s_per_gpu']:,.0f}", f"{r['tflops_per_gpu']:.0f}",
                     f"{100 * r['mfu']:.1f}%", f"{r['peak_mem_gib']:.1f}", r["loss_falling"]])
    head = [f"{d['model']}, seq {d['seq']}, micro-batch {d['micro_batch']}, {d['world_size']} GPUs; "
            f"median of {d['steps']} steps after {d['warmup']} warm-up. MFU: 6(N - N_emb) + 12 L d S FLOPs per "
            "token against 989.4 TFLOP/s.", ""]
    return head + _table(["plan", "recompute", "tokens/s/GPU", "TFLOP/s/GPU", "MFU", "peak GiB", "loss falls"], rows)


def _attention(d: dict) -> list[str]:
    rows = []
    for case in d["cases"]:
        for name, r in case["results"].items():
            ratio = next((v for k, v in r.items() if k.startswith("speedup")), "")
            rows.append([case["case"], case["seq"], f"{case['heads']}x{case['head_dim']}",
                         f"{case['keep_fraction']:.4f}", name, f"{r['ms']:.2f}", f"{r['tflops']:.0f}", ratio])
    return (["bf16, forward + backward, TFLOP/s on unmasked FLOPs; ratio against the case's baseline.", ""]
            + _table(["case", "seq", "heads", "kept", "backend", "ms", "TFLOP/s", "ratio"], rows))


def _varlen_docs(d: dict) -> list[str]:
    rows = []
    for case in d["cases"]:
        for name, r in case["results"].items():
            if "ms" not in r:
                rows.append([case["case"], case["documents"], "", "", name, r.get("error", ""), "", ""])
                continue
            rows.append([case["case"], case["documents"], f"{case['mean_doc_len']:.0f}",
                         f"{case['heads_q']}/{case['heads_kv']}x{case['head_dim']}",
                         f"dispatcher ({case['dispatcher_backend']})" if name == "dispatcher" else name,
                         f"{r['ms']:.2f}",
                         f"{r['tflops_kept']:.0f}", r.get("speedup_vs_flex_per_call", "")])
    return (["Packed documents, bf16, forward + backward, one row of 8,192 tokens; TFLOP/s on the kept entries; "
             "ratio against FlexAttention with the block mask built on every call. `sdpa_row` ignores the "
             "documents (one cuDNN call over the row): the cost of unpacked rows, not the same result.", ""]
            + _table(["case", "documents", "mean length", "heads", "backend", "ms", "TFLOP/s", "ratio"], rows))


def _fused_ops(d: dict) -> list[str]:
    rows = []
    for name, r in d["elementwise"].items():
        def gbps(k, r=r):
            ms = {p: r[k].get(f"{p}_kernel_ms") or r[k][f"{p}_ms"] for p in ("fwd", "bwd")}
            return f"{r['bytes_fwd'] / ms['fwd'] / 1e6:.0f} / {r['bytes_bwd'] / ms['bwd'] / 1e6:.0f}"
        speed = (f"{r['fwd_speedup_vs_compile']:.2f} / {r['bwd_speedup_vs_compile']:.2f}"
                 if "fwd_speedup_vs_compile" in r else "")
        rows.append([name, *(gbps(k) for k in ("triton", "eager", "compile") if k in r),
                     f"{r['fwd_fraction_of_peak']:.2f} / {r['bwd_fraction_of_peak']:.2f}", speed])
    lines = [f"Bandwidth GB/s (forward / backward) on GPU kernel time, bytes read + written; target 80% of "
             f"{d['peak_GBps_assumed']:.0f} GB/s and faster than torch.compile.", ""]
    lines += _table(["op / shape", "triton", "eager", "torch.compile", "triton / 4.2 TB/s", "vs compile"], rows)
    ce = d["fused_linear_cross_entropy"]
    lines += ["", f"Fused linear cross-entropy, {ce['tokens']} tokens, hidden {ce['hidden']}, vocab {ce['vocab']:,}:",
              ""]
    keys = [k for k, v in ce.items() if isinstance(v, dict) and "fwd_bwd_ms" in v]
    peers = [p for p in ("eager", "liger") if p in ce]

    def ratios(k):
        return [f"{ce[k][f'time_ratio_vs_{p}']:.2f} / {ce[k][f'peak_ratio_vs_{p}']:.2f}"
                if f"time_ratio_vs_{p}" in ce[k] else "" for p in peers]
    if d.get("liger_kernel"):
        lines[-1:] = [f"liger-kernel {d['liger_kernel']}.", ""]
    lines += _table(["", "fwd+bwd ms", "extra peak GiB", *(f"time / peak vs {p}" for p in peers)],
                    [[k, f"{ce[k]['fwd_bwd_ms']:.1f}", f"{ce[k]['peak_extra_GiB']:.2f}", *ratios(k)] for k in keys])
    return lines


def _fwd_sweep(d: dict) -> list[str]:
    """Per case: the library's entry point, torch.compile, and the best variant of each family."""
    rows = []
    for case, r in d["cases"].items():
        v = {k: x for k, x in r["variants"].items() if x.get("valid", True)}
        families: dict[str, str] = {}
        for name in sorted(v, key=lambda n: v[n]["us"]):
            family = ("tile" if name.startswith("tile") else name.rstrip("0123456789w_s").split("_r")[0]) + (
                "_masked" if "_masked" in name else "")
            families.setdefault(family, name)
        for name in ["lib", "compile", *(n for n in families.values() if n not in ("lib", "compile"))]:
            rows.append([case, name, f"{v[name]['us']:.1f}", f"{v[name]['GBps']:.0f}",
                         f"{v[name]['speedup_vs_compile']:.3f}x"])
    return (["Forwards on GPU kernel time (median of rounds of 20 calls, variants interleaved), bytes read + "
             "written. `lib` is the library's default; each other row is the fastest variant of its family "
             "(`tile`: the library's kernel pinned to one config, `_masked`: with masks, `flat`: inductor's "
             "1-D layout, `evict_first`: the forward before this sweep). Variants whose output is off the "
             "reference are left out.", ""]
            + _table(["case", "variant", "us", "GB/s", "vs torch.compile"], rows))


def _row_bwd_sweep(d: dict) -> list[str]:
    rows = []
    for case, r in d["cases"].items():
        for name, v in r.items():
            if isinstance(v, dict) and "us" in v:
                rows.append([case, name, f"{v['us']:.1f}", f"{v['GBps']:.0f}", f"{v['fraction_of_peak']:.2f}",
                             f"{v['speedup_vs_compile']:.2f}x", v["best_config"]])
    return ([f"Backward of the reducing row kernels on GPU kernel time, bytes read + written; target 80% of "
             f"{d['peak_GBps_assumed']:.0f} GB/s. `tuned` is the default (next tiles loaded early, autotuned), "
             "`plain` the previous loop.", ""]
            + _table(["case", "variant", "us", "GB/s", "of 4.2 TB/s", "vs torch.compile", "tuned config"], rows))


def _vae_encode(d: dict) -> list[str]:
    rows = [[r["dtype"], f"{r['lf']['ms']:.0f}", f"{r['diffusers']['ms']:.0f}",
             f"{r['speedup_lf_over_diffusers']:.2f}x", f"{r['lf']['peak_gib']:.2f} / {r['diffusers']['peak_gib']:.2f}"]
            for r in d["runs"]]
    return ([f"Wan2.1 VAE encode, shape {d['shape']}, {d['encode_tflop']:.0f} TFLOP per clip.", ""]
            + _table(["dtype", "lf ms", "diffusers ms", "speed-up", "peak GiB lf / diffusers"], rows))


def _autotune(d: dict) -> list[str]:
    rows = []
    for p in d["plans"]:
        m, pred, default = p["measured"], p["predicted_calibrated"], p["predicted_default"]
        rows.append([p["plan"], p["recompute"], f"{m['step_s']:.3f}", f"{default['step_s']:.3f}",
                     f"{100 * (default['step_s'] / m['step_s'] - 1):+.1f}%", f"{pred['step_s']:.3f}",
                     f"{100 * (pred['step_s'] / m['step_s'] - 1):+.1f}%", f"{m['peak_gib']:.1f}",
                     f"{default['peak_gib']:.1f}"])
    shape = d["model"] if f"seq {d['seq']}" in d["model"] else f"{d['model']}, seq {d['seq']}"
    return ([f"{shape}, global batch {d['global_batch']}, {d['cluster']}. Predictions with the cost model's "
             "default rates and with the rates `calibrate()` measured in the same job.", ""]
            + _table(["plan", "recompute", "measured s/step", "predicted (defaults)", "error (defaults)",
                      "predicted (calibrated)", "error (calibrated)", "measured peak GiB", "predicted peak GiB"],
                     rows))


def _autotune_sweep(d: dict) -> list[str]:
    s = d["summary"]
    return _autotune(d) + ["", f"Chosen plan at {s['chosen_fraction_of_best']:.0%} of the sweep's best; median / max "
                           f"step-time error {s['median_abs_step_error']:.1%} / {s['max_abs_step_error']:.1%} "
                           "(default rates).", ""]


def _step_anatomy(d: dict) -> list[str]:
    def opt(r: dict, key: str, fmt: str) -> str:
        return format(r[key], fmt) if key in r else "-"

    rows = [[r["model"], r["micro_batch"], r["grad_accum"], r["recompute"], "on" if r["fused_ops"] else "off",
             f"{r['step_s']:.3f}", opt(r, "gpu_busy_fraction", ".0%"), opt(r, "host_syncs", ".0f"),
             opt(r, "kernel_launches", ".0f"), f"{r['peak_gib']:.1f}"] for r in d["rows"]]
    lines = ([d["note"], ""] if d.get("note") else []) + _table(
        ["model", "micro-batch", "accum", "recompute", "fused ops", "s/step", "GPU busy", "host syncs",
         "kernel launches", "peak GiB"], rows)
    for r in (r for r in d["rows"] if "memory_peak" in r):
        mp = r["memory_peak"]
        lines += ["", f"{r['model']}, {r['micro_batch']} x {r['grad_accum']}, recompute {r['recompute']}: peak "
                  f"{mp['peak_gib']:.1f} GiB, {mp['held_before_step_gib']:.1f} GiB held before the step; made in "
                  "the step and alive at the peak:", ""]
        lines += _table(["allocated at", "GiB", "allocations"], [
            [f"`{g['frame']}`" if g["frame"] != "?" else "no Python frame (autograd backward, C++)", f"{g['gib']:.2f}",
             g["count"]] for g in mp["allocated_in_step_alive_at_peak"][:8]])
    return lines


def _fp8_llama(d: dict) -> list[str]:
    lines = [f"{d['model']}, seq {d['seq']}, micro-batch {d['micro_batch']}, torch.compile {d['compile']}, "
             f"torchao {d['torchao']}; median of {d['steps']} steps.", ""]
    rows = [[name, f"{r['step_ms_median']:.0f}", f"{r['tokens_per_s']:,.0f}", r["fp8_linears"],
             f"{r['peak_bytes'] / 2**30:.1f}"]
            for name, r in d.get("throughput", {}).items() if isinstance(r, dict) and "tokens_per_s" in r]
    lines += _table(["variant", "step ms", "tokens/s", "fp8 linears", "peak GiB"], rows)
    curves = d.get("curves", {})
    names = [k for k in ("bf16", "fp8_tensorwise") if "losses" in curves.get(k, {})]
    if names:
        n, window = len(curves[names[0]]["losses"]), 20
        lines += [f"Loss curves, {n} steps on {curves['data']} (mean loss per {window}-step window):", ""]
        rows = [[f"{i + 1}-{min(i + window, n)}",
                 *[f"{sum(curves[k]['losses'][i:i + window]) / len(curves[k]['losses'][i:i + window]):.3f}"
                   for k in names]] for i in range(0, n, window)]
        lines += _table(["steps", *names], rows)
    return lines


def _published(d: dict) -> list[str]:
    rows = []
    for r in d["rows"]:
        p = r["predicted"]
        rows.append([r["model"], r["gpus"], f"`{r['plan']}`", f"{r['published_tokens_per_s_per_gpu']:,}",
                     f"{p['tokens_per_s_per_gpu']:,.0f} ({p['recompute']})", f"{r['published_over_predicted']:.2f}",
                     f"{p['exposed_comm_s'] / p['step_s']:.0%}",
                     f"{p['peak_gib']:.0f}" + ("" if p["fits_80gib"] else " (> 80)")])
    return ([f"Published: {d['source']}; sequence {d['seq']}. Predicted with the datasheet rates in "
             f"{d['precision_predicted']} (the published H100 rows run FP8 recipes; see the script's docstring).", ""]
            + _table(["model", "GPUs", "plan", "published tok/s/GPU", "predicted (recompute)", "published / predicted",
                      "exposed comm", "predicted peak GiB"], rows))


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"


def _memory_check(d: dict) -> list[str]:
    lines = [f"One GPU ({d.get('capacity_gib') or 0:.0f} GiB), {d['precision']}; median of {d['steps']} steps after "
             f"{d['warmup']} warm-up. Predicted: `estimate_memory` (peak) and `step_cost` on {d['cluster']}.", ""]
    for w in d["workloads"].values():
        a = w["auto"]
        lines += [f"**{w['model']}**, {w['shape']}. auto: activation budget {a['budget_activation_gib']:.2f} GiB "
                  f"(uniform selective needs {a['selective_everywhere_gib']:.2f}, "
                  f"fits: {a['uniform_selective_fits']}); "
                  f"plan {a['plan_activation_gib']:.2f} GiB, fits {a['fits']}, blocks {a['counts']}, recomputes "
                  f"{a['recompute_tflop']:.1f} TFLOP vs full's {a['full_recompute_tflop']:.1f}.", ""]
        rows = []
        for name, r in w["plans"].items():
            if "step_s_median" not in r:
                why = r.get("skipped") or ("out of memory" if "oom" in r else r.get("error", "?"))
                rows.append([name, "-", f"{r.get('peak_gib_predicted', 0):.1f}", "-", "-", "-", "-", why])
                continue
            measured = r["peak_gib_measured"]
            rows.append([name, "-" if measured is None else f"{measured:.1f}", f"{r['peak_gib_predicted']:.1f}",
                         _pct(r.get("peak_error")), f"{r['step_s_median']:.3f}", f"{r['step_s_predicted']:.3f}",
                         _pct(r["step_error"]), r["loss_falling"]])
        lines += _table(["recompute", "measured peak GiB", "predicted GiB", "error", "measured s/step",
                         "predicted s/step", "error", "loss falls"], rows)
    return lines


def _lerobot_stream(d: dict) -> list[str]:
    ds = d["dataset"]
    rows = []
    for name, r in d["runs"].items():
        if "error" in r:
            rows.append([name, "-", "-", "-", "-", "-", f"error: {' '.join(r['error'])[:80]}"])
            continue
        rows.append([name, f"{r['samples']:,}", f"{r['samples_per_s']:,.0f}", f"{r['samples_per_s_per_core']:,.0f}",
                     f"{r['peak_rss_anon_mib']:,.0f}", f"{r['init_s']:.1f}", "whole dataset" if r["whole_dataset"]
                     else f"{r['seconds']:.0f} s"])
    ratios = ", ".join(f"{k}: {v:.2f}x" for k, v in d.get("lf_over_lerobot_per_core", {}).items()) or "n/a"
    head = [f"LeRobot v3.0, {ds['bytes'] / 1e9:.2f} GB of parquet ({ds['frames']:,} frames, {ds['image']}x"
            f"{ds['image']} PNG, action chunk {ds['horizon']}), read in order; first samples equal across readers: "
            f"{d['values_match']}. lf / lerobot samples/s per core: {ratios}.", ""]
    return head + _table(["reader", "samples", "samples/s", "samples/s/core", "peak anon RSS MiB", "init s",
                          "read"], rows)


def _wan_dit_peer(d: dict) -> list[str]:
    rows = [[name, f"{r['step_s_median']:.2f}", f"{r['tflops']:.0f}", f"{100 * r['mfu']:.1f}%", f"{r['peak_gib']:.1f}",
             r["loss_falling"]] for name, r in d["runs"].items() if "step_s_median" in r]
    ratio = d.get("speedup_lf_over_diffusers")
    return ([f"{d['model']}, latents {tuple(d['latents'])} = {d['tokens']:,} tokens + {d['text_tokens']} text tokens, "
             f"{d.get('parallel', 'one GPU')} (one clip per GPU), recompute {d['recompute']}, {d['precision']}; "
             f"median of {d['steps']} steps after "
             f"{d['warmup']}. Model FLOPs from the IR (no recompute) against 989.4 TFLOP/s."
             + (f" lf / diffusers speed: {ratio:.2f}x." if ratio else "")
             + (f" With lf's fused ops (`lf_fused`): {fused:.2f}x."
                if (fused := d.get("speedup_lf_fused_over_diffusers")) else ""), ""]
            + _table(["model", "s/step", "TFLOP/s", "MFU", "peak GiB", "loss falls"], rows))


def _vla_peer(d: dict) -> list[str]:
    rows = []
    for variant, v in d["variants"].items():
        for name, r in v["runs"].items():
            if "step_s_median" not in r:
                rows.append([f"{v['model']} ({variant})", name, "-", "-", "-", "-", "-", "-", "-", "error"])
                continue
            peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
            ratio = f"{v['speedup_lf_over_peer']:.2f}x" if name == "lf" and "speedup_lf_over_peer" in v else ""
            rows.append([f"{v['model']} ({variant}), {v['params_lf'] / 1e9:.2f}B", name, f"{r['step_s_median']:.3f}",
                         f"{r['samples_per_s_per_gpu']:,.1f}", f"{r['tokens_per_s_per_gpu']:,.0f}",
                         f"{r['tflops_per_gpu']:.0f}", f"{100 * r['mfu']:.1f}%", peak, f"{r['first_loss']:.3f}",
                         ratio])
    side = next(iter(d["variants"].values()), {}).get("config", {}).get("image_size", "?")
    return ([f"{d['world_size']} GPUs, DDP, {d['batch_per_gpu']} samples per GPU (one {side}x{side} image, 16 "
             f"instruction tokens, state, 4x4 action chunk), recompute {d['recompute']}, {d['precision']}; median of "
             f"{d['steps']} steps after {d['warmup']}. Peer: SigLIP + Llama from transformers "
             f"{d['transformers']}. Model FLOPs from the IR (no recompute) against 989.4 TFLOP/s.", ""]
            + _table(["model", "impl", "s/step", "samples/s/GPU", "tokens/s/GPU", "TFLOP/s/GPU", "MFU", "peak GiB",
                      "first loss", "lf / peer"], rows))


def _qwen2_vl_peer(d: dict) -> list[str]:
    rows = []
    for name, r in d["runs"].items():
        if "step_s_median" not in r:
            why = " ".join(r.get("error", {}).values())
            rows.append([name, "-", "-", "-", "-", "-", "-", "-", "-",
                         "out of memory" if "OutOfMemory" in why else f"error: {why[:60]}"])
            continue
        ratios = ", ".join(f"{v:.2f}x vs {k}" for k, v in r.get("vs_peer", {}).items())
        rows.append([name, f"{r['step_s_median']:.2f}", f"{r['tokens_per_s_per_gpu']:,.0f}",
                     f"{r['tflops_per_gpu']:.0f}", f"{100 * r['mfu']:.1f}%", f"{100 * r['mfu_doc_causal']:.1f}%",
                     f"{r['peak_mem_gib']:.1f}",
                     f"{r['losses'][0]:.4f}", r["loss_falling"], ratios])
    b = d["per_rank_batch"]
    best = d.get("best_lf_over_best_peer")
    return ([f"{d['model']}, plan `{d['plan']}`, {d['world_size']} GPUs; per rank one packed row of "
             f"{' / '.join(str(r['tokens']) for r in b)} tokens ({' / '.join(str(r['images']) for r in b)} images, "
             f"{' / '.join(str(r['image_tokens']) for r in b)} image tokens); {d['precision']}; median of {d['steps']} "
             f"steps after {d['warmup']}. tokens/s count text + image tokens; FLOPs from the IR (dense attention; "
             "'doc-causal' counts same-sample causal scores only) against 989.4 TFLOP/s; transformers "
             f"{d['transformers']}." + (f" Best lf / best peer: {best:.2f}x." if best else ""), ""]
            + _table(["run (impl, attention, recompute)", "s/step", "tokens/s/GPU", "TFLOP/s/GPU", "MFU",
                      "MFU doc-causal", "peak GiB", "first loss", "loss falls", "lf / peer"], rows))


RENDERERS: dict[str, tuple[str, Callable[[dict], list[str]]]] = {
    "llama3_parallel": ("Llama-3-8B under lf-parallel plans vs a plain FSDP2 peer", _llama3_parallel),
    "attention": ("Attention dispatcher vs SDPA and FlexAttention", _attention),
    "fused_ops": ("Fused Triton ops", _fused_ops),
    "varlen_docs": ("Packed-document attention: varlen kernel vs FlexAttention", _varlen_docs),
    "vae_encode": ("Wan VAE encode vs diffusers", _vae_encode),
    "row_bwd_sweep": ("Row-kernel backwards: loop variants", _row_bwd_sweep),
    "fwd_sweep": ("Element-wise forwards: launch shape, masks, cache policy", _fwd_sweep),
    "autotune_check": ("Auto-tuner: predicted vs measured", _autotune),
    "autotune_": ("Auto-tuner: exhaustive sweep, predicted vs measured", _autotune_sweep),
    "step_anatomy": ("One training step on one GPU: GPU-busy share, host syncs, fused ops", _step_anatomy),
    "published_check": ("Cost model vs Megatron-Core's published H100 throughput", _published),
    "wan_dit_peer": ("Wan2.1 DiT training step vs diffusers", _wan_dit_peer),
    "qwen2_vl_peer": ("Qwen2-VL-7B packed image-text SFT vs transformers, FSDP2 on 2 GPUs", _qwen2_vl_peer),
    "fp8_llama": ("FP8 (torchao float8) vs bf16 training on Llama-3-8B's shape", _fp8_llama),
    "lerobot_stream": ("LeRobot dataset streaming: lf-data vs lerobot's LeRobotDataset", _lerobot_stream),
    "vla_peer": ("~3B VLA (tokens and flow) vs the same model in transformers, DDP", _vla_peer),
    "memory_check": ("Recompute plans on one H200: memory and step time, predicted vs measured", _memory_check),
}


def render() -> str:
    """The whole BENCHMARKS.md text from every ``bench/results/*.json``."""
    lines = ["# Benchmarks", "", "Generated by `python bench/report.py` from `bench/results/*.json`; do not edit.", ""]
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        key = next((k for k in RENDERERS if path.stem.startswith(k)), None)
        title, fn = RENDERERS[key] if key else (path.stem, None)
        lines += [f"## {title} ({path.stem})", "", f"`bench/results/{path.name}`: {_meta(data)}.", ""]
        lines += fn(data) if fn else ["(no renderer for this file)", ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if BENCHMARKS.md is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python bench/report.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
