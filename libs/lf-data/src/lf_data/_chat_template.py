"""ChatML / Qwen2-VL chat rendering straight to token ids, with the loss mask on assistant tokens (no Jinja).

Follows the ``chat_template`` of Qwen2-VL's ``tokenizer_config.json`` (Qwen2-VL, arXiv:2409.12191)::

    <|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n      (added when the first turn is not system)
    <|im_start|>user\\n<|vision_start|><|image_pad|>...<|vision_end|>What is this?<|im_end|>\\n
    <|im_start|>assistant\\nA cat.<|im_end|>\\n

with ``<|image_pad|>`` repeated once per visual token of the image (what ``Qwen2VLProcessor`` does).
Targets (``loss_mask`` True): each assistant turn's content and its closing ``<|im_end|>``; the
role headers, the line break after ``<|im_end|>``, system and user turns are not.

Segments are tokenized separately (``add_special_tokens=False``) and concatenated, so the mask is exact.
This equals tokenizing the whole rendered string whenever the tokenizer's pre-tokenizer splits at the
line break after the role and at the template's special tokens (true for GPT-2 / Qwen2 byte-level BPE;
tested against ``transformers``' ``apply_chat_template``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

__all__ = ["ChatTemplate", "Message", "parse_conversation", "qwen2_vl_image_tokens"]

ROLE_ALIASES = {"system": "system", "user": "user", "assistant": "assistant", "human": "user", "gpt": "assistant"}
"""Accepted roles: ``{"role", "content"}`` messages (OpenAI / HF) and ``{"from", "value"}`` (ShareGPT / LLaVA)."""

Message = tuple[str, list[str | None]]
"""(role, parts): each part a text string or ``None`` for one image."""


@dataclass(frozen=True, kw_only=True)
class ChatTemplate:
    """Strings of a ChatML-style template; the defaults are Qwen2-VL's."""

    im_start: str = "<|im_start|>"
    """Opens a turn, followed by the role and a line break."""
    im_end: str = "<|im_end|>"
    """Closes a turn (followed by a line break); a target token on assistant turns."""
    vision_start: str | None = "<|vision_start|>"
    """Token before an image's placeholder tokens (``None``: none)."""
    image_pad: str = "<|image_pad|>"
    """Placeholder token, repeated once per visual token of the image."""
    vision_end: str | None = "<|vision_end|>"
    """Token after an image's placeholder tokens (``None``: none)."""
    default_system: str | None = "You are a helpful assistant."
    """System turn added when the conversation does not start with one (``None``: never)."""
    image_marker: str = "<image>"
    """Where an image goes in string content (LLaVA style); without any marker the images open the first user turn."""

    def special_ids(self, tok: Tokenizer) -> dict[str, int]:
        """Ids of the template's special tokens in ``tok``.

        Raises:
            ValueError: a token is not in the vocabulary (names it).
        """
        out = {}
        for name in ("im_start", "im_end", "vision_start", "image_pad", "vision_end"):
            token = getattr(self, name)
            if token is None:
                continue
            i = tok.token_to_id(token)
            if i is None:
                raise ValueError(f"ChatTemplate.{name}: token {token!r} is not in the tokenizer's vocabulary")
            out[name] = i
        return out

    def render(self, tok: Tokenizer, messages: Sequence[Message], image_tokens: Sequence[int]) -> tuple[list, list]:
        """Token ids and loss mask (True on targets) of a conversation, images expanded to placeholders.

        Args:
            tok: tokenizer holding the template's special tokens (see :meth:`special_ids`).
            messages: from :func:`parse_conversation`.
            image_tokens: placeholder count of each image, in order of appearance.

        Returns:
            (ids, mask): two lists of equal length.
        """
        sp = self.special_ids(tok)
        ids: list[int] = []
        mask: list[bool] = []

        def add(seg: list[int], target: bool) -> None:
            ids.extend(seg)
            mask.extend([target] * len(seg))

        def text(s: str) -> list[int]:
            return tok.encode(s, add_special_tokens=False).ids if s else []

        if self.default_system is not None and (not messages or messages[0][0] != "system"):
            messages = [("system", [self.default_system]), *messages]
        images = iter(image_tokens)
        for role, parts in messages:
            target = role == "assistant"
            add([sp["im_start"], *text(f"{role}\n")], False)
            for part in parts:
                if part is None:
                    vis = [sp["image_pad"]] * next(images)
                    add([*([sp["vision_start"]] if "vision_start" in sp else []), *vis,
                         *([sp["vision_end"]] if "vision_end" in sp else [])], False)
                else:
                    add(text(part), target)
            add([sp["im_end"]], target)
            add(text("\n"), False)
        return ids, mask


