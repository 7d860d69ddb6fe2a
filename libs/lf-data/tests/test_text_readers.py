"""TextStream: jsonl / parquet / plain-text documents, tokenized, sharded, with every bad-input error.

Oracle: the files written here (every document read must equal what was written) and the same HF
``tokenizers`` tokenizer applied to the written text (byte-level BPE, so ``decode`` round-trips exactly).
"""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from lf_data._errors import DataError
from lf_data._packing import pack_sequences
from lf_data._text_readers import TextStream
from lf_data.text import build_instruction_tokenizer

DOCS = ["The quick brown fox.", "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.",
        "line one\nline two", "数据 streaming 🚀", "  leading and trailing spaces  ", "x"]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t.train_from_iterator(DOCS * 3, trainer)
    return t


def write_jsonl(path: Path, lines: list) -> Path:
    """Each item: a dict (dumped), or raw bytes / str written as the line."""
    with open(path, "wb") as f:
        for item in lines:
            raw = item if isinstance(item, bytes) else (item if isinstance(item, str) else json.dumps(item)).encode()
            f.write(raw + b"\n")
    return path


def texts(ds) -> list[tuple[str, int, str]]:
    return [(Path(s["file"]).name, s["row"], ds.tokenizer.decode(s["input_ids"].tolist())) for s in ds]


def test_jsonl_values_ids_and_labels(tmp_path, tok):
    """Every document equals the written one; ids are the tokenizer's; labels = ids; rows are lines from 1."""
    f = write_jsonl(tmp_path / "a.jsonl", [{"text": d, "id": i} for i, d in enumerate(DOCS[:3])] + [""] +
                    [{"text": d} for d in DOCS[3:]])
    samples = list(TextStream(f, tok))
    assert [s["row"] for s in samples] == [1, 2, 3, 5, 6, 7]  # the blank line 4 is not a record
    for s, d in zip(samples, DOCS, strict=True):
        assert s["modality"] == "text" and s["piece"] == 0 and s["file"] == str(f)
        assert s["input_ids"].dtype == torch.int64 and s["input_ids"].tolist() == tok.encode(d).ids
        assert torch.equal(s["labels"], s["input_ids"]) and s["loss_mask"].all()
        assert tok.decode(s["input_ids"].tolist()) == d


def test_parquet_row_groups_string_and_binary(tmp_path, tok):
    """50 rows in row groups of 7 (string column, then a binary column): rows from 0, texts as written."""
    docs = [f"{DOCS[i % len(DOCS)]} #{i}" for i in range(50)]
    pq.write_table(pa.table({"body": docs, "n": list(range(50))}), tmp_path / "s.parquet", row_group_size=7)
    pq.write_table(pa.table({"body": pa.array([d.encode() for d in docs], pa.binary())}), tmp_path / "b.parquet",
                   row_group_size=7)
    assert pq.ParquetFile(tmp_path / "s.parquet").num_row_groups == 8
    for name in ("s.parquet", "b.parquet"):
        got = texts(TextStream(tmp_path / name, tok, text_field="body", batch_docs=5))
        assert got == [(name, i, d) for i, d in enumerate(docs)]


def test_plain_text_paragraphs_file_mode_and_gzip(tmp_path, tok):
    """Paragraphs split on (whitespace-only) blank lines keep their inner line breaks; file mode reads it whole."""
    raw = "\ufeffpara one\nstill one\n\n\n  \t\npara two\r\nwith crlf\r\n\r\nlast\n"
    (tmp_path / "p.txt").write_bytes(raw.encode())
    with gzip.open(tmp_path / "p.txt.gz", "wb") as f:
        f.write(raw.encode())
    want = [(1, "para one\nstill one"), (6, "para two\r\nwith crlf"), (9, "last")]
    for name in ("p.txt", "p.txt.gz"):
        assert texts(TextStream(tmp_path / name, tok)) == [(name, r, t) for r, t in want]
    whole = texts(TextStream(tmp_path / "p.txt", tok, text_mode="file"))
    assert whole == [("p.txt", 1, raw[1:-1])]


def test_folder_eos_and_max_tokens_pieces(tmp_path, tok):
    """A folder is read in sorted order; eos is appended; pieces of max_tokens concatenate to the document."""
    write_jsonl(tmp_path / "b.jsonl", [{"text": DOCS[1]}])
    (tmp_path / "a.txt").write_text(DOCS[0] + "\n")
    (tmp_path / "notes.csv").write_text("ignored")
    eos = tok.token_to_id("<|endoftext|>")
    samples = list(TextStream(tmp_path, str(tmp_path / "tok.json") if tok.save(str(tmp_path / "tok.json")) is None
                              else tok, eos_token="<|endoftext|>", max_tokens=4))
    by_doc: dict[str, list] = {}
    for s in samples:
        assert 1 <= len(s["input_ids"]) <= 4
        by_doc.setdefault(Path(s["file"]).name, []).append(s)
    assert list(by_doc) == ["a.txt", "b.jsonl"]
    for name, d in (("a.txt", DOCS[0]), ("b.jsonl", DOCS[1])):
        assert [s["piece"] for s in by_doc[name]] == list(range(len(by_doc[name])))
        assert torch.cat([s["input_ids"] for s in by_doc[name]]).tolist() == [*tok.encode(d).ids, eos]


