"""``--set`` on `lf eval RUN` and `lf sample RUN` (issue 25: every command that reads a config takes it): the keys
that do not change the trained model are applied in memory, every other key is refused by name with the allowed
ones, a misspelled key gets the closest valid one, and a key that an explicit option also sets is refused.

Oracles: the evaluation report the command writes (episodes per task, max_steps, eval seed, whether the random
baseline ran), the config the sampler receives, and the run's config.toml, byte for byte unchanged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lf_orchestrator._options import EVAL_KEYS, SAMPLE_KEYS
from lf_orchestrator.cli import app
from lf_orchestrator.config import load_config, to_toml

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run fastest on one thread

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _invoke(*args) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), \
        f"a traceback instead of an error message: {result.exception!r}\n{result.output}"
    return result.exit_code, " ".join(result.output.split())


def _sets(*items: str) -> list[str]:
    return [a for item in items for a in ("--set", item)]


def test_eval_applies_set_in_memory(vla_run, tmp_path):
    """`lf eval RUN --set eval.episodes=1 --set eval.max_steps=5 ...`: the written report records 1 episode per task,
    max_steps 5, eval seed 7 and no random baseline (the run's config says 2, 20, 100000 and yes); config.toml is
    unchanged."""
    run = Path(shutil.copytree(vla_run, tmp_path / "run"))
    before = (run / "config.toml").read_bytes()
    code, out = _invoke("eval", run, *_sets("eval.episodes=1", "eval.max_steps=5", "eval.seed=7",
                                            "eval.random_baseline=false", "run.threads=1", "run.device=cpu"))
    assert code == 0, out
    (report_path,) = run.glob("eval-*.json")
    report = json.loads(report_path.read_text())
    (row,) = report["tasks"]
    assert (row["episodes"], len(row["vla_successes"]), report["max_steps"], report["eval_seed"]) == (1, 1, 5, 7)
    assert "random_success" not in row
    assert (run / "config.toml").read_bytes() == before
    cfg = load_config(run / "config.toml")
    assert (cfg.eval.episodes, cfg.eval.max_steps) == (2, 20)


def test_eval_refuses_keys_that_change_the_trained_model(vla_run):
    """model.*, train.*, parallel.*, data.* and eval.at_end are refused by name with the allowed keys; a misspelled
    key gets "did you mean"; an option and --set of the same key are refused naming both; all exit 2 before any
    rollout."""
    allowed = f"allowed: {', '.join(EVAL_KEYS)}"
    for key in ("model.size=small", "train.steps=3", "parallel.dp=2", "data.image_size=16", "eval.at_end=true",
                "action_tokenizer.n_bins=64"):
        code, out = _invoke("eval", vla_run, "--set", key)
        name = key.partition("=")[0]
        assert code == 2 and f"lf eval: --set {name} cannot change for a trained run" in out and allowed in out, out
    code, out = _invoke("eval", vla_run, "--set", "eval.episdes=1")
    assert code == 2 and "unknown key 'eval.episdes'; did you mean 'eval.episodes'?" in out, out
    for option, key in ((["--episodes", "1"], "eval.episodes=2"), (["--no-random"], "eval.random_baseline=true"),
                        (["--device", "cpu"], "run.device=cpu")):
        code, out = _invoke("eval", vla_run, *option, "--set", key)
        name = key.partition("=")[0]
        assert code == 2 and f"--set {name} and {option[0]}" in out and f"both set {name}" in out, out
    code, out = _invoke("eval", vla_run, "--set", "eval.episodes=0")
    assert code == 2 and "eval.episodes: expected an integer >= 1, got 0" in out, out
    assert not list(vla_run.glob("eval-*.json"))


@pytest.fixture(scope="module")
def video_run(tmp_path_factory) -> Path:
    """A wan_dit run folder with its config and text encoder but no checkpoint (sampling itself is patched out)."""
    from lf_data import METAWORLD_INSTRUCTIONS, build_instruction_tokenizer
    from lf_orchestrator.families._video_data import save_text_encoder

    run = tmp_path_factory.mktemp("video_run")
    (run / "config.toml").write_text(to_toml(load_config(EXAMPLES / "wan_t2v.toml")))
    tok = build_instruction_tokenizer([METAWORLD_INSTRUCTIONS["reach-v3"]])
    save_text_encoder(run, tok, torch.zeros(tok.get_vocab_size(), 4))
    return run


def test_sample_applies_set_in_memory(video_run, tmp_path, monkeypatch):
    """`lf sample RUN --set video.sample_steps=3 --set video.guidance=1.5 --set video.frames=5 --set video.shift=2`:
    the config the sampler receives carries them (the options stay unset, so it reads them from there);
    config.toml is unchanged."""
    import lf_orchestrator.families.video_sample as video_sample
    from lf_data import METAWORLD_INSTRUCTIONS

    seen = {}

    def fake_sample_video(cfg, run_dir, prompt, **kw):
        seen.update(cfg=cfg, **kw)
        return kw["out"], (cfg.video.frames, 8, 8)

    monkeypatch.setattr(video_sample, "sample_video", fake_sample_video)
    before = (video_run / "config.toml").read_bytes()
    code, out = _invoke("sample", video_run, "--prompt", METAWORLD_INSTRUCTIONS["reach-v3"],
                        "--out", tmp_path / "clip.mp4",
                        *_sets("video.sample_steps=3", "video.guidance=1.5", "video.frames=5", "video.shift=2",
                               "run.threads=1"))
    assert code == 0, out
    v = seen["cfg"].video
    assert (v.sample_steps, v.guidance, v.frames, v.shift) == (3, 1.5, 5, 2.0)
    assert (seen["steps"], seen["guidance"], seen["frames"]) == (None, None, None)
    assert (video_run / "config.toml").read_bytes() == before


def test_sample_refuses_keys_that_change_the_trained_model(video_run):
    """model.*, train.*, video.cfg_dropout and run.device (sampling runs on the CPU) are refused by name with the
    allowed keys; a misspelled key gets "did you mean"; --steps with --set video.sample_steps is refused."""
    from lf_data import METAWORLD_INSTRUCTIONS

    prompt = ["--prompt", METAWORLD_INSTRUCTIONS["reach-v3"]]
    allowed = f"allowed: {', '.join(SAMPLE_KEYS)}"
    for key in ("model.size=small", "train.lora_rank=4", "video.cfg_dropout=0.0", "run.device=cuda"):
        code, out = _invoke("sample", video_run, *prompt, "--set", key)
        name = key.partition("=")[0]
        assert code == 2 and f"lf sample: --set {name} cannot change for a trained run" in out and allowed in out, out
    assert "lf sample runs on the CPU" in out
    code, out = _invoke("sample", video_run, *prompt, "--set", "video.sample_step=2")
    assert code == 2 and "unknown key 'video.sample_step'; did you mean 'video.sample_steps'?" in out, out
    code, out = _invoke("sample", video_run, *prompt, "--steps", "2", "--set", "video.sample_steps=3")
    assert code == 2 and "--set video.sample_steps and --steps both set video.sample_steps" in out, out
