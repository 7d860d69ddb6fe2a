"""The IR graph of the Wan 2.1 causal video VAE: one component per resolution level.

Node names are the module paths of diffusers' ``AutoencoderKLWan`` (``encoder.down_blocks.3``,
``decoder.up_blocks.0.upsamplers.0``, ``quant_conv``, ...), which is all the checkpoint
interop needs to map names. Each component's ``seq_len`` is its level's input voxels per
sample (frames x height x width), the ``seq`` of the VAE nodes (see ``lf_ir._nodes_vae``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lf_ir._graph import Component, Edge
from lf_ir._nodes_vae import CausalConv3D, ChannelRMSNorm, VAEAttention, VAEResample, VAEResBlock

if TYPE_CHECKING:
    from lf_ir.recipes.wan_vae import WanVAEConfig


def _level(name: str, geometry: tuple[int, int, int], nodes: list) -> Component:
    t, h, w = geometry
    # modality "image": frames of a video; the graph has no "video" modality yet
    return Component(name=name, modality="image", seq_len=t * h * w, nodes=nodes)


def _mid(prefix: str, dim: int, frames: int) -> list:
    return [VAEResBlock(name=f"{prefix}.mid_block.resnets.0", in_channels=dim, out_channels=dim),
            VAEAttention(name=f"{prefix}.mid_block.attentions.0", dim=dim, frames=frames),
            VAEResBlock(name=f"{prefix}.mid_block.resnets.1", in_channels=dim, out_channels=dim)]


def encoder_components(cfg: WanVAEConfig, frames: int, height: int, width: int) -> list[Component]:
    """Components ``encoder0..encoder{L-1}`` for a clip of ``frames`` x ``height`` x ``width``; the last
    ends with ``quant_conv`` (2 * z_dim channels: latent mean and log-variance)."""
    dims = [cfg.base_dim * m for m in (1, *cfg.dim_mult)]
    nodes: list = [CausalConv3D(name="encoder.conv_in", in_channels=cfg.in_channels, out_channels=dims[0])]
    comps, geo, scale, j = [], (frames, height, width), 1.0, 0
    last = len(cfg.dim_mult) - 1
    for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        for _ in range(cfg.num_res_blocks):
            nodes.append(VAEResBlock(name=f"encoder.down_blocks.{j}", in_channels=cin, out_channels=cout))
            j, cin = j + 1, cout
            if scale in cfg.attn_scales:
                nodes.append(VAEAttention(name=f"encoder.down_blocks.{j}", dim=cout, frames=geo[0]))
                j += 1
        if i != last:
            mode = "down3d" if cfg.temperal_downsample[i] else "down2d"
            down = VAEResample(name=f"encoder.down_blocks.{j}", dim=cout, mode=mode, frames=geo[0])
            nodes.append(down)
            comps.append(_level(f"encoder{i}", geo, nodes))
            nodes, geo, scale, j = [], (down.out_frames, geo[1] // 2, geo[2] // 2), scale / 2, j + 1
    nodes += [*_mid("encoder", dims[-1], geo[0]),
              ChannelRMSNorm(name="encoder.norm_out", dim=dims[-1]),
              CausalConv3D(name="encoder.conv_out", in_channels=dims[-1], out_channels=2 * cfg.z_dim),
              CausalConv3D(name="quant_conv", in_channels=2 * cfg.z_dim, out_channels=2 * cfg.z_dim,
                           kernel=(1, 1, 1))]
    comps.append(_level(f"encoder{last}", geo, nodes))
    return comps


def decoder_components(cfg: WanVAEConfig, frames: int, height: int, width: int) -> list[Component]:
    """Components ``decoder0..decoder{L-1}`` for latents of ``frames`` x ``height`` x ``width``; the
    first starts with ``post_quant_conv``."""
    base = cfg.decoder_base_dim or cfg.base_dim
    dims = [base * m for m in (cfg.dim_mult[-1], *cfg.dim_mult[::-1])]
    upsample = cfg.temperal_downsample[::-1]
    nodes: list = [CausalConv3D(name="post_quant_conv", in_channels=cfg.z_dim, out_channels=cfg.z_dim,
                                kernel=(1, 1, 1)),
                   CausalConv3D(name="decoder.conv_in", in_channels=cfg.z_dim, out_channels=dims[0]),
                   *_mid("decoder", dims[0], frames)]
    comps, geo = [], (frames, height, width)
    last = len(cfg.dim_mult) - 1
    for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        cin = cin // 2 if i > 0 else cin  # Wan 2.1: each upsampler halves the channels
        for k in range(cfg.num_res_blocks + 1):
            nodes.append(VAEResBlock(name=f"decoder.up_blocks.{i}.resnets.{k}", in_channels=cin, out_channels=cout))
            cin = cout
        if i != last:
            mode = "up3d" if upsample[i] else "up2d"
            up = VAEResample(name=f"decoder.up_blocks.{i}.upsamplers.0", dim=cout, mode=mode, frames=geo[0])
            nodes.append(up)
            comps.append(_level(f"decoder{i}", geo, nodes))
            nodes, geo = [], (up.out_frames, geo[1] * 2, geo[2] * 2)
    nodes += [ChannelRMSNorm(name="decoder.norm_out", dim=dims[-1]),
              CausalConv3D(name="decoder.conv_out", in_channels=dims[-1], out_channels=cfg.out_channels)]
    comps.append(_level(f"decoder{last}", geo, nodes))
    return comps


def chain_edges(comps: list[Component]) -> list[Edge]:
    """Edges from each level's last node to the next level."""
    return [Edge(src=a.name, src_node=a.nodes[-1].name, dst=b.name) for a, b in zip(comps, comps[1:], strict=False)]