def test_packs_with_pack_sequences(tmp_path, tok):
    """pack_sequences' labels are each document's next tokens (oracle: the tokenizer's ids shifted by one)."""
    f = write_jsonl(tmp_path / "a.jsonl", [{"text": d} for d in DOCS])
    b = pack_sequences(list(TextStream(f, tok)), seq_len=256)[0]
    assert sorted(b.sample_index[0]) == list(range(len(DOCS)))
    for d, i in enumerate(b.sample_index[0]):  # document d of the row is input sample i
        sel = b.document_ids[0] == d
        ids = tok.encode(DOCS[i]).ids
        assert b.input_ids[0][sel].tolist() == ids
        assert b.labels[0][sel].tolist() == [*ids[1:], -100]


BAD_JSONL = [  # (line, reason, message fragment)
    (b'{"text": "ok", ', "invalid_json", r"line 2: invalid JSON at column"),
    ({"body": "x"}, "missing_field", r"line 2: field 'text' missing \(keys: \['body'\]\)"),
    ({"text": None}, "missing_field", r"line 2: field 'text' is null"),
    ({"text": 7}, "wrong_type", r"line 2: field 'text' must be a string, got int"),
    ({"text": ["a"]}, "wrong_type", r"line 2: field 'text' must be a string, got list"),
    ([1, 2], "wrong_type", r"line 2: expected a JSON object, got list"),
    ({"text": " \n\t"}, "empty_document", r"line 2: field 'text' is an empty document"),
    (b'{"text": "caf\xe9"}', "invalid_utf8", r"line 2: invalid UTF-8 at byte 13"),
    ('{"text": "a\\ud800b"}', "invalid_utf8", r"line 2: field 'text': lone surrogate at character 1"),
]


@pytest.mark.parametrize("bad,reason,msg", BAD_JSONL, ids=[b[1] + str(i) for i, b in enumerate(BAD_JSONL)])
def test_jsonl_bad_input(tmp_path, tok, bad, reason, msg):
    """Each bad line raises a DataError naming file, line and field; under "skip" it is counted, the rest read."""
    f = write_jsonl(tmp_path / "bad.jsonl", [{"text": "first"}, bad, {"text": "third"}])
    with pytest.raises(DataError, match=r"bad\.jsonl: " + msg) as e:
        list(TextStream(f, tok))
    assert e.value.reason == reason and e.value.record == 2 and e.value.file == str(f)
    ds = TextStream(f, tok, on_error="skip")
    assert texts(ds) == [("bad.jsonl", 1, "first"), ("bad.jsonl", 3, "third")]
    assert ds.skipped == {reason: 1} and len(ds.problems) == 1


def test_all_bad_lines_counted_in_one_file(tmp_path, tok):
    """Skip counts add up over a file holding every bad kind once."""
    f = write_jsonl(tmp_path / "bad.jsonl", [b[0] for b in BAD_JSONL] + [{"text": "fine"}])
    ds = TextStream(f, tok, on_error="skip")
    assert texts(ds) == [("bad.jsonl", len(BAD_JSONL) + 1, "fine")]
    want: dict[str, int] = {}
    for _, reason, _ in BAD_JSONL:
        want[reason] = want.get(reason, 0) + 1
    assert ds.skipped == want


def test_parquet_and_file_level_bad_input(tmp_path, tok):
    """Null / non-string / bad-UTF-8 parquet rows, a missing column, a corrupt parquet, a missing file, a cut gzip."""
    pq.write_table(pa.table({"text": ["a", None, "c"]}), tmp_path / "null.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "int.parquet")
    pq.write_table(pa.table({"text": pa.array([b"ok", b"\xff\xfe"], pa.binary())}), tmp_path / "bin.parquet")
    pq.write_table(pa.table({"other": ["a"]}), tmp_path / "nocol.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not a parquet file at all")
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "badutf.txt").write_bytes(b"good para\n\nbad \xc3\x28 here\nmore\n")
    lines = "".join(json.dumps({"text": f"doc {i} {i * 7919 % 10007}"}) + "\n" for i in range(2000)).encode()
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(lines)[:4000])
    cases = [("null.parquet", "missing_field", r"null\.parquet: row 1: field 'text' is null"),
             ("int.parquet", "wrong_type", r"int\.parquet: row 0: field 'text' must be a string, got int"),
             ("bin.parquet", "invalid_utf8", r"bin\.parquet: row 1: field 'text': invalid UTF-8 at byte 0"),
             ("nocol.parquet", "missing_field", r"nocol\.parquet: column 'text' missing \(columns: \['other'\]\)"),
             ("junk.parquet", "invalid", r"junk\.parquet: cannot read parquet"),
             ("empty.txt", "empty_document", r"empty\.txt: line 1: field 'text' is an empty document"),
             ("badutf.txt", "invalid_utf8", r"badutf\.txt: line 3: invalid UTF-8 at byte 4"),
             ("cut.jsonl.gz", "truncated", r"cut\.jsonl\.gz: cannot read past line"),
             ("gone.jsonl", "missing_file", r"gone\.jsonl: file missing")]
    for name, reason, msg in cases:
        mode = "file" if name == "empty.txt" else "paragraph"
        with pytest.raises(DataError, match=msg) as e:
            list(TextStream(tmp_path / name, tok, text_mode=mode))
        assert e.value.reason == reason, name
    ds = TextStream([tmp_path / n for n, _, _ in cases], tok, on_error="skip")
    got = [(n, t) for n, _, t in texts(ds)]
    assert ("null.parquet", "a") in got and ("null.parquet", "c") in got and ("bin.parquet", "ok") in got
    assert ("badutf.txt", "good para") in got and ("badutf.txt", "more") not in got
    assert ds.skipped == {"missing_field": 2, "wrong_type": 2, "invalid_utf8": 2, "invalid": 1, "truncated": 1,
                          "missing_file": 1}


