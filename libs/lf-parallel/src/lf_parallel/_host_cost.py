"""Host (kernel-launch) time of a training step: launches counted from the IR, priced per launch.

Eager PyTorch runs on two clocks: the host walks the Python modules and the autograd graph and enqueues
one kernel per ATen op, the GPU runs them. The host runs ahead of the GPU (the launch queue is asynchronous),
so a step takes about ``max(GPU, host)``; a model whose blocks are narrow (Qwen2-VL's 1,280-wide ViT, 1,024
patches) makes the host the pace. Counts, not guesses:

- :func:`count_block_launches` lowers one IR block (``lf_ir.lower_node``) under ``FakeTensorMode`` (CPU tensors
  without storage or compute) and runs forward and backward at batch 1 and 8 tokens under bf16 autocast and the
  block's recompute mode (lf-memory's ``apply_recompute``), counting in a ``TorchDispatchMode`` the ATen ops that
  launch a kernel (views, ``empty*``, ``detach`` and other aliasing or allocation-only ops excluded). Launches do
  not depend on widths or tokens, so the count holds at any shape; it is cached per node and mode. On the GPU an op
  is about one launch (cuDNN attention a few, the CPU's flash attention one), so the count is checked against the
  profiler's launches of ``bench/results/step_anatomy*_h200.json`` (``tests/test_host_cost.py``: -2% to +8%).
  ``F.rms_norm`` is counted as CUDA's one fused kernel (the CPU decomposes it into ~6 ops). Why counted and not a
  table: the counts follow the model code (fused ops, casts, recompute wrappers) without re-fitting, and the fake
  run costs ~0.3 s per block type.
- Everything else (embeddings, patch embedding, heads, loss, the model's glue: rotary tables, casts) is
  :data:`OTHER_LAUNCHES_PER_NODE` per non-block node per micro-batch (forward + backward), fitted to the same files.

Forward launches are issued from Python (modules, autograd recording, autocast casts, for ``selective`` also
the selective-checkpoint dispatch mode), backward launches from the C++ autograd engine, so they get two
prices: :attr:`~lf_parallel._calibrate.Calibration.host_us_per_launch` and ``host_us_per_backward_launch``.
A recomputed forward is Python again and a selective block's forward and recompute go through the
checkpoint's Python dispatch mode (``host_us_per_sac_launch`` extra per op).

Combining host and GPU (:func:`overlap_step`): with no sync inside a micro-batch the host runs ahead across
forward and backward and micro-batches, ``max(gpu, host)`` per step. A sync inside each micro-batch (Qwen2-VL's
varlen attention boundaries: 5 per micro-batch, ``host_syncs`` in the step-anatomy files) drains the queue:
the forward (host-bound: Python) cannot run ahead of the previous backward (GPU-bound), so each pass costs
``max(gpu_pass, host_pass)`` and the step is their sum. The IR marks this with per-image components (their
varlen boundaries are computed on the host, :mod:`lf_parallel._mm_cost`).
"""

from __future__ import annotations

from functools import lru_cache
from unittest import mock

_SKIP = frozenset({"empty", "empty_like", "empty_strided", "detach", "lift_fresh", "alias", "set_", "resize_",
                   "_local_scalar_dense", "is_nonzero", "_to_copy_noop", "new_empty", "new_empty_strided",
                   "_has_compatible_shallow_copy_type", "sym_size", "sym_stride", "sym_numel"})
_TOKENS = 8


def _launches(func) -> bool:
    """Whether ATen op ``func`` launches a kernel: not a view (an aliasing, non-writing output) nor an allocation."""
    if func.namespace != "aten" or func._overloadpacket.__name__ in _SKIP:
        return False
    return not any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


def _cuda_rms_norm(x, normalized_shape, weight=None, eps=None):
    """Stands in for ``F.rms_norm`` while counting: CUDA runs it as one fused kernel forward and one backward
    (``_fused_rms_norm``), the CPU as a composite of ~6 ops; ``layer_norm`` has CUDA's op count."""
    import torch.nn.functional as F

    return F.layer_norm(x, normalized_shape, weight, None, 1e-6 if eps is None else eps)


def _counter():
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Count(TorchDispatchMode):
        """Counts the kernel-launching ATen ops run under it."""

        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += _launches(func)
            return func(*args, **(kwargs or {}))

    return _Count()


def _inputs(node, module, x):
    """The block's forward arguments besides ``x`` (batch 1, ``_TOKENS`` tokens), by block kind."""
    import torch

    from lf_kernels import MaskSpec

    kind = type(node).__name__
    att = getattr(node, "attention", None) or getattr(node, "self_attn", None)
    head_dim = getattr(att, "head_dim", 64)
    if kind == "MMBlock":
        dtype = torch.float32 if type(att.rope).__name__ == "VisionRoPE" else torch.bfloat16
        table = torch.randn(1, _TOKENS, head_dim, dtype=dtype)
        return (), {"cos_sin": (table, table)}
    if kind == "JointAttentionBlock":  # vla_flow: the prefix stream (x), the action suffix, the prefix padding
        suffix = torch.randn(1, node.suffix_len, node.expert_dim, requires_grad=True)
        return (suffix, torch.ones(1, _TOKENS, dtype=torch.bool)), {}
    if kind == "DiTBlock":
        table = torch.randn(1, _TOKENS, 1, head_dim)
        return (torch.randn(1, _TOKENS, node.dim), torch.randn(1, 6, node.dim), (table, table)), {}
    kind = getattr(module, "mask_kind", "causal")
    spec = getattr(getattr(node, "attention", None), "mask_spec", None)  # the IR mask's own parameters
    extra = {}  # masks with a parameter (the VLA's prefix_lm): the block's own, within the _TOKENS counted
    if kind == "prefix_lm":
        extra["prefix_len"] = min(getattr(spec, "prefix_len", None) or 1, _TOKENS)
    elif kind == "block_causal":
        extra["frame_tokens"] = min(getattr(spec, "frame_tokens", None) or 1, _TOKENS)
    return (MaskSpec(kind=kind, **extra),), {}


