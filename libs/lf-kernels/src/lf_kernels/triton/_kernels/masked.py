"""Loads and stores that drop their masks when a kernel's blocks divide the tensor (``EVEN``, a compile-time flag).

Without a mask Triton issues plain vector accesses; with one it keeps the predicate. Shared by the element-wise
kernels whose hosts set ``EVEN`` with a ``triton.heuristics`` after the tuner's pick.
"""

import triton
import triton.language as tl


@triton.jit
def load_f32(ptrs, mask, EVEN: tl.constexpr):
    """``ptrs``' values in float32; masked lanes read 0 unless ``EVEN``."""
    if EVEN:
        return tl.load(ptrs).to(tl.float32)
    return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def store(ptrs, value, mask, EVEN: tl.constexpr):
    """``value`` cast to the pointee dtype, written where ``mask`` holds (everywhere when ``EVEN``)."""
    if EVEN:
        tl.store(ptrs, value.to(ptrs.dtype.element_ty))
    else:
        tl.store(ptrs, value.to(ptrs.dtype.element_ty), mask=mask)
