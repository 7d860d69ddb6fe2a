"""The models ``bench/autotune_check.py`` measures: model, IR graph, random per-rank batches, loss, cp loss.

Shapes (GPU; ``dry=True``: the recipes' tiny sizes on a few tokens, for the CPU):

- ``llama3``: Llama-3-8B with ``layers`` decoder layers (default 8), ``seq`` tokens per sample (8,192).
- ``qwen2_vl``: Qwen2-VL-7B with ``layers`` decoder layers and as many ViT blocks scaled by 32/28 (default 7
  and 8), one 448x448 image per sample (32 x 32 = 1,024 patches, 256 merged tokens at text positions 8..263)
  in ``seq`` text tokens (2,048). One image per sample (the graph's own unit), no packing. As in ``lf run``, the
  image grids stay on the host and the M-RoPE ids are computed there (no host-device sync in the forward).
- ``wan_dit``: Wan2.1-1.3B with ``layers`` DiT blocks (default 10 of 30) on 81 x 480 x 832 video: latents
  (16, 21, 60, 104), 32,760 tokens, 512 text tokens of 4,096 features; flow-matching loss at a random sigma.

Layer counts are reduced so that every plan of a sweep (recompute ``none`` included) fits one H200 and each
trial takes seconds; predictions are made for the same reduced graph. Context-parallel losses (``cp_loss``)
exist for llama3 and wan_dit (lf-parallel's harness feeding); qwen2_vl plans with cp > 1 are not measured.

Bench scripts are run as files, so this module is imported by path from ``autotune_check.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

WAN_VIDEO = (81, 480, 832)
"""Frames, height, width of the Wan2.1 check (the 1.3B model's native 480p)."""


@dataclasses.dataclass(frozen=True)
class Workload:
    """One model of the check: how to build it, its graph, feed it, score it."""

    name: str
    """Model and shape, for the report."""
    graph: object
    """The ``lf_ir.Graph`` the tuner ranks (the reduced model, at the measured sequence)."""
    seq: int
    """Tokens per sample of the main component (``search_plans(seq=...)``)."""
    build: Callable[[], torch.nn.Module]
    """Builds the model on the current default device (the check builds on meta, then materializes)."""
    batch: Callable[[int, int, str], dict]
    """(micro_batch, seed, device) -> dict of random tensors of one micro-batch."""
    loss: Callable[[torch.nn.Module, dict], torch.Tensor]
    """(model, batch) -> float32 scalar loss."""
    cp_loss: Callable[[torch.nn.Module, dict, object], torch.Tensor] | None = None
    """(model, batch, ContextParallel) -> this rank's loss share; None: cp plans are not measured."""


def llama3(layers: int | None, seq: int | None, dry: bool) -> Workload:
    from lf_ir import Llama3Model, llama3_config
    from lf_ir.recipes import llama3 as recipe
    from lf_ir.recipes.llama3 import next_token_loss
    from lf_parallel import llama_cp_loss

    seq = seq or (64 if dry else 8192)
    cfg = llama3_config("tiny", vocab_size=512, max_seq_len=seq) if dry else llama3_config("8B", layers=layers or 8)
    graph = recipe.build_graph(cfg, seq)

    def batch(mb: int, seed: int, device: str) -> dict:
        gen = torch.Generator().manual_seed(seed)
        return {"ids": torch.randint(0, cfg.vocab_size, (mb, seq), generator=gen).to(device)}

    return Workload(name=f"llama3-{'tiny' if dry else '8B'} {cfg.layers} layers, seq {seq}", graph=graph, seq=seq,
                    build=lambda: Llama3Model(cfg, graph), batch=batch,
                    loss=lambda model, b: next_token_loss(model(b["ids"]), b["ids"]), cp_loss=llama_cp_loss)


def qwen2_vl(layers: int | None, seq: int | None, dry: bool) -> Workload:
    from lf_ir import mrope_position_ids
    from lf_ir.recipes.llama3 import next_token_loss
    from lf_ir.recipes.qwen2_vl import Qwen2VLModel, build_graph, qwen2_vl_config

    side = 4 if dry else 32  # patches per image side
    seq = seq or (32 if dry else 2048)
    if dry:
        cfg = qwen2_vl_config("tiny")
    else:
        text = layers or 7
        cfg = qwen2_vl_config("7B", layers=text, vision_layers=max(1, round(text * 32 / 28)))
    merged = side * side // cfg.spatial_merge_size ** 2
    graph = build_graph(cfg, seq_len=seq, image_patches=side * side)
    patch = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2

    def batch(mb: int, seed: int, device: str) -> dict:
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, min(cfg.image_token_id, cfg.vocab_size), (mb, seq), generator=gen)
        ids[:, 2:2 + merged] = cfg.image_token_id
        grid = torch.tensor([(1, side, side)] * mb)  # stays on the host, as lf run's batches keep it
        positions = mrope_position_ids(ids, grid, image_token_id=cfg.image_token_id,
                                       spatial_merge_size=cfg.spatial_merge_size)  # host-side, as lf run's collate
        return {"ids": ids.to(device), "pixels": torch.randn(mb * side * side, patch, generator=gen).to(device),
                "grid": grid, "positions": positions.to(device)}

    def loss(model, b):
        return next_token_loss(model(b["ids"], b["pixels"], b["grid"], position_ids=b["positions"]), b["ids"])

    name = (f"qwen2_vl-{'tiny' if dry else '7B'} {cfg.vision_layers}+{cfg.layers} layers, {side * side} patches, "
            f"seq {seq}")
    return Workload(name=name, graph=graph, seq=seq, build=lambda: Qwen2VLModel(cfg, graph), batch=batch, loss=loss)


