"""Multimodal terms of the cost model: images and documents packed into one sample, and the host overhead of
a vision tower that works image by image.

The IR prices a sample as one sequence per component (Qwen2-VL: one image of ``image_patches`` patches and
``seq_len`` text tokens). A packed training row holds several samples and several images, and the lowered
model attends inside each one (``MMAttention(segments=...)``, per-sample causal attention), so:

- **segments**: the attention core of a per-image component (:func:`per_image_components`) is divided by
  ``images_per_sample`` (n equal images of ``seq / n`` patches keep ``1 / n`` of the dense scores), and that
  of a packed component (:func:`packed_components`) by ``docs_per_sample`` (documents of equal length);
- **segment overhead**: the vision tower builds each image's patch positions, rotary tables and attention
  segments on the host (``lf_ir._mm_positions``: a ``.tolist()`` sync and a few small launches per image) and
  launches its attention per segment; the decoder of the measured run attends per packed sample the same
  way. Priced as ``host_overhead_us_per_segment`` per attention segment (image or packed sample), per block,
  per pass (forward, backward, recomputed forward) of the per-image components and of the decoder they feed
  (:attr:`lf_parallel._calibrate.Calibration.host_overhead_us_per_segment`, fitted to
  ``bench/results/qwen2_vl_peer_h200x2.json``; see there).

A component is *per-image* when its blocks' attention carries a 2-D vision RoPE (``lf_ir``'s ``VisionRoPE``,
Qwen2-VL's ViT), the marker of the per-image position and segment code.
"""

from __future__ import annotations


def _vision_rope(node) -> bool:
    att = getattr(node, "attention", None) or getattr(node, "self_attn", None)
    return type(getattr(att, "rope", None)).__name__ == "VisionRoPE"


def per_image_components(graph) -> frozenset[str]:
    """Names of the components whose attention and positions work image by image (see the module docstring)."""
    return frozenset(c.name for c in graph.components if any(_vision_rope(n) for n in c.nodes))


def packed_components(graph, main: str, per_image: frozenset[str]) -> frozenset[str]:
    """Components whose sample is a row of packed documents: the main one and those a per-image component feeds
    (Qwen2-VL's decoder, whose 28 blocks are fewer than the ViT's 32, so it is not lf-memory's main)."""
    return frozenset({main, *(e.dst for e in getattr(graph, "edges", ()) if e.src in per_image)}) - per_image


def segments(comp: str, packed: frozenset[str], per_image: frozenset[str], images_per_sample: float,
             docs_per_sample: float) -> float:
    """Attention segments of one sample of component ``comp``: its images (a per-image component), its packed
    documents (a :func:`packed_components` one), else 1.

    Raises:
        ValueError: ``images_per_sample`` or ``docs_per_sample`` below 1.
    """
    for key, value in (("images_per_sample", images_per_sample), ("docs_per_sample", docs_per_sample)):
        if value < 1:
            raise ValueError(f"{key} must be >= 1, got {value}")
    if comp in per_image:
        return images_per_sample
    return docs_per_sample if comp in packed else 1.0


def segment_overhead_s(comp: str, packed: frozenset[str], per_image: frozenset[str], segs: float, micro_batch: int,
                       blocks: float, passes: float, us_per_segment: float) -> float:
    """Host + launch time of running ``blocks`` blocks of component ``comp`` one attention segment at a time,
    ``passes`` times (forward, backward, recomputed forward), for one micro-batch; seconds. Zero for a graph
    without a per-image component and for components neither per-image nor packed."""
    if not per_image or (comp not in per_image and comp not in packed):
        return 0.0
    return micro_batch * segs * blocks * passes * us_per_segment * 1e-6
