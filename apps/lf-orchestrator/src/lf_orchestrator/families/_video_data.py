"""Video-family data: the Wan VAE, cached clip latents, and the tiny text encoder.

Clips: ``video.frames`` (4k + 1) consecutive frames of one Meta-World episode,
starting every ``video.clip_stride`` frames, scaled to [-1, 1] and encoded once by
the Wan VAE (``lf_ir.recipes.wan_vae``, chunked causal encoding, latent mean,
then ``normalize_latents``). Cache (atomic: hidden folder, then rename):
``<video.cache_dir>/<key>/latents.safetensors`` with ``latents`` (clips, z, f, h, w)
float32, ``task_index`` (clips,) and the normalization's ``latents_mean`` / ``latents_std`` (z,),
keyed by the dataset's ``info.json`` (and, for ``data.source = "lerobot"``, the tasks and frames per episode
read), the VAE settings and the clip layout. A VAE trained by a
``wan_vae`` run (``video.vae_weights`` names its folder) normalizes with the statistics of these
clips' latents (:mod:`._vae_run`).

Text encoder ``"embedding"``: a fixed N(0, 1) table (words, text_dim) seeded by
``run.seed``, looked up for the instruction's word ids (``lf_data``'s word-level
tokenizer), zero on padding, ``text_len`` tokens: (text_len, text_dim) per task.
Saved in the run folder (``text_encoder.safetensors`` + ``instruction_tokenizer.json``)
so ``lf sample`` encodes new prompts the same way.

Legend: ``video_bcthw`` (batch, 3, frames, H, W); ``latent_bcfhw`` (batch, z, latent frames, h, w).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from lf_orchestrator._atomic import atomic_dir, atomic_path, write_text_atomic

FORMAT = 2


def build_vae(v, device: torch.device | str = "cpu", run_dir: Path | None = None):
    """The Wan VAE of a video run: the run folder's ``vae.safetensors`` when ``run_dir`` has one (a trained VAE
    with its latent statistics, :mod:`._vae_run`), else the wan_vae run named by ``video.vae_weights`` (a folder),
    else ``video.vae_size`` with the ``video.vae_weights`` file loaded, else lf-ir's init with ``video.vae_seed``.

    Raises:
        FileNotFoundError: ``video.vae_weights`` names a missing file, or a run folder without a checkpoint.
        ValueError: ``video.vae_weights`` is not a safetensors file.
    """
    from lf_ir import materialize
    from lf_ir.recipes.wan_vae import WanVAE, wan_vae_config
    from lf_orchestrator.families._vae_run import VAE_FILE, is_vae_run, load_run_vae, load_vae_file

    if run_dir is not None and (Path(run_dir) / VAE_FILE).is_file():
        return load_vae_file(Path(run_dir) / VAE_FILE, device)
    if is_vae_run(v.vae_weights):
        return load_run_vae(v.vae_weights, device)

    with torch.device("meta"):
        vae = WanVAE(wan_vae_config(v.vae_size))
    vae = materialize(vae, device, seed=v.vae_seed)
    if v.vae_weights:
        if not Path(v.vae_weights).is_file():
            raise FileNotFoundError(f"video.vae_weights: no file {v.vae_weights}")
        try:
            state = load_file(v.vae_weights, device=str(device))
        except SafetensorError as err:
            raise ValueError(f"video.vae_weights: {v.vae_weights} is not a safetensors file ({err})") from None
        vae.load_state_dict(state)
    return vae.eval().requires_grad_(False)


def _key(cfg, dataset_root: Path) -> str:
    v = cfg.video
    from lf_orchestrator.families._metaworld import dataset_selection
    from lf_orchestrator.families._vae_run import is_vae_run, run_vae_id

    weights = ""
    if is_vae_run(v.vae_weights):
        weights = run_vae_id(v.vae_weights)
    elif v.vae_weights:
        if not Path(v.vae_weights).is_file():
            raise FileNotFoundError(f"video.vae_weights: {v.vae_weights} is neither a wan_vae run folder nor a "
                                    "VAE weights file")
        st = Path(v.vae_weights).stat()
        weights = f"{Path(v.vae_weights).resolve()}:{st.st_size}:{st.st_mtime_ns}"
    info = (dataset_root / "meta" / "info.json").read_text()
    selection = dataset_selection(cfg)  # a lerobot dataset's data.tasks / data.max_steps; none for metaworld
    text = json.dumps([FORMAT, info, str(dataset_root), v.vae_size, v.vae_seed, weights, v.frames, v.clip_stride,
                       *([selection] if selection else [])])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def clip_starts(dataset, frames: int, stride: int) -> list[tuple[int, int]]:
    """(start frame, task index) of every clip: ``frames`` consecutive frames inside one episode."""
    out = []
    for a, b in dataset.episode_ranges:
        out += [(s, int(dataset[s]["task_index"])) for s in range(a, b - frames + 1, stride)]
    return out


def encode_clips(cfg, dataset, batch: int = 4, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Latents of every clip (CPU tensors; cached, see the module docstring), encoded ``batch`` clips at a time on
    ``device``. Raises ValueError when no episode is long enough."""
    from lf_orchestrator.families._vae_run import is_vae_run, latent_stats, with_stats

    v = cfg.video
    final = Path(v.cache_dir) / _key(cfg, Path(dataset.root))
    if (final / "latents.safetensors").is_file():
        return load_file(str(final / "latents.safetensors"))
    starts = clip_starts(dataset, v.frames, v.clip_stride)
    if not starts:
        raise ValueError(f"video.frames: no episode of {dataset.root} has {v.frames} frames")
    vae, latents = build_vae(v, device), []
    with torch.no_grad():
        for i in range(0, len(starts), batch):
            clips = [torch.stack([torch.as_tensor(dataset.image(s + j)) for j in range(v.frames)])
                     for s, _ in starts[i:i + batch]]
            video_bcthw = torch.stack(clips).permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0
            latents.append(vae.encode(video_bcthw.to(device))[0].cpu())
    raw = torch.cat(latents)
    if is_vae_run(v.vae_weights):  # a trained VAE without published statistics: those of these clips
        with_stats(vae, *latent_stats(raw))
    tensors = {"latents": vae.normalize_latents(raw).contiguous(),
               "task_index": torch.tensor([t for _, t in starts]),
               "latents_mean": torch.tensor(vae.cfg.latents_mean), "latents_std": torch.tensor(vae.cfg.latents_std)}
    with atomic_dir(final) as tmp:  # another process that finished first keeps its copy
        save_file(tensors, str(tmp / "latents.safetensors"))
    return tensors


