"""Meta-World v3 tasks: instructions, a rendering env wrapper, and demonstration generation.

metaworld and mujoco are imported only when an env is built (``pip install
'lf-data[sim]'``); ``MUJOCO_GL`` defaults to ``osmesa`` at that moment.
"""

from ._mw_env import MetaWorldEnv
from ._mw_generate import METAWORLD_FEATURES_NAMES, generate_metaworld, metaworld_episode_seed
from ._mw_instructions import METAWORLD_INSTRUCTIONS

__all__ = ["METAWORLD_FEATURES_NAMES", "METAWORLD_INSTRUCTIONS", "MetaWorldEnv", "generate_metaworld",
           "metaworld_episode_seed"]
