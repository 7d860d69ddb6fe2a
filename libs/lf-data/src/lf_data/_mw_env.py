"""A Meta-World task with camera rendering, shared by data generation and closed-loop evaluation.

Rendering uses ``mujoco.Renderer`` with shadows, reflections and multisample
anti-aliasing off: under osmesa (llvmpipe) a frame then costs ~3-7 ms instead
of ~20 ms (no MSAA) or ~100-250 ms (shadows). Before
mujoco is imported, ``MUJOCO_GL`` defaults to ``osmesa`` (software, works
headless); export ``MUJOCO_GL=egl`` before importing lf_data to use a GPU.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings

import numpy as np

from ._mw_instructions import instruction_for

__all__ = ["MetaWorldEnv", "import_sim"]

_SIM_HINT = "Meta-World support needs the 'sim' extra: pip install 'lf-data[sim]'"


def _free_renderer(renderer) -> None:
    """Close a ``mujoco.Renderer`` without corrupting other live renderers.

    ``Renderer.close`` (mujoco 3.3) destroys its GL context first and then frees
    its GPU objects in whatever context is current, deleting another renderer's
    textures (its next frames come out as noise). Free the objects with our own
    context current first.
    """
    gl, mjr = getattr(renderer, "_gl_context", None), getattr(renderer, "_mjr_context", None)
    if gl is not None and mjr is not None:
        gl.make_current()
        mjr.free()
        renderer._mjr_context = None
    renderer.close()


def _load_triton_before_osmesa() -> None:
    """Load Triton's LLVM before OSMesa's, when Triton is installed and rendering is software.

    libOSMesa (llvmpipe) and Triton's ``libtriton`` each carry their own LLVM. Loading
    ``libtriton`` after an OSMesa context exists crashes the process (segfault inside
    ``import triton``; seen with triton 3.9, Mesa's llvmpipe, torch 2.13), and torch imports
    triton lazily (``torch._dynamo``, ``torch.compile``, meta-device init), so a process that
    renders and then builds a model would crash. Loaded in the other order both work.
    """
    if os.environ.get("MUJOCO_GL") != "osmesa" or "triton" in sys.modules:
        return
    if importlib.util.find_spec("triton") is not None:
        import triton  # noqa: F401  (loaded for its side effect on the process's shared libraries)


def import_sim():
    """Import ``(metaworld, mujoco)`` lazily; ImportError naming the extra when absent."""
    os.environ.setdefault("MUJOCO_GL", "osmesa")
    _load_triton_before_osmesa()
    try:
        import metaworld
        import metaworld.env_dict
        import metaworld.policies
        import mujoco
    except ImportError as e:
        raise ImportError(f"{_SIM_HINT} ({e})") from e
    return metaworld, mujoco


class MetaWorldEnv:
    """One Meta-World v3 task, goal observable, rendered from a fixed camera.

    ``reset(seed)`` fully determines the episode: the goal and object positions
    are drawn from ``seed`` exactly as Meta-World's own goal-observable
    constructor does (``ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE[task](seed=seed)``),
    and MuJoCo's data (including solver warm starts) is reset first, so a reused
    env gives the same episode as a fresh one. (Meta-World's ``env.reset(seed=)``
    ignores its seed.)

    Images are upright: cameras whose up axis points below the horizon
    (Meta-World's ``corner*`` cameras) are rotated by 180 degrees, which is a roll
    of the camera and does not mirror the scene.

    Args:
        task: Meta-World v3 task name, e.g. ``"reach-v3"`` (a key of
            ``METAWORLD_INSTRUCTIONS``).
        image_size: square image side in pixels.
        camera: MuJoCo camera name (``corner``, ``corner2``, ``topview``, ...).
        max_steps: ``done`` becomes True after this many steps.

    Attributes:
        instruction: the English instruction of the task.
        action_dim: 4 (dx, dy, dz in [-1, 1] scaled by Meta-World, gripper effort).
        state_dim: 39 (hand xyz, gripper, two object poses, the same 18 values of
            the previous step, goal xyz).

    Raises:
        ValueError: unknown task or camera, bad sizes.
        ImportError: metaworld/mujoco not installed (``pip install 'lf-data[sim]'``).

    Example:
        >>> env = MetaWorldEnv("reach-v3", image_size=64)  # doctest: +SKIP
        >>> obs = env.reset(seed=0)
        >>> obs, success, done = env.step(env.expert_action())
    """

    action_dim = 4
    state_dim = 39

    def __init__(self, task: str, *, image_size: int = 64, camera: str = "corner", max_steps: int = 150) -> None:
        self.instruction = instruction_for(task)
        if int(image_size) < 8:
            raise ValueError(f"image_size must be >= 8, got {image_size}")
        if int(max_steps) < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self._metaworld, self._mujoco = import_sim()
        self.task, self.image_size, self.camera, self.max_steps = task, int(image_size), camera, int(max_steps)
        self._policy = self._metaworld.policies.ENV_POLICY_MAP[task]()
        self._env = None
        self._renderer = None
        self._build()
        self._obs: np.ndarray | None = None
        self.steps = 0

    def _build(self) -> None:
        mj = self._mujoco
        self.close()
        cls = self._metaworld.env_dict.ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE[f"{self.task}-goal-observable"]
        self._env = cls(seed=0)
        self._env.max_path_length = 1 << 30  # we count steps ourselves
        model = self._env.model
        self._cam = mj.mj_name2id(model, mj.mjtObj.mjOBJ_CAMERA, self.camera)
        if self._cam < 0:
            names = [model.camera(i).name for i in range(model.ncam)]
            raise ValueError(f"unknown camera {self.camera!r}; cameras: {names}")
        model.vis.global_.offwidth = max(model.vis.global_.offwidth, self.image_size)
        model.vis.global_.offheight = max(model.vis.global_.offheight, self.image_size)
        model.vis.quality.offsamples = 0  # no multisampling: ~2.7x faster under osmesa
        try:
            self._renderer = mj.Renderer(model, self.image_size, self.image_size)
        except Exception as e:  # mujoco raises FatalError without a GL backend
            raise RuntimeError(
                f"cannot create a MuJoCo renderer with MUJOCO_GL={os.environ.get('MUJOCO_GL')!r} "
                f"({e}). Set MUJOCO_GL=osmesa (software) or egl (GPU) before mujoco is first imported."
            ) from e
        self._rotate: bool | None = None

    def reset(self, seed: int) -> dict:
        """Start the episode determined by ``seed`` (0 <= seed < 2**32).

        Returns:
            ``{"image": uint8 (H, W, 3), "state": float32 (39,)}``.
        """
        seed = int(seed)
        if not 0 <= seed < 2**32:
            raise ValueError(f"seed must be in [0, 2**32), got {seed}")
        if getattr(self._env, "_did_see_sim_exception", False):
            self._build()  # Meta-World never clears this flag: start from a fresh env
        env = self._env
        self._mujoco.mj_resetData(env.model, env.data)
        # Same draw as Meta-World's goal-observable constructor: global numpy RNG seeded,
        # one reset with the random vector unfrozen, then frozen; restored afterwards.
        rng_state = np.random.get_state()
        np.random.seed(seed)
        try:
            env._freeze_rand_vec = False
            env.reset()
            env._freeze_rand_vec = True
            env.seed(seed)
        finally:
            np.random.set_state(rng_state)
        self._obs, _ = env.reset()
        self.steps = 0
        return self._observation()

    def step(self, action: np.ndarray, *, render: bool = True) -> tuple[dict, bool, bool]:
        """Apply ``action`` (4,), clipped to [-1, 1]; returns ``(obs, success, done)``.

        ``done`` is True on success or once ``max_steps`` steps were taken.
        Stepping on after ``done`` is allowed (data generation records a few
        frames after success). With ``render=False`` the observation's
        ``"image"`` is None and the step skips the ~7 ms camera render (an
        action chunk executed open-loop needs an image only at its end).
        """
        if self._obs is None:
            raise RuntimeError("MetaWorldEnv.step called before reset(seed)")
        a = np.asarray(action, dtype=np.float32)
        if a.shape != (4,):
            raise ValueError(f"action must have shape (4,), got {a.shape}")
        self._obs, _, _, _, info = self._env.step(np.clip(a, -1.0, 1.0))
        self.steps += 1
        success = bool(info["success"])
        return self._observation(render), success, success or self.steps >= self.max_steps

    def expert_action(self) -> np.ndarray:
        """Meta-World's scripted expert action for the current observation, clipped, float32 (4,)."""
        if self._obs is None:
            raise RuntimeError("MetaWorldEnv.expert_action called before reset(seed)")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Constant(s) may be too high": we clip
            a = self._policy.get_action(self._obs)
        return np.clip(np.asarray(a, dtype=np.float32), -1.0, 1.0)

    def render(self) -> np.ndarray:
        """uint8 ``(H, W, 3)`` upright camera image of the current state."""
        mj, r = self._mujoco, self._renderer
        r.update_scene(self._env.data, camera=self._cam)
        r.scene.flags[mj.mjtRndFlag.mjRND_SHADOW] = 0
        r.scene.flags[mj.mjtRndFlag.mjRND_REFLECTION] = 0
        img = r.render()
        if self._rotate is None:  # camera up axis (column 1 of cam_xmat) below the horizon
            self._rotate = bool(self._env.data.cam_xmat[self._cam].reshape(3, 3)[2, 1] < 0)
        return np.ascontiguousarray(img[::-1, ::-1]) if self._rotate else img.copy()

    def _observation(self, render: bool = True) -> dict:
        return {"image": self.render() if render else None, "state": self._obs.astype(np.float32)}

    def close(self) -> None:
        """Free the renderer and the simulator."""
        if self._renderer is not None:
            _free_renderer(self._renderer)
            self._env.close()
            self._renderer = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: modules may be gone
            pass

    def __enter__(self) -> MetaWorldEnv:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
