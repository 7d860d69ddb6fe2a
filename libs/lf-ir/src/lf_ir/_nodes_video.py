"""Video diffusion-transformer input/output nodes: 3D patch embedding, timestep and text embeddings,
adaLN modulation tables, the modulated output head, and the 3D RoPE settings.

Follows Wan2.1 (Wan Team, "Wan: Open and Advanced Large-Scale Video Generative Models",
arXiv 2503.20314) as implemented by diffusers' ``WanTransformer3DModel``; the adaLN
conditioning is DiT's (Peebles & Xie, arXiv 2212.09748).

``seq`` for these nodes is the number of latent video tokens per sample:
``(latent_frames / p_t) * (latent_height / p_h) * (latent_width / p_w)``. Nodes that
run once per sample (the timestep embedding) ignore it; the text projection runs on
the text component, whose ``seq`` is the text tokens per sample.

Torch-free: lowering rules live in ``_lower_video.py``.
"""

from __future__ import annotations

import math
from typing import ClassVar

import msgspec

from lf_ir import _bytes
from lf_ir._base import SeqSplit, _Node


class RoPE3D(msgspec.Struct, frozen=True, kw_only=True):
    """3D rotary embedding settings (Wan2.1 / diffusers ``WanRotaryPosEmbed``).

    Each head's features are split into (t, h, w) groups of sizes
    ``(head_dim - 2 * h_dim, h_dim, h_dim)`` with ``h_dim = 2 * (head_dim // 6)``;
    each group is rotated by its token's latent-grid coordinate along that axis
    (Su et al., RoFormer, arXiv 2104.09864), pairing features ``(2i, 2i + 1)``
    (interleaved, not "rotate half"), with ``inv_freq[i] = theta ** (-2i / group)``.

    Example:
        >>> RoPE3D().split(128)
        (44, 42, 42)
    """

    theta: float = 10000.0
    """Base of the geometric frequency progression."""
    max_seq_len: int = 1024
    """Largest position per axis (diffusers ``rope_max_seq_len``); grids beyond it are errors."""

    def split(self, head_dim: int) -> tuple[int, int, int]:
        """Features per axis (t, h, w) of a head of ``head_dim`` features."""
        hw = 2 * (head_dim // 6)
        return head_dim - 2 * hw, hw, hw

    def problem(self, head_dim: int) -> str | None:
        """Why these settings cannot rotate heads of ``head_dim`` features (None if they can)."""
        if head_dim % 2 or head_dim < 6:
            return f"head_dim must be even and at least 6 (3 axes of rotated pairs), got {head_dim}"
        if not self.theta > 0 or not math.isfinite(self.theta):
            return f"theta must be a positive finite number, got {self.theta!r}"
        if not isinstance(self.max_seq_len, int) or self.max_seq_len <= 0:
            return f"max_seq_len must be a positive integer, got {self.max_seq_len!r}"
        return None


class VideoPatchEmbed(_Node, frozen=True, kw_only=True, tag="video_patch_embed"):
    """Non-overlapping 3D patches: latents (batch, channels, frames, H, W) -> (batch, tokens, dim).

    A Conv3d with kernel = stride = ``patch``; tokens in (frame, row, column) order.
    ``seq_split`` is ``"local"``: each token depends on its own patch only. The input
    is data (latents), so the backward computes the weight gradient only (1x forward).
    """

    in_channels: int
    """Latent channels (16 for the Wan VAE)."""
    dim: int
    """Token width."""
    patch: tuple[int, int, int] = (1, 2, 2)
    """Patch size (frames, rows, columns) in latent pixels."""

    def __post_init__(self) -> None:
        self._positive(in_channels=self.in_channels, dim=self.dim)
        if len(self.patch) != 3:
            self._fail(f"patch must have 3 entries (t, h, w), got {self.patch!r}")
        self._positive(**{f"patch[{i}]": p for i, p in enumerate(self.patch)})

    @property
    def in_dim(self) -> int | None:
        return None

    @property
    def out_dim(self) -> int:
        return self.dim

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"proj.weight": (self.dim, self.in_channels, *self.patch), "proj.bias": (self.dim,)}

    def forward_flops(self, batch: int, seq: int) -> int:
        return 2 * batch * seq * self.in_channels * math.prod(self.patch) * self.dim

    def backward_flops(self, batch: int, seq: int) -> int:
        return self.forward_flops(batch, seq)

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Read the latents and the weights, write the conv output, copy it to token order (read, write)."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        latents = batch * seq * self.in_channels * math.prod(self.patch)
        return (latents + 3 * batch * seq * self.dim) * dtype_bytes + _bytes.params_bytes(self, dtype_bytes)

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """The latents (batch, channels, frames, H, W) = seq * channels * patch volume per sample."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return batch * seq * self.in_channels * math.prod(self.patch) * dtype_bytes


class TimestepEmbedding(_Node, frozen=True, kw_only=True, tag="timestep_embedding"):
    """Diffusion time t (batch,) -> temb (batch, dim) and the shared modulation (batch, chunks, dim).

    ``temb = linear_2(silu(linear_1(sinusoid(t))))`` with the cos-first sinusoid of
    ``freq_dim`` features (DDPM / diffusers ``Timesteps(flip_sin_to_cos=True,
    downscale_freq_shift=0)``), then ``time_proj(silu(temb))`` viewed as ``chunks``
    modulation vectors shared by every block. Runs once per sample: FLOPs ignore
    ``seq``; the sinusoid is data, so ``linear_1``'s backward is its weight gradient only.
    """

    freq_dim: int
    """Sinusoid features (even)."""
    dim: int
    """Model width."""
    chunks: int = 6
    """Modulation vectors per block (shift, scale, gate for attention and for the MLP)."""

    def __post_init__(self) -> None:
        self._positive(freq_dim=self.freq_dim, dim=self.dim, chunks=self.chunks)
        if self.freq_dim % 2:
            self._fail(f"freq_dim must be even, got {self.freq_dim}")

    @property
    def in_dim(self) -> int | None:
        return None

    @property
    def out_dim(self) -> int:
        return self.dim

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        d, p = self.dim, self.chunks * self.dim
        return {"linear_1.weight": (d, self.freq_dim), "linear_1.bias": (d,), "linear_2.weight": (d, d),
                "linear_2.bias": (d,), "time_proj.weight": (p, d), "time_proj.bias": (p,)}

    def forward_flops(self, batch: int, seq: int) -> int:
        return 2 * batch * self.dim * (self.freq_dim + self.dim + self.chunks * self.dim)

    def backward_flops(self, batch: int, seq: int) -> int:
        return 2 * self.forward_flops(batch, seq) - 2 * batch * self.freq_dim * self.dim

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Per sample (``seq`` unused): the float32 sinusoid and its cast, three linears, two SiLUs, weights."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        f, d, c = self.freq_dim, self.dim, self.chunks
        elems = batch * (f + d) + batch * 2 * d + batch * 2 * d + batch * 2 * d + batch * (d + c * d)
        return batch * f * (4 + 4) + elems * dtype_bytes + _bytes.params_bytes(self, dtype_bytes)

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Per sample (``seq`` unused): the sinusoid in the weights' dtype (freq_dim), the two SiLU inputs and
        the linear_2 / time_proj inputs (4 * dim)."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return batch * (self.freq_dim + 4 * self.dim) * dtype_bytes


class TextProjection(_Node, frozen=True, kw_only=True, tag="text_projection"):
    """Text-encoder states (batch, text_len, in_features) -> (batch, text_len, dim).

    ``linear_2(gelu_tanh(linear_1(x)))`` (PixArt-alpha caption projection, arXiv
    2310.00426). The input comes from a frozen text encoder (data), so ``linear_1``'s
    backward is its weight gradient only.
    """

    in_features: int
    """Text-encoder width (4096 for umT5-XXL)."""
    dim: int
    """Model width."""

    def __post_init__(self) -> None:
        self._positive(in_features=self.in_features, dim=self.dim)

    @property
    def in_dim(self) -> int:
        return self.in_features

    @property
    def out_dim(self) -> int:
        return self.dim

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        d = self.dim
        return {"linear_1.weight": (d, self.in_features), "linear_1.bias": (d,), "linear_2.weight": (d, d),
                "linear_2.bias": (d,)}

    def forward_flops(self, batch: int, seq: int) -> int:
        return 2 * batch * seq * self.dim * (self.in_features + self.dim)

    def backward_flops(self, batch: int, seq: int) -> int:
        return 2 * self.forward_flops(batch, seq) - 2 * batch * seq * self.in_features * self.dim

    def tp_dims(self) -> dict[str, int | None]:
        """Megatron MLP split: linear_1 column-parallel, linear_2 row-parallel."""
        return {"linear_1.weight": 0, "linear_1.bias": 0, "linear_2.weight": 1, "linear_2.bias": None}

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """linear_1 (read, write), tanh-GELU (read, write), linear_2 (read, write), weights."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        tokens, d = batch * seq, self.dim
        return tokens * (self.in_features + 5 * d) * dtype_bytes + _bytes.params_bytes(self, dtype_bytes)

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """The text states (T*in_features), the GELU input and linear_2's input (2*T*dim).

        Its output (the context) is kept by every cross-attention that reads it: see
        :meth:`lf_ir._nodes_dit.DiTAttention.shared_saved_bytes`.
        """
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return batch * seq * (self.in_features + 2 * self.dim) * dtype_bytes