def test_bad_arguments(tmp_path, tok):
    """Arguments are checked when the reader is built, with messages naming the value."""
    f = write_jsonl(tmp_path / "a.jsonl", [{"text": "a"}])
    with pytest.raises(ValueError, match="eos_token '<eos>' is not in"):
        TextStream(f, tok, eos_token="<eos>")
    with pytest.raises(ValueError, match="tokenizer file .*nope.json not found"):
        TextStream(f, tmp_path / "nope.json")
    with pytest.raises(ValueError, match=r"unknown file format"):
        TextStream(tmp_path / "a.csv", tok)
    with pytest.raises(ValueError, match="rank=2 world_size=2"):
        TextStream(f, tok, rank=2, world_size=2)
    with pytest.raises(ValueError, match="on_error must be"):
        TextStream(f, tok, on_error="ignore")


def _mixed_corpus(tmp_path: Path) -> list[Path]:
    files = []
    for k in range(4):
        f = write_jsonl(tmp_path / f"j{k}.jsonl", [{"text": f"doc {k}-{i}"} for i in range(k + 3)])
        files.append(f)
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(23)]}), tmp_path / "p.parquet", row_group_size=5)
    (tmp_path / "t.txt").write_text("\n\n".join(f"para {i}" for i in range(9)))
    return [*files, tmp_path / "p.parquet", tmp_path / "t.txt"]


@pytest.mark.parametrize("shard", ["record", "file"])
def test_rank_sharding_disjoint_and_complete(tmp_path, tok, shard):
    """Ranks 0..2 read disjoint sets whose union is the single-reader stream (oracle: world_size=1)."""
    files = _mixed_corpus(tmp_path)
    everything = texts(TextStream(files, tok))
    assert len(everything) == 18 + 23 + 9
    parts = [texts(TextStream(files, tok, rank=r, world_size=3, shard=shard)) for r in range(3)]
    assert sum(len(p) for p in parts) == len(everything)
    assert sorted(x for p in parts for x in p) == sorted(everything)
    assert all(p for p in parts)
    assert parts == [texts(TextStream(files, tok, rank=r, world_size=3, shard=shard)) for r in range(3)]


def test_dataloader_workers_split_a_rank(tmp_path, tok):
    """Two DataLoader workers of rank 1 of 2 read rank 1's records exactly once between them."""
    files = _mixed_corpus(tmp_path)
    want = sorted(texts(TextStream(files, tok, rank=1, world_size=2)))
    ds = TextStream(files, tok, rank=1, world_size=2)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    got = sorted((Path(s["file"]).name, s["row"], tok.decode(s["input_ids"].tolist())) for s in loader)
    assert got == want


def test_streaming_memory_is_bounded(tmp_path):
    """Peak traced memory while streaming 1,500 records (~3 MB of decoded text) stays below 1/8 of the text.

    Oracle: the decoded size of what was written (a reader holding the dataset would exceed it). A word-level
    tokenizer keeps this fast; tracemalloc sees the reader's Python strings and the numpy token arrays.
    """
    body = " ".join(["streaming text"] * 140)  # ~2 KB per document
    n = 1500
    with open(tmp_path / "big.jsonl", "w") as f:
        for i in range(n):
            f.write(json.dumps({"text": f"{i} {body}"}) + "\n")
    pq.write_table(pa.table({"text": [f"{i} {body}" for i in range(n)]}), tmp_path / "big.parquet",
                   row_group_size=500)
    decoded = sum(len(f"{i} {body}") for i in range(n))
    tok = build_instruction_tokenizer(["streaming text"])
    for name in ("big.jsonl", "big.parquet"):
        ds = TextStream(tmp_path / name, tok, batch_docs=32)
        next(iter(ds))  # warm up: pyarrow loads its compute kernels (~2 MB, once per process) on first use
        tracemalloc.start()
        count = tokens = 0
        for s in ds:
            count += 1
            tokens += len(s["input_ids"])
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert count == n and tokens == n * 281
        assert peak < decoded / 8, (name, peak, decoded)
