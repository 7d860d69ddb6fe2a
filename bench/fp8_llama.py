"""FP8 vs bf16 training-step throughput on Llama-3-8B, and the auto recompute plan vs full recompute.

One GPU (H200/H100). The model is Llama-3-8B's shape (d=4096, 32 heads, 8 KV heads, SwiGLU 14336,
vocab 128256) with fewer layers (``--layers``, default 8) so that bf16 weights, gradients and AdamW
state fit one GPU next to the activations; FP8 changes the per-layer GEMMs, so the ratio carries to
32 layers up to the share of the embedding and LM head (kept bf16).

Part 1, throughput: the same model and batch in bf16, then with lf-memory's ``apply_fp8`` (torchao
float8, ``tensorwise`` and ``rowwise``; LM head and small GEMMs stay bf16), each ``torch.compile``d
(``--no-compile`` to skip), timed over ``--steps`` after ``--warmup`` steps: tokens/s and step ms.

Part 2, recompute: a budget half-way between the predicted activation bytes of full recompute and of
uniform ``selective`` (so neither ``none`` nor ``selective`` fits: a naive setup needs ``full``). For
``full`` and for ``plan_recompute``'s plan: the predicted activation bytes, the recomputed FLOPs (the
planner's price), the measured ``torch.cuda.max_memory_allocated`` of a step and its time.

    python bench/fp8_llama.py --out bench/results/fp8_llama_h200.json
    python bench/fp8_llama.py --dry --out /tmp/fp8_dry.json     # CPU smoke run: tiny model, no FP8

Part 3, loss curves: ``--curve-steps`` (200) AdamW steps of bf16 and of FP8 tensorwise from the same
initial weights on the same byte-level stream of the Python standard library's source (bytes as token
ids, a real and learnable text), losses recorded per step side by side; weights are bf16 as in part 1.

Needs torchao for parts 1 and 3 (torchao 0.17.x is the release built against torch 2.11; 0.16 was built
against 2.10: check the table in ``torchao/__init__.py``); without it part 1 records the error.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback

import torch

from lf_ir import Llama3Model, llama3_config, materialize, next_token_loss
from lf_ir.recipes.llama3 import build_graph
from lf_memory import apply_fp8, apply_recompute, fp8_filter, plan_recompute


def _model(cfg, device, dtype):
    with torch.device("meta"):
        model = Llama3Model(cfg)
    return materialize(model, device, seed=0).to(dtype)


def _time_steps(model, ids, steps: int, warmup: int, device) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    cuda = device.type == "cuda"
    times = []
    for i in range(warmup + steps):
        if cuda:
            torch.cuda.synchronize()
            if i == warmup:
                torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        loss = next_token_loss(model(ids), ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    step_s = sorted(times)[len(times) // 2]
    return {"step_ms_median": 1e3 * step_s, "tokens_per_s": ids.numel() / step_s, "loss": float(loss),
            "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None}


def _throughput(args, cfg, device, ids) -> dict:
    out = {}
    for name in ("bf16", *([] if args.dry else ["fp8_tensorwise", "fp8_rowwise"])):
        try:
            model = _model(cfg, device, torch.bfloat16)
            converted = []
            if name.startswith("fp8"):
                keep = fp8_filter(min_features=1024, tokens=ids.numel())
                converted = apply_fp8(model, name.split("_", 1)[1], module_filter=keep)
            if args.compile and device.type == "cuda":
                model = torch.compile(model)
            out[name] = {**_time_steps(model, ids, args.steps, args.warmup, device), "fp8_linears": len(converted)}
        except Exception as err:  # record and go on: one failing variant must not lose the others
            out[name] = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc(limit=3)}
        finally:
            model = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if "fp8_tensorwise" in out and "tokens_per_s" in out.get("fp8_tensorwise", {}) and "tokens_per_s" in out["bf16"]:
        out["speedup_tensorwise"] = out["fp8_tensorwise"]["tokens_per_s"] / out["bf16"]["tokens_per_s"]
    if "tokens_per_s" in out.get("fp8_rowwise", {}) and "tokens_per_s" in out["bf16"]:
        out["speedup_rowwise"] = out["fp8_rowwise"]["tokens_per_s"] / out["bf16"]["tokens_per_s"]
    return out


def _recompute(args, cfg, device, ids) -> dict:
    batch, seq = ids.shape
    graph = build_graph(cfg, seq_len=seq)
    full = plan_recompute(graph, 2**60, batch, None, 2, options=("full",))
    none = plan_recompute(graph, 2**60, batch, None, 2, options=("none", "full"))
    selective = plan_recompute(graph, 2**60, batch, None, 2, options=("selective", "full"))
    budget = (full.saved_bytes + selective.saved_bytes) // 2
    auto = plan_recompute(graph, budget, batch, None, 2)
    out = {"budget_bytes": budget, "predicted_bytes": {"none": none.saved_bytes, "selective": selective.saved_bytes,
                                                       "full": full.saved_bytes},
           "selective_fits_budget": selective.saved_bytes <= budget}
    for name, plan in (("full", full), ("auto", auto)):
        model = _model(cfg, device, torch.bfloat16)
        apply_recompute(model.blocks, "auto", plan=plan)
        out[name] = {"options": plan.counts(), "predicted_activation_bytes": plan.saved_bytes,
                     "recompute_flops": plan.recompute_flops,
                     **_time_steps(model, ids, args.steps, args.warmup, device)}
        model = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
    out["auto_over_full_recompute_flops"] = auto.recompute_flops / max(full.recompute_flops, 1)
    return out


def _stdlib_bytes(n_tokens: int) -> torch.Tensor:
    """The first ``n_tokens`` bytes of the standard library's ``.py`` files (sorted paths) as int64 ids."""
    import os
    import pathlib

    root = pathlib.Path(os.__file__).parent
    chunks, total = [], 0
    for path in sorted(root.rglob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= n_tokens:
            break
    buf = b"".join(chunks)[:n_tokens]
    if len(buf) < n_tokens:
        raise SystemExit(f"the standard library under {root} has only {len(buf)} bytes of source; need {n_tokens}")
    return torch.frombuffer(bytearray(buf), dtype=torch.uint8).to(torch.int64)


def _curves(args, cfg, device) -> dict:
    steps, batch, seq = args.curve_steps, args.micro_batch, args.seq
    stream = _stdlib_bytes(steps * batch * seq).view(steps, batch, seq)
    out = {"data": "python stdlib .py bytes", "steps": steps, "lr": 3e-4, "warmup": 20}
    for name in ("bf16", *([] if args.dry else ["fp8_tensorwise"])):
        try:
            model = _model(cfg, device, torch.bfloat16)
            if name.startswith("fp8"):
                apply_fp8(model, "tensorwise", module_filter=fp8_filter(min_features=1024, tokens=batch * seq))
            step_model = torch.compile(model) if args.compile and device.type == "cuda" else model
            opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, foreach=True)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 20))
            losses = []
            t0 = time.perf_counter()
            for i in range(steps):
                ids = stream[i].to(device)
                loss = next_token_loss(step_model(ids), ids)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                losses.append(float(loss))
            out[name] = {"losses": losses, "wall_s": time.perf_counter() - t0}
        except Exception as err:
            out[name] = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc(limit=3)}
        finally:
            model = step_model = opt = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if "losses" in out.get("fp8_tensorwise", {}) and "losses" in out["bf16"]:
        a, b = out["bf16"]["losses"], out["fp8_tensorwise"]["losses"]
        tail = max(1, len(a) // 10)
        out["final_mean_bf16"] = sum(a[-tail:]) / tail
        out["final_mean_fp8"] = sum(b[-tail:]) / tail
        out["max_abs_diff_last_half"] = max(abs(x - y) for x, y in zip(a[len(a) // 2:], b[len(b) // 2:], strict=True))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--dry", action="store_true", help="CPU smoke run: tiny Llama 3, no FP8")
    parser.add_argument("--layers", type=int, default=8, help="Llama-3-8B layers kept (32 in the full model)")
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--curve-steps", type=int, default=200, help="steps of the bf16 vs FP8 loss curves")
    parser.add_argument("--parts", default="throughput,recompute,curves", help="comma list of parts to run")
    args = parser.parse_args()
    if args.dry:
        device, cfg, args.seq, args.steps, args.warmup = torch.device("cpu"), llama3_config("tiny"), 64, 2, 1
        args.curve_steps = 3
    else:
        if not torch.cuda.is_available():
            raise SystemExit("needs a CUDA GPU (use --dry on the CPU)")
        device, cfg = torch.device("cuda"), llama3_config("8B", layers=args.layers)
    ids = torch.randint(0, cfg.vocab_size, (args.micro_batch, args.seq), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "model": f"llama3-8B shape, {cfg.layers} layers" if not args.dry else "tiny",
              "micro_batch": args.micro_batch, "seq": args.seq, "steps": args.steps, "compile": args.compile}
    try:
        import torchao
        result["torchao"] = torchao.__version__
    except ImportError:
        result["torchao"] = None
    parts = set(args.parts.split(","))
    if "throughput" in parts:
        result["throughput"] = _throughput(args, cfg, device, ids)
    if "recompute" in parts:
        result["recompute"] = _recompute(args, cfg, device, ids)
    if "curves" in parts:
        result["curves"] = _curves(args, cfg, device)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