class AdaLNModulation(_Node, frozen=True, kw_only=True, tag="adaln_modulation"):
    """A learned (1, chunks, dim) table added to the time modulation: (batch, chunks, dim) -> chunks.

    The adaLN of DiT (arXiv 2212.09748) with the projection shared across blocks and a
    per-block table (Wan2.1). Chunk ``i`` is ``(table[:, i] + emb[:, i])`` in float32.
    """

    dim: int
    """Model width."""
    chunks: int = 6
    """Modulation vectors (6 in a block, 2 in the output head)."""

    def __post_init__(self) -> None:
        self._positive(dim=self.dim, chunks=self.chunks)

    @property
    def in_dim(self) -> int:
        return self.dim

    @property
    def out_dim(self) -> int:
        return self.dim

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"table": (1, self.chunks, self.dim)}

    def forward_flops(self, batch: int, seq: int) -> int:
        return 0

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Per sample (``seq`` unused): read the time modulation and the table, write the float32 sum."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        n = self.chunks * self.dim
        return batch * n * (dtype_bytes + 4) + n * dtype_bytes

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Nothing: the add keeps no tensor (a :class:`~lf_ir._nodes_dit.DiTBlock`'s gates keep its output,
        counted by the block)."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return 0


class AdaLNHead(_Node, frozen=True, kw_only=True, tag="adaln_head"):
    """Final modulated norm and projection: (batch, tokens, dim) -> (batch, tokens, out_features).

    ``proj(layer_norm(x) * (1 + scale) + shift)`` with ``shift, scale`` from a
    2-chunk :class:`AdaLNModulation` of temb (no affine LayerNorm, float32).
    ``out_features`` is ``out_channels * prod(patch)``; unpatchify is a reshape.
    """

    dim: int
    """Model width."""
    out_features: int
    """Output features per token (channels times patch volume)."""
    eps: float = 1e-6
    """LayerNorm epsilon."""

    def __post_init__(self) -> None:
        self._positive(dim=self.dim, out_features=self.out_features)
        if not self.eps > 0:
            self._fail(f"eps must be positive, got {self.eps!r}")

    @property
    def modulation(self) -> AdaLNModulation:
        return AdaLNModulation(name=f"{self.name}.modulation", dim=self.dim, chunks=2)

    @property
    def in_dim(self) -> int:
        return self.dim

    @property
    def out_dim(self) -> int:
        return self.out_features

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"modulation.table": (1, 2, self.dim), "proj.weight": (self.out_features, self.dim),
                "proj.bias": (self.out_features,)}

    seq_split: ClassVar[SeqSplit] = "local"

    def forward_flops(self, batch: int, seq: int) -> int:
        return 2 * batch * seq * self.dim * self.out_features

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Float32 LayerNorm (cast in, read, write), modulation (read, write twice), cast back, proj, weights."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        tokens, d = batch * seq, self.dim
        f32 = tokens * d * (4 + 4) + tokens * d * (4 + 4) + tokens * d * 2 * 4  # norm; * (1 + scale); + shift
        casts = tokens * d * dtype_bytes * 2  # cast in (read), cast out (write)
        proj = tokens * (d + self.out_features) * dtype_bytes
        return f32 + casts + proj + _bytes.params_bytes(self, dtype_bytes)

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Float32: the LayerNorm input (T*dim), mean and rstd (T each), the normalized tokens (T*dim) and
        ``1 + scale`` (batch*dim); the projection's input (T*dim) in the activation dtype."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        tokens, d = batch * seq, self.dim
        return (2 * tokens * d + 2 * tokens + batch * d) * 4 + tokens * d * dtype_bytes
