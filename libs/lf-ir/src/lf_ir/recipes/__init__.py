"""Model recipes: each builds an IR graph (and the module that assembles its components)."""

from lf_ir.recipes import llama3, vla

RECIPES = {"vla": vla, "llama3": llama3}
"""Recipe name -> module with ``build_graph`` and a config factory."""

__all__ = ["RECIPES", "llama3", "vla"]
