"""The wan_vae recipe (video_vae family) trained by the recipe trainer, and a wan_dit run that encodes with it.

Oracles: the held-out reconstruction L1 at fixed inputs before and after training (a falling loss), the
random-init VAE of the same size on the same clips (the trained VAE must reconstruct better and give other
latents), the per-channel statistics of the cached latents (the normalization makes them zero-mean, unit-std),
the trained weights read back from the run folder, and the mp4 written by `lf sample` from a copied run folder
(decoded with PyAV).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from lf_orchestrator.cli import app
from lf_orchestrator.config import ConfigError, load_config, to_toml
from lf_orchestrator.train import Trainer
from lf_parallel import init_distributed

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
DATA = ["data.source='lerobot'", "data.tasks=['reach-v3']", "data.image_size=32", "data.max_steps=60",
        "run.threads=1", "video.frames=5", "video.clip_stride=4"]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run fastest on one thread


@pytest.fixture(scope="module")
def vae(dataset_dir, tmp_path_factory) -> SimpleNamespace:
    """A tiny wan_vae run (the example config at 32 x 32, 5 frames), trained 24 steps: its run folder ``dir``,
    the evaluation ``before`` training, the ``summary`` and the trained ``weights``."""
    run_dir = tmp_path_factory.mktemp("vae") / "run"
    cfg = load_config(EXAMPLES / "wan_vae.toml", [
        *DATA, f"data.path='{dataset_dir}'", "model.size='tiny'", "model.overrides={}", "train.steps=24",
        "train.ckpt_every=24", "train.global_batch=4", "parallel.micro_batch=4", "train.warmup_steps=2",
        "train.lr=3e-3", "train.log_every=1", "vae.eval_clips=4", "vae.eval_fraction=0.34"])
    run_dir.mkdir(parents=True)
    (run_dir / "config.toml").write_text(to_toml(cfg))  # what `lf run` writes
    trainer = Trainer(cfg, run_dir, init_distributed("cpu"))
    before = trainer.evaluate()
    summary = trainer.fit()
    return SimpleNamespace(dir=run_dir, before=before, summary=summary,
                           weights={k: v.clone() for k, v in trainer.model.state_dict().items()})


def test_vae_recipe_trains_and_held_out_reconstruction_improves(vae):
    """The held-out posterior-mean reconstruction L1 falls below 0.8 x the initial one, PSNR rises; the run
    folder's checkpoint holds the trained weights (read back by the video family's loader)."""
    from lf_orchestrator.families._vae_run import load_run_vae

    before, after = vae.before, vae.summary["eval"]
    assert after["eval/l1"] < 0.8 * before["eval/l1"]
    assert after["eval/psnr"] > before["eval/psnr"] + 1.0
    loaded = load_run_vae(vae.dir).state_dict()
    assert loaded.keys() == vae.weights.keys()
    assert all(torch.equal(loaded[k], vae.weights[k]) for k in loaded)


def _dit(dataset_dir: Path, tmp_path: Path, *extra: str):
    return load_config(EXAMPLES / "wan_t2v.toml", [
        *DATA, f"data.path='{dataset_dir}'", f"video.cache_dir='{tmp_path / 'latents'}'", "train.steps=4",
        "train.ckpt_every=4", "train.warmup_steps=1", "train.log_every=1", *extra])


def test_dit_run_encodes_with_the_trained_vae_and_lf_sample_uses_it(vae, dataset_dir, tmp_path):
    """A wan_dit run with video.vae_weights = the wan_vae run folder: its latents differ from the random-init
    VAE's, are normalized by their own statistics (per-channel mean 0, std 1), decode(encode(x)) is closer to x
    than with the random-init VAE, and `lf sample` on a copy of the run folder (the VAE run folder gone) decodes
    with the trained VAE that the run folder carries."""
    import av

    from lf_orchestrator.families._metaworld import open_dataset
    from lf_orchestrator.families._vae_run import VAE_FILE
    from lf_orchestrator.families._video_data import build_vae
    from lf_orchestrator.families.video_vae import VideoVAEFamily

    vae_run = vae.dir

    random_cfg = _dit(dataset_dir, tmp_path)
    trained_cfg = _dit(dataset_dir, tmp_path, f"video.vae_weights='{vae_run}'")
    ctx = init_distributed("cpu")
    random_trainer = Trainer(random_cfg, tmp_path / "random", ctx)
    run_dir = tmp_path / "trained"
    trainer = Trainer(trained_cfg, run_dir, ctx)
    assert trainer.family.latents.shape == random_trainer.family.latents.shape
    assert not torch.allclose(trainer.family.latents, random_trainer.family.latents, atol=1e-2)
    per_channel = trainer.family.latents.transpose(0, 1).flatten(1)
    assert torch.allclose(per_channel.mean(1), torch.zeros(4), atol=1e-4)
    assert torch.allclose(per_channel.std(1), torch.ones(4), atol=1e-3)

    vae_cfg = load_config(vae_run / "config.toml")
    fam = VideoVAEFamily(vae_cfg, vae_run, ctx)
    fam.prepare()
    video = fam.clips(fam.eval_starts[:4])
    errors = {}
    with torch.no_grad():
        for name, cfg in (("random", random_cfg), ("trained", trained_cfg)):
            vae = build_vae(cfg.video)
            errors[name] = float((vae.decode(vae.encode(video)[0]) - video).abs().mean())
    assert errors["trained"] < 0.8 * errors["random"], errors
    assert open_dataset(trained_cfg, generate=False).root == Path(dataset_dir)

    trainer.fit()
    (run_dir / "config.toml").write_text(to_toml(trained_cfg))  # what `lf run` writes
    copy = tmp_path / "copied" / "run"
    shutil.copytree(run_dir, copy)
    shutil.move(vae_run, tmp_path / "vae-moved")  # the sample must not need the VAE run folder
    try:
        assert (copy / VAE_FILE).is_file()
        out = tmp_path / "clip.mp4"
        result = CliRunner().invoke(app, ["sample", str(copy), "--prompt", "reach the red goal position",
                                          "--steps", "2", "--out", str(out)])
        assert result.exit_code == 0, result.output
        with av.open(str(out)) as c:
            decoded = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
        assert len(decoded) == 5 and decoded[0].shape == (32, 32, 3)
        for flag, message in (("--steps", "--steps must be >= 1, got 0"), ("--frames", "--frames must be >= 1")):
            result = CliRunner().invoke(app, ["sample", str(copy), "--prompt", "reach", flag, "0",
                                              "--out", str(tmp_path / "zero.mp4")])
            assert result.exit_code != 0 and message in result.output, result.output
        sampled = build_vae(load_config(copy / "config.toml").video, run_dir=copy)
        trained = build_vae(trained_cfg.video, run_dir=run_dir)
        assert sampled.cfg == trained.cfg
        assert all(torch.equal(a, b) for a, b in zip(sampled.state_dict().values(), trained.state_dict().values(),
                                                     strict=True))
    finally:
        shutil.move(tmp_path / "vae-moved", vae_run)


def test_dit_config_refuses_a_vae_run_of_another_size(vae, dataset_dir, tmp_path):
    """Oracle: the config checker's contract: video.vae_size must name the wan_vae run's model.size (the
    message names the key, the run's size and the value received); a non-wan_vae folder is refused too."""
    vae_run = vae.dir
    with pytest.raises(ConfigError, match=r"video.vae_size: expected the model.size of the wan_vae run .*'tiny'.*"
                                          r"'wan2.1'"):
        _dit(dataset_dir, tmp_path, f"video.vae_weights='{vae_run}'", "video.vae_size='wan2.1'")
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.toml").write_text(to_toml(load_config(EXAMPLES / "wan_t2v.toml")))
    with pytest.raises(ConfigError, match="is a model.recipe = 'wan_dit' run, expected a 'wan_vae' run"):
        _dit(dataset_dir, tmp_path, f"video.vae_weights='{other}'")


def test_vae_refuses_frames_of_another_size(dataset_dir, tmp_path):
    """The VAE (and its latent noise) is sized by ``data.image_size``: a dataset of 32-pixel frames under a
    16-pixel config is refused naming the field and the dataset's size, before any training."""
    from lf_orchestrator.families.video_vae import VideoVAEFamily

    cfg = load_config(EXAMPLES / "wan_vae.toml", [*DATA, f"data.path='{dataset_dir}'", "data.image_size=16",
                                                  "model.size='tiny'", "model.overrides={}"])
    family = VideoVAEFamily(cfg, tmp_path, init_distributed("cpu"))
    with pytest.raises(ValueError, match=r"data.image_size.*32 x 32"):
        family.prepare()


def test_vae_weights_that_are_no_vae_are_refused_by_name(tmp_path):
    """``video.vae_weights`` naming a missing path or a file that is not safetensors fails naming the key (a
    FileNotFoundError / ValueError that `lf run` prints), not with a raw OS or safetensors error."""
    from lf_orchestrator.families._video_data import build_vae

    garbage = tmp_path / "vae.safetensors"
    garbage.write_bytes(b"not a safetensors file" * 8)
    with pytest.raises(ValueError, match="video.vae_weights: .* is not a safetensors file"):
        build_vae(SimpleNamespace(vae_weights=str(garbage), vae_size="tiny", vae_seed=0))
    with pytest.raises(FileNotFoundError, match="video.vae_weights"):
        build_vae(SimpleNamespace(vae_weights=str(tmp_path / "missing"), vae_size="tiny", vae_seed=0))
