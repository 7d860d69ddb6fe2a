"""Config sections of the LLM, VLM and video families (``[corpus]``, ``[vlm]``, ``[video]``).

Kept out of ``config.py`` so that file only names them; like every section they
are frozen, keyword-only msgspec structs that reject unknown keys, and this
module imports no torch. :data:`FAMILY_READS` says which sections and keys each
family reads (a key it does not read is a config error).
"""

from __future__ import annotations

from typing import Literal

import msgspec


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class CorpusSection(_Section):
    """Text corpus of the ``llm`` family (``model.recipe = "llama3"``)."""

    source: Literal["stdlib_docstrings"] = "stdlib_docstrings"
    """``stdlib_docstrings``: the docstrings of the running Python's standard library (module, class and
    function docstrings of every ``.py`` file under ``sysconfig``'s ``stdlib`` path, files in sorted order):
    English prose shipped with every Python, so the corpus needs no network; it depends on the Python
    version, which is part of the cache key."""
    cache_dir: str = ".lf-cache/corpus"
    """Folder of the cached corpus + tokenizer (one subfolder per content key, written atomically)."""
    max_chars: int = 400_000
    """Stop collecting documents after this many characters (files in sorted order: deterministic)."""
    min_chars: int = 80
    """Skip docstrings shorter than this."""
    seq_len: int = 128
    """Tokens per packed row (documents packed by ``lf_data.pack_sequences``; longer ones are cut into pieces)."""
    eval_fraction: float = 0.05
    """Share of documents held out for the evaluation perplexity (chosen by a hash of the document)."""


class VLMSection(_Section):
    """Image-text SFT of the ``vlm`` family (``model.recipe = "qwen2_vl"``) on Meta-World frames."""

    prompt: str = "What is the robot doing?"
    """User turn after the image; the answer is the episode's task instruction."""
    image_size: int = 56
    """Frames are resized to this square side (pixels, a multiple of patch_size * spatial_merge_size)."""
    frame_stride: int = 4
    """Use every n-th frame of each episode."""
    eval_fraction: float = 0.1
    """Share of episodes held out for the evaluation (answer-token accuracy)."""


class VideoSection(_Section):
    """Text-to-video of the ``video`` family (``model.recipe = "wan_dit"``) on Meta-World clips."""

    frames: int = 9
    """Frames per clip (4k + 1, the Wan VAE's causal layout)."""
    clip_stride: int = 8
    """Frames between the starts of consecutive clips of an episode."""
    vae_size: str = "tiny"
    """``lf_ir.recipes.wan_vae`` size. ``tiny`` uses its deterministic init (seed ``vae_seed``): fine for the CPU
    example, meaningless latents for real use; full-size runs give ``vae_weights``."""
    vae_weights: str = ""
    """Optional safetensors file of VAE weights in lf-ir naming (``lf convert`` of the diffusers checkpoint)."""
    vae_seed: int = 0
    """Init seed of the VAE when no weights are given."""
    cache_dir: str = ".lf-cache/wan-latents"
    """Folder of the cached VAE latents (one subfolder per content key, written atomically)."""
    text_encoder: Literal["embedding"] = "embedding"
    """``embedding``: a fixed, seeded embedding table over the instruction's words (the tiny default),
    cached per task; the DiT's text projection learns on top. (umT5 would plug in here for full size.)"""
    cfg_dropout: float = 0.1
    """Probability of replacing a sample's text states by the null (zero) states (classifier-free guidance)."""
    sigma_distribution: Literal["uniform", "logit_normal"] = "logit_normal"
    """Training noise-level distribution (``lf_ir.flow.sample_sigmas``)."""
    shift: float = 3.0
    """Timestep shift of training and sampling sigmas (SD3 eq. 23; Wan uses 3-5)."""
    sample_steps: int = 20
    """Euler steps of ``lf sample``."""
    guidance: float = 4.0
    """Classifier-free guidance scale of ``lf sample`` (1 = no guidance)."""
    latents: Literal["vae", "synthetic"] = "vae"
    """``vae``: Meta-World clips of ``data.image_size`` encoded by the Wan VAE and cached. ``synthetic``: N(0, 1)
    latents of the shape a ``frames`` x ``height`` x ``width`` clip encodes to, drawn per clip index (no dataset,
    no VAE): for throughput / memory runs only (e.g. 385 frames at 480x832), the loss means nothing
    (``lf_orchestrator.families._video_synthetic`` says why)."""
    height: int = 480
    """With ``latents = "synthetic"``: clip height, pixels (a multiple of the VAE stride x patch, 16)."""
    width: int = 832
    """With ``latents = "synthetic"``: clip width, pixels (a multiple of the VAE stride x patch, 16)."""
    synthetic_clips: int = 64
    """With ``latents = "synthetic"``: distinct training clips (indices of the sampler)."""