def text_table(vocab: int, text_dim: int, seed: int) -> torch.Tensor:
    """The fixed embedding table (vocab, text_dim) float32 of the ``embedding`` text encoder."""
    return torch.randn(vocab, text_dim, generator=torch.Generator().manual_seed(seed))


def encode_text(tok, table: torch.Tensor, texts: list[str], text_len: int) -> torch.Tensor:
    """Text states (len(texts), text_len, text_dim): table rows of the word ids, zero on padding (id 0)."""
    from lf_data import encode_instructions

    ids, mask = encode_instructions(tok, texts, text_len)
    ids_t = torch.as_tensor(ids, dtype=torch.long)
    return table[ids_t] * torch.as_tensor(mask, dtype=torch.float32)[..., None]


def save_text_encoder(run_dir: Path, tok, table: torch.Tensor) -> None:
    """Write ``instruction_tokenizer.json`` and ``text_encoder.safetensors`` into the run folder (each atomically:
    a reader sees the old file or the new one)."""
    write_text_atomic(Path(run_dir) / "instruction_tokenizer.json", tok.to_str(pretty=True))
    with atomic_path(Path(run_dir) / "text_encoder.safetensors") as tmp:
        save_file({"embedding": table.contiguous()}, str(tmp))


TRAINED_FILE = "trained_instructions.json"
"""Run-folder file: the instructions of the clips the run trained on (what `lf sample` can expect to know)."""


def save_trained_instructions(run_dir: Path, instructions: list[str]) -> None:
    """Write :data:`TRAINED_FILE` (a JSON list, sorted, distinct) atomically."""
    from lf_orchestrator.checkpoint import write_text_atomic

    write_text_atomic(Path(run_dir) / TRAINED_FILE, json.dumps(sorted(set(instructions)), indent=1))


def _normalized(text: str) -> str:
    return " ".join(text.lower().split()).rstrip(".")


def untrained_prompt(run_dir: Path, prompt: str) -> list[str] | None:
    """The run's trained instructions when ``prompt`` is none of them (compared lowercased, whitespace collapsed,
    a final period ignored); None when it is one, or the run folder predates :data:`TRAINED_FILE`."""
    path = Path(run_dir) / TRAINED_FILE
    if not path.is_file():
        return None
    trained = json.loads(path.read_text())
    return None if _normalized(prompt) in {_normalized(t) for t in trained} else trained


def unknown_prompt_words(run_dir: Path, prompt: str) -> tuple[list[str], bool, list[str]]:
    """The words of ``prompt`` that the run's instruction tokenizer maps to ``[UNK]`` (distinct after lowercasing,
    as first written, in prompt order),
    whether every word of it is one, and the words the tokenizer knows (sorted). Reads only
    ``instruction_tokenizer.json``.

    Raises:
        FileNotFoundError: the run folder has no ``instruction_tokenizer.json`` (names it).
    """
    from tokenizers import Tokenizer

    from lf_data.text import UNK_ID

    path = Path(run_dir) / "instruction_tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: missing {path.name} (not a video-family run folder?)")
    tok = Tokenizer.from_file(str(path))
    enc = tok.encode(prompt, add_special_tokens=False)
    unknown = [prompt[a:b] for i, (a, b) in zip(enc.ids, enc.offsets, strict=True) if i == UNK_ID]
    known = sorted(set(tok.get_vocab(with_added_tokens=False)) - {"[PAD]", "[UNK]"})
    distinct: dict[str, str] = {}  # the tokenizer lowercases: 'Fly' and 'fly' are one word
    for word in unknown:
        distinct.setdefault(tok.normalizer.normalize_str(word), word)
    return list(distinct.values()), len(unknown) == len(enc.ids), known


def load_text_encoder(run_dir: Path):
    """(tokenizer, table) saved by :func:`save_text_encoder`; FileNotFoundError naming a missing file."""
    from tokenizers import Tokenizer

    for name in ("instruction_tokenizer.json", "text_encoder.safetensors"):
        if not (Path(run_dir) / name).is_file():
            raise FileNotFoundError(f"{run_dir}: missing {name} (not a video-family run folder?)")
    return (Tokenizer.from_file(str(Path(run_dir) / "instruction_tokenizer.json")),
            load_file(str(Path(run_dir) / "text_encoder.safetensors"))["embedding"])
