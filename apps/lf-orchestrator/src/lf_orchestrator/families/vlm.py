"""The ``vlm`` family: Qwen2-VL SFT on Meta-World frames, "What is the robot doing?" -> the task instruction.

Sample: one frame (every ``vlm.frame_stride``-th of an episode) resized to
``vlm.image_size`` and cut into Qwen2-VL's processor-ordered patches, in the chat
template ``<im_start> user <vision_start> <image_pad> x n <vision_end> PROMPT <im_end>
<im_start> assistant ANSWER <im_end>``; the loss (cross-entropy summed over tokens)
covers the answer and its closing ``<im_end>`` only. Episodes are split into
training and held-out ones; evaluation reports the held-out answer-token accuracy
(teacher-forced, greedy) and cross-entropy.

Tokenizer: the tiny example builds a word-level tokenizer (``lf_data.build_instruction_tokenizer``)
over the prompt and the instructions, with ``<im_start>`` / ``<im_end>`` after the words and the
recipe's vision ids; a full-size run would load Qwen2-VL's own ``tokenizer.json`` (not wired in).

Legend: ``ids_bs`` (batch, seq); ``patches_nf`` (patches, C*T*p*p); ``grid_thw`` (images, 3).
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from lf_ir import mrope_position_ids
from lf_orchestrator._atomic import write_text_atomic
from lf_orchestrator.families._metaworld import open_dataset, split_episodes
from lf_orchestrator.families.base import Family

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
"""Image mean of Qwen2-VL's processor (OpenAI CLIP)."""
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
"""Image standard deviation of Qwen2-VL's processor."""


