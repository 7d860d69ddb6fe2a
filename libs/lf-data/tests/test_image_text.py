"""ImageTextStream and the ChatML / Qwen2-VL template: values, label mask, errors, sharding.

Oracles: the files and PNGs written here (images read must equal the arrays written); HF ``transformers``'
``apply_chat_template`` with Qwen2-VL's chat template on the same tokenizer (token ids), the rendered
string's character spans of assistant turns (loss mask); HF ``Qwen2VLImageProcessorPil`` (image token counts).
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from lf_data._chat_template import ChatTemplate, parse_conversation, qwen2_vl_image_tokens
from lf_data._errors import DataError
from lf_data._image_text import ImageTextStream
from lf_data._packing import pack_sequences

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"]
# chat_template.json of Qwen/Qwen2-VL-7B-Instruct (the peer's own template, rendered by transformers' Jinja).
QWEN2_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] "
    "== 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content "
    "%}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}")

CONVERSATIONS = [
    [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in the picture?"}]},
     {"role": "assistant", "content": "A red square on a blue field."}],
    [{"role": "system", "content": "Answer briefly."},
     {"role": "user", "content": [{"type": "text", "text": "Compare "}, {"type": "image"}, {"type": "text",
                                                                                             "text": " and "},
                                  {"type": "image"}]},
     {"role": "assistant", "content": "The left one is darker."},
     {"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Less light.\nMore shade."}],
    [{"role": "user", "content": "No image here, just text 🚀"}, {"role": "assistant", "content": "Fine."}],
]
PARQUET_CONV = [{"role": "user", "content": "<image>What is in the picture?"},
                {"role": "assistant", "content": "A red square."}]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t.train_from_iterator([json.dumps(c) for c in CONVERSATIONS] * 3 + ["user assistant system"], trainer)
    return t


def hf_reference(tok: Tokenizer, conversation: list, counts: list[int]) -> tuple[list[int], list[bool]]:
    """Ids from transformers' apply_chat_template (Qwen2-VL's template) with each image pad expanded as
    Qwen2VLProcessor does; mask True on tokens inside an assistant turn's content + its <|im_end|>."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tok)
    text = hf.apply_chat_template(conversation, tokenize=False, chat_template=QWEN2_VL_TEMPLATE)
    pieces = text.split("<|image_pad|>")
    text = pieces[0] + "".join("<|image_pad|>" * n + p for n, p in zip(counts, pieces[1:], strict=True))
    spans, at, head = [], 0, "<|im_start|>assistant\n"
    while (start := text.find(head, at)) >= 0:
        end = text.index("<|im_end|>", start) + len("<|im_end|>")
        spans.append((start + len(head), end))
        at = end
    enc = tok.encode(text, add_special_tokens=False)
    mask = [any(a <= s and e <= b for a, b in spans) for s, e in enc.offsets]
    return enc.ids, mask


@pytest.mark.parametrize("k", range(len(CONVERSATIONS)))
def test_render_matches_transformers_qwen2_vl_template(tok, k):
    """Ids equal HF apply_chat_template's; the mask is exactly the assistant spans (see hf_reference)."""
    conv = CONVERSATIONS[k]
    n_images = sum(isinstance(c["content"], list) and p["type"] == "image" for c in conv for p in
                   (c["content"] if isinstance(c["content"], list) else []))
    counts = [3, 5][:n_images]
    ids, mask = ChatTemplate().render(tok, parse_conversation(conv, ChatTemplate(), n_images), counts)
    ref_ids, ref_mask = hf_reference(tok, conv, counts)
    assert ids == ref_ids
    assert mask == ref_mask
    assert sum(mask) > 0 and ids.count(tok.token_to_id("<|image_pad|>")) == sum(counts)


def test_qwen2_vl_image_tokens_match_hf_processor():
    """Token counts equal HF Qwen2VLImageProcessorPil's grid_thw product / merge_size**2."""
    pytest.importorskip("transformers")
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    small_max = 28 * 28 * 64  # a lower max_pixels exercises the downscaling branch on small (fast) images
    for max_pixels, sizes in [(28 * 28 * 1280, [(37, 90), (28, 28), (10, 10), (2000, 30), (700, 1500)]),
                              (small_max, [(300, 400), (480, 640), (100, 100)])]:
        proc = Qwen2VLImageProcessorPil(size={"shortest_edge": 56 * 56, "longest_edge": max_pixels})
        for h, w in sizes:
            img = Image.fromarray(np.zeros((h, w, 3), np.uint8))
            grid = proc(images=[img], return_tensors="np")["image_grid_thw"]
            assert qwen2_vl_image_tokens(h, w, max_pixels=max_pixels) == int(np.prod(grid)) // 4, (h, w)


