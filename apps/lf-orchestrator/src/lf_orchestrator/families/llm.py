"""The ``llm`` family: causal-LM pretraining of the llama3 recipe on packed stdlib docstrings.

Data: :mod:`lf_orchestrator.families._corpus` (one sample = one packed row of
``corpus.seq_len`` tokens). Loss: next-token cross-entropy summed over labelled
tokens (``lf_kernels.fused_linear_cross_entropy`` over the final hidden states and
the head weight, chunked: the (tokens, vocab) logits are never stored; plain logits
when tensor parallelism shards the head). Evaluation: perplexity
``exp(mean CE)`` over the held-out rows.

Document masks: rows hold several documents. ``Llama3Model`` (lf-ir) takes
``positions`` and ``key_padding`` but no ``document_ids``, so attention is plain
causal across the documents of a row (labels never cross a document end, and
positions run 0..seq-1 as in unmasked packing). When the lowered attention takes
``document_ids`` (lf-kernels' causal + documents mask) this family passes it
together with the per-document positions (:data:`DOCUMENT_MASKS` says which).
"""

from __future__ import annotations

import inspect
import json
import math
import shutil

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from lf_ir._lower import AttentionModule
from lf_kernels import fused_linear_cross_entropy
from lf_orchestrator.families._corpus import build_corpus, load_rows
from lf_orchestrator.families.base import Family

DOCUMENT_MASKS = "document_ids" in inspect.signature(AttentionModule.forward).parameters
"""Whether lf-ir's attention accepts packed-document ids (False in lf-ir 0.3.0: causal across documents)."""


def lm_loss_sum(model: nn.Module, ids_bs: torch.Tensor, labels_bs: torch.Tensor,
                positions_bs: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy (float32) summed over tokens whose label is not -100; ids/labels (batch, seq) int64.

    Runs the ``text`` component of a llama3 / qwen2-style model up to its head, then the fused linear CE.
    """
    text = model.components["text"]
    h_bsd = text(ids_bs, mask=model.mask, positions=positions_bs, stop=len(text.layers) - 1)
    head = text.layers[-1]
    weight = head._tied[0].weight if head._tied else head.weight
    if isinstance(weight, DTensor):  # tensor parallel head: gathered logits, plain CE
        logits = head(h_bsd)
        return F.cross_entropy(logits.flatten(0, 1).float(), labels_bs.flatten(), reduction="sum")
    return fused_linear_cross_entropy(h_bsd.flatten(0, 1), weight.to(h_bsd.dtype), labels_bs.flatten(),
                                      reduction="sum").float()


class LLMFamily(Family):
    """llama3 on the stdlib-docstring corpus (see the module docstring)."""

    name = "llm"
    loss_label = "next-token cross-entropy"

    def prepare(self) -> None:
        c = self.cfg.corpus
        self.folder = build_corpus(c, self.recipe_cfg.vocab_size)
        self.rows = load_rows(self.folder, "train")
        self.eval_rows = load_rows(self.folder, "eval")
        if self.ctx.is_main:
            shutil.copyfile(self.folder / "tokenizer.json", self.run_dir / "tokenizer.json")
            (self.run_dir / "corpus.json").write_text((self.folder / "meta.json").read_text())
        self.meta = json.loads((self.folder / "meta.json").read_text())

    @property
    def num_samples(self) -> int:
        return int(self.rows["input_ids"].shape[0])

    @property
    def seq_len(self) -> int:
        return self.cfg.corpus.seq_len

    def collate(self, indices: list[int], step: int) -> dict[str, torch.Tensor]:
        idx = torch.tensor(indices)
        return {k: v[idx].long() for k, v in self.rows.items()}

    def normalizer(self, batch: dict[str, torch.Tensor]) -> int:
        return int((batch["labels"] != -100).sum())

    def loss_sum(self, model, batch):
        if DOCUMENT_MASKS:  # pragma: no cover (lf-ir does not take document ids yet)
            raise NotImplementedError("wire document_ids through Llama3Model.forward")
        return lm_loss_sum(model, batch["input_ids"], batch["labels"]), {}

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Held-out perplexity ``exp(sum CE / labelled tokens)`` and the mean CE, nats per token."""
        total, count = 0.0, 0
        n, mb = self.eval_rows["input_ids"].shape[0], self.cfg.parallel.micro_batch
        device = next(model.parameters()).device
        for start in range(0, n, mb):
            b = {k: v[start:start + mb].long().to(device) for k, v in self.eval_rows.items()}
            total += float(lm_loss_sum(model, b["input_ids"], b["labels"]))
            count += self.normalizer(b)
        ce = total / max(count, 1)
        return {"eval/cross_entropy": ce, "eval/perplexity": math.exp(min(ce, 50.0)), "eval/tokens": float(count)}


def make_family(cfg, run_dir, ctx) -> LLMFamily:
    """The family object of ``model.recipe = "llama3"``."""
    return LLMFamily(cfg, run_dir, ctx)
