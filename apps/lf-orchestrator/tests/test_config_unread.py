"""A config key that the recipe's family does not read is an error naming the file, the key, the recipe and what
its family reads (``lf_orchestrator._config_unread``; the table is ``families.sections.FAMILY_READS``).

Oracles: the messages written out by hand; the configs the project ships (the embedded default, ``examples/`` and
``examples/full/``), which must load as they are; what ``lf run`` writes into the run folder (``to_toml`` of the
config with absolute paths), which must load again to the same config, as ``--resume``, ``lf eval`` and
``lf sample`` read it; the ``Config`` struct itself for the names in the table.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from lf_ir import recipe_names
from lf_orchestrator.config import Config, ConfigError, load_config, to_toml
from lf_orchestrator.families.sections import ALL_KEYS, COMMON_READS, FAMILY_READS

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = [None, *sorted(ROOT.glob("examples/*.toml")), *sorted(ROOT.glob("examples/full/*.toml"))]
VLA_EXAMPLE = ROOT / "examples" / "vla_tokens.toml"
LLAMA_EXAMPLE = ROOT / "examples" / "llama3_pretrain.toml"


def _name(path) -> str:
    return "default" if path is None else str(Path(path).relative_to(ROOT))


@pytest.mark.parametrize("path", SHIPPED, ids=_name)
def test_every_shipped_config_loads_and_its_run_folder_copy_loads_back(path, tmp_path, monkeypatch):
    """The embedded default and every example load; the run folder's config.toml that ``lf run`` writes from it
    (absolute paths, only the sections the family reads) loads back to the same config (``lf run --resume``)."""
    from lf_orchestrator.run_folder import absolute_paths

    cfg = absolute_paths(load_config(path, check_paths=False))
    (tmp_path / "config.toml").write_text(written := to_toml(cfg))
    monkeypatch.chdir(tmp_path)  # --resume from another folder
    again = load_config(tmp_path / "config.toml", check_paths=False)
    assert to_toml(again) == written  # every key the family reads comes back (the others keep their defaults)
    assert again.model == cfg.model and again.train == cfg.train and again.parallel == cfg.parallel


def _expect(tmp_path, toml: str, overrides: list[str], message: str) -> None:
    path = tmp_path / "run.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as err:
        load_config(path, overrides, check_paths=False)
    assert str(err.value) == message.format(path=path)


def test_a_section_the_family_does_not_read_is_named_with_the_file(tmp_path):
    _expect(tmp_path, '[model]\nrecipe = "vla"\n[corpus]\nseq_len = 64\n', [],
            "{path}: corpus.seq_len: model.recipe = 'vla' (family vla) does not read [corpus]; the vla family "
            "reads [run], [model], [train], [memory], [parallel], [data], [eval], [action_tokenizer]. Remove it "
            "(recipes that read it: gemma, llama3)")
    _expect(tmp_path, '[model]\nrecipe = "llama3"\n[action_tokenizer]\nkind = "fast"\n', [],
            "{path}: action_tokenizer.kind: model.recipe = 'llama3' (family llm) does not read [action_tokenizer]; "
            "the llm family reads [run], [model], [train], [memory], [parallel], [data] (prefetch), [eval] (at_end), "
            "[corpus]. "
            "Remove it (recipes that read it: vla)")


def test_a_key_written_by_set_is_named_with_why():
    """Meta-World's closed-loop evaluation keys with llama3, through --set (defaults never count: the file has
    no [eval] section at all, nor [data])."""
    with pytest.raises(ConfigError) as err:
        load_config(LLAMA_EXAMPLE, ["eval.episodes=5"], check_paths=False)
    assert str(err.value) == (
        f"{LLAMA_EXAMPLE} with --set: eval.episodes: model.recipe = 'llama3' (family llm) does not read it "
        "(closed-loop evaluation in Meta-World is the VLA's; the llm family reports held-out perplexity); the llm "
        "family reads [run], [model], [train], [memory], [parallel], [data] (prefetch), [eval] (at_end), [corpus]. "
        "Remove it (recipes that read it: vla, vla_flow)")


def test_vla_flow_refuses_the_action_tokenizer_even_at_its_defaults(tmp_path):
    """The former vla_flow check compared the section with its defaults; now writing it at all is the error."""
    _expect(tmp_path, '[model]\nrecipe = "vla_flow"\nsize = "tiny"\n[action_tokenizer]\nkind = "binning"\n', [],
            "{path}: action_tokenizer.kind: model.recipe = 'vla_flow' (family vla_flow) does not read "
            "[action_tokenizer] (its actions are continuous, normalized by the dataset mean/std); the vla_flow "
            "family reads [run], [model], [train], [memory], [parallel], [data], [eval]. Remove it (recipes that "
            "read it: vla)")


def test_part_of_a_section(tmp_path):
    """wan_vae reads [video] frames and clip_stride only (its clips), not the DiT's sampling keys."""
    toml = '[model]\nrecipe = "wan_vae"\nsize = "tiny"\n[video]\nframes = 9\nshift = 2.0\n'
    _expect(tmp_path, toml, [],
            "{path}: video.shift: model.recipe = 'wan_vae' (family video_vae) does not read it; the video_vae "
            "family reads [run], [model], [train], [memory], [parallel], [data] (prefetch, source, path, tasks, "
            "episodes_per_task, image_size, max_steps, seed, workers), [eval] (at_end), [vae], [video] (frames, "
            "clip_stride). Remove it (recipes that read it: wan_dit)")


