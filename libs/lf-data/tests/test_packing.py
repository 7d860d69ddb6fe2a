"""Sequence packing (best-fit decreasing) and data-parallel balancing by predicted cost."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lf_data._balance import balance_by_cost, cost_coefficients, imbalance, row_costs, sample_costs
from lf_data._packing import iter_packed, pack_sequences, packed_attention_mask, packing_efficiency

SEQ = 4096
IMAGE_TOKENS = 256


def mixed_workload(n: int, seed: int = 0) -> list[dict]:
    """Text documents (log-normal length, median 400), image-text pairs (prefix-LM over the image and
    question) and VLA samples (image + instruction prefix, 8x7 action tokens in blocks of 7): 50/30/20%."""
    rng = np.random.default_rng(seed)
    out = []
    for kind in rng.choice(3, size=n, p=[0.5, 0.3, 0.2]):
        if kind == 0:
            n_tok = int(np.clip(rng.lognormal(np.log(400), 1.0), 8, SEQ))
            out.append({"input_ids": rng.integers(0, 32000, n_tok)})
        elif kind == 1:
            q, a = rng.integers(8, 64), rng.integers(16, 256)
            out.append({"input_ids": rng.integers(0, 32000, IMAGE_TOKENS + q + a), "prefix_len": IMAGE_TOKENS + q})
        else:
            instr = int(rng.integers(8, 32))
            prefix = IMAGE_TOKENS + instr
            blocks = np.concatenate([np.zeros(prefix, int), 1 + np.arange(56) // 7])
            loss = np.arange(prefix + 56) >= prefix
            out.append({"input_ids": rng.integers(0, 32000, prefix + 56), "block_ids": blocks, "loss_mask": loss})
    return out


def _reference_mask(sample: dict) -> np.ndarray:
    """Float-free oracle written from the definitions: causal, prefix-LM (PaLI), block-causal."""
    n = len(sample["input_ids"])
    q, k = np.arange(n)[:, None], np.arange(n)[None, :]
    if "block_ids" in sample:
        b = np.asarray(sample["block_ids"])
        return b[None, :] <= b[:, None]
    return (k <= q) | (k < sample.get("prefix_len", 0))


def test_packed_rows_match_samples_small():
    """Oracle: each document's tokens, positions, labels and mask rebuilt from its own sample by definition."""
    samples = mixed_workload(60, seed=1)
    samples = [{**s, "input_ids": s["input_ids"][:300]} if "block_ids" not in s and "prefix_len" not in s else s
               for s in samples]
    batches = pack_sequences(samples, 1024, rows_per_batch=4)
    seen = []
    for b in batches:
        mask = packed_attention_mask(b.document_ids, b.block_ids)
        for r, members in enumerate(b.sample_index):
            at = 0
            for d, i in enumerate(members):
                s, n = samples[i], len(samples[i]["input_ids"])
                sl = slice(at, at + n)
                assert b.input_ids[r, sl].tolist() == list(s["input_ids"])
                assert b.position_ids[r, sl].tolist() == list(range(n))
                assert (b.document_ids[r, sl] == d).all()
                ids = np.asarray(s["input_ids"])
                loss = s.get("loss_mask", np.arange(n) >= s.get("prefix_len", 0))
                want = np.where(loss[1:], ids[1:], -100).tolist() + [-100]
                assert b.labels[r, sl].tolist() == want
                np.testing.assert_array_equal(mask[r, sl, sl].numpy(), _reference_mask(s))
                assert not mask[r, sl, :at].any() and not mask[r, sl, at + n:].any()  # no cross-document leak
                at += n
                seen.append(i)
            assert (b.document_ids[r, at:] == -1).all() and (b.labels[r, at:] == -100).all()
    assert sorted(seen) == list(range(len(samples)))


def test_causal_documents_match_lf_kernels_mask():
    """Oracle: lf-kernels' dense_mask(MaskSpec('causal'), document_ids=...) for pure causal documents."""
    kernels = pytest.importorskip("lf_kernels")
    rng = np.random.default_rng(2)
    samples = [{"input_ids": rng.integers(0, 99, int(n))} for n in rng.integers(1, 40, 30)]
    b = pack_sequences(samples, 64)[0]
    ours = packed_attention_mask(b.document_ids, b.block_ids)
    theirs = kernels.dense_mask(kernels.MaskSpec("causal"), 64, 64, document_ids=b.document_ids)[:, 0]
    real = ~b.is_pad
    both = real[:, :, None] & real[:, None, :]
    assert torch.equal(ours & both, theirs & both)


def test_packing_efficiency_mixed_workload():
    """Oracle: real tokens counted from the samples; efficiency = real / slots above 95% (measured ~99%)."""
    samples = mixed_workload(3000)
    batches = list(iter_packed(samples, SEQ, buffer_size=1000, token_budget=8 * SEQ))
    eff = packing_efficiency(batches)
    real = sum(len(s["input_ids"]) for s in samples)
    assert sum(int((~b.is_pad).sum()) for b in batches) == real
    assert all(b.input_ids.shape == (8, SEQ) for b in batches[:-1])
    assert sorted(i for b in batches for row in b.sample_index for i in row) == list(range(len(samples)))
    assert eff > 0.95, eff


def test_bad_samples_named():
    """Oracle: the error names the sample position and the value."""
    with pytest.raises(ValueError, match=r"sample 1 has 9 tokens > seq_len=8"):
        pack_sequences([{"input_ids": [1]}, {"input_ids": list(range(9))}], 8)
    assert pack_sequences([{"input_ids": list(range(9))}], 8, truncate=True)[0].input_ids[0].tolist() == list(range(8))
    with pytest.raises(ValueError, match=r"sample 0: block_ids must be non-decreasing"):
        pack_sequences([{"input_ids": [1, 2], "block_ids": [1, 0]}], 8)


def test_lpt_balance_within_5_percent_and_graham_bound():
    """Oracle: Graham's LPT bound max_load <= mean + max_cost (always), and <= 5% over the mean on
    realistic global batches (1,024 mixed samples, 8 ranks, 1B-parameter costs)."""
    a, b = cost_coefficients(1_200_000_000, 16, 2048, embedding_params=65_000_000)
    worst = 0.0
    for seed in range(10):
        lengths = [len(s["input_ids"]) for s in mixed_workload(1024, seed)]
        costs = sample_costs(lengths, a, b)
        for world in (2, 4, 8):
            assign = balance_by_cost(costs, world)
            assert sorted(i for r in assign for i in r) == list(range(len(costs)))
            loads = np.array([costs[r].sum() for r in assign])
            assert loads.max() <= loads.mean() + costs.max() + 1e-6 * loads.mean()
            worst = max(worst, imbalance(costs, assign))
    assert worst < 0.05, worst
    equal_count = imbalance(costs, [list(range(r, len(costs), 8)) for r in range(8)])
    assert equal_count > imbalance(costs, balance_by_cost(costs, 8))  # equal counts are worse


def test_row_costs_sum_documents():
    """Oracle: a * l + b * l^2 summed over the documents of each packed row, by hand."""
    b = pack_sequences([{"input_ids": [1] * 3}, {"input_ids": [1] * 2}, {"input_ids": [1] * 4}], 5)[0]
    costs = row_costs(b.document_ids, a=2.0, b=1.0)
    assert b.sample_index == [[2], [0, 1]]  # best fit decreasing: 4 alone, then 3 + 2
    assert costs.tolist() == [2 * 4 + 4**2, (2 * 3 + 3**2) + (2 * 2 + 2**2)]
