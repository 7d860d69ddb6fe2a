"""lf-ir: the unified IR of LoongForge.

A model is a :class:`Graph` of components per modality, each an ordered list of
typed nodes with shapes, parameter counts and FLOPs. Recipes build graphs;
:func:`lower_node` / :class:`ComponentModule` turn them into torch modules.
"""

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
                          TransformerBlockModule,
                          init_weights,
                          lf_modules,
                          lower_node,
                          materialize,
)
from lf_ir._nodes import (
                          MLP,
                          Attention,
                          Embedding,
                          IRError,
                          LearnedPositional,
                          Linear,
                          Node,
                          Norm,
                          PatchEmbed2D,
                          TransformerBlock,
)
from lf_ir.recipes import RECIPES
from lf_ir.recipes.vla import VLAConfig, VLAModel, vla_config

__version__ = "0.1.0"

__all__ = [
    "MLP", "RECIPES", "Attention", "Component", "ComponentModule", "Edge", "Embedding", "Graph",
    "IRError", "LearnedPositional", "Linear", "Node", "Norm", "PatchEmbed2D", "TransformerBlock",
    "TransformerBlockModule", "VLAConfig", "VLAModel", "forward_flops", "from_json",
    "init_weights", "lf_modules", "lower_node", "materialize", "node_backward_flops",
    "node_forward_flops", "node_params", "param_count", "summary_rows", "to_json", "validate",
    "vla_config",
]