def test_what_the_trainer_applies_to_every_family_is_accepted():
    """train.lora_rank, train.freeze and parallel.spec apply to the VLA too (one trainer): never refused."""
    cfg = load_config(VLA_EXAMPLE, ["train.lora_rank=4", "train.freeze=['vision.*']", "parallel.plan=manual",
                                    "parallel.spec='dp=1'", "eval.at_end=false"], check_paths=False)
    assert (cfg.train.lora_rank, cfg.train.freeze, cfg.parallel.spec) == (4, ["vision.*"], "dp=1")


def test_the_table_names_real_sections_and_keys_and_covers_every_recipe():
    """Oracle: the Config struct. A typo in FAMILY_READS would make a real key an error (or hide one)."""
    from lf_orchestrator._config_unread import recipe_family

    fields = {name: msgspec.structs.fields(getattr(Config(), name)) for name in Config.__struct_fields__}
    for reads in [COMMON_READS, *FAMILY_READS.values()]:
        for section, keys in reads.items():
            assert section in fields, section
            assert keys is ALL_KEYS or set(keys) <= {f.name for f in fields[section]}, (section, keys)
    assert {recipe_family(r) for r in recipe_names()} == set(FAMILY_READS)


def test_run_folders_written_before_0_10_load_again(tmp_path, dataset_dir):
    """lf-orchestrator 0.9 wrote every section into a run folder's config.toml, made absolute (a VLA run's
    corpus.cache_dir, vlm / video / vae sections): that file, in its run folder (next to plan.json), loads with
    the unread sections dropped, as `lf run --resume`, `lf eval` and `lf sample` read it; the same text as a
    user's config file is refused naming the first unread key. Oracle: the file's own values."""
    import msgspec

    cfg = load_config(None, [f"data.path='{dataset_dir}'", "data.tasks=['reach-v3']"])
    old = msgspec.to_builtins(cfg)  # every section, as 0.9's to_toml wrote it
    old["corpus"]["cache_dir"] = str(tmp_path / "corpus-cache")
    text = msgspec.toml.encode(old).decode()
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(text)
    (run / "plan.json").write_text("{}")
    loaded = load_config(run / "config.toml")
    assert loaded.data.path == str(dataset_dir) and loaded.model.recipe == "vla"
    (run / "config.toml").write_text(text + "\n[trian]\nsteps = 3\n")  # a typo stays an error, even there
    with pytest.raises(ConfigError, match=r"unknown .*trian"):
        load_config(run / "config.toml")
    (tmp_path / "mine.toml").write_text(text)
    with pytest.raises(ConfigError, match=r"corpus\.source: model\.recipe = 'vla' \(family vla\) does not read"):
        load_config(tmp_path / "mine.toml")
