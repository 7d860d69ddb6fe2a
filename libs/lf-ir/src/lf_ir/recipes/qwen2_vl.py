"""Qwen2-VL recipe: a ViT with 2D RoPE and a patch merger feeding a Qwen2 decoder with M-RoPE.

Follows "Qwen2-VL" (Wang et al. 2024, arXiv 2409.12191) as implemented by HF
``transformers``' ``Qwen2VLForConditionalGeneration`` (v5.x):

- vision: flattened (C, T=2, 14, 14) patches -> bias-free 3D patch embedding ->
  pre-LayerNorm blocks (q/k/v/o with biases, 2D RoPE, quick-GELU MLP), attention
  restricted to each frame of each image -> patch merger (LayerNorm, 2x2 patches
  fused, Linear-GELU-Linear to the LLM width);
- text: Qwen2 decoder (q/k/v with bias, o without, RMSNorm, SwiGLU, GQA, M-RoPE
  over (t, h, w) position ids from ``get_rope_index``); the merged image tokens
  replace the image-pad placeholder ids; head tied (2B) or not (7B).

``lf_ir.interop.hf_qwen2_vl`` converts HF checkpoints both ways.

Legend: ``ids_bs`` (batch, seq) int64; ``patches_nf`` (patches, C*T*p*p);
``grid_thw`` (images, 3) int64; ``logits_bsv`` (batch, seq, vocab).
"""

from __future__ import annotations

import msgspec
import torch
from torch import nn

from lf_ir import _lower_mm  # noqa: F401  (registers the lowering rules of the nodes below)
from lf_ir._graph import Component, Edge, Graph, validate
from lf_ir._lower import ComponentModule
from lf_ir._mm_positions import mrope_position_ids, vision_patch_positions, vision_segments
from lf_ir._mrope import MRoPE, VisionRoPE
from lf_ir._mrope_torch import mrope_cos_sin, vision_rope_cos_sin
from lf_ir._nodes import MLP, Embedding, LMHead, Norm
from lf_ir._nodes_mm import MMAttention, MMBlock
from lf_ir._nodes_vision import FeedForward, PatchEmbed3D, PatchMerger
from lf_ir._pipeline_glue import blocks_between
from lf_ir.recipes._spec import RecipeSpec, lazy_function, register_recipe
from lf_kernels import MaskSpec


