"""Position ids of a Qwen2-VL style sequence: patch (row, column) ids, attention segments, M-RoPE ids.

Patches arrive in the order of Qwen2-VL's image processor: frame by frame, and
inside a frame block-major over ``merge x merge`` blocks (the ``merge**2`` patches
that the patch merger fuses are consecutive). ``grid_thw`` (images, 3) int64 gives
each image's (frames, patch rows, patch columns) before merging.

:func:`mrope_position_ids` is transformers' ``Qwen2VLModel.get_rope_index``
(v5.x) with the image / video tokens found from their ids: text runs count up by
one; a vision run of ``t x (h/m) x (w/m)`` tokens starting at position ``p`` gets
ids ``(p + t_i, p + h_i, p + w_i)``, and the text after it starts at
``p + max(h, w) / m``.

Legend: ``ids_bs`` (batch, seq) int64; ``pos_3bs`` (3, batch, seq) int64.
"""

from __future__ import annotations

import itertools

import torch


def vision_patch_positions(grid_thw: torch.Tensor, merge: int) -> torch.Tensor:
    """(tokens, 2) int64 (row, column) of every patch, in processor order (see module docstring).

    Raises:
        ValueError: ``grid_thw`` not (images, 3), or rows / columns not divisible by ``merge``.
    """
    _check_grid(grid_thw, merge)
    out = []
    for t, h, w in grid_thw.tolist():
        rows = torch.arange(h, device=grid_thw.device)[:, None].expand(h, w)
        cols = torch.arange(w, device=grid_thw.device)[None, :].expand(h, w)
        block = (h // merge, merge, w // merge, merge)
        pos = torch.stack([rows.reshape(block).transpose(1, 2).flatten(),
                           cols.reshape(block).transpose(1, 2).flatten()], dim=-1)
        out.append(pos.repeat(t, 1))
    return torch.cat(out)


def vision_segments(grid_thw: torch.Tensor) -> list[int]:
    """Patches per attention segment: one segment per frame of each image (HF ``cu_seqlens`` differences)."""
    return [h * w for t, h, w in grid_thw.tolist() for _ in range(t)]


def _check_grid(grid_thw: torch.Tensor, merge: int) -> None:
    if grid_thw.dim() != 2 or grid_thw.shape[1] != 3:
        raise ValueError(f"image_grid_thw must be (images, 3), got shape {tuple(grid_thw.shape)}")
    for i, (t, h, w) in enumerate(grid_thw.tolist()):
        if t <= 0 or h % merge or w % merge or h <= 0 or w <= 0:
            raise ValueError(f"image_grid_thw[{i}] = {[t, h, w]}: need t > 0 and rows, columns positive "
                             f"multiples of spatial_merge_size {merge}")


def mrope_position_ids(ids_bs: torch.Tensor, image_grid_thw: torch.Tensor | None, *, image_token_id: int,
                       spatial_merge_size: int, attention_mask: torch.Tensor | None = None,
                       video_grid_thw: torch.Tensor | None = None,
                       video_token_id: int | None = None) -> torch.Tensor:
    """(3, batch, seq) int64 M-RoPE position ids, as transformers' ``get_rope_index``.

    Without any grid the ids are ``0..seq-1`` on all three axes (HF's text-only path,
    which ignores ``attention_mask``). With grids, padding (``attention_mask == 0``)
    gets id 0 and is skipped when counting. Grids are consumed in order over the whole
    batch; an image (video) run of placeholder tokens consumes as many grids as it
    has tokens for.

    Raises:
        ValueError: a vision run whose length does not equal its grids' merged token
            count, more runs than grids, or grids left over (the numbers named).
    """
    b, s = ids_bs.shape
    if image_grid_thw is None and video_grid_thw is None:
        return torch.arange(s, device=ids_bs.device).view(1, 1, s).expand(3, b, s)
    m = spatial_merge_size
    grids = {1: iter((image_grid_thw if image_grid_thw is not None else torch.zeros(0, 3)).tolist()),
             2: iter((video_grid_thw if video_grid_thw is not None else torch.zeros(0, 3)).tolist())}
    pos_3bs = torch.zeros(3, b, s, dtype=ids_bs.dtype, device=ids_bs.device)
    for row in range(b):
        keep = (attention_mask[row].bool().to(ids_bs.device) if attention_mask is not None
                else torch.ones(s, dtype=torch.bool, device=ids_bs.device))
        ids = ids_bs[row][keep].tolist()
        kinds = [1 if i == image_token_id else 2 if video_token_id is not None and i == video_token_id else 0
                 for i in ids]
        parts, current, start = [], 0, 0
        for kind, run in itertools.groupby(kinds):
            n = len(list(run))
            if kind == 0:
                parts.append(torch.arange(n).view(1, -1).expand(3, -1) + current)
                current += n
            else:
                used = 0
                while used < n:
                    grid = next(grids[kind], None)
                    if grid is None:
                        raise ValueError(f"sample {row}: a run of {n} {'image' if kind == 1 else 'video'} tokens at "
                                         f"position {start} has no grid left to fill it")
                    t, h, w = grid
                    parts.append(_grid_ids(t, h // m, w // m, current))
                    used += t * (h // m) * (w // m)
                    current += max(h, w) // m
                if used != n:
                    raise ValueError(f"sample {row}: a run of {n} vision tokens at position {start} does not match "
                                     f"its grids, which give {used} merged tokens")
            start += n
        if parts:
            pos_3bs[:, row, keep] = torch.cat(parts, dim=1).to(pos_3bs)
    left = len(list(grids[1])) + len(list(grids[2]))
    if left:
        raise ValueError(f"{left} image/video grid(s) left over: more grids than placeholder runs in input_ids")
    return pos_3bs


def _grid_ids(t: int, h: int, w: int, start: int) -> torch.Tensor:
    """(3, t*h*w) ids of one merged grid starting at ``start`` (HF ``get_vision_position_ids``)."""
    tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack([tt, hh, ww]).reshape(3, -1) + start
