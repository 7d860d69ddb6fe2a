"""The resampling node of causal video VAEs (Wan 2.1, arXiv 2503.20314), re-exported by ``lf_ir._nodes_vae``.

``seq`` is the voxels (frames x height x width) of the node's input per sample, as for
every VAE node (see :mod:`lf_ir._nodes_vae`); ``frames`` says how they split into frames.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from lf_ir import _bytes, _bytes_video
from lf_ir._base import SeqSplit, _Node

ResampleMode = Literal["down2d", "down3d", "up2d", "up3d"]


class VAEResample(_Node, frozen=True, kw_only=True, tag="vae_resample"):
    """Halve (``down*``) or double (``up*``) height and width; the ``*3d`` modes also resample time.

    - ``down2d``: pad right/bottom by 1, 3x3 conv stride 2 per frame.
    - ``down3d``: ``down2d``, then frame 0 kept and a causal (3,1,1) conv of stride 2 over all frames:
      T -> 1 + (T - 1) // 2 frames.
    - ``up2d``: nearest x2 upsampling, 3x3 conv per frame to ``out_channels``.
    - ``up3d``: frame 0 kept; frames 1.. through a causal (3,1,1) conv to 2 x channels, split into two
      frames each (T -> 2T - 1 frames); then ``up2d``.
    """

    dim: int
    """Input channels."""
    mode: ResampleMode
    """Which resampling (see the class docstring)."""
    frames: int
    """Input frames per sample at the graph's clip length."""
    out_channels: int = 0
    """Output channels of the ``up*`` modes (0: ``dim // 2``, Wan 2.1); ``down*`` keep ``dim``."""

    seq_split: ClassVar[SeqSplit] = "none"

    def __post_init__(self) -> None:
        self._positive(dim=self.dim, frames=self.frames)
        if self.mode not in ("down2d", "down3d", "up2d", "up3d"):
            self._fail(f"mode must be down2d, down3d, up2d or up3d, got {self.mode!r}")
        if self.out_channels < 0 or (self.mode.startswith("up") and self.out_dim < 1):
            self._fail(f"out_channels must be positive (or 0 for dim // 2), got {self.out_channels!r}")

    @property
    def in_dim(self) -> int:
        return self.dim

    @property
    def out_dim(self) -> int:
        if self.mode.startswith("down"):
            return self.dim
        return self.out_channels or self.dim // 2

    @property
    def out_frames(self) -> int:
        """Frames of the output for ``frames`` input frames."""
        return {"down3d": 1 + (self.frames - 1) // 2, "up3d": 2 * self.frames - 1}.get(self.mode, self.frames)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = {"conv.weight": (self.out_dim, self.dim, 1, 3, 3), "conv.bias": (self.out_dim,)}
        if self.mode.endswith("3d"):
            t_out = 2 * self.dim if self.mode == "up3d" else self.dim
            shapes.update({"time_conv.weight": (t_out, self.dim, 3, 1, 1), "time_conv.bias": (t_out,)})
        return shapes

    def forward_flops(self, batch: int, seq: int) -> int:
        if seq % self.frames:
            self._fail(f"seq {seq} (input voxels) is not a multiple of frames {self.frames}")
        area, d, o = seq // self.frames, self.dim, self.out_dim
        if self.mode.startswith("down"):
            flops = 2 * batch * self.frames * (area // 4) * d * d * 9
            if self.mode == "down3d":
                flops += 2 * batch * ((self.frames - 1) // 2) * (area // 4) * d * d * 3
            return flops
        flops = 2 * batch * self.out_frames * 4 * area * d * o * 9
        if self.mode == "up3d":
            flops += 2 * batch * (self.frames - 1) * area * d * 2 * d * 3
        return flops

    def _conv_inputs(self, batch: int, seq: int) -> tuple[int, int]:
        """Elements of the spatial conv's input and of the time conv's kept input (0 when it does not run)."""
        if seq % self.frames:
            self._fail(f"seq {seq} (input voxels) is not a multiple of frames {self.frames}")
        area, d, f = seq // self.frames, self.dim, self.frames
        if self.mode.startswith("down"):
            time = batch * f * (area // 4) * d if self.mode == "down3d" and f > 1 else 0
            return batch * f * _bytes_video.padded_area(area) * d, time
        time = batch * (f + 1) * area * d if self.mode == "up3d" and f > 1 else 0
        return batch * self.out_frames * 4 * area * d, time

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Pad or upsample (read, write), the spatial conv (read, write) and the time conv (read, write)."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        spatial, time = self._conv_inputs(batch, seq)
        area = seq // self.frames
        out_area = area // 4 if self.mode.startswith("down") else 4 * area
        out = batch * self.out_frames * out_area * self.out_dim
        elems = batch * seq * self.dim + spatial + spatial + out + 2 * time
        return elems * dtype_bytes + _bytes.params_bytes(self, dtype_bytes)

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """What the convs keep: ``down*`` the frames padded by a row and a column (square frames assumed,
        else off by ``|h + w - 2 sqrt(hw)|`` pixels a frame) and, ``down3d`` with frames > 1, the whole
        spatial conv output (the time conv reads a view of it); ``up*`` the upsampled frames (output frames x
        4 area) and, ``up3d`` with frames > 1, frames 1.. with 2 zero frames in front."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return sum(self._conv_inputs(batch, seq)) * dtype_bytes