class Qwen2VLConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Sizes of a Qwen2-VL model (defaults: Qwen2-VL-7B-Instruct). Widths in features, lengths in tokens.

    Example:
        >>> qwen2_vl_config("2B").tie_embeddings
        True
    """

    vocab_size: int = 152064
    """Vocabulary size (HF ``vocab_size``)."""
    dim: int = 3584
    """LLM width (HF ``hidden_size``)."""
    layers: int = 28
    """Decoder blocks (HF ``num_hidden_layers``)."""
    heads: int = 28
    """Query heads of the decoder; must divide ``dim``."""
    kv_heads: int = 4
    """Key/value heads of the decoder; must divide ``heads``."""
    ffn_hidden: int = 18944
    """SwiGLU hidden width (HF ``intermediate_size``)."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon (HF ``rms_norm_eps``)."""
    rope_theta: float = 1000000.0
    """M-RoPE base (HF ``rope_theta``)."""
    mrope_section: tuple[int, int, int] = (16, 24, 24)
    """Rotary frequencies per (t, h, w) band; sum to head_dim / 2 (HF ``mrope_section``)."""
    max_seq_len: int = 32768
    """Longest sequence the model is meant for (HF ``max_position_embeddings``), tokens."""
    tie_embeddings: bool = False
    """Whether the head shares the embedding table (HF ``tie_word_embeddings``)."""
    vision_dim: int = 1280
    """ViT width (HF vision ``embed_dim``)."""
    vision_layers: int = 32
    """ViT blocks (HF vision ``depth``)."""
    vision_heads: int = 16
    """ViT heads (HF vision ``num_heads``)."""
    vision_mlp_ratio: int = 4
    """ViT MLP hidden width / vision_dim (HF vision ``mlp_ratio``)."""
    vision_act: str = "quick_gelu"
    """ViT MLP activation (HF vision ``hidden_act``): gelu, gelu_tanh, quick_gelu or silu."""
    vision_rope_theta: float = 10000.0
    """ViT 2D RoPE base (HF vision ``rope_parameters.rope_theta``)."""
    merger_dim: int = 3584
    """Width of the merged image tokens (HF vision ``hidden_size``); must equal ``dim``."""
    in_channels: int = 3
    """Image channels."""
    patch_size: int = 14
    """Patch side in pixels."""
    temporal_patch_size: int = 2
    """Frames per patch."""
    spatial_merge_size: int = 2
    """Patches merged per side by the merger."""
    image_token_id: int = 151655
    """Placeholder id of one merged image token."""
    video_token_id: int = 151656
    """Placeholder id of one merged video token."""
    vision_start_token_id: int = 151652
    """Id opening an image or video (kept in config.json)."""
    vision_end_token_id: int = 151653
    """Id closing an image or video (kept in config.json)."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def vision_head_dim(self) -> int:
        return self.vision_dim // self.vision_heads


SIZES: dict[str, dict] = {
    "tiny": dict(vocab_size=512, dim=64, layers=2, heads=4, kv_heads=2, ffn_hidden=128, mrope_section=(2, 3, 3),
                 max_seq_len=1024, vision_dim=32, vision_layers=2, vision_heads=2, merger_dim=64,
                 image_token_id=500, video_token_id=501, vision_start_token_id=502, vision_end_token_id=503),
    "2B": dict(vocab_size=151936, dim=1536, heads=12, kv_heads=2, ffn_hidden=8960, tie_embeddings=True,
               merger_dim=1536),
    "7B": {},
}
"""Named sizes, overrides of the Qwen2VLConfig defaults. ``2B`` and ``7B`` are the config.json values of
Qwen/Qwen2-VL-2B-Instruct and Qwen/Qwen2-VL-7B-Instruct (2,208,985,600 and 8,291,375,616 parameters);
``tiny`` is for tests."""


def qwen2_vl_config(size: str = "7B", **overrides) -> Qwen2VLConfig:
    """The config of a named size (any case: ``"8b"`` = ``"8B"``) with field overrides.

    Raises:
        ValueError: unknown size (lists the sizes); TypeError: unknown field.
    """
    return SPEC.config(size, **overrides)


def build_graph(cfg: Qwen2VLConfig, seq_len: int | None = None, image_patches: int = 1024) -> Graph:
    """The IR graph: a ``vision`` component (one image of ``image_patches`` patches per sample) whose
    ``merger`` tokens enter the ``text`` component (``seq_len`` tokens, default ``cfg.max_seq_len``).

    Vision nodes: ``patch_embed``, ``block0..``, ``merger``; text: ``embed``, ``layer0..``, ``norm``, ``head``.

    Raises:
        IRError: naming the node that does not fit (e.g. ``'layer0.attention'`` when ``dim`` is not
            divisible by ``heads`` or ``mrope_section`` does not sum to head_dim / 2; the edge from
            ``'merger'`` when ``merger_dim != dim``).
    """
    vd, eps = cfg.vision_dim, 1e-6
    vision_blocks = [MMBlock(
        name=f"block{i}", attn_norm=Norm(name=f"block{i}.attn_norm", dim=vd, kind="layer", eps=eps),
        attention=MMAttention(name=f"block{i}.attention", dim=vd, heads=cfg.vision_heads, kv_heads=cfg.vision_heads,
                              mask="full", qkv_bias=True, o_bias=True, rope=VisionRoPE(theta=cfg.vision_rope_theta)),
        mlp_norm=Norm(name=f"block{i}.mlp_norm", dim=vd, kind="layer", eps=eps),
        mlp=FeedForward(name=f"block{i}.mlp", dim=vd, hidden=vd * cfg.vision_mlp_ratio, activation=cfg.vision_act),
    ) for i in range(cfg.vision_layers)]
    vision = Component(name="vision", modality="image", seq_len=image_patches, nodes=[
        PatchEmbed3D(name="patch_embed", dim=vd, in_channels=cfg.in_channels, patch_size=cfg.patch_size,
                     temporal_patch_size=cfg.temporal_patch_size),
        *vision_blocks,
        PatchMerger(name="merger", in_features=vd, out_features=cfg.merger_dim, merge=cfg.spatial_merge_size),
    ])
    mrope = MRoPE(theta=cfg.rope_theta, sections=tuple(cfg.mrope_section))
    text_blocks = [MMBlock(
        name=f"layer{i}", attn_norm=Norm(name=f"layer{i}.attn_norm", dim=cfg.dim, kind="rms", eps=cfg.norm_eps),
        attention=MMAttention(name=f"layer{i}.attention", dim=cfg.dim, heads=cfg.heads, kv_heads=cfg.kv_heads,
                              mask="causal", qkv_bias=True, o_bias=False, rope=mrope),
        mlp_norm=Norm(name=f"layer{i}.mlp_norm", dim=cfg.dim, kind="rms", eps=cfg.norm_eps),
        mlp=MLP(name=f"layer{i}.mlp", dim=cfg.dim, hidden=cfg.ffn_hidden, activation="swiglu", bias=False),
    ) for i in range(cfg.layers)]
    text = Component(name="text", modality="text", seq_len=seq_len or cfg.max_seq_len, nodes=[
        Embedding(name="embed", num_embeddings=cfg.vocab_size, dim=cfg.dim),
        *text_blocks,
        Norm(name="norm", dim=cfg.dim, kind="rms", eps=cfg.norm_eps),
        LMHead(name="head", dim=cfg.dim, vocab_size=cfg.vocab_size, tied_to="embed" if cfg.tie_embeddings else None),
    ])
    return validate(Graph(name="qwen2_vl", recipe="qwen2_vl", components=[vision, text],
                          edges=[Edge(src="vision", src_node="merger", dst="text")]))


def _check_placeholders(where_bs: torch.Tensor, tokens: int, token_id: int) -> None:
    """Raise unless ``where_bs`` (batch, seq) bool marks exactly ``tokens`` placeholders.

    On the host a ``ValueError``; on an accelerator an asynchronous device assert
    (``torch._assert_async``), so the check costs no host-device synchronization.
    A mismatch there fails the next synchronizing call with CUDA's generic
    "device-side assert triggered" (this message goes to the kernel's stderr) and
    leaves the CUDA context unusable: the process must restart. ``lf run``'s
    collate builds the placeholders from the grids, so it never trips this.
    """
    if where_bs.device.type != "cpu":
        torch._assert_async(where_bs.sum() == tokens, f"input_ids: the number of placeholders (id {token_id}) "
                            f"differs from the {tokens} vision tokens")
        return
    found = int(where_bs.sum())
    if found != tokens:
        raise ValueError(f"input_ids hold {found} placeholders (id {token_id}) but the vision tower gives {tokens} "
                         "tokens")


class Qwen2VLModel(nn.Module):
    """The lowered Qwen2-VL. Build under ``torch.device("meta")``, then ``lf_ir.materialize``.

    Example:
        >>> from lf_ir import materialize
        >>> with torch.device("meta"):
        ...     model = Qwen2VLModel(qwen2_vl_config("tiny"))
        >>> model = materialize(model, "cpu", seed=0)
        >>> model(torch.zeros(2, 8, dtype=torch.long)).shape
        torch.Size([2, 8, 512])
    """

    def __init__(self, cfg: Qwen2VLConfig, graph: Graph | None = None):
        super().__init__()
        self.cfg = cfg
        self.graph = graph if graph is not None else build_graph(cfg)
        self.components = nn.ModuleDict({c.name: ComponentModule(c) for c in self.graph.components})
        self.mask = MaskSpec(kind="causal")
        self._mrope = MRoPE(theta=cfg.rope_theta, sections=tuple(cfg.mrope_section))
        self._vision_rope = VisionRoPE(theta=cfg.vision_rope_theta)

    @property
    def blocks(self) -> list[nn.Module]:
        """Every transformer block, ViT first then decoder (for recompute planning)."""
        return self.components["vision"].blocks + self.components["text"].blocks

    def encode_images(self, patches_nf: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """Merged image tokens (sum_i t_i*h_i*w_i / merge**2, dim) for processor-ordered patches.

        Raises:
            ValueError: ``patches_nf`` rows differ from the patches ``grid_thw`` describes.
        """
        vision, m = self.components["vision"], self.cfg.spatial_merge_size
        grid_thw = grid_thw.cpu()  # read on the host below: one copy (a sync only if it lives on the GPU)
        pos_n2 = vision_patch_positions(grid_thw, m)
        if patches_nf.shape[0] != pos_n2.shape[0]:
            raise ValueError(f"pixel_values: {patches_nf.shape[0]} patches but image_grid_thw describes "
                             f"{pos_n2.shape[0]}")
        cos, sin = vision_rope_cos_sin(self._vision_rope, self.cfg.vision_head_dim,
                                       pos_n2.to(patches_nf.device, non_blocking=True))
        segments = vision_segments(grid_thw)
        x_bsd = vision.layers[0](patches_nf)[None]
        for block in vision.layers[1:-1]:
            x_bsd = block(x_bsd, cos_sin=(cos[None], sin[None]), segments=segments)
        return vision.layers[-1](x_bsd[0])

    def forward(self, ids_bs: torch.Tensor, pixel_values: torch.Tensor | None = None,
                image_grid_thw: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, pixel_values_videos: torch.Tensor | None = None,
                video_grid_thw: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (batch, seq, vocab) for token ids with image (video) placeholders filled by the ViT.

        pixel_values / image_grid_thw: processor-ordered patches (patches, C*T*p*p) and grids (images, 3);
        the same for videos. attention_mask: optional (batch, seq), 1 = real token. position_ids: optional
        (3, batch, seq) M-RoPE ids (default: :func:`lf_ir._mm_positions.mrope_position_ids`).

        Raises:
            ValueError: ``ids_bs`` not 2-D, or placeholder counts differ from the merged tokens.
        """
        x_bsd, *side = self.embed_inputs(ids_bs, pixel_values, image_grid_thw, attention_mask, position_ids,
                                         pixel_values_videos, video_grid_thw)
        return self.trunk_head(self.trunk_blocks(x_bsd, *side), *side)

    def embed_inputs(self, ids_bs: torch.Tensor, pixel_values: torch.Tensor | None = None,
                     image_grid_thw: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                     position_ids: torch.Tensor | None = None, pixel_values_videos: torch.Tensor | None = None,
                     video_grid_thw: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pipeline glue (:mod:`lf_ir._pipeline_glue`): the decoder's input and its side tensors.

        Takes :meth:`forward`'s inputs; returns ``(x_bsd, position_ids_b3s, key_padding_bs)``: the token
        embeddings with the merged image tokens (batch, seq, dim), the M-RoPE ids (batch, 3, seq) int64
        (batch first for transport) and the key padding (batch, seq) bool, True = real token. A pipeline
        cuts the inputs along dim 0 into micro-batches: the patch rows then stay with their samples only
        when every sample has the same number of patches.

        Raises:
            ValueError: as :meth:`forward`.
        """
        if ids_bs.dim() != 2:
            raise ValueError(f"input_ids: expected (batch, seq), got shape {tuple(ids_bs.shape)}")
        text, cfg = self.components["text"], self.cfg
        x_bsd = text.layers[0](ids_bs)
        for pixels, grid, token in ((pixel_values, image_grid_thw, cfg.image_token_id),
                                    (pixel_values_videos, video_grid_thw, cfg.video_token_id)):
            if pixels is not None:
                tokens_nd = self.encode_images(pixels, grid).to(x_bsd.dtype)
                where_bs = ids_bs == token
                _check_placeholders(where_bs, tokens_nd.shape[0], token)
                x_bsd = x_bsd.masked_scatter(where_bs[..., None], tokens_nd)
        if position_ids is None:
            position_ids = mrope_position_ids(ids_bs, image_grid_thw, image_token_id=cfg.image_token_id,
                                              spatial_merge_size=cfg.spatial_merge_size, attention_mask=attention_mask,
                                              video_grid_thw=video_grid_thw, video_token_id=cfg.video_token_id)
        padding_bs = (torch.ones_like(ids_bs, dtype=torch.bool) if attention_mask is None
                      else attention_mask.bool().to(ids_bs.device))
        return x_bsd, position_ids.transpose(0, 1), padding_bs

    def trunk_blocks(self, x_bsd: torch.Tensor, position_ids_b3s: torch.Tensor, key_padding_bs: torch.Tensor, *,
                     start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Pipeline glue: the decoder blocks among ``text`` nodes ``[start, stop)``; (batch, seq, dim) in and out."""
        cos_sin = mrope_cos_sin(self._mrope, self.cfg.head_dim, position_ids_b3s.transpose(0, 1), x_bsd.dtype)
        key_padding = None if bool(key_padding_bs.all()) else key_padding_bs
        for block in blocks_between(self.components["text"], start, stop):
            x_bsd = block(x_bsd, self.mask, key_padding, cos_sin=cos_sin)
        return x_bsd

    def trunk_head(self, x_bsd: torch.Tensor, *side: torch.Tensor) -> torch.Tensor:
        """Pipeline glue: final norm and head, logits (batch, seq, vocab)."""
        text = self.components["text"]
        return text.layers[-1](text.layers[-2](x_bsd))


SPEC = register_recipe(RecipeSpec(
    name="qwen2_vl", family="vlm", config_class=Qwen2VLConfig, sizes=SIZES, build_graph=build_graph,
    model=Qwen2VLModel, import_hf=lazy_function("lf_ir.interop", "import_hf_qwen2_vl"),
    export_hf=lazy_function("lf_ir.interop", "export_hf_qwen2_vl"),
    masks=("full", "causal"), tensor_parallel=True, sequence_parallel=True))
"""The qwen2_vl recipe (vlm family): bidirectional vision encoder, causal decoder."""
