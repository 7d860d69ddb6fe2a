"""The offline text corpus of the llm family: Python standard-library docstrings, a BPE on them, packed rows.

Why this corpus: every Python ships its standard library's source, whose module,
class and function docstrings are a few MB of edited English prose about
programming, so a run needs no download. Determinism: ``.py`` files under
``sysconfig.get_paths()["stdlib"]`` in sorted order (``site-packages``, ``test``,
``tests``, ``idlelib`` and ``lib2to3`` skipped), docstrings in ``ast.walk`` order,
exact duplicates dropped, until ``max_chars``. The corpus differs between Python
versions, so the version is part of the cache key.

Tokenizer: HF ``tokenizers`` byte-level BPE (GPT-2 style) trained on the training
split, vocabulary = the model's ``vocab_size``, ``<|endoftext|>`` ends each document. The trainer stops
when no pair is left to merge, so a large vocabulary on this small corpus gets fewer ids (Llama-3's
128,256 on the ~1.4 M characters of Python 3.11's docstrings: 23,130); ``meta.json`` records
``tokenizer_vocab``, every id is below the model's ``vocab_size``, and the model keeps its size.
Documents longer than a row are cut into row-sized pieces; rows are packed by
:func:`lf_data.pack_sequences` (labels never cross a document end). Held-out
documents (``crc32(text) % 10000 < eval_fraction * 10000``) form the evaluation rows.

Cache (atomic: written to a hidden folder, then renamed): ``<cache_dir>/<key>/``
holding ``tokenizer.json``, ``rows.safetensors`` and ``meta.json``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
import sysconfig
import zlib
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lf_orchestrator._atomic import atomic_dir

EOS = "<|endoftext|>"
FORMAT = 1
_SKIP = {"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"}
FIELDS = ("input_ids", "labels", "position_ids", "document_ids")


def stdlib_docstrings(max_chars: int, min_chars: int) -> list[str]:
    """Docstrings of the standard library in a fixed order (see the module docstring), about ``max_chars`` in all."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs, seen, total = [], set(), 0
    for path in sorted(root.rglob("*.py")):
        if _SKIP & set(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            if doc and len(doc) >= min_chars and doc not in seen:
                seen.add(doc)
                docs.append(doc)
                total += len(doc)
                if total >= max_chars:
                    return docs
    return docs


def cache_key(c, vocab_size: int) -> str:
    """Content key of the cached corpus: every setting that changes it, the Python and tokenizers versions."""
    import tokenizers

    text = json.dumps([FORMAT, sys.version, tokenizers.__version__, c.source, c.max_chars, c.min_chars, c.seq_len,
                       c.eval_fraction, vocab_size])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def train_bpe(texts: list[str], vocab_size: int):
    """A byte-level BPE ``tokenizers.Tokenizer`` of ``vocab_size`` ids (``<|endoftext|>`` = 0)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def _pieces(tok, docs: list[str], seq_len: int) -> list[dict]:
    eos = tok.token_to_id(EOS)
    out = []
    for enc in tok.encode_batch(docs):
        ids = [*enc.ids, eos]
        out += [{"input_ids": ids[i:i + seq_len]} for i in range(0, len(ids), seq_len) if len(ids[i:i + seq_len]) > 1]
    return out


def build_corpus(c, vocab_size: int) -> Path:
    """The cache folder of the corpus (built now unless present); see the module docstring."""
    from lf_data import pack_sequences

    final = Path(c.cache_dir) / cache_key(c, vocab_size)
    if (final / "meta.json").is_file():
        return final
    docs = stdlib_docstrings(c.max_chars, c.min_chars)
    held = [zlib.crc32(d.encode()) % 10000 < c.eval_fraction * 10000 for d in docs]
    train = [d for d, h in zip(docs, held, strict=True) if not h]
    held_out = [d for d, h in zip(docs, held, strict=True) if h]
    if not train or not held_out:
        raise ValueError(f"corpus: {len(docs)} docstrings give {len(train)} training and {len(held_out)} held-out "
                         f"documents; raise corpus.max_chars or change corpus.eval_fraction")
    tok = train_bpe(train, vocab_size)
    tensors = {}
    for split, texts in (("train", train), ("eval", held_out)):
        packed = pack_sequences(_pieces(tok, texts, c.seq_len), c.seq_len)[0]
        tensors.update({f"{split}.{f}": getattr(packed, f).contiguous() for f in FIELDS})
    meta = {"documents": len(docs), "train_documents": len(train), "eval_documents": len(held_out),
            "chars": sum(map(len, docs)), "train_rows": int(tensors["train.input_ids"].shape[0]),
            "eval_rows": int(tensors["eval.input_ids"].shape[0]), "python": sys.version.split()[0],
            "vocab_size": vocab_size, "tokenizer_vocab": tok.get_vocab_size(), "seq_len": c.seq_len}
    with atomic_dir(final) as tmp:  # another process that finished first keeps its copy
        tok.save(str(tmp / "tokenizer.json"))
        save_file(tensors, str(tmp / "rows.safetensors"))
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    return final


def load_rows(folder: Path, split: str) -> dict[str, torch.Tensor]:
    """The packed rows of ``split`` (``train`` / ``eval``): (rows, seq) tensors keyed by field."""
    t = load_file(str(Path(folder) / "rows.safetensors"))
    return {f: t[f"{split}.{f}"] for f in FIELDS}
