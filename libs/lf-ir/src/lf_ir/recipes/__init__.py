"""Model recipes: each builds an IR graph and the module that assembles its components, and registers its
:class:`RecipeSpec` (config, sizes, graph, model, converters, parallelisms) from its own module.

Importing this package imports every recipe module below, so :data:`RECIPES` is full.
"""

from lf_ir.recipes import gemma, llama3, qwen2_vl, vla, vla_flow, wan_dit, wan_vae  # each registers its RecipeSpec
from lf_ir.recipes._spec import (
    RECIPES,
    RecipeSpec,
    lazy_function,
    recipe_names,
    recipe_spec,
    register_recipe,
    unregister_recipe,
)

__all__ = ["RECIPES", "RecipeSpec", "gemma", "lazy_function", "llama3", "qwen2_vl", "recipe_names", "recipe_spec",
           "register_recipe", "unregister_recipe", "vla", "vla_flow", "wan_dit", "wan_vae"]
