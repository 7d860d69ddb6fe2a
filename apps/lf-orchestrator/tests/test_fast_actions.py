"""FAST action tokens in the token VLA (``action_tokenizer.kind = "fast"``): targets, decoding, fallback, a run.

Oracles: ``FastTokenizer.encode`` / ``quantize`` / ``reconstruct`` called directly on the same chunks (targets,
round trip), a float64 cross-entropy over the real positions recomputed from the model's logits (loss mask), the
tokenizer's own error bound (RMS <= 0.5 / scale, normalized units, unclipped chunks), the greedy decode without
``eos_id`` (early stop), and the files and metrics a run writes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from lf_orchestrator.config import ConfigError, load_config

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "vla_fast.toml"


def _tiny_sets(out: Path, data: Path) -> list[str]:
    """``--set`` overrides that make examples/vla_fast.toml the conftest's tiny run (same data, model, steps)."""
    return [f"run.out_dir='{out}'", "run.device='cpu'", "run.threads=2", f"data.path='{data}'",
            "data.tasks=['reach-v3']", "data.episodes_per_task=3", "data.image_size=32", "data.max_steps=60",
            "data.workers=1", "data.action_horizon=2", "data.max_instruction_len=6", "model.size='tiny'",
            "model.overrides={ patch_size = 8 }", "train.steps=6", "train.global_batch=8", "train.lr=3e-3",
            "train.warmup_steps=2", "train.log_every=1", "train.ckpt_every=3", "parallel.micro_batch=4",
            "eval.episodes=2", "eval.max_steps=20"]


@pytest.fixture(scope="module")
def fitted(dataset_dir, tmp_path_factory):
    """(config, dataset, FAST encoder) fitted on the session's tiny dataset."""
    from lf_orchestrator.families._metaworld import open_dataset
    from lf_orchestrator.families.vla import assembly

    cfg = load_config(EXAMPLE, _tiny_sets(tmp_path_factory.mktemp("runs"), dataset_dir))
    dataset = open_dataset(cfg, generate=True, action_horizon=cfg.data.action_horizon)
    return cfg, dataset, assembly.build_encoder(cfg, dataset)


def _samples(dataset, n=12):
    idx = np.linspace(0, len(dataset) - 1, n).astype(int)  # episode starts, middles and padded ends
    return [dataset[int(i)] for i in idx]


def test_targets_and_loss_mask_match_the_tokenizer(fitted):
    """labels = offset + FastTokenizer.encode(chunk), then EOS, then -100; inputs are the labels shifted right
    with EOS padding; the model's loss is the float64 cross-entropy of exactly those L + 1 positions."""
    from lf_orchestrator.families.vla import assembly

    cfg, dataset, enc = fitted
    fast, m, offset = enc.action_tokenizer, enc.max_action_tokens, enc.vocab.offset
    assert enc.eos_id == offset + fast.vocab_size and enc.vocab.n_bins == fast.vocab_size + 1
    lengths = [len(t) for t in fast.encode(np.stack([dataset[i]["actions"].numpy() for i in range(len(dataset))]))]
    assert m == max(lengths)  # max_action_tokens = 0: the longest training encoding
    samples = _samples(dataset)
    batch = enc.collate(samples)
    expected = fast.encode(np.stack([s["actions"].numpy() for s in samples]))
    assert batch["labels"].shape == (len(samples), m + 1) and batch["action_in_ids"].shape == (len(samples), m)
    for r, seq in enumerate(expected):
        n = len(seq)
        assert batch["labels"][r, :n].tolist() == [offset + t for t in seq]
        assert batch["labels"][r, n].item() == enc.eos_id
        assert (batch["labels"][r, n + 1:] == -100).all()
        assert batch["action_in_ids"][r, :n].tolist() == [offset + t for t in seq]
        assert (batch["action_in_ids"][r, n:] == enc.eos_id).all()

    model = assembly.build_model(assembly.model_config(cfg, enc), torch.device("cpu"), 0)
    assert model.cfg.num_action_tokens == m + 1 and model.cfg.n_action_bins == fast.vocab_size + 1
    assert int(model.loss_normalizer(batch)) == sum(len(s) + 1 for s in expected)
    loss, _ = model.training_loss(batch)
    with torch.no_grad():
        logp = torch.log_softmax(model(batch["image"], batch["instruction_ids"], batch["instruction_mask"],
                                       batch["state"], batch["action_in_ids"]).double(), -1)
    ref = -sum(logp[r, j, batch["labels"][r, j]] for r, s in enumerate(expected) for j in range(len(s) + 1))
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-5)  # float32 logits, float64 sum