def image_patches(image_hw3: torch.Tensor, side: int, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """(patches (grid_h * grid_w, C * T * p * p) float32, grid_thw (3,)) of one uint8 image, in the patch
    order of HF ``Qwen2VLImageProcessor`` (merge windows contiguous; the frame repeated ``T`` times)."""
    p, m, t = cfg.patch_size, cfg.spatial_merge_size, cfg.temporal_patch_size
    x = image_hw3.permute(2, 0, 1)[None].float() / 255.0
    x = F.interpolate(x, size=(side, side), mode="bilinear", antialias=True, align_corners=False)[0]
    x = (x - torch.tensor(CLIP_MEAN)[:, None, None]) / torch.tensor(CLIP_STD)[:, None, None]
    c, gh = x.shape[0], side // p
    x = x[None].expand(t, c, side, side)  # (T, C, H, W): a still image fills the temporal patch
    x = x.reshape(1, t, c, gh // m, m, p, gh // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gh * gh, c * t * p * p).contiguous(), torch.tensor([1, gh, gh])


PROMPT_TOKENS = 24
"""Text tokens of a sample besides the image's (template, prompt, answer), for the plan's sequence length."""


def image_tokens(vlm_image_size: int, cfg) -> int:
    """Language-model tokens of one ``vlm.image_size`` square image: ``(side / patch / merge) ** 2``."""
    return (vlm_image_size // cfg.patch_size // cfg.spatial_merge_size) ** 2


class VLMFamily(Family):
    """qwen2_vl SFT on Meta-World frames (see the module docstring)."""

    name = "vlm"
    loss_label = "answer-token cross-entropy"
    host_keys = ("image_grid_thw",)

    def prepare(self) -> None:
        from lf_data import build_instruction_tokenizer

        v, rc = self.cfg.vlm, self.recipe_cfg
        self.dataset = open_dataset(self.cfg, generate=self.ctx.is_main)
        train_eps, eval_eps = split_episodes(self.dataset.num_episodes, v.eval_fraction)
        self.train_frames = self._frames(train_eps)
        self.eval_frames = self._frames(eval_eps)
        self.tok = build_instruction_tokenizer([v.prompt, "user assistant", *self.dataset.tasks])
        words = self.tok.get_vocab_size()
        self.im_start, self.im_end = words, words + 1
        first_special = min(rc.image_token_id, rc.video_token_id, rc.vision_start_token_id, rc.vision_end_token_id)
        if self.im_end >= min(first_special, rc.vocab_size):
            raise ValueError(f"vlm: the word-level tokenizer needs {words + 2} ids but the model's special ids "
                             f"start at {first_special} (vocab_size {rc.vocab_size}); raise model.overrides")
        self.n_image_tokens = image_tokens(v.image_size, rc)
        if self.ctx.is_main:
            write_text_atomic(self.run_dir / "instruction_tokenizer.json", self.tok.to_str(pretty=True))
            write_text_atomic(self.run_dir / "vlm_template.json", json.dumps(
                {"im_start": self.im_start, "im_end": self.im_end, "image_tokens": self.n_image_tokens,
                 "train_frames": len(self.train_frames), "eval_frames": len(self.eval_frames)}))

    def _frames(self, episodes: list[int]) -> list[int]:
        stride = self.cfg.vlm.frame_stride
        return [i for e in episodes for i in range(*self.dataset.episode_ranges[e])[::stride]]

    @property
    def num_samples(self) -> int:
        return len(self.train_frames)

    @property
    def seq_len(self) -> int:
        return self.n_image_tokens + PROMPT_TOKENS

    def _words(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def _sample(self, frame: int) -> tuple[list[int], int, torch.Tensor, torch.Tensor]:
        rc, item = self.recipe_cfg, self.dataset[frame]
        prompt = [self.im_start, *self._words("user"), rc.vision_start_token_id,
                  *[rc.image_token_id] * self.n_image_tokens, rc.vision_end_token_id, *self._words(self.cfg.vlm.prompt),
                  self.im_end, self.im_start, *self._words("assistant")]
        ids = prompt + [*self._words(item["task"]), self.im_end]
        patches, grid = image_patches(item["image"], self.cfg.vlm.image_size, rc)
        return ids, len(prompt), patches, grid

    def _batch(self, frames: list[int]) -> dict[str, torch.Tensor]:
        samples = [self._sample(f) for f in frames]
        length = max(len(s[0]) for s in samples)
        ids = torch.zeros(len(samples), length, dtype=torch.long)
        labels = torch.full((len(samples), length), -100, dtype=torch.long)
        mask = torch.zeros(len(samples), length, dtype=torch.long)
        for r, (seq, prompt_len, _, _) in enumerate(samples):
            ids[r, :len(seq)] = torch.tensor(seq)
            mask[r, :len(seq)] = 1
            labels[r, prompt_len - 1:len(seq) - 1] = torch.tensor(seq[prompt_len:])  # predict the answer only
        grid = torch.stack([s[3] for s in samples])
        rc = self.recipe_cfg
        # M-RoPE ids on the host here, not per forward on the GPU (there they cost host syncs per sample)
        positions = mrope_position_ids(ids, grid, image_token_id=rc.image_token_id,
                                       spatial_merge_size=rc.spatial_merge_size, attention_mask=mask)
        return {"input_ids": ids, "labels": labels, "attention_mask": mask,
                "pixel_values": torch.cat([s[2] for s in samples]), "image_grid_thw": grid, "position_ids": positions}

    def collate(self, indices: list[int], step: int) -> dict[str, torch.Tensor]:
        return self._batch([self.train_frames[i] for i in indices])

    def normalizer(self, batch) -> int:
        return int((batch["labels"] != -100).sum())

    def _logits(self, model, batch) -> torch.Tensor:
        return model(batch["input_ids"], pixel_values=batch["pixel_values"], image_grid_thw=batch["image_grid_thw"],
                     attention_mask=batch["attention_mask"], position_ids=batch["position_ids"])

    def loss_sum(self, model, batch):
        logits = self._logits(model, batch).float()
        labels = batch["labels"]
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
        correct = ((logits.argmax(-1) == labels) & (labels != -100)).sum()
        return loss, {"answer_accuracy": correct}

    def evaluate(self, model) -> dict[str, float]:
        """Held-out answer-token accuracy and cross-entropy (nats per answer token); {} without held-out episodes."""
        if not self.eval_frames:
            return {}
        device, mb = next(model.parameters()).device, self.cfg.parallel.micro_batch
        loss = correct = count = 0.0
        for start in range(0, len(self.eval_frames), mb):
            batch = self.to_device(self._batch(self.eval_frames[start:start + mb]), device)
            total, metrics = self.loss_sum(model, batch)
            loss, correct = loss + float(total), correct + float(metrics["answer_accuracy"])
            count += self.normalizer(batch)
        return {"eval/answer_accuracy": correct / max(count, 1), "eval/cross_entropy": loss / max(count, 1)}


def make_family(cfg, run_dir, ctx) -> VLMFamily:
    """The family object of ``model.recipe = "qwen2_vl"``."""
    return VLMFamily(cfg, run_dir, ctx)


__all__ = ["CLIP_MEAN", "CLIP_STD", "PROMPT_TOKENS", "VLMFamily", "image_patches", "image_tokens", "make_family"]
