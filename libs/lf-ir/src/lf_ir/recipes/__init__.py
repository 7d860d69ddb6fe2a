"""Model recipes: each builds an IR graph (and the module that assembles its components)."""

from lf_ir.recipes import gemma, llama3, qwen2_vl, vla, vla_flow, wan_dit, wan_vae

RECIPES = {"vla": vla, "llama3": llama3, "qwen2_vl": qwen2_vl, "wan_dit": wan_dit, "wan_vae": wan_vae,
           "vla_flow": vla_flow, "gemma": gemma}
"""Recipe name -> module with ``build_graph`` and a config factory."""

__all__ = ["RECIPES", "gemma", "llama3", "qwen2_vl", "vla", "vla_flow", "wan_dit", "wan_vae"]
