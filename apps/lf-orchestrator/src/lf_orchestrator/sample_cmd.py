"""`lf sample`: generate a clip from a trained video-family run (``model.recipe = "wan_dit"``).

Integrates the learned rectified flow from noise with ``lf_ir.flow.euler_sample``
(shifted sigma schedule, classifier-free guidance against the null text states),
decodes the latents with the run's Wan VAE and writes an mp4 with PyAV
(``lf_data.write_video``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from lf_orchestrator._console import fail, make_console
from lf_orchestrator._options import SAMPLE_KEYS, SetOpt, load_trained_run, set_keys

console = make_console(stderr=True)


def _fail(message: str) -> None:
    fail(console, message)


def sample_cmd(run_dir: Annotated[Path, typer.Argument(help="A video-family run folder made by `lf run`.")],
               prompt: Annotated[str, typer.Option(help="Text prompt (e.g. a Meta-World task instruction).")],
               out: Annotated[Path, typer.Option(help="Output mp4 file.")] = Path("clip.mp4"),
               frames: Annotated[Optional[int], typer.Option(
                   help="Frames, 4k + 1 (default: the run's video.frames).")] = None,
               steps: Annotated[Optional[int], typer.Option(
                   help="Euler steps (default: the run's video.sample_steps).")] = None,
               guidance: Annotated[Optional[float], typer.Option(
                   help="Classifier-free guidance scale (default: the run's video.guidance).")] = None,
               seed: Annotated[int, typer.Option(help="Noise seed.")] = 0,
               fps: Annotated[int, typer.Option(help="Frames per second of the mp4.")] = 10,
               overrides: SetOpt = None):
    """Sample a video from a trained text-to-video run and write it as an mp4.

    An empty prompt is refused. Words of the prompt that the run's text vocabulary (the words of its training
    instructions) lacks encode as the unknown token: a warning names them and the vocabulary's size. A prompt
    that is none of the instructions the run trained on (``trained_instructions.json``) gets a warning naming
    them.

    --set changes, in memory only, the sampling keys of the run's config.toml: video.frames, video.sample_steps,
    video.guidance, video.shift, run.threads (any other key is refused by name; a key that an option given here
    also sets, e.g. --steps with --set video.sample_steps, too)."""
    from lf_orchestrator.config import ConfigError

    if not prompt.strip():
        _fail("--prompt is empty; give the text to generate a clip for (e.g. a task instruction the run trained on)")
    if not (run_dir / "config.toml").is_file():
        _fail(f"{run_dir}: not a run folder (no config.toml)" if run_dir.exists() else f"{run_dir}: no such folder")
    try:
        cfg = load_trained_run(run_dir, overrides, SAMPLE_KEYS, "lf sample", {
            "video.frames": ("--frames", frames), "video.sample_steps": ("--steps", steps),
            "video.guidance": ("--guidance", guidance)}, hint="lf sample runs on the CPU")
    except ConfigError as err:
        _fail(str(err))
    if "run.threads" in set_keys(overrides):
        import os

        import torch

        torch.set_num_threads(cfg.run.threads or os.cpu_count() or 1)
    if cfg.model.recipe != "wan_dit":
        _fail(f"{run_dir}: model.recipe is {cfg.model.recipe!r}; `lf sample` needs a video run (wan_dit)")
    from lf_orchestrator.families._video_data import unknown_prompt_words, untrained_prompt
    from lf_orchestrator.families.video_sample import sample_video

    try:
        _warn_unknown_words(*unknown_prompt_words(run_dir, prompt))
        trained = untrained_prompt(run_dir, prompt)
        if trained is not None:
            shown = "; ".join(repr(t) for t in trained[:8]) + ("; ..." if len(trained) > 8 else "")
            console.print(f"[bold yellow]warning:[/] --prompt is none of the {len(trained)} instruction(s) the run "
                          f"trained on ({escape(shown)}): expect a clip of what it learned, not of this prompt",
                          highlight=False, soft_wrap=True)
        path, shape = sample_video(cfg, run_dir, prompt, out=out, frames=frames, steps=steps, guidance=guidance,
                                   seed=seed, fps=fps)
    except (ValueError, FileNotFoundError) as err:
        _fail(str(err))
    console.print(f"wrote {path} ({shape[0]} frames of {shape[1]}x{shape[2]})")


def _warn_unknown_words(unknown: list[str], all_unknown: bool, known: list[str]) -> None:
    """Print a warning naming the prompt's words that the run's text vocabulary lacks (none: nothing)."""
    if not unknown:
        return
    what = "no word of --prompt is" if all_unknown else "some words of --prompt are not"
    shown = ", ".join(repr(w) for w in known[:12]) + (", ..." if len(known) > 12 else "")
    words = ", ".join(repr(w) for w in unknown)
    console.print(f"[bold yellow]warning:[/] {what} in the run's text vocabulary ({len(known)} known words: "
                  f"{escape(shown)}); unknown, encoded as \\[UNK]: {escape(words)}", highlight=False, soft_wrap=True)
