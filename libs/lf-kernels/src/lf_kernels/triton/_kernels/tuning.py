"""Launch shapes of the row kernels: ``@triton.autotune`` configs on a GPU, one small fixed config in the interpreter.

Every row kernel works on ``(BLOCK_R, BLOCK_D)`` tiles: ``BLOCK_D`` (the
feature block, a power of two fixed by the host from the hidden size) and
``BLOCK_R`` rows at a time, ``BLOCK_R`` and ``num_warps`` tuned per hidden size.
Candidates keep each thread's share of one tile between ``min_elems`` and
``max_elems`` float32 values (enough bytes in flight per thread, no register
spills). Under ``TRITON_INTERPRET=1`` the list is a single config, so the
autotuner never benchmarks and the CPU suite stays fast.

Persistent backward kernels (those that reduce over rows) run a grid fixed by
:func:`persistent_split` before the launch, so the size of their float32
partial-sum buffer does not depend on the config the tuner picks. Their loops
keep the next tiles' loads in flight while a tile is computed (``STAGES``, see
:data:`BWD_STAGES`): one program per SM alone otherwise waits a full memory
latency per tile with only one tile's bytes requested.
"""

from __future__ import annotations

import functools

import triton

from . import INTERPRETED

INTERPRETER_ROWS = 4  # BLOCK_R under the interpreter: several rows per tile, so the CPU suite covers the 2-D paths
_WARPS = (4, 8, 16)


def row_configs(block_d: int, *, rows=(1, 2, 4, 8, 16), warps=_WARPS, min_elems: int = 8, max_elems: int = 32,
                regs_per_elem: float = 0.0, interp_rows: int | None = None, name: str = "BLOCK_R"
                ) -> list[triton.Config]:
    """Autotune candidates ``BLOCK_R`` (meta-parameter ``name``) x ``num_warps`` for ``BLOCK_R x block_d`` tiles.

    Returns one config (``BLOCK_R = interp_rows``, default ``INTERPRETER_ROWS``) under the interpreter; else all
    pairs whose elements per thread ``BLOCK_R * block_d / (32 * num_warps)`` lie in ``[min_elems, max_elems]``
    (at least the smallest tile, if none does), and, with ``regs_per_elem`` (a kernel's registers per tile
    element, measured with ptxas for sm_90), whose register estimate fits ``65536 / threads`` (max 255) unspilled.
    """
    if INTERPRETED:
        return [triton.Config({name: INTERPRETER_ROWS if interp_rows is None else interp_rows}, num_warps=4)]
    out = [triton.Config({name: r}, num_warps=w) for r in rows for w in warps
           if min_elems <= r * block_d / (32 * w) <= max_elems
           and r * block_d / (32 * w) * regs_per_elem <= min(255, 65536 // (32 * w))]
    return out or [triton.Config({name: rows[0]}, num_warps=warps[-1])]


BWD_STAGES: tuple[int, ...] = (3, 1)
"""Loop pipelining the persistent backward kernels are tuned over (meta-parameter ``STAGES``): ``0`` loads the
next tile into registers before computing the current one; ``1`` no pipelining (each tile's loads wait out a
full memory latency: the kernels before issue 7's rewrite, kept as a candidate so tuning never loses to them);
``k >= 2`` Triton's loop pipeliner (``tl.range(num_stages=k)``: ``cp.async`` copies ``k - 1`` tiles ahead into
shared memory; checked with sm_90 builds that the tile loads become ``cp.async`` of 16 bytes). Under the
interpreter only the first entry runs. The default keeps ``3`` and ``1``: with all four modes as candidates the
tuner picked ``3`` at all six shapes measured on the H200 (``bench/results/row_bwd_sweep_h200.json``: 0.87-0.95
of 4.2 TB/s against 0.68-0.82 for ``1``), and two modes halve the first call's compile time. A module setting so
that benchmarks and tests can pin one mode (rebuild the kernels' ``functools.cache`` after changing it)."""

BWD_PROGRAMS_PER_SM: int | None = None
"""If set, overrides :func:`programs_per_sm` (benchmark sweeps); ``None`` keeps the measured rule."""


def bwd_configs(configs: list[triton.Config], stages: tuple[int, ...] | None = None) -> list[triton.Config]:
    """``configs`` x ``STAGES`` in ``stages`` (default :data:`BWD_STAGES`; only the first under the interpreter)."""
    stages = BWD_STAGES if stages is None else stages
    if INTERPRETED:
        stages = stages[:1]
    return [triton.Config({**c.kwargs, "STAGES": s}, num_warps=c.num_warps) for c in configs for s in stages]


def autotuned(kernel, configs: list[triton.Config], key: list[str]):
    """``triton.autotune(configs, key)(kernel)``; one jitted kernel may sit under several tuners (one per bucket)."""
    return triton.autotune(configs=configs, key=key)(kernel)


@functools.cache
def _sm_count(index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


INTERPRETER_SMS = 1  # what the interpreter pretends to have: a few programs (one per SM share), fast CPU tests


def sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA device (cached per device), ``INTERPRETER_SMS`` elsewhere."""
    if device.type != "cuda":
        return INTERPRETER_SMS
    return _sm_count(device.index if device.index is not None else 0)


def programs_per_sm(block_d: int, partials: int = 1) -> int:
    """Persistent programs per SM for a reduction over rows of ``block_d`` features.

    About ``4096 / block_d`` (1 at hidden 4096, 2 at 1536-2048, at most 4) divided by the number of
    float32 partial buffers (at least 1). Measured on an H200 (bf16, GPU kernel time of the backward
    incl. the partial-sum reduction, sweep of 0.5x-8x the earlier count): 0.5x the earlier
    ``8192 / block_d`` was fastest for every reducing kernel at both bench shapes (rms_norm 8192 x 4096:
    73 us at 0.5x, 76 at 1x, 97 at 8x; 32760 x 1536: 110 / 119 / 124 us; modulate 62 / 67 / 78 us), so
    fewer, longer-running programs and a smaller partial-sum buffer win. That sweep predates the
    pipelined loops (``BWD_STAGES``) and kept the tuner's first pick across counts;
    ``bench/kernels/row_bwd_sweep.py`` re-measures 1 / 2 / 4 per SM with them. :data:`BWD_PROGRAMS_PER_SM`
    overrides the rule.
    """
    if BWD_PROGRAMS_PER_SM is not None:
        return BWD_PROGRAMS_PER_SM
    return max(1, min(4, 4096 // max(block_d, 1)) // partials)


def persistent_split(n_rows: int, programs: int) -> tuple[int, int]:
    """``(programs, rows_per_program)``: contiguous row chunks for at most ``programs`` programs.

    Every program but the last gets exactly ``rows_per_program`` rows and none is empty; with more
    programs than rows, each gets one row.
    """
    if n_rows <= 0:
        return 0, 1
    rows_per_program = -(-n_rows // max(1, programs))
    return -(-n_rows // rows_per_program), rows_per_program
