"""IR nodes of causal video VAEs (Wan 2.1, arXiv 2503.20314): causal conv3d, channel RMS norm,
residual block, per-frame attention block and spatial / temporal resampling.

Feature maps are (batch, channels, frames, height, width); a node's ``in_dim`` /
``out_dim`` are channels.

**What ``seq`` means here.** For every node of this module ``seq`` is the number
of voxels (frames x height x width) of the node's *input*, per sample. A VAE
graph therefore has one component per resolution level (its ``seq_len`` the
level's input voxels), and the nodes whose cost depends on how those voxels
split into frames (attention, temporal resampling) carry ``frames``, the input
frame count at the graph's clip length; a different ``seq`` at the same
``frames`` means a different frame area. ``CausalConv3D`` and ``VAEResBlock`` carry
``frames`` too (0: unknown) for their byte rules: a causal conv keeps its input with
``kernel_t - 1`` padding frames in front. Heights and widths must be even where
a node halves them (the recipes check divisibility by 8).

FLOPs count convolutions and matmuls only (multiply-add = 2, output voxels x
in_channels x kernel volume x out_channels), as ``torch.utils.flop_counter``
does; norms, activations, nearest upsampling and residual adds count 0.
"""

from __future__ import annotations

from typing import ClassVar

from lf_ir import _bytes, _bytes_video
from lf_ir._base import SeqSplit, _Node
from lf_ir._nodes_vae_resample import ResampleMode, VAEResample

__all__ = ["CausalConv3D", "ChannelRMSNorm", "ResampleMode", "VAEAttention", "VAEResBlock", "VAEResample"]


def _check_frames(node) -> None:
    if not isinstance(node.frames, int) or node.frames < 0:
        node._fail(f"frames must be a non-negative integer (0: unknown), got {node.frames!r}")


def _prefixed(children: dict[str, _Node], attr: str) -> dict:
    out: dict = {}
    for key, child in children.items():
        out.update({f"{key}.{k}": v for k, v in getattr(child, attr)().items()})
    return out


class CausalConv3D(_Node, frozen=True, kw_only=True, tag="causal_conv3d"):
    """3D convolution causal in time (``kernel_t - 1`` zero frames on the left), stride 1, same size.

    (batch, in_channels, T, H, W) -> (batch, out_channels, T, H, W); lowered to
    :class:`lf_kernels.conv3d.CausalConv3d` (feature cache for chunked clips).
    """

    in_channels: int
    """Input channels."""
    out_channels: int
    """Output channels."""
    kernel: tuple[int, int, int] = (3, 3, 3)
    """Kernel (time, height, width); height and width odd (symmetric spatial padding)."""
    frames: int = 0
    """Input frames per sample at the graph's clip length, for the byte rules (0: unknown, the
    ``kernel_t - 1`` padding frames of the input are then left out)."""

    seq_split: ClassVar[SeqSplit] = "none"

    def __post_init__(self) -> None:
        self._positive(in_channels=self.in_channels, out_channels=self.out_channels)
        _check_frames(self)
        if len(self.kernel) != 3 or any(not isinstance(k, int) or k < 1 for k in self.kernel):
            self._fail(f"kernel must be 3 positive ints, got {self.kernel!r}")
        if self.kernel[1] % 2 == 0 or self.kernel[2] % 2 == 0:
            self._fail(f"kernel height and width must be odd, got {self.kernel!r}")

    @property
    def in_dim(self) -> int:
        return self.in_channels

    @property
    def out_dim(self) -> int:
        return self.out_channels

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"weight": (self.out_channels, self.in_channels, *self.kernel), "bias": (self.out_channels,)}

    def forward_flops(self, batch: int, seq: int) -> int:
        kt, kh, kw = self.kernel
        return 2 * batch * seq * self.in_channels * self.out_channels * kt * kh * kw

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Write the padded input stream (``kernel_t > 1``), read it and the weights, write the output."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        stream = batch * _bytes_video.conv_stream_voxels(self, seq) * self.in_channels
        pad = stream + batch * seq * self.in_channels if self.kernel[0] > 1 else 0
        return (pad + stream + batch * seq * self.out_channels) * dtype_bytes + _bytes.params_bytes(self, dtype_bytes)

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """The input stream: ``seq`` voxels plus ``kernel_t - 1`` zero (or cached) frames in front, times
        in_channels (exact with ``frames`` set; its padding left out when ``frames`` is 0)."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return batch * _bytes_video.conv_stream_voxels(self, seq) * self.in_channels * dtype_bytes


class ChannelRMSNorm(_Node, frozen=True, kw_only=True, tag="channel_rms_norm"):
    """RMS norm over the channel dim of (batch, channels, ...): ``x / ||x||_2 * sqrt(dim) * weight``.

    Wan's ``RMS_norm`` (L2-normalize with eps 1e-12, scale by sqrt(channels)), shape preserving.
    """

    dim: int
    """Channels."""

    def __post_init__(self) -> None:
        self._positive(dim=self.dim)

    @property
    def in_dim(self) -> int:
        return self.dim

    @property
    def out_dim(self) -> int:
        return self.dim

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"weight": (self.dim,)}

    def forward_flops(self, batch: int, seq: int) -> int:
        return 0

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Read the input twice (norm, divide), write the normalized, scaled and weighted tensors."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return 5 * batch * seq * self.dim * dtype_bytes + _bytes.params_bytes(self, dtype_bytes)

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """The input (float32 copy for 16-bit inputs), the L2 norm and its clamp (per voxel, float32 when
        upcast) and the normalized input times sqrt(dim) (activation dtype); the SiLU that follows a bare
        ``norm_out`` in a VAE stage keeps one more (batch*seq*dim) tensor, not counted here."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return _bytes_video.channel_norm_saved(batch * seq, self.dim, dtype_bytes)


