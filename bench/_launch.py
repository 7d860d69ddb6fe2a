"""How the multi-process bench scripts start: torchrun on GPUs, or two spawned gloo processes with ``--dry``.

Bench scripts are run as files (``python bench/x.py``), so this module is imported from their ``main`` (the
script's folder is ``sys.path[0]`` there), not at module level: tests load the scripts' functions by path.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["launch"]


def _dry_worker(rank: int, world: int, port: int, run: Callable[[Any], None], args: Any) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    run(args)


def launch(run: Callable[[Any], None], args: Any, *, dry_world: int = 2) -> None:
    """``run(args)`` in this torchrun process, or with ``args.dry`` in ``dry_world`` spawned CPU processes.

    Raises:
        SystemExit: not ``--dry`` and not under torchrun on a CUDA machine.
    """
    if not args.dry:
        if not torch.cuda.is_available() or "WORLD_SIZE" not in os.environ:
            raise SystemExit("launch with torchrun on GPUs (see the docstring), or use --dry on the CPU")
        run(args)
        return
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_dry_worker, args=(dry_world, port, run, args), nprocs=dry_world, start_method="spawn")