def parse_conversation(value: object, template: ChatTemplate, num_images: int) -> list[Message]:
    """Check a conversation and place its images; raises ``ValueError`` naming the bad element.

    Accepts a list of ``{"role", "content"}`` or ``{"from", "value"}`` dicts; content is a string (images at
    ``template.image_marker``) or a list of ``{"type": "text", "text": ...}`` / ``{"type": "image"}`` parts.
    Without any image marker or part, the ``num_images`` images open the first user turn. Checks: a non-empty
    list, known roles, string text, at least one assistant turn with text, as many image places as images.
    """
    if not isinstance(value, list) or not value:
        raise ValueError(f"must be a non-empty list of messages, got {type(value).__name__} {str(value)[:40]!r}")
    out: list[Message] = []
    for k, msg in enumerate(value):
        if not isinstance(msg, dict):
            raise ValueError(f"[{k}] must be an object, got {type(msg).__name__}")
        rkey, ckey = ("role", "content") if "role" in msg else ("from", "value")
        role = ROLE_ALIASES.get(msg.get(rkey)) if isinstance(msg.get(rkey), str) else None
        if role is None:
            raise ValueError(f"[{k}].{rkey}: unknown role {msg.get(rkey)!r} (known: {sorted(ROLE_ALIASES)})")
        out.append((role, _parts(msg.get(ckey), template, f"[{k}].{ckey}")))
    if not any(role == "assistant" and any(p for p in parts if p) for role, parts in out):
        raise ValueError("has no assistant turn with text (nothing to train on)")
    places = sum(p is None for _, parts in out for p in parts)
    if places == 0 and num_images:
        first_user = next((k for k, (role, _) in enumerate(out) if role == "user"), None)
        if first_user is None:
            raise ValueError(f"has {num_images} image(s) but no user turn to put them in")
        role, parts = out[first_user]
        out[first_user] = (role, [*([None] * num_images), *parts])
    elif places != num_images:
        raise ValueError(f"has {places} image place(s) ({template.image_marker!r} markers or image parts) "
                         f"but the record has {num_images} image(s)")
    return out


def _parts(content: object, template: ChatTemplate, where: str) -> list[str | None]:
    if isinstance(content, str):
        pieces = content.split(template.image_marker)
        parts: list[str | None] = [pieces[0]]
        for piece in pieces[1:]:
            parts += [None, piece]
        return [p for p in parts if p != ""]
    if isinstance(content, list):
        parts = []
        for j, item in enumerate(content):
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "image":
                parts.append(None)
            elif kind == "text" and isinstance(item.get("text"), str):
                parts.append(item["text"])
            else:
                raise ValueError(f"{where}[{j}]: expected {{'type': 'text', 'text': str}} or {{'type': 'image'}}, "
                                 f"got {str(item)[:60]!r}")
        return parts
    raise ValueError(f"{where}: must be a string or a list of parts, got {type(content).__name__}")


def qwen2_vl_image_tokens(height: int, width: int, *, patch_size: int = 14, merge_size: int = 2,
                          min_pixels: int = 56 * 56, max_pixels: int = 28 * 28 * 1280) -> int:
    """Visual tokens of one ``height`` x ``width`` image in Qwen2-VL (``<|image_pad|>`` count).

    ``smart_resize`` of HF ``Qwen2VLImageProcessor``: both sides rounded to multiples of
    ``patch_size * merge_size`` with the pixel count kept in ``[min_pixels, max_pixels]``; then one token per
    ``merge_size x merge_size`` patches.

    Raises:
        ValueError: a side below 1 or an aspect ratio above 200 (as Qwen2-VL).
    """
    if height < 1 or width < 1 or max(height, width) / min(height, width) > 200:
        raise ValueError(f"image size {height}x{width}: sides must be >= 1 and the aspect ratio <= 200")
    f = patch_size * merge_size
    h, w = round(height / f) * f, round(width / f) * f
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return (h // f) * (w // f)