@lru_cache(maxsize=256)
def count_block_launches(node, recompute: str = "none") -> tuple[int, int, int]:
    """Kernel launches (counts) of one IR block's training pass on one micro-batch: ``(forward, recomputed forward,
    backward)``, counted on fake CPU tensors (``FakeTensorMode``: shapes only, so a 7B block costs ~0.3 s; see the
    module docstring). The recomputed forward is the backward pass's count minus the same block's backward count
    without recompute.

    Raises:
        TypeError: a node without a lowering (``lf_ir.lower_node``).
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from lf_ir import lower_node
    from lf_memory import apply_recompute

    def run(mode: str) -> tuple[int, int]:
        with FakeTensorMode(), mock.patch("torch.nn.functional.rms_norm", _cuda_rms_norm):  # no storage
            module = lower_node(node)
            wrapped = torch.nn.ModuleList([module])
            apply_recompute(wrapped, mode)
            x = torch.randn(1, _TOKENS, node.out_dim, requires_grad=True)
            args, kwargs = _inputs(node, module, x)
            fwd, bwd = _counter(), _counter()
            with torch.autocast("cpu", dtype=torch.bfloat16), fwd:
                out = wrapped[0](x, *args, **kwargs)
            outs = out if isinstance(out, tuple) else (out,)  # a joint block returns both streams
            loss = sum(o.float().sum() for o in outs if o is not None)
            with bwd:
                loss.backward()
        return fwd.n, bwd.n

    f, b = run("none")
    if recompute == "none":
        return f, 0, b
    f_rc, b_rc = run(recompute)
    return f_rc, max(b_rc - b, 0), b


def overlap_step(gpu_passes: list[float], host_passes: list[float], synced: bool) -> float:
    """Time of host and GPU work that overlap, seconds: ``max(sum gpu, sum host)`` when nothing syncs inside a
    micro-batch, else the sum over passes of ``max(gpu, host)`` (see the module docstring).

    Args:
        gpu_passes: GPU seconds of each pass (e.g. all micro-batches' forwards, their backwards).
        host_passes: host seconds of the same passes.
        synced: a host sync inside every micro-batch.
    """
    if synced:
        return sum(max(g, h) for g, h in zip(gpu_passes, host_passes, strict=True))
    return max(sum(gpu_passes), sum(host_passes))


OTHER_LAUNCHES_PER_NODE = 90.0
"""Launches per non-block node per micro-batch (forward + backward, with its share of the model's glue: rotary
tables, image scatter, loss, gradient accumulation, optimizer), all priced as forward (Python) launches. Fitted
to the profiler's counts minus the counted blocks' (launches per micro-batch: Llama-3 8 layers 1,253 - 1,080
over 3 nodes, Qwen2-VL 8 + 7 layers 2,157 - 1,669 over 5, Wan2.1 10 blocks 2,482 - 1,970 over 5; 90 is their
pooled least-squares ratio rounded down, -35% / -8% / -12% on the residuals, -3% / -1% / -1% on the totals)."""


def stage_launches(blocks: dict, others: float, mode: str, ratio: float) -> tuple[float, float, float, float]:
    """``(other forward, block forward, recomputed forward, backward)`` launches of one micro-batch on a stage:
    ``blocks`` (node -> count) counted by :func:`count_block_launches` under ``mode`` (a share ``ratio`` of them
    recomputed), and :data:`OTHER_LAUNCHES_PER_NODE` per non-block node (``others`` of them)."""
    counted = mode if mode in ("selective", "full") else ("full" if mode == "every_k" else "none")
    fwd = rc = bwd = 0.0
    for node, count in blocks.items():
        f, r, b = count_block_launches(node, counted)
        fwd, rc, bwd = fwd + count * f, rc + count * ratio * r, bwd + count * b
    return others * OTHER_LAUNCHES_PER_NODE, fwd, rc, bwd


def host_pass_s(launches: tuple[float, float, float, float], selective: bool, cal) -> tuple[float, float]:
    """Host seconds of one micro-batch's forward and backward (with its recomputed forward) pass: Python
    launches at ``cal.host_us_per_launch``, autograd-engine launches at ``cal.host_us_per_backward_launch``,
    plus ``cal.host_us_per_sac_launch`` per forward and recomputed op of a ``selective`` block."""
    other, fwd, rc, bwd = launches
    py = cal.host_us_per_launch + (cal.host_us_per_sac_launch if selective else 0.0)
    return ((other * cal.host_us_per_launch + fwd * py) * 1e-6,
            (rc * py + bwd * cal.host_us_per_backward_launch) * 1e-6)
