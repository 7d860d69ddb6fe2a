"""Model recipes: each builds an IR graph (and the module that assembles its components)."""

from lf_ir.recipes import vla

RECIPES = {"vla": vla}
"""Recipe name -> module with ``build_graph`` and a config factory."""

__all__ = ["RECIPES", "vla"]
