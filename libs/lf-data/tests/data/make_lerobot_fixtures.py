"""Write tiny LeRobot datasets with the ``lerobot`` package itself, and a JSON of every value given to it.

The committed fixtures ``lerobot_v30/`` (codebase v3.0) and ``lerobot_v21/`` (codebase v2.1) are what
lerobot's own ``LeRobotDataset.create(...)`` / ``add_frame`` / ``save_episode`` (/ ``finalize``) wrote; next
to each dataset folder, ``written.json`` holds the values added (states, actions, tasks, frame indices,
and the uint8 frames of both cameras as nested lists). ``test_lerobot_package_fixtures.py`` reads them with
lf-data and does not need lerobot.

Versions (``lerobot`` pins ``torch<2.11`` and ``torchvision``, so each lives in its own venv):

- codebase v3.0: ``lerobot==0.4.4`` (``CODEBASE_VERSION = "v3.0"``), ``datasets`` 4.x, ``av`` 15.1.
- codebase v2.1: ``lerobot==0.3.3`` (``CODEBASE_VERSION = "v2.1"``; 0.3.x is the last release writing
  v2.1), ``datasets`` 3.6.

Commands (Python 3.11; torch 2.13 CPU from the local wheel; ``--no-deps`` for lerobot, which would pull CUDA
torch, robot drivers, wandb, rerun...; then only what its dataset code imports)::

    python3 -m venv /tmp/lrvenv30
    /tmp/lrvenv30/bin/pip install /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
    /tmp/lrvenv30/bin/pip install --no-deps lerobot==0.4.4 torchvision==0.28.0
    /tmp/lrvenv30/bin/pip install "datasets>=4,<5" "huggingface_hub>=0.34.2,<0.36" "accelerate>=1.10,<2" \
        pandas pyarrow "av>=15,<16" jsonlines draccus==0.10.0 deepdiff termcolor packaging einops pillow
    /tmp/lrvenv30/bin/python libs/lf-data/tests/data/make_lerobot_fixtures.py libs/lf-data/tests/data/lerobot_v30

    python3 -m venv /tmp/lrvenv21
    /tmp/lrvenv21/bin/pip install /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
    /tmp/lrvenv21/bin/pip install --no-deps lerobot==0.3.3 torchvision==0.28.0
    /tmp/lrvenv21/bin/pip install "datasets>=2.19,<=3.6.0" "huggingface_hub>=0.34.2,<0.36" \
        "accelerate>=1.10,<2" pandas pyarrow "av>=14.2,<16" jsonlines draccus==0.10.0 "deepdiff<9" termcolor \
        packaging einops pillow
    /tmp/lrvenv21/bin/python libs/lf-data/tests/data/make_lerobot_fixtures.py libs/lf-data/tests/data/lerobot_v21

PyPI's ``torchvision`` wheels link CUDA torch, so their compiled ops do not load next to a CPU torch and
``import torchvision`` then fails registering fake kernels for ``torchvision::nms`` / ``qnms``;
:func:`_torchvision_without_ops` declares those two op schemas first. lerobot's dataset writer uses no
torchvision op (it imports ``torchvision.transforms`` for reading only).

Data: 3 episodes of 9, 11 and 8 frames at 10 fps; ``observation.state`` float32 (4,), ``action`` float32 (3,),
a task string per episode (two episodes share one), camera ``observation.images.front`` stored as video
(lerobot's default: AV1 ``libsvtav1``, yuv420p, crf 30, lossy) and ``observation.images.wrist`` stored as
PNG images in the parquet (lossless). Frames are smooth gradients with a 16x16 square whose position
encodes the frame index and whose shade encodes the episode, so a lossy codec keeps them recognisable and
a frame read from the wrong index or episode is far from the one written. The frames are not stored in the
JSON (size): tests rebuild them with :func:`frame_image`, and ``frame_sha256`` (first 16 hex digits per
frame and camera) proves the rebuilt frames are the ones given to lerobot.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np

FPS = 10
LENGTHS = (9, 11, 8)
TASKS = ("pick up the red cube", "open the drawer", "pick up the red cube")
H, W = 48, 64
SEED = 1234


def frame_image(episode: int, t: int, camera: int) -> np.ndarray:
    """uint8 ``(H, W, 3)`` test frame: a gradient background and a 16x16 square.

    The square's cell in a 3 x 4 grid is ``t`` (``t < 12``) and its shade is the episode (white, black,
    yellow), so frames differ from each other in luma over a region large enough to survive AV1 at crf 30.
    """
    y, x = np.mgrid[0:H, 0:W]
    img = np.stack([x * 200 // (W - 1) + 20, y * 200 // (H - 1) + 20, np.full_like(x, 90 + 60 * camera)], -1)
    img = img.astype(np.uint8)
    r, c = (t // 4) * 16, (t % 4) * 16
    img[r:r + 16, c:c + 16] = np.array([[235, 235, 235], [15, 15, 15], [230, 200, 40]][episode % 3], np.uint8)
    return img


def _torchvision_without_ops() -> None:
    import torch

    for op in ("nms", "qnms"):
        torch.library.define(f"torchvision::{op}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="folder to (re)create: <out>/dataset and <out>/written.json")
    args = ap.parse_args(argv)
    _torchvision_without_ops()
    import lerobot
    from lerobot.datasets.lerobot_dataset import CODEBASE_VERSION, LeRobotDataset

    features = {
        "observation.state": {"dtype": "float32", "shape": (4,), "names": ["x", "y", "z", "gripper"]},
        "action": {"dtype": "float32", "shape": (3,), "names": ["dx", "dy", "dz"]},
        "observation.images.front": {"dtype": "video", "shape": (H, W, 3), "names": ["height", "width", "channels"]},
        "observation.images.wrist": {"dtype": "image", "shape": (H, W, 3), "names": ["height", "width", "channels"]},
    }
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    root = args.out / "dataset"
    ds = LeRobotDataset.create(repo_id="lf/fixture", fps=FPS, features=features, root=root, robot_type="toy",
                               use_videos=True)
    rng = np.random.default_rng(SEED)
    episodes = []
    new_api = CODEBASE_VERSION == "v3.0"  # 0.4.x: the task goes in the frame; 0.3.x: add_frame(frame, task)
    for e, (n, task) in enumerate(zip(LENGTHS, TASKS, strict=True)):
        state = rng.normal(size=(n, 4)).astype(np.float32)
        action = rng.uniform(-1, 1, size=(n, 3)).astype(np.float32)
        for t in range(n):
            frame = {"observation.state": state[t], "action": action[t],
                     "observation.images.front": frame_image(e, t, 0),
                     "observation.images.wrist": frame_image(e, t, 1)}
            if new_api:
                ds.add_frame({**frame, "task": task})
            else:
                ds.add_frame(frame, task=task)
        ds.save_episode()
        episodes.append({"episode_index": e, "task": task, "length": n, "frame_index": list(range(n)),
                         "observation.state": state.tolist(), "action": action.tolist()})
    if hasattr(ds, "finalize"):
        ds.finalize()
    shutil.rmtree(root / "images", ignore_errors=True)  # lerobot's temporary PNGs, if any are left
    written = {"lerobot_version": lerobot.__version__, "codebase_version": CODEBASE_VERSION, "fps": FPS,
               "height": H, "width": W, "python": sys.version.split()[0],
               "frames": "frame_image(episode, t, camera) in make_lerobot_fixtures.py; camera 0 = front, 1 = wrist",
               "frame_sha256": [[[hashlib.sha256(frame_image(e, t, c).tobytes()).hexdigest()[:16] for c in (0, 1)]
                                 for t in range(n)] for e, n in enumerate(LENGTHS)],
               "episodes": episodes}
    (args.out / "written.json").write_text(json.dumps(written))
    print(f"wrote {root} with lerobot {lerobot.__version__} (codebase {CODEBASE_VERSION})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
