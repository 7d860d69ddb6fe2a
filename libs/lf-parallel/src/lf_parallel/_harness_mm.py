"""Tiny qwen2_vl and wan_dit models, their fixed random batches and losses, for the parallel harness.

Every batch tensor has the sample on dim 0 (the harness slices it per data-parallel
rank): a qwen2_vl sample holds one 4x4-patch image (``pixels`` (batch, 16, C*T*p*p),
``grid`` (batch, 3)) whose 4 merged tokens fill placeholders 2..5 of its 16 text ids;
a wan_dit sample holds clean latents, noise and a noise level sigma drawn once from the
batch seed, so the single-process run and every plan regress onto the same targets.

wan_dit is built as :class:`WanFlowLoss`, the recipe's model whose ``forward`` is the
flow-matching loss (state-dict names unchanged): a DDP or FSDP wrapper then runs the
whole loss, and under context parallelism (``cp`` given) the forward splits the video
tokens after the patch embedding (zigzag layout) and scores this rank's tokens only.

Legend: ``latents_bcfhw`` (batch, channels, frames, height, width); ``x_bsd`` (batch, tokens, dim).
"""

from __future__ import annotations

import torch
from torch import nn

QWEN2_VL_SEQ = 16
"""Text tokens per qwen2_vl sample (4 of them image placeholders)."""
QWEN2_VL_GRID = (1, 4, 4)
"""(frames, rows, columns) of patches of each sample's image: 16 patches, 4 merged tokens."""
WAN_LATENT = (4, 4, 4)
"""(frames, height, width) of each wan_dit sample's latents: a (4, 2, 2) token grid, 16 tokens."""
WAN_SIZES = {"tiny": dict(dim=48, heads=4, ffn_dim=64)}
"""Overrides of ``wan_dit_config(size)``: 4 heads of 12 features, so tp and Ulysses cp of 2 and 4 divide them
(the recipe's own tiny has 3 heads)."""


def qwen2_vl_build(size: str) -> nn.Module:
    from lf_parallel._harness_recipes import spec_model

    return spec_model("qwen2_vl", size, graph_kw={"seq_len": QWEN2_VL_SEQ, "image_patches": 16})


def qwen2_vl_batch(model: nn.Module, batch: int, seed: int) -> dict:
    cfg = model.cfg
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.image_token_id, (batch, QWEN2_VL_SEQ), generator=gen)
    ids[:, 2:6] = cfg.image_token_id
    patch = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2
    return {"ids": ids, "pixels": torch.randn(batch, 16, patch, generator=gen),
            "grid": torch.tensor([QWEN2_VL_GRID] * batch)}


def qwen2_vl_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """Next-token cross-entropy over the text ids (image placeholders included), float32."""
    from lf_ir.recipes.llama3 import next_token_loss

    ids = batch["ids"]
    return next_token_loss(model(ids, batch["pixels"].flatten(0, 1), batch["grid"]), ids)


def patchify(x_bcfhw: torch.Tensor, patch: tuple[int, int, int]) -> torch.Tensor:
    """(batch, c, f*pt, h*ph, w*pw) -> tokens (batch, f*h*w, c*pt*ph*pw): the inverse of ``WanDiTModel.unpatchify``."""
    b, c, ft, hp, wp = x_bcfhw.shape
    pt, ph, pw = patch
    x = x_bcfhw.reshape(b, c, ft // pt, pt, hp // ph, ph, wp // pw, pw)
    return x.permute(0, 2, 4, 6, 3, 5, 7, 1).reshape(b, (ft // pt) * (hp // ph) * (wp // pw), -1)


def wan_flow_loss_class() -> type:
    """``WanDiTModel``'s subclass whose forward is the flow-matching loss, whole or context-parallel (built on
    first call: lf-ir's Wan recipe is imported then)."""
    from lf_ir import recipe_spec
    from lf_ir.flow import interpolate, timesteps_from_sigmas, velocity_target

    WanDiTModel = recipe_spec("wan_dit").model  # noqa: N806  (the registered model class)

    class WanFlowLoss(WanDiTModel):
        """``WanDiTModel`` whose forward is the flow-matching loss (float32 scalar), whole or context-parallel.

        forward(x0 (batch, c, f, h, w), text (batch, text tokens, text_dim), noise like x0, sigma (batch,),
        cp=None). With a :class:`lf_parallel._context.ContextParallel` ``cp`` (and the model's self-attention
        made context-parallel by ``apply_context_parallel``) it returns the mean squared error over this cp
        rank's tokens: every rank holds as many, so the mean over the cp ranks is the whole loss.
        """

        def forward(self, x0, text, noise, sigma, cp=None):
            x_t = interpolate(x0, noise, sigma).to(x0.dtype)
            t_b = timesteps_from_sigmas(sigma)
            if cp is None:  # as WanDiTModel.flow_loss, whose self(...) would call this forward
                pred = WanDiTModel.forward(self, x_t, t_b, text)
                return self.components["video"]["loss"](pred, x0, noise, sigma)
            from lf_ir import rope3d_cos_sin

            grid = self._check(x_t, t_b, text)
            video, cfg = self.components["video"], self.cfg
            rope = rope3d_cos_sin(cfg.rope(), cfg.head_dim, grid, x_t.device)  # whole sequence: attention picks rows
            x_bsd = cp.shard(video["patch_embed"](x_t), dim=1)
            temb_bd, emb_bcd = video["time_embed"](t_b)
            temb_bd = temb_bd.type_as(text)
            context = self.components["text"]["text_proj"](text)
            for block in self.blocks:
                x_bsd = block(x_bsd, context, emb_bcd, rope)
            pred = video["head"](x_bsd, temb_bd).float()
            target = cp.shard(patchify(velocity_target(x0, noise), cfg.patch), dim=1)
            return ((pred - target) ** 2).mean()

    return WanFlowLoss


def wan_dit_build(size: str) -> nn.Module:
    from lf_ir import recipe_spec
    from lf_parallel._harness_recipes import spec_model

    spec = recipe_spec("wan_dit")
    overrides = WAN_SIZES.get(spec.size_name(size, where="--size"), {})
    patch = spec.config(size, **overrides).patch
    f, h, w = WAN_LATENT
    tokens = (f // patch[0]) * (h // patch[1]) * (w // patch[2])
    return spec_model("wan_dit", size, graph_kw={"seq_len": tokens}, model_class=wan_flow_loss_class(), **overrides)


def wan_dit_batch(model: nn.Module, batch: int, seed: int) -> dict:
    cfg = model.cfg
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, cfg.in_channels, *WAN_LATENT)
    return {"x0": torch.randn(shape, generator=gen), "noise": torch.randn(shape, generator=gen),
            "sigma": torch.rand(batch, generator=gen),
            "text": torch.randn(batch, cfg.text_len, cfg.text_dim, generator=gen)}


def wan_dit_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """Flow-matching velocity MSE at the batch's fixed sigma and noise (``lf_ir.flow``), float32."""
    return model(batch["x0"], batch["text"], batch["noise"], batch["sigma"])


def wan_dit_cp_loss(model: nn.Module, batch: dict, cp) -> torch.Tensor:
    """This cp rank's share of :func:`wan_dit_loss` (mean over the cp ranks = the whole loss)."""
    return model(batch["x0"], batch["text"], batch["noise"], batch["sigma"], cp)
