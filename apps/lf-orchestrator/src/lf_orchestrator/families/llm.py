"""The ``llm`` family: causal-LM pretraining of the llama3 recipe on packed stdlib docstrings.

Data: :mod:`lf_orchestrator.families._corpus` (one sample = one packed row of
``corpus.seq_len`` tokens). Loss: next-token cross-entropy summed over labelled
tokens (``lf_kernels.fused_linear_cross_entropy`` over the final hidden states and
the head weight, chunked: the (tokens, vocab) logits are never stored; plain logits
when tensor parallelism shards the head). Evaluation: perplexity
``exp(mean CE)`` over the held-out rows.

Document masks: rows hold several documents; each attends only within itself
(lf-kernels' causal + documents mask through ``document_ids``) with rotary positions
restarting at every document, so a packed row computes what its documents would
alone, and labels never cross a document end.
"""

from __future__ import annotations

import json
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from lf_kernels import fused_linear_cross_entropy
from lf_orchestrator._atomic import write_bytes_atomic, write_text_atomic
from lf_orchestrator.families._context import cp_all_sum, lm_batch_shard
from lf_orchestrator.families._corpus import build_corpus, load_rows
from lf_orchestrator.families.base import Family


def lm_loss_sum(model: nn.Module, ids_bs: torch.Tensor, labels_bs: torch.Tensor,
                positions_bs: torch.Tensor | None = None, document_ids_bs: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy (float32) summed over tokens whose label is not -100; ids/labels (batch, seq) int64.

    Runs the ``text`` component of a llama3 / qwen2-style model up to its head, then the fused linear CE.
    ``positions_bs`` / ``document_ids_bs`` (batch, seq) int64: per-document rotary positions and the
    packed-document ids that keep attention within each document. The head's GEMMs run in the autocast dtype
    when autocast is on (as the eager head's ``F.linear`` would; float32 hidden states otherwise take fp32 SIMT
    GEMMs over the whole vocabulary), the chunk logits and the softmax in float32.
    """
    text = model.components["text"]
    h_bsd = text(ids_bs, mask=model.mask, positions=positions_bs, document_ids=document_ids_bs,
                 stop=len(text.layers) - 1)
    head = text.layers[-1]
    weight = head._tied[0].weight if head._tied else head.weight
    if isinstance(weight, DTensor):  # tensor parallel head: gathered logits, plain CE
        logits = head(h_bsd)
        return F.cross_entropy(logits.flatten(0, 1).float(), labels_bs.flatten(), reduction="sum")
    dtype = h_bsd.dtype
    if torch.is_autocast_enabled(h_bsd.device.type):  # the dtype autocast would give the head's F.linear
        dtype = torch.get_autocast_dtype(h_bsd.device.type)
    return fused_linear_cross_entropy(h_bsd.flatten(0, 1).to(dtype), weight.to(dtype), labels_bs.flatten(),
                                      reduction="sum").float()


class LLMFamily(Family):
    """llama3 on the stdlib-docstring corpus (see the module docstring)."""

    name = "llm"
    loss_label = "next-token cross-entropy"
    context_parallel = True

    def prepare(self) -> None:
        c = self.cfg.corpus
        self.folder = build_corpus(c, self.recipe_cfg.vocab_size)
        self.rows = load_rows(self.folder, "train")
        self.eval_rows = load_rows(self.folder, "eval")
        if self.ctx.is_main:
            write_bytes_atomic(self.run_dir / "tokenizer.json", (self.folder / "tokenizer.json").read_bytes())
            write_text_atomic(self.run_dir / "corpus.json", (self.folder / "meta.json").read_text())
        self.meta = json.loads((self.folder / "meta.json").read_text())
        ids, vocab = self.meta.get("tokenizer_vocab", self.recipe_cfg.vocab_size), self.recipe_cfg.vocab_size
        if ids < vocab:  # the log and plan.json say so (families/_corpus.py: the BPE ran out of merges)
            self.data_note = (f"corpus BPE has {ids:,} ids of the model's {vocab:,} (the corpus has no more merges); "
                              f"{self.num_samples} training rows of {self.seq_len} tokens")

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

    def loss_sum(self, model, batch, cp=None):
        """Summed next-token CE; with ``cp`` over this rank's token shard (:func:`._context.lm_batch_shard`)."""
        if cp is not None:
            batch = lm_batch_shard(batch, cp)
        return lm_loss_sum(model, batch["input_ids"], batch["labels"], batch["position_ids"],
                           batch["document_ids"]), {}

    def pipeline_inputs(self, batch):
        """``((input_ids, position_ids, document_ids), labels)``: the first stage's token ids and side tensors."""
        return (batch["input_ids"], batch["position_ids"], batch["document_ids"]), batch["labels"]

    def evaluate(self, model: nn.Module, cp=None) -> dict[str, float]:
        """Held-out perplexity ``exp(sum CE / labelled tokens)`` and the mean CE, nats per token; with ``cp``
        each rank scores its token shards and the sums are added over the cp group."""
        total, count = 0.0, 0
        n, mb = self.eval_rows["input_ids"].shape[0], self.cfg.parallel.micro_batch
        device = next(model.parameters()).device
        for start in range(0, n, mb):
            b = {k: v[start:start + mb].long().to(device) for k, v in self.eval_rows.items()}
            count += self.normalizer(b)
            if cp is not None:
                b = lm_batch_shard(b, cp)
            ce_sum = lm_loss_sum(model, b["input_ids"], b["labels"], b["position_ids"], b["document_ids"])
            total += float(ce_sum if cp is None else cp_all_sum(ce_sum, cp))
        ce = total / max(count, 1)
        return {"eval/cross_entropy": ce, "eval/perplexity": math.exp(min(ce, 50.0)), "eval/tokens": float(count)}


def make_family(cfg, run_dir, ctx) -> LLMFamily:
    """The family object of ``model.recipe = "llama3"``."""
    return LLMFamily(cfg, run_dir, ctx)
