"""Instruction tokenizer: deterministic ids, padding and truncation."""

from __future__ import annotations

import numpy as np

from lf_data import build_instruction_tokenizer, encode_instructions


def test_ids_are_sorted_vocab_and_order_independent():
    """Oracle: ids written by hand: [PAD]=0, [UNK]=1, then sorted lowercased words and punctuation."""
    texts = ["Push the puck, fast", "reach the goal"]
    tok = build_instruction_tokenizer(texts)
    expect = {"[PAD]": 0, "[UNK]": 1, ",": 2, "fast": 3, "goal": 4, "puck": 5, "push": 6, "reach": 7, "the": 8}
    assert tok.get_vocab() == expect
    assert build_instruction_tokenizer(reversed(texts)).get_vocab() == expect
    assert tok.encode("PUSH the ball").ids == [6, 8, 1]


def test_padding_mask_and_truncation():
    """Oracle: hand-written ids (goal=2, puck=3, push=4, reach=5, the=6); mask True exactly on real
    tokens, long text cut to its first max_len tokens."""
    tok = build_instruction_tokenizer(["push the puck", "reach the goal"])
    ids, mask = encode_instructions(tok, ["push the puck", "reach", "", "reach the goal push the puck"], 4)
    assert ids.dtype == np.int64 and mask.dtype == bool and ids.shape == (4, 4)
    assert ids.tolist() == [[4, 6, 3, 0], [5, 0, 0, 0], [0, 0, 0, 0], [5, 6, 2, 4]]
    assert mask.tolist() == [[True, True, True, False], [True, False, False, False],
                             [False] * 4, [True] * 4]