def test_decoding_the_targets_gives_the_chunk_back(fitted):
    """The target sequences decode to reconstruct(quantize(chunk)) exactly, within RMS 0.5 / scale (normalized)
    of the chunk when nothing was clipped; nothing falls back."""
    _, dataset, enc = fitted
    fast = enc.action_tokenizer
    samples = _samples(dataset)
    chunks = np.stack([s["actions"].numpy() for s in samples]).astype(np.float64)
    labels = enc.collate(samples)["labels"]
    before = dict(enc.decode_counts)
    out = enc.decode_actions(labels.masked_fill(labels == -100, enc.eos_id))
    coeffs, clipped = fast.quantize(chunks)
    np.testing.assert_array_equal(out, fast.reconstruct(coeffs))
    err = enc.action_bounds.normalize(out) - enc.action_bounds.normalize(chunks)
    rms = np.sqrt((err ** 2).mean(axis=(1, 2)))
    assert (rms[~clipped] <= 0.5 / fast.scale + 1e-12).all() and (~clipped).any()
    assert enc.decode_counts == {"chunks": before["chunks"] + len(samples), "invalid": before["invalid"]}


def test_invalid_sequences_fall_back_to_zero_actions_and_are_counted(fitted):
    """No EOS, one token too many (more than H * A coefficients) and an empty sequence give zero chunks; a
    valid one decodes; counts add up."""
    _, dataset, enc = fitted
    fast, eos, off = enc.action_tokenizer, enc.eos_id, enc.vocab.offset
    chunk = np.stack([dataset[0]["actions"].numpy()]).astype(np.float64)
    valid = [off + t for t in fast.encode(chunk)[0]]
    width = enc.max_action_tokens + 2
    rows = [[off] * width,                                         # never ends
            valid + valid[:1] + [eos] * (width - len(valid) - 1),  # every BPE piece adds coefficients
            [eos] * width,                                         # empty
            valid + [eos] * (width - len(valid))]
    before = dict(enc.decode_counts)
    out = enc.decode_actions(torch.tensor(rows))
    assert out.shape == (4, fast.horizon, fast.action_dim)
    assert (out[:3] == 0).all()
    np.testing.assert_array_equal(out[3], fast.reconstruct(fast.quantize(chunk)[0])[0])
    assert enc.decode_counts["invalid"] - before["invalid"] == 3
    assert enc.decode_counts["chunks"] - before["chunks"] == 4


def test_max_action_tokens_below_the_longest_chunk_is_an_error(fitted, dataset_dir, tmp_path):
    """A set max_action_tokens that some training chunk exceeds stops the fit naming the field; a batch whose
    chunk encodes longer than the fixed limit is refused naming it too."""
    from lf_orchestrator.families.vla import assembly
    from lf_orchestrator.families.vla._fast_actions import FastBatchEncoder

    _, dataset, enc = fitted
    cfg = load_config(EXAMPLE, [*_tiny_sets(tmp_path, dataset_dir), "action_tokenizer.max_action_tokens=1"])
    with pytest.raises(ConfigError, match=r"action_tokenizer.max_action_tokens: \d+ of \d+ training chunks"):
        assembly.build_encoder(cfg, dataset)
    narrow = FastBatchEncoder(enc.instruction_tokenizer, enc.action_tokenizer, enc.state_mean, enc.state_std,
                              max_instruction_len=6, max_action_tokens=1)
    longest = max(range(len(dataset)), key=lambda i: len(enc.action_tokenizer.encode(dataset[i]["actions"][None])[0]))
    with pytest.raises(ValueError, match="max_action_tokens=1"):
        narrow.collate([dataset[longest]])
    with pytest.raises(ConfigError, match="model.overrides: 'action_tokens'"):
        load_config(EXAMPLE, [*_tiny_sets(tmp_path, dataset_dir), "model.overrides={ action_tokens = 5 }"])