def wan_dit(layers: int | None, seq: int | None, dry: bool) -> Workload:
    from lf_ir.recipes.wan_dit import build_graph, video_tokens, wan_dit_config
    from lf_parallel import wan_flow_loss_class

    if seq is not None:
        raise SystemExit("--seq: wan_dit's tokens follow from the video size (81 x 480 x 832)")
    if dry:
        cfg = wan_dit_config("tiny", dim=48, heads=4, ffn_dim=64)
        latent = (cfg.in_channels, 3, 8, 8)  # 3 x 4 x 4 = 48 tokens
    else:
        cfg = wan_dit_config("1.3B", layers=layers or 10)
        f, h, w = WAN_VIDEO
        latent = (cfg.in_channels, (f - 1) // 4 + 1, h // 8, w // 8)
    tokens = (latent[1] // cfg.patch[0]) * (latent[2] // cfg.patch[1]) * (latent[3] // cfg.patch[2])
    if not dry and tokens != video_tokens(cfg, *WAN_VIDEO):  # the recipe's own count
        raise RuntimeError(f"wan_dit latents give {tokens} tokens, the recipe {video_tokens(cfg, *WAN_VIDEO)}")
    graph = build_graph(cfg, seq_len=tokens)

    def batch(mb: int, seed: int, device: str) -> dict:
        gen = torch.Generator().manual_seed(seed)
        return {"x0": torch.randn(mb, *latent, generator=gen).to(device),
                "noise": torch.randn(mb, *latent, generator=gen).to(device),
                "sigma": torch.rand(mb, generator=gen).to(device),
                "text": torch.randn(mb, cfg.text_len, cfg.text_dim, generator=gen).to(device)}

    name = f"wan_dit-{'tiny' if dry else '1.3B'} {cfg.layers} layers, {tokens} tokens" + (
        "" if dry else " (81x480x832)")
    return Workload(name=name, graph=graph, seq=tokens, build=lambda: wan_flow_loss_class()(cfg, graph), batch=batch,
                    loss=lambda model, b: model(b["x0"], b["text"], b["noise"], b["sigma"]),
                    cp_loss=lambda model, b, cp: model(b["x0"], b["text"], b["noise"], b["sigma"], cp))


WORKLOADS = {"llama3": llama3, "qwen2_vl": qwen2_vl, "wan_dit": wan_dit}
"""``--model`` -> (layers, seq, dry) -> :class:`Workload`."""