class VAEResBlock(_Node, frozen=True, kw_only=True, tag="vae_res_block"):
    """Residual block: ``shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x))))))``, convs causal 3x3x3.

    The shortcut is a 1x1x1 conv when channels change, the identity otherwise.
    """

    in_channels: int
    """Input channels."""
    out_channels: int
    """Output channels."""
    frames: int = 0
    """Input frames per sample at the graph's clip length, for the convs' byte rules (0: unknown)."""

    seq_split: ClassVar[SeqSplit] = "none"

    def __post_init__(self) -> None:
        self._positive(in_channels=self.in_channels, out_channels=self.out_channels)
        _check_frames(self)

    @property
    def in_dim(self) -> int:
        return self.in_channels

    @property
    def out_dim(self) -> int:
        return self.out_channels

    def children(self) -> dict[str, _Node]:
        """Sub-nodes by attribute name of the lowered module (norm1, conv1, norm2, conv2[, shortcut])."""
        i, o, n = self.in_channels, self.out_channels, self.name
        kids: dict[str, _Node] = {
            "norm1": ChannelRMSNorm(name=f"{n}.norm1", dim=i),
            "conv1": CausalConv3D(name=f"{n}.conv1", in_channels=i, out_channels=o, frames=self.frames),
            "norm2": ChannelRMSNorm(name=f"{n}.norm2", dim=o),
            "conv2": CausalConv3D(name=f"{n}.conv2", in_channels=o, out_channels=o, frames=self.frames)}
        if i != o:
            kids["shortcut"] = CausalConv3D(name=f"{n}.shortcut", in_channels=i, out_channels=o, kernel=(1, 1, 1))
        return kids

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return _prefixed(self.children(), "param_shapes")

    def tp_dims(self) -> dict[str, int | None]:
        return _prefixed(self.children(), "tp_dims")

    def forward_flops(self, batch: int, seq: int) -> int:
        return sum(c.forward_flops(batch, seq) for c in self.children().values())

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """The children's traffic, two SiLUs (read, write) and the residual add (read 2, write 1)."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        tokens = batch * seq
        elementwise = 2 * tokens * (self.in_channels + self.out_channels) + 3 * tokens * self.out_channels
        return elementwise * dtype_bytes + sum(c.forward_bytes(batch, seq, dtype_bytes)
                                              for c in self.children().values())

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Both channel norms and convs, the two SiLU inputs (T*in, T*out) and, for 16-bit inputs, the 1x1x1
        shortcut's input (in float32 it is the tensor norm1 keeps); see :mod:`lf_ir._bytes_video`."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        kids = self.children()
        tokens = batch * seq
        total = sum(kids[k].saved_bytes(batch, seq, dtype_bytes) for k in ("norm1", "conv1", "norm2", "conv2"))
        total += tokens * (self.in_channels + self.out_channels) * dtype_bytes
        if "shortcut" in kids and dtype_bytes < 4:
            total += kids["shortcut"].saved_bytes(batch, seq, dtype_bytes)
        return total


class VAEAttention(_Node, frozen=True, kw_only=True, tag="vae_attention"):
    """Single-head self-attention among the pixels of each frame, residual: ``x + proj(attn(qkv(norm(x))))``.

    Frames do not attend to each other. ``qkv`` and ``proj`` are per-pixel linears, as
    1x1x1 convolutions (Wan's 1x1 ``Conv2d``).
    """

    dim: int
    """Channels (the head width)."""
    frames: int
    """Input frames per sample at the graph's clip length (``seq / frames`` pixels attend together)."""

    seq_split: ClassVar[SeqSplit] = "none"

    def __post_init__(self) -> None:
        self._positive(dim=self.dim, frames=self.frames)

    @property
    def in_dim(self) -> int:
        return self.dim

    @property
    def out_dim(self) -> int:
        return self.dim

    def children(self) -> dict[str, _Node]:
        """Sub-nodes by attribute name of the lowered module (norm, qkv, proj)."""
        d, n = self.dim, self.name
        return {"norm": ChannelRMSNorm(name=f"{n}.norm", dim=d),
                "qkv": CausalConv3D(name=f"{n}.qkv", in_channels=d, out_channels=3 * d, kernel=(1, 1, 1)),
                "proj": CausalConv3D(name=f"{n}.proj", in_channels=d, out_channels=d, kernel=(1, 1, 1))}

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return _prefixed(self.children(), "param_shapes")

    def tp_dims(self) -> dict[str, int | None]:
        return {key: None for key in self.param_shapes()}

    def forward_flops(self, batch: int, seq: int) -> int:
        if seq % self.frames:
            self._fail(f"seq {seq} (input voxels) is not a multiple of frames {self.frames}")
        area = seq // self.frames
        linears = sum(c.forward_flops(batch, seq) for c in self.children().values())
        return linears + 4 * batch * self.frames * area * area * self.dim

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Norm, qkv conv, the per-frame token copy of q/k/v, a flash-style core (float32 lse), proj, residual."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        kids, tokens, d = self.children(), batch * seq, self.dim
        convs = sum(c.forward_bytes(batch, seq, dtype_bytes) for c in kids.values())
        elems = 2 * 3 * tokens * d + 4 * tokens * d + 3 * tokens * d  # copy; core; residual add
        return convs + elems * dtype_bytes + tokens * _bytes.LSE_BYTES

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """The channel norm and the qkv conv's input (T*dim), then by SDPA's CPU kernel:

        - batch > 1 (flash): the one token-order copy of q, k and v (3*T*dim), the output (T*dim, the proj
          input is a view of it) and the float32 log-sum-exp (T, one head);
        - batch 1: the per-frame q/k/v are strided views of the qkv output, so SDPA takes its math path:
          that output (3*T*dim), the scaled q and k (T*dim each), the softmax probabilities
          (frames * area**2 per sample) and the proj input (T*dim); for 16-bit inputs the math runs in
          float32 and keeps float32 v and scaled q, k (3*T*dim*4) and probabilities instead.
        """
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        tokens = batch * seq
        norm = self.children()["norm"].saved_bytes(batch, seq, dtype_bytes) + tokens * self.dim * dtype_bytes
        if batch == 1 and seq > 1:
            if seq % self.frames:
                self._fail(f"seq {seq} (input voxels) is not a multiple of frames {self.frames}")
            probs = self.frames * (seq // self.frames) ** 2
            if dtype_bytes < 4:
                return norm + (3 * tokens * self.dim + probs) * 4 + tokens * self.dim * dtype_bytes
            return norm + (6 * tokens * self.dim + probs) * dtype_bytes
        return norm + 4 * tokens * self.dim * dtype_bytes + tokens * _bytes.LSE_BYTES