def test_run_folder_round_trip_and_kind_mismatch(fitted, tmp_path):
    """The saved FAST encoder loads back equal; a binning config on a FAST folder (and the reverse file), or a
    layout whose end-of-action id the folder's tokenizers do not reproduce, fails naming the file."""
    from lf_orchestrator.families.vla import assembly

    cfg, _, enc = fitted
    assembly.save_encoder(enc, tmp_path)
    back = assembly.load_encoder(cfg, tmp_path)
    assert back.action_tokenizer == enc.action_tokenizer and back.max_action_tokens == enc.max_action_tokens
    assert back.eos_id == enc.eos_id
    binning = load_config(EXAMPLE, [f"data.path='{cfg.data.path}'", "action_tokenizer.kind='binning'"])
    with pytest.raises(ValueError, match="action_tokenizer.json"):
        assembly.load_encoder(binning, tmp_path)
    layout = json.loads((tmp_path / "action_tokens.json").read_text())
    (tmp_path / "action_tokens.json").write_text(json.dumps({**layout, "eos_id": enc.eos_id + 1}))
    with pytest.raises(ValueError, match="'eos_id'"):
        assembly.load_encoder(cfg, tmp_path)
    (tmp_path / "action_tokens.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="action_tokens.json"):
        assembly.load_encoder(cfg, tmp_path)


def test_generate_with_eos_stops_early_as_a_prefix_of_plain_greedy(fitted):
    """Oracle: greedy decoding without ``eos_id``; with it, the output is that output's prefix and every row
    holds the EOS unless all positions were decoded. The binning layout keeps H * A token positions."""
    from lf_ir import vla_config
    from lf_orchestrator.families.vla import assembly

    cfg, dataset, enc = fitted
    model = assembly.build_model(assembly.model_config(cfg, enc), torch.device("cpu"), 0)
    obs = enc.observation(np.stack([dataset[i]["image"].numpy() for i in range(3)]),
                          np.stack([dataset[i]["state"].numpy() for i in range(3)]), [dataset[0]["task"]] * 3)
    args = (obs["image"], obs["instruction_ids"], obs["instruction_mask"], obs["state"])
    full = model.generate(*args)
    short = model.generate(*args, eos_id=enc.eos_id)
    assert full.shape[1] == model.cfg.num_action_tokens
    assert torch.equal(short, full[:, :short.shape[1]])
    assert short.shape[1] == full.shape[1] or bool((short == enc.eos_id).any(1).all())
    plain = vla_config("tiny", action_horizon=4, action_dim=4)
    assert plain.num_action_tokens == 16 and plain.seq_len == plain.prefix_len + 15


def test_lf_run_fast_example_tiny(dataset_dir, tmp_path):
    """`lf run examples/vla_fast.toml --set ...` (tiny): trains with a finite, falling loss, writes the FAST
    files, and its evaluation counts the chunks that did not decode."""
    from typer.testing import CliRunner

    from lf_orchestrator.cli import app

    args = ["run", str(EXAMPLE)]
    for item in _tiny_sets(tmp_path / "runs", dataset_dir):
        args += ["--set", item]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["train/loss"] for r in rows}
    assert sorted(losses) == list(range(1, 7)) and all(math.isfinite(v) for v in losses.values())
    assert losses[6] < losses[1]
    layout = json.loads((run_dir / "action_tokens.json").read_text())
    spec = json.loads((run_dir / "model.json").read_text())["config"]
    assert spec["action_tokens"] == layout["max_action_tokens"] + 1
    assert json.loads((run_dir / "action_tokenizer.json").read_text())["format"] == "lf-tokenize-action/fast"
    report = json.loads((run_dir / "eval.json").read_text())
    (row,) = report["tasks"]
    assert 0 <= row["invalid_action_chunks"] <= row["action_chunks"] and row["action_chunks"] > 0
    assert report["invalid_action_chunks"] == row["invalid_action_chunks"]
    assert "did not decode" in result.output
