"""Triton kernels of the fused ops; imported lazily by :mod:`lf_kernels.triton._dispatch`.

``INTERPRETED`` records whether the kernels were defined under Triton's
interpreter (``TRITON_INTERPRET=1`` at import), which decides whether they can
take CPU tensors.
"""

from triton import knobs

INTERPRETED: bool = bool(knobs.runtime.interpret)


def num_programs_hint(device, default: int = 4) -> int:
    """Streaming multiprocessors on a CUDA device, ``default`` elsewhere (interpreter)."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return default


def row_block(n_cols: int) -> tuple[int, int]:
    """``(BLOCK, num_warps)`` for a kernel that holds one row of ``n_cols`` in registers."""
    import triton

    block = triton.next_power_of_2(n_cols)
    warps = 32 if block >= 32768 else 16 if block >= 8192 else 8 if block >= 2048 else 4
    return block, warps
