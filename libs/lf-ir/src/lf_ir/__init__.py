"""lf-ir: the unified IR of LoongForge.

A model is a :class:`Graph` of components per modality, each an ordered list of
typed nodes with shapes, parameter counts and FLOPs. Recipes build graphs;
:func:`lower_node` / :class:`ComponentModule` turn them into torch modules.

For the libraries above it (lf-memory, lf-parallel) and the orchestrator: :class:`AttentionModule` /
:class:`DiTAttentionModule` (the lowered attentions context parallel swaps), :func:`rope3d_cos_sin` /
:func:`apply_rope3d` (Wan's 3D RoPE), :data:`PIPELINE_GLUE` (the methods a multi-component model provides to
be pipelined) and :func:`fused_modules` (the submodules with a fused path).
"""

from lf_ir import _lower_vae, _lower_video, flow  # noqa: F401  (register the lowerings of their node families)
from lf_ir._base import SeqSplit, TPStyle
from lf_ir._cost import node_backward_flops, node_forward_flops, node_params
from lf_ir._fused import RMSNormModule, fused_modules, use_fused_ops
from lf_ir._graph import (
                          Component,
                          Edge,
                          Graph,
                          backward_flops,
                          forward_flops,
                          from_json,
                          param_count,
                          summary_rows,
                          to_json,
                          validate,
)
from lf_ir._lower import (
                          AttentionModule,
                          ComponentModule,
                          LMHeadModule,
                          TransformerBlockModule,
                          init_weights,
                          lf_modules,
                          lower_node,
                          materialize,
                          register_lowering,
)
from lf_ir._lower_video import DiTAttentionModule
from lf_ir._mask import Mask, MaskKind, as_mask
from lf_ir._mm_positions import mrope_position_ids
from lf_ir._mrope import MRoPE, VisionRoPE
from lf_ir._mrope_torch import mrope_cos_sin, vision_rope_cos_sin
from lf_ir._nodes import (
                          MLP,
                          Attention,
                          Embedding,
                          IRError,
                          LearnedPositional,
                          Linear,
                          LMHead,
                          Node,
                          Norm,
                          PatchEmbed2D,
                          RoPE,
                          TransformerBlock,
)
from lf_ir._nodes_dit import DiTAttention, DiTBlock
from lf_ir._nodes_expert import ActionTimeEmbed, JointAttentionBlock
from lf_ir._nodes_flow import FlowMatchingLoss
from lf_ir._nodes_mm import MMAttention, MMBlock
from lf_ir._nodes_vae import CausalConv3D, ChannelRMSNorm, VAEAttention, VAEResample, VAEResBlock
from lf_ir._nodes_video import AdaLNHead, AdaLNModulation, RoPE3D, TextProjection, TimestepEmbedding, VideoPatchEmbed
from lf_ir._nodes_vision import FeedForward, PatchEmbed3D, PatchMerger
from lf_ir._pipeline_glue import PIPELINE_GLUE
from lf_ir._rope3d_torch import apply_rope3d, rope3d_cos_sin
from lf_ir._rope_torch import apply_rope, rope_cos_sin, rope_inv_freq
from lf_ir._table import ComponentCost, GraphCost, cost_table, graph_cost
from lf_ir.recipes import RECIPES, RecipeSpec, recipe_names, recipe_spec, register_recipe, unregister_recipe
from lf_ir.recipes.llama3 import Llama3Config, Llama3Model, llama3_config, next_token_loss
from lf_ir.recipes.qwen2_vl import Qwen2VLConfig, Qwen2VLModel, qwen2_vl_config
from lf_ir.recipes.vla import VLAConfig, VLAModel, vla_config
from lf_ir.recipes.vla_flow import VLAFlowConfig, VLAFlowModel, vla_flow_config
from lf_ir.recipes.wan_dit import WanDiTConfig, WanDiTModel, latent_grid, video_tokens, wan_dit_config
from lf_ir.recipes.wan_vae import WanVAE, WanVAEConfig, decode_flops, encode_flops, latent_shape, wan_vae_config

__version__ = "0.7.0"

__all__ = [
    "ActionTimeEmbed", "JointAttentionBlock", "VLAFlowConfig", "VLAFlowModel", "vla_flow_config", "AdaLNHead",
    "AdaLNModulation", "Attention", "CausalConv3D", "ChannelRMSNorm", "Component", "ComponentCost", "ComponentModule",
    "DiTAttention", "DiTBlock", "Edge", "Embedding", "FeedForward", "FlowMatchingLoss", "Graph", "GraphCost",
    "IRError", "LearnedPositional", "Linear", "Llama3Config", "Llama3Model", "LMHead", "LMHeadModule", "Mask",
    "MaskKind", "MLP", "MMAttention", "MMBlock", "MRoPE", "Node", "Norm", "PatchEmbed2D", "PatchEmbed3D",
    "PatchMerger", "Qwen2VLConfig", "Qwen2VLModel", "RECIPES", "RecipeSpec", "RoPE", "RoPE3D", "SeqSplit",
    "TextProjection", "TimestepEmbedding", "TPStyle", "TransformerBlock", "TransformerBlockModule", "VAEAttention",
    "VAEResample", "VAEResBlock", "VideoPatchEmbed", "VisionRoPE", "VLAConfig", "VLAModel", "WanDiTConfig",
    "WanDiTModel", "WanVAE", "WanVAEConfig", "apply_rope", "as_mask", "backward_flops", "cost_table", "decode_flops",
    "encode_flops", "flow", "forward_flops", "from_json", "graph_cost", "init_weights", "latent_grid", "latent_shape",
    "lf_modules", "llama3_config", "lower_node", "materialize", "mrope_cos_sin", "mrope_position_ids",
    "next_token_loss", "node_backward_flops", "node_forward_flops", "node_params", "param_count", "qwen2_vl_config",
    "recipe_names", "recipe_spec", "register_lowering", "register_recipe", "unregister_recipe", "rope_cos_sin",
    "rope_inv_freq",
    "summary_rows", "to_json", "validate", "video_tokens", "vision_rope_cos_sin", "vla_config", "wan_dit_config",
    "wan_vae_config", "RMSNormModule", "use_fused_ops", "fused_modules", "AttentionModule", "DiTAttentionModule",
    "PIPELINE_GLUE", "apply_rope3d", "rope3d_cos_sin",
]
