"""lf-ir: the unified IR of LoongForge.

A model is a :class:`Graph` of components per modality, each an ordered list of
typed nodes with shapes, parameter counts and FLOPs. Recipes build graphs;
:func:`lower_node` / :class:`ComponentModule` turn them into torch modules.
"""

from lf_ir._base import SeqSplit, TPStyle
from lf_ir._cost import node_backward_flops, node_forward_flops, node_params
from lf_ir._graph import (
                          Component,
                          Edge,
                          Graph,
                          forward_flops,
                          from_json,
                          param_count,
                          summary_rows,
                          to_json,
                          validate,
)
from lf_ir._lower import (
                          ComponentModule,
                          LMHeadModule,
                          TransformerBlockModule,
                          init_weights,
                          lf_modules,
                          lower_node,
                          materialize,
                          register_lowering,
)
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
from lf_ir._rope_torch import apply_rope, rope_cos_sin, rope_inv_freq
from lf_ir.recipes import RECIPES
from lf_ir.recipes.llama3 import Llama3Config, Llama3Model, llama3_config, next_token_loss
from lf_ir.recipes.vla import VLAConfig, VLAModel, vla_config

__version__ = "0.2.0"

__all__ = [
    "Attention", "Component", "ComponentModule", "Edge", "Embedding", "Graph", "IRError", "LMHead",
    "LMHeadModule", "LearnedPositional", "Linear", "Llama3Config", "Llama3Model", "MLP", "Node", "Norm",
    "PatchEmbed2D", "RECIPES", "RoPE", "SeqSplit", "TPStyle", "TransformerBlock", "TransformerBlockModule",
    "VLAConfig", "VLAModel", "apply_rope", "forward_flops", "from_json", "init_weights", "lf_modules",
    "llama3_config", "lower_node", "materialize", "next_token_loss", "node_backward_flops",
    "node_forward_flops", "node_params", "param_count", "register_lowering", "rope_cos_sin", "rope_inv_freq",
    "summary_rows", "to_json", "validate", "vla_config",
]
