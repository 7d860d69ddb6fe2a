"""Triton kernels of the fused ops; imported lazily by :mod:`lf_kernels.triton._dispatch`.

``INTERPRETED`` records whether the kernels were defined under Triton's
interpreter (``TRITON_INTERPRET=1`` at import), which decides whether they can
take CPU tensors.
"""

from triton import knobs

INTERPRETED: bool = bool(knobs.runtime.interpret)