class VAESection(_Section):
    """Training of the Wan VAE by the ``video_vae`` family (``model.recipe = "wan_vae"``) on Meta-World clips;
    the clips are ``video.frames`` frames every ``video.clip_stride`` at ``data.image_size``."""

    kl_weight: float = 1e-4
    """Weight of the KL term against the L1 reconstruction, both means per element (latent elements, pixels)."""
    eval_fraction: float = 0.1
    """Share of episodes held out for the evaluation (every ``round(1 / eval_fraction)``-th episode)."""
    eval_clips: int = 16
    """Held-out clips the evaluation reconstructs."""


ALL_KEYS = None
"""In :data:`FAMILY_READS`: the family reads every key of the section."""

_METAWORLD_DATA = ("source", "path", "tasks", "episodes_per_task", "image_size", "max_steps", "seed", "workers")
"""The ``[data]`` keys of the Meta-World episodes the vlm / video / video_vae families train on
(``families._metaworld.open_dataset``)."""

COMMON_READS: dict[str, tuple[str, ...] | None] = {
    "run": ALL_KEYS, "model": ALL_KEYS, "train": ALL_KEYS, "memory": ALL_KEYS, "parallel": ALL_KEYS,
    "data": ("prefetch",), "eval": ("at_end",),
}
"""Sections (and keys) the trainer reads for every family: section -> its keys, or :data:`ALL_KEYS`."""

FAMILY_READS: dict[str, dict[str, tuple[str, ...] | None]] = {
    "llm": {"corpus": ALL_KEYS},
    "vlm": {"vlm": ALL_KEYS, "data": _METAWORLD_DATA},
    "video": {"video": ALL_KEYS, "data": _METAWORLD_DATA},
    "video_vae": {"vae": ALL_KEYS, "video": ("frames", "clip_stride"), "data": _METAWORLD_DATA},
    "vla": {"data": ALL_KEYS, "eval": ALL_KEYS, "action_tokenizer": ALL_KEYS},
    "vla_flow": {"data": ALL_KEYS, "eval": ALL_KEYS},
}
"""What each family reads beyond :data:`COMMON_READS` (keys add to the common ones): family -> section -> keys,
or :data:`ALL_KEYS`. A section or key of the config that the chosen family does not read, written in the TOML file
or by ``--set``, is an error naming it (``lf_orchestrator._config_unread``); the run folder's ``config.toml`` holds
exactly these sections (``lf_orchestrator.config.to_toml``)."""

UNREAD_WHY: dict[tuple[str, str], str] = {
    ("vla_flow", "action_tokenizer"): "its actions are continuous, normalized by the dataset mean/std",
    ("llm", "eval"): "closed-loop evaluation in Meta-World is the VLA's; the llm family reports held-out perplexity",
    ("vlm", "eval"): "closed-loop evaluation in Meta-World is the VLA's; the vlm family reports answer accuracy",
    ("video", "eval"): "closed-loop evaluation in Meta-World is the VLA's",
    ("video_vae", "eval"): "closed-loop evaluation in Meta-World is the VLA's",
}
"""(family, section) -> why the family does not read (part of) the section, added to the error."""


def family_reads(family: str) -> dict[str, tuple[str, ...] | None]:
    """Section -> keys (or :data:`ALL_KEYS`) that ``family`` reads: :data:`COMMON_READS` and the family's entries.

    Raises:
        KeyError: ``family`` is not a key of :data:`FAMILY_READS`.
    """
    reads = dict(COMMON_READS)
    for section, keys in FAMILY_READS[family].items():
        common = reads.get(section, ())
        reads[section] = ALL_KEYS if keys is ALL_KEYS or common is ALL_KEYS else (*common, *keys)
    return reads