def png_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def test_jsonl_images_labels_and_values(tmp_path, tok):
    """Images (relative path, list, base64, data URI, RGBA, gray) equal what was written; labels = ids on the mask."""
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (20, 30, 3), np.uint8)
    rgba = rng.integers(0, 256, (8, 9, 4), np.uint8)
    gray = rng.integers(0, 256, (12, 7), np.uint8)
    (tmp_path / "img").mkdir()
    Image.fromarray(rgb).save(tmp_path / "img" / "a.png")
    Image.fromarray(rgba).save(tmp_path / "img" / "b.png")
    b64 = base64.b64encode(png_bytes(gray)).decode()
    recs = [{"image": "img/a.png", "conversations": [{"from": "human", "value": "<image>\nWhat is it?"},
                                                     {"from": "gpt", "value": "Noise."}]},
            {"image": ["img/b.png", {"bytes": b64}], "conversations": CONVERSATIONS[1]},
            {"image": f"data:image/png;base64,{b64}", "conversations": CONVERSATIONS[0]},
            {"image": [], "conversations": CONVERSATIONS[2]}]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    samples = list(ImageTextStream(tmp_path / "sft.jsonl", tok, image_tokens=lambda h, w: h // 4 + 1))
    want_images = [[rgb], [rgba[..., :3], np.repeat(gray[..., None], 3, 2)], [np.repeat(gray[..., None], 3, 2)], []]
    pad = tok.token_to_id("<|image_pad|>")
    for s, want, line in zip(samples, want_images, [1, 2, 3, 4], strict=True):
        assert s["modality"] == "image_text" and s["row"] == line
        assert len(s["images"]) == len(want)
        for got, w in zip(s["images"], want, strict=True):
            assert got.dtype == torch.uint8 and got.shape == (*w.shape[:2], 3) and np.array_equal(got.numpy(), w)
        assert s["image_tokens"] == [w.shape[0] // 4 + 1 for w in want]
        assert int((s["input_ids"] == pad).sum()) == sum(s["image_tokens"])
        assert torch.equal(s["labels"], torch.where(s["loss_mask"], s["input_ids"], -100))
    # First record: "<image>\n" at the start of the user turn; the target is exactly "Noise.<|im_end|>".
    s = samples[0]
    assert tok.decode(s["input_ids"][s["loss_mask"]].tolist(), skip_special_tokens=False) == "Noise.<|im_end|>"
    ids, mask = hf_reference(tok, [{"role": "user", "content": [{"type": "image"}, {"type": "text",
                                                                                   "text": "\nWhat is it?"}]},
                                   {"role": "assistant", "content": "Noise."}], [6])
    assert s["input_ids"].tolist() == ids and s["loss_mask"].tolist() == mask


def test_parquet_binary_and_hf_image_struct(tmp_path, tok):
    """Parquet: encoded bytes column and the HF datasets Image struct; conversations as list<struct>; rows from 0."""
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 256, (6 + i, 5, 3), np.uint8) for i in range(5)]
    conv = [PARQUET_CONV] * 5
    pq.write_table(pa.table({"image": pa.array([png_bytes(a) for a in arrays], pa.binary()), "conversations": conv}),
                   tmp_path / "bin.parquet", row_group_size=2)
    pq.write_table(pa.table({"image": [{"bytes": png_bytes(a), "path": None} for a in arrays],
                             "conversations": conv}), tmp_path / "hf.parquet")
    for name in ("bin.parquet", "hf.parquet"):
        samples = list(ImageTextStream(tmp_path / name, tok, image_tokens=4))
        assert [s["row"] for s in samples] == list(range(5))
        for s, a in zip(samples, arrays, strict=True):
            assert np.array_equal(s["images"][0].numpy(), a)


def test_packed_labels_are_the_assistant_tokens(tmp_path, tok):
    """pack_sequences keeps loss only on next tokens inside the mask (oracle: the sample's own mask, shifted)."""
    (tmp_path / "a.jsonl").write_text(json.dumps({"image": [], "conversations": CONVERSATIONS[2]}) + "\n")
    s = next(iter(ImageTextStream(tmp_path / "a.jsonl", tok)))
    b = pack_sequences([s], seq_len=len(s["input_ids"]) + 3)[0]
    n = len(s["input_ids"])
    want = torch.where(s["loss_mask"][1:], s["input_ids"][1:], -100)
    assert torch.equal(b.labels[0, :n - 1], want) and (b.labels[0, n - 1:] == -100).all()


def _bad_records(tmp_path: Path) -> list[tuple[object, str, str]]:
    (tmp_path / "ok.png").write_bytes(png_bytes(np.zeros((4, 4, 3), np.uint8)))
    (tmp_path / "corrupt.png").write_bytes(png_bytes(np.zeros((40, 40, 3), np.uint8))[:50])
    (tmp_path / "lfs.png").write_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 9\n")
    good = CONVERSATIONS[0]
    return [  # (record or raw line, reason, message fragment after "bad.jsonl: line 2: ")
        ({"image": "nope.png", "conversations": good}, "missing_file",
         r"field 'image': image file .*nope\.png not found"),
        ({"image": "corrupt.png", "conversations": good}, "invalid_image", r"field 'image': cannot decode image"),
        ({"image": "lfs.png", "conversations": good}, "lfs_pointer", r"field 'image': image .*lfs\.png is a Git LFS"),
        ({"image": ["ok.png", {"bytes": "%%%"}], "conversations": good}, "invalid_image",
         r"field 'image\[1\]': invalid base64"),
        ({"image": 5, "conversations": good}, "wrong_type", r"field 'image': image must be a path, bytes"),
        ({"conversations": good}, "missing_field", r"field 'image' missing \(keys: \['conversations'\]\)"),
        ({"image": "ok.png", "conversations": None}, "missing_field", r"field 'conversations' is null"),
        ({"image": "ok.png", "conversations": "hi"}, "invalid_conversation",
         r"field 'conversations' must be a non-empty list of messages, got str"),
        ({"image": "ok.png", "conversations": [{"role": "robot", "content": "x"}]}, "invalid_conversation",
         r"field 'conversations' \[0\]\.role: unknown role 'robot'"),
        ({"image": "ok.png", "conversations": [{"role": "user", "content": 3}]}, "invalid_conversation",
         r"field 'conversations' \[0\]\.content: must be a string or a list of parts, got int"),
        ({"image": "ok.png", "conversations": [{"role": "user", "content": "<image> hi"}]}, "invalid_conversation",
         r"field 'conversations' has no assistant turn with text"),
        ({"image": "ok.png", "conversations": [{"role": "user", "content": "<image><image>"},
                                                {"role": "assistant", "content": "x"}]}, "invalid_conversation",
         r"field 'conversations' has 2 image place\(s\) .* but the record has 1 image"),
        ({"image": "ok.png", "conversations": [{"role": "user", "content": "x " * 300},
                                                {"role": "assistant", "content": "y"}]}, "too_long",
         r"\d+ tokens > max_tokens=200"),
        (b'{"image": "ok.png", "conversations": [', "invalid_json", r"invalid JSON at column"),
    ]


def test_bad_records_raise_and_skip(tmp_path, tok):
    """Every bad record raises a DataError naming file, line and field; "skip" counts it and reads the rest."""
    bad = _bad_records(tmp_path)
    good = json.dumps({"image": "ok.png", "conversations": CONVERSATIONS[0]})
    for rec, reason, msg in bad:
        line = rec if isinstance(rec, bytes) else json.dumps(rec).encode()
        (tmp_path / "bad.jsonl").write_bytes(good.encode() + b"\n" + line + b"\n" + good.encode() + b"\n")
        with pytest.raises(DataError, match=r"bad\.jsonl: line 2: " + msg) as e:
            list(ImageTextStream(tmp_path / "bad.jsonl", tok, image_tokens=2, max_tokens=200))
        assert e.value.reason == reason and e.value.record == 2 and e.value.file.endswith("bad.jsonl"), reason
    lines = [good] + [r.decode() if isinstance(r, bytes) else json.dumps(r) for r, _, _ in bad] + [good]
    (tmp_path / "all.jsonl").write_text("\n".join(lines) + "\n")
    ds = ImageTextStream([tmp_path / "all.jsonl", tmp_path / "gone.jsonl"], tok, image_tokens=2, max_tokens=200,
                         on_error="skip")
    assert [s["row"] for s in ds] == [1, len(lines)]
    want: dict[str, int] = {"missing_file": 1}
    for _, reason, _ in bad:
        want[reason] = want.get(reason, 0) + 1
    assert ds.skipped == want and len(ds.problems) == len(bad) + 1


def test_template_tokens_must_exist(tmp_path):
    """A tokenizer without the template's special tokens is refused when the reader is built."""
    plain = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    (tmp_path / "a.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"ChatTemplate.im_start: token '<\|im_start\|>' is not in"):
        ImageTextStream(tmp_path / "a.jsonl", plain)


def test_rank_sharding_disjoint_and_complete(tmp_path, tok):
    """Ranks 0..2 of 3 read disjoint records whose union is the single reader's (jsonl + parquet)."""
    (tmp_path / "ok.png").write_bytes(png_bytes(np.zeros((4, 4, 3), np.uint8)))
    rec = {"image": "ok.png", "conversations": CONVERSATIONS[0]}
    (tmp_path / "a.jsonl").write_text((json.dumps(rec) + "\n") * 7)
    pq.write_table(pa.table({"image": ["ok.png"] * 11, "conversations": [PARQUET_CONV] * 11}),
                   tmp_path / "b.parquet", row_group_size=4)
    files = [tmp_path / "a.jsonl", tmp_path / "b.parquet"]

    def keys(ds):
        return [(Path(s["file"]).name, s["row"]) for s in ds]

    everything = keys(ImageTextStream(files, tok, image_tokens=1))
    assert len(everything) == 18
    parts = [keys(ImageTextStream(files, tok, image_tokens=1, rank=r, world_size=3)) for r in range(3)]
    assert sorted(x for p in parts for x in p) == sorted(everything) and sum(map(len, parts)) == 18
