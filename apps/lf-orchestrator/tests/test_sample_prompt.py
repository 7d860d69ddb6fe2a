"""`lf sample --prompt`: an empty prompt is refused, words the run's text vocabulary lacks are named in a warning.
Oracle: the word-level vocabulary built in the test from two Meta-World instructions (7 words)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lf_data import METAWORLD_INSTRUCTIONS, build_instruction_tokenizer
from lf_orchestrator.cli import app
from lf_orchestrator.config import load_config, to_toml
from lf_orchestrator.families._video_data import (
    save_text_encoder,
    save_trained_instructions,
    unknown_prompt_words,
    untrained_prompt,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
INSTRUCTIONS = [METAWORLD_INSTRUCTIONS["reach-v3"], METAWORLD_INSTRUCTIONS["push-v3"]]


@pytest.fixture(scope="module")
def video_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """A wan_dit run folder with its config and text encoder but no checkpoint (sampling then fails by name)."""
    run = tmp_path_factory.mktemp("video_run")
    (run / "config.toml").write_text(to_toml(load_config(EXAMPLES / "wan_t2v.toml")))
    tok = build_instruction_tokenizer(INSTRUCTIONS)
    save_text_encoder(run, tok, torch.zeros(tok.get_vocab_size(), 4))
    words = sorted({w for text in INSTRUCTIONS for w in text.lower().split()})
    return run, words


def _sample(run: Path, prompt: str):
    return CliRunner().invoke(app, ["sample", str(run), "--prompt", prompt, "--steps", "1"])


def test_empty_prompt_is_refused(video_run):
    """Exit 2 (usage) with a message naming --prompt, before the run is read; the library function refuses too."""
    run, _ = video_run
    for prompt in ("", "   "):
        out = _sample(run, prompt)
        assert out.exit_code == 2 and "--prompt is empty" in out.output, out.output
    from lf_orchestrator.families.video_sample import sample_clip

    with pytest.raises(ValueError, match="prompt: empty"):
        sample_clip(load_config(run / "config.toml"), run, " ")


def test_unknown_words_are_named_with_the_vocabulary_size(video_run):
    """Some words unknown, all unknown, none unknown (case-insensitive, as the tokenizer lowercases): the warning
    names exactly the unknown words (distinct, in prompt order; punctuation is a word to the tokenizer) and the
    known vocabulary; sampling then goes on (and stops here for want of a checkpoint)."""
    run, words = video_run
    assert unknown_prompt_words(run, "Fly over the goal, FLY!") == (["Fly", "over", ",", "!"], False, words)
    out = _sample(run, "Fly over the goal")
    text = " ".join(out.output.split())
    assert f"warning: some words of --prompt are not in the run's text vocabulary ({len(words)} known words: " \
           f"{', '.join(repr(w) for w in words)}); unknown, encoded as [UNK]: 'Fly', 'over'" in text
    assert out.exit_code == 2 and "no complete checkpoint" in text  # the warning does not stop sampling
    text = " ".join(_sample(run, "dance on mars").output.split())
    assert "warning: no word of --prompt is in the run's text vocabulary" in text
    assert "unknown, encoded as [UNK]: 'dance', 'on', 'mars'" in text
    assert "warning" not in _sample(run, INSTRUCTIONS[0].upper()).output


def test_a_prompt_the_run_did_not_train_on_is_named_in_a_warning(video_run, tmp_path):
    """The run trained on reach's instruction only (both instructions' words are in its vocabulary): push's
    instruction gets a warning naming the trained one; reach's, in capitals with a final period, does not; a run
    folder without trained_instructions.json (older runs) gets none."""
    run = tmp_path / "run"
    shutil.copytree(video_run[0], run)
    save_trained_instructions(run, [INSTRUCTIONS[0], INSTRUCTIONS[0]])
    assert untrained_prompt(run, INSTRUCTIONS[1]) == [INSTRUCTIONS[0]]
    assert untrained_prompt(run, f"  {INSTRUCTIONS[0].upper()}.") is None
    assert untrained_prompt(video_run[0], INSTRUCTIONS[1]) is None
    text = " ".join(_sample(run, INSTRUCTIONS[1]).output.split())
    assert (f"warning: --prompt is none of the 1 instruction(s) the run trained on ('{INSTRUCTIONS[0]}')") in text
    assert "not in the run's text vocabulary" not in text  # every word is known: only the new warning
    assert "none of the" not in " ".join(_sample(run, INSTRUCTIONS[0]).output.split())
