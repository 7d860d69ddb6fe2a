"""Qwen2-VL-7B image-text SFT step on 2 GPUs under FSDP2: lf's ``qwen2_vl`` recipe against transformers'
``Qwen2VLForConditionalGeneration``, in the same job.

Batch, per rank one packed row (no padding): synthetic chat samples ``<im_start> user <vision_start>
<image_pad> x n <vision_end> PROMPT <im_end> <im_start> assistant ANSWER <im_end>``, images of 448x448, 336x504
and 672x448 px in turn (1024 / 864 / 1536 patches, 256 / 216 / 384 merged tokens), 200-600 text tokens each,
added while they fit ``--seq`` (8192) tokens (the last one's text cut to fit; rows hold ~7.7-8.2k tokens, 11-13
images). As lf-data's packing does, positions (M-RoPE ids of ``get_rope_index`` / ``mrope_position_ids``, and
text positions) restart in each sample and attention stays inside it; the loss (mean cross-entropy, float32
logits, the same function for both) covers the answer and its ``<im_end>``. Rank r packs with seed ``--seed`` +
r, once, on the host, outside the timed step (a data loader's work); every step trains on it (the loss falls).

- lf: ``Qwen2VLModel`` (``materialize`` seed 0) through :class:`PackedQwen2VL`: the recipe's ``embed_inputs``
  (ViT with per-image attention segments) given the packed M-RoPE ids, its decoder blocks with one attention
  segment per sample (per-sample causal SDPA: ``trunk_blocks`` has no packed-document mask), ``trunk_head``;
  lf-parallel ``parallelize`` with ``zero=3,dp=2`` (FSDP2 per block of both towers, then the root).
- transformers (``sdpa``; ``flash_attention_2`` too when ``flash_attn`` imports): the same config
  (``hf_config_from_qwen2_vl``) and weights (lf's, through ``lf_to_hf_state``); transformers' own packed input,
  ``position_ids`` (4, batch, seq) with the per-sample text positions first, from which it builds the packed
  causal mask (a dense block-diagonal mask for SDPA, varlen for flash-attn). ``fully_shard`` per
  ``Qwen2VLVisionBlock`` / ``Qwen2VLDecoderLayer``, then the root.

Both: fp32 master weights, FSDP2 ``MixedPrecisionPolicy(param bf16, reduce fp32)``, fused AdamW (``--lr``).
Recompute (``--recompute``, each mode run for both): ``none``, ``vision`` (every ViT block), ``text`` (every
decoder layer) or ``full`` (both), per block: lf's ``apply_recompute``; transformers' own
``activation_checkpointing_enable`` (non-reentrant), switched off on the blocks not chosen. Every input tensor
sits on the GPU (FSDP2's root moves them there anyway); both build their ViT indices from it each step.
Timing, peak memory and the per-variant JSON are ``bench/llama3_parallel.py``'s (imported): ``--warmup`` steps,
median of ``--steps`` (slowest rank per step). tokens/s/GPU: every token the LLM consumes (text + merged image
tokens), both ranks. FLOPs: lf-ir ``graph_cost`` of this batch (ViT per image
size, decoder on the packed row; dense attention term, no recompute) against 989.4 TFLOP/s; ``mfu_doc_causal``
counts the decoder's same-sample causal scores only.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        torchrun --nproc-per-node 2 bench/qwen2_vl_peer.py --out bench/results/qwen2_vl_peer_h200x2.json
    python bench/qwen2_vl_peer.py --dry --out /tmp/qwen2_vl_peer_dry.json   # CPU: tiny model, 2 gloo ranks
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lf_ir import MRoPE, graph_cost, materialize, mrope_cos_sin, mrope_position_ids
from lf_ir.interop.hf_qwen2_vl import hf_config_from_qwen2_vl, lf_to_hf_state
from lf_ir.recipes.qwen2_vl import Qwen2VLModel, build_graph, qwen2_vl_config
from lf_memory import apply_recompute
from lf_parallel import build_mesh, build_optimizer, check_plan, init_distributed, parallelize, parse_plan, shutdown

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("llama3_parallel_bench", REPO / "bench" / "llama3_parallel.py")
L3 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(L3)  # shared timing / summary / error recording (bench/ is not a package)

PLAN = "zero=3,dp=2"
IMAGES_PX = ((448, 448), (336, 504), (672, 448))
"""Image (height, width) in pixels, used in turn."""
DRY_IMAGES_PX = ((56, 56), (56, 84), (84, 56))
RECOMPUTE = {"none": (), "vision": ("vision",), "text": ("text",), "full": ("vision", "text")}
"""Recompute mode -> the towers whose every block is recomputed."""
IGNORE = -100


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file to write (rank 0)")
    p.add_argument("--dry", action="store_true", help="CPU smoke run: tiny qwen2_vl, 2 gloo processes, 2 steps")
    p.add_argument("--size", default="7B", help="qwen2_vl size")
    p.add_argument("--seq", type=int, default=8192, help="packed tokens per rank (LLM side)")
    p.add_argument("--recompute", default="full,vision", help="comma list of modes: " + ", ".join(RECOMPUTE))
    p.add_argument("--peer-attn", default="sdpa,flash_attention_2",
                   help="transformers attention implementations (flash_attention_2 only if flash_attn imports)")
    p.add_argument("--skip-lf", action="store_true", help="run the transformers peer only")
    p.add_argument("--skip-peer", action="store_true", help="run lf only")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=None, help="AdamW lr (default 1e-4; 1e-3 with --dry)")
    p.add_argument("--seed", type=int, default=0, help="batch seed of rank 0 (rank r uses seed + r)")
    p.add_argument("--timeout-s", type=float, default=180.0,
                   help="collective timeout: a rank that fails alone (e.g. out of memory) ends the job after it")
    args = p.parse_args(argv)
    modes = [m.strip() for m in args.recompute.split(",") if m.strip()]
    bad = [m for m in modes if m not in RECOMPUTE]
    if bad or not modes:
        p.error(f"--recompute: unknown mode(s) {bad or modes}; expected a comma list of {list(RECOMPUTE)}")
    args.modes = modes
    if args.dry:
        args.size, args.seq, args.warmup, args.steps = "tiny", 160, 0, 2
    args.lr = args.lr or (1e-3 if args.dry else 1e-4)
    return args


def special_ids(cfg) -> dict[str, int]:
    """Chat-template ids: Qwen2's ``<|im_start|>`` / ``<|im_end|>`` sit 8 / 7 below ``<|vision_start|>``
    (151644, 151645 in the 7B vocabulary; the tiny config keeps the layout), text ids below them."""
    vs = cfg.vision_start_token_id
    return {"im_start": vs - 8, "im_end": vs - 7, "text_max": vs - 9}


def _sample(cfg, gen: torch.Generator, hw: tuple[int, int], text: int) -> dict:
    """One chat sample with ``text`` text tokens (half prompt, half answer) and one image of ``hw`` pixels."""
    sp, p, m = special_ids(cfg), cfg.patch_size, cfg.spatial_merge_size
    gh, gw = hw[0] // p, hw[1] // p
    merged = gh * gw // m ** 2
    words = torch.randint(0, sp["text_max"], (text,), generator=gen).tolist()
    n_prompt = (text - 8) // 2  # 8 template tokens: im_start, user, vs, ve, im_end, im_start, assistant, im_end
    prompt = [sp["im_start"], words[0], cfg.vision_start_token_id, *[cfg.image_token_id] * merged,
              cfg.vision_end_token_id, *words[8:8 + n_prompt], sp["im_end"], sp["im_start"], words[1]]
    ids = prompt + words[8 + n_prompt:] + [sp["im_end"]]
    patches = torch.randn(gh * gw, cfg.in_channels * cfg.temporal_patch_size * p * p, generator=gen)
    return {"ids": ids, "answer_from": len(prompt), "pixels": patches, "grid": [1, gh, gw]}


def pack_batch(cfg, seq: int, seed: int, dry: bool) -> dict:
    """One packed row of chat samples (see the module docstring), every tensor on the host.

    Returns ``ids`` (1, S) int64, ``targets`` (1, S) int64 (next token inside an answer, else -100),
    ``pos_3bs`` (3, 1, S) M-RoPE ids, ``text_pos`` (1, S) per-sample positions, ``pixels`` (patches,
    C*T*p*p) float32, ``grid`` (images, 3) int64 and ``doc_lens`` (tokens per sample), S = sum(doc_lens) <= seq.
    """
    gen, sizes = torch.Generator().manual_seed(seed), DRY_IMAGES_PX if dry else IMAGES_PX
    lo, hi = (8, 24) if dry else (200, 600)
    samples, used = [], 0
    while True:
        hw = sizes[len(samples) % len(sizes)]
        text = int(torch.randint(lo, hi + 1, (1,), generator=gen))
        merged = (hw[0] // cfg.patch_size) * (hw[1] // cfg.patch_size) // cfg.spatial_merge_size ** 2
        text = min(text, seq - used - merged)
        if text < lo:
            break
        samples.append(_sample(cfg, gen, hw, text))
        used += len(samples[-1]["ids"])
    ids, targets, pos, text_pos = [], [], [], []
    grid = torch.tensor([s["grid"] for s in samples])
    for i, s in enumerate(samples):
        row = torch.tensor(s["ids"])
        tgt = torch.full_like(row, IGNORE)
        tgt[s["answer_from"] - 1:-1] = row[s["answer_from"]:]
        ids.append(row), targets.append(tgt), text_pos.append(torch.arange(len(row)))
        pos.append(mrope_position_ids(row[None], grid[i:i + 1], image_token_id=cfg.image_token_id,
                                      spatial_merge_size=cfg.spatial_merge_size))
    return {"ids": torch.cat(ids)[None], "targets": torch.cat(targets)[None], "pos_3bs": torch.cat(pos, dim=2),
            "text_pos": torch.cat(text_pos)[None], "pixels": torch.cat([s["pixels"] for s in samples]),
            "grid": grid, "doc_lens": [len(s["ids"]) for s in samples]}


def step_flops(cfg, batch: dict) -> dict:
    """lf-ir FLOPs (forward + backward, no recompute) of one packed row: the ViT per image size (batch = images
    of that size), the decoder on the row; ``doc_causal`` counts the decoder's attention scores over same-sample
    causal pairs only (backward = 2x forward, the IR's rule)."""
    seq = batch["ids"].shape[1]
    patches = Counter(int(t * h * w) for t, h, w in batch["grid"].tolist())
    total = 0
    for n, count in patches.items():
        vision = graph_cost(build_graph(cfg, seq_len=seq, image_patches=n), batch=count).components[0]
        total += vision.forward_flops + vision.backward_flops
    graph = build_graph(cfg, seq_len=seq)
    text = graph_cost(graph, batch=1).components[1]
    total += text.forward_flops + text.backward_flops
    attn = [n.attention for n in graph.components[1].nodes if getattr(n, "is_block", False)]
    saved = sum(a.forward_flops(1, seq) - a.forward_flops_unmasked(1, seq, batch["doc_lens"]) for a in attn)
    return {"dense": total, "doc_causal": total - 3 * saved}


class PackedQwen2VL(nn.Module):
    """lf's ``Qwen2VLModel`` on one packed row: logits (1, S, vocab) with attention inside each packed sample.

    The recipe's ``embed_inputs`` (ViT + placeholder fill, with the given M-RoPE ids), its decoder blocks called
    with ``segments=doc_lens`` (one causal attention per sample), its ``trunk_head``. A module of its own so
    that FSDP2's root hooks run around the whole forward (parameter names gain a ``model.`` prefix).
    """

    def __init__(self, model: Qwen2VLModel):
        super().__init__()
        self.model = model
        self.rope = MRoPE(theta=model.cfg.rope_theta, sections=tuple(model.cfg.mrope_section))

    def forward(self, ids_bs, pixels_nf, grid_thw, pos_3bs, doc_lens: list[int]) -> torch.Tensor:
        m = self.model
        x_bsd, _, _ = m.embed_inputs(ids_bs, pixels_nf, grid_thw, position_ids=pos_3bs)
        cos_sin = mrope_cos_sin(self.rope, m.cfg.head_dim, pos_3bs, x_bsd.dtype)
        for block in m.components["text"].blocks:
            x_bsd = block(x_bsd, m.mask, None, cos_sin=cos_sin, segments=doc_lens)
        return m.trunk_head(x_bsd)


def answer_loss(logits_bsv: torch.Tensor, targets_bs: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the answer tokens, in float32 (the same for both models)."""
    return F.cross_entropy(logits_bsv.float().flatten(0, 1), targets_bs.flatten(), ignore_index=IGNORE)


def _to_device(batch: dict, device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _lf(mode: str, args, cfg, device, batch: dict):
    """lf's model under lf-parallel's ZeRO-3 plan; returns the step function."""
    with torch.device("meta"):
        model = Qwen2VLModel(cfg, build_graph(cfg, seq_len=args.seq))
    model = PackedQwen2VL(materialize(model, device, seed=0))
    plan = check_plan(parse_plan(PLAN, precision="bf16", micro_batch=1), world_size=dist.get_world_size(),
                      global_batch=dist.get_world_size(), graph=model.model.graph)

    def recompute(m):
        for tower in RECOMPUTE[mode]:
            apply_recompute(m.model.components[tower].blocks, "full")

    mesh = build_mesh(plan, device.type)
    model = parallelize(model, mesh, plan, recompute=recompute)
    opt = build_optimizer(model, mesh, plan, lr=args.lr, fused=True)
    b = _to_device(batch, device)

    def step():
        loss = answer_loss(model(b["ids"], b["pixels"], b["grid"], b["pos_3bs"], b["doc_lens"]), b["targets"])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach().float()

    return step


def hf_model(cfg, attn: str, device):
    """transformers' model of ``cfg`` (float32, ``attn`` attention) holding lf's ``materialize(seed=0)`` weights."""
    import transformers

    fields = {k: v for k, v in hf_config_from_qwen2_vl(cfg).items() if k not in ("model_type", "torch_dtype", "dtype")}
    with torch.device(device):
        hf = transformers.Qwen2VLForConditionalGeneration._from_config(
            transformers.Qwen2VLConfig(**fields), attn_implementation=attn, dtype=torch.float32)
        with torch.device("meta"):
            lf = Qwen2VLModel(cfg, build_graph(cfg, seq_len=64))
        state = lf_to_hf_state(materialize(lf, device, seed=0).state_dict(), cfg)

    def in_memory(key: str) -> str:  # checkpoint names -> transformers 5.x module names
        if key.startswith("visual."):
            return "model." + key
        return "model.language_model." + key.removeprefix("model.") if key.startswith("model.") else key

    hf.load_state_dict({in_memory(k): v for k, v in state.items()}, strict=True)
    del lf, state
    return hf.train()


def _peer(mode: str, attn: str, args, cfg, device, batch: dict):
    """transformers' model, FSDP2 per block then the root, its own gradient checkpointing; the step function."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    hf = hf_model(cfg, attn, device)
    towers = {"vision": hf.model.visual.blocks, "text": hf.model.language_model.layers}
    if RECOMPUTE[mode]:
        enable = getattr(hf, "activation_checkpointing_enable", None)  # transformers >= 5.24; older: gradient_...
        (enable or hf.gradient_checkpointing_enable)({"use_reentrant": False})
        for name, blocks in towers.items():
            for block in blocks:
                block.gradient_checkpointing = name in RECOMPUTE[mode]
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in [*towers["vision"], *towers["text"]]:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(hf, mesh=mesh, mp_policy=mp)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    opt = torch.optim.AdamW(hf.parameters(), lr=args.lr, fused=True)
    b = _to_device(batch, device)
    pos_4bs = torch.cat([b["text_pos"][None], b["pos_3bs"]])  # transformers' packed form: text positions first

    def step():
        out = hf(input_ids=b["ids"], pixel_values=b["pixels"], image_grid_thw=b["grid"], position_ids=pos_4bs,
                 use_cache=False)
        loss = answer_loss(out.logits, b["targets"])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach().float()

    return step


def _peer_attns(args, device) -> tuple[list[str], dict]:
    """The peer attention implementations to run and those skipped (with why)."""
    run, skipped = [], {}
    for attn in filter(None, (a.strip() for a in args.peer_attn.split(","))):
        if attn == "flash_attention_2" and (device.type != "cuda" or importlib.util.find_spec("flash_attn") is None):
            skipped[attn] = "flash_attn is not importable" if device.type == "cuda" else "needs CUDA"
        else:
            run.append(attn)
    return run, skipped


def _ratios(result: dict) -> None:
    """Per recompute mode: lf over each peer (tokens/s), first-step loss gaps, and the best time of each."""
    runs = result["runs"]
    for key, r in runs.items():
        if not key.startswith("lf ") or "tokens_per_s_per_gpu" not in r:
            continue
        mode = key.split(" ", 1)[1]
        for pk, p in runs.items():
            if pk.startswith("transformers ") and pk.endswith(f" {mode}") and "tokens_per_s_per_gpu" in p:
                r.setdefault("vs_peer", {})[pk] = r["tokens_per_s_per_gpu"] / p["tokens_per_s_per_gpu"]
                gap = r["losses"][0] - p["losses"][0]
                r.setdefault("first_loss_minus_peer", {})[pk] = gap
                r.setdefault("first_loss_within_1e-2", {})[pk] = abs(gap) <= 1e-2
    best = {}
    for key, r in runs.items():  # the fastest run of each implementation ("lf", "transformers sdpa", ...)
        impl = key.rsplit(" ", 1)[0]
        if r.get("tokens_per_s_per_gpu", 0) > runs.get(best.get(impl), {}).get("tokens_per_s_per_gpu", 0):
            best[impl] = key
    result["best"] = best
    tps = {impl: runs[key]["tokens_per_s_per_gpu"] for impl, key in best.items()}
    if "lf" in tps and len(tps) > 1:
        result["best_lf_over_best_peer"] = tps["lf"] / max(v for impl, v in tps.items() if impl != "lf")


def run(args: argparse.Namespace) -> None:
    """One rank: every recompute mode for lf then the peer(s); rank 0 writes ``args.out`` after each variant."""
    ctx = init_distributed("cpu" if args.dry else "cuda", timeout_s=args.timeout_s)
    device, world = ctx.device, ctx.world_size
    if world != 2:
        raise SystemExit(f"this benchmark runs on 2 processes (plan {PLAN}); got WORLD_SIZE={world}")
    cfg = qwen2_vl_config(args.size, layers=2, vision_layers=2) if args.dry else qwen2_vl_config(args.size)
    batch = pack_batch(cfg, args.seq, args.seed + ctx.rank, args.dry)
    mine = {"tokens": batch["ids"].shape[1], "images": batch["grid"].shape[0], "samples": len(batch["doc_lens"]),
            "image_tokens": int((batch["ids"] == cfg.image_token_id).sum()),
            "answer_tokens": int((batch["targets"] != IGNORE).sum()), **step_flops(cfg, batch)}
    ranks = [None] * world
    dist.all_gather_object(ranks, mine)
    tokens, flops = sum(r["tokens"] for r in ranks), sum(r["dense"] for r in ranks)
    flops_tok = flops / tokens
    attns, skipped = _peer_attns(args, device)
    result = {"model": f"qwen2_vl {args.size}" + (" (2 + 2 layers)" if args.dry else ""), "plan": PLAN,
              "seq": args.seq, "world_size": world, "dry": args.dry, "per_rank_batch": ranks,
              "images_px": [list(s) for s in (DRY_IMAGES_PX if args.dry else IMAGES_PX)],
              "tokens_counted": "every token the LLM consumes: text + merged image tokens, both ranks",
              "flops_per_step": flops, "flops_per_step_doc_causal": sum(r["doc_causal"] for r in ranks),
              "flops_source": "lf-ir graph_cost, forward + backward, dense attention term, no recompute",
              "peak_flops": L3.PEAK_FLOPS, "precision": "fp32 master weights, FSDP2 param bf16 / reduce fp32",
              "optimizer": f"AdamW fused lr={args.lr}", "peer_packing": "transformers packed position_ids (4, b, s)",
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "transformers": _version("transformers"), **L3._commit(),
              "warmup": args.warmup, "steps": args.steps, "peer_skipped": skipped, "runs": {}}

    def write():
        if ctx.is_main:
            _ratios(result)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1))

    for mode in args.modes:
        builds = [] if args.skip_lf else [(f"lf {mode}", lambda m=mode: _lf(m, args, cfg, device, batch))]
        if not args.skip_peer:
            builds += [(f"transformers {a} {mode}", lambda m=mode, a=a: _peer(m, a, args, cfg, device, batch))
                       for a in attns]
        for name, build in builds:
            out = {"recompute": mode, **L3._run_variant(name, build, args, device, tokens, flops_tok)}
            if "step_s_median" in out:
                out["mfu_doc_causal"] = result["flops_per_step_doc_causal"] / out["step_s_median"] / world / \
                    L3.PEAK_FLOPS
            result["runs"][name] = out
            write()
    write()
    shutdown(ctx)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv=None) -> None:
    from _launch import launch  # bench/ is sys.path[0] when this file runs as a script

    launch(run, _args(argv))


if __name__ == "__main__":
    main()
