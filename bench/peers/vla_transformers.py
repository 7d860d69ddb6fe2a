"""The VLAs of lf's ``vla`` and ``vla_flow`` recipes as a user would write them with HF ``transformers``.

Peers for ``bench/vla_peer.py``: built from transformers classes of the same sizes (random init, no weights),
the glue in plain PyTorch, the masks as a user would pass them (a 4D boolean mask, True = may attend).

- :class:`TokenVLA` (OpenVLA-style): ``SiglipVisionModel`` (no pooling head) -> ``nn.Linear`` projector;
  instruction embeddings and a state ``nn.Linear`` token; ``LlamaForCausalLM`` over
  ``[patches | instruction | state | action tokens]`` with the prefix-LM mask (prefix bidirectional, actions
  causal, padded instruction keys masked) and ``logits_to_keep`` = the action positions.
- :class:`FlowVLA` (pi0-style, as openpi / lerobot write it): the same encoder and projector, a backbone
  ``LlamaModel`` and an action-expert ``LlamaModel`` whose decoder layers are run by hand in one joint
  attention per layer (prefix queries see the prefix; suffix queries see everything), RoPE from the
  backbone's rotary embedding, SDPA with GQA. The last backbone layer's unused parts (q, o, MLP, the
  final norm) and the expert's token embedding are removed, as the lf recipe has none (and DDP needs every
  parameter used). Suffix input: pi0's action/time MLP with a sine-cosine time embedding.

Structural differences from lf's recipes (a few parameters, < 0.1% at the 3B size): RMSNorm and RoPE in the
Llama parts where lf has LayerNorm and learned positions; SigLIP's attention biases.

Legend: ``x_bsd`` (batch, seq, width); ``_bhsd`` (batch, heads, seq, head_dim); actions ``_bha``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _siglip(cfg) -> nn.Module:
    from transformers import SiglipVisionConfig, SiglipVisionModel

    hidden = getattr(cfg, "vision_mlp_hidden", None) or cfg.vision_hidden
    return SiglipVisionModel(SiglipVisionConfig(
        hidden_size=cfg.vision_dim, intermediate_size=hidden, num_hidden_layers=cfg.vision_layers,
        num_attention_heads=cfg.vision_heads, image_size=cfg.image_size, patch_size=cfg.patch_size,
        vision_use_head=False))


def _llama_config(vocab: int, dim: int, hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                       tie_word_embeddings=False, max_position_embeddings=4096, attn_implementation="sdpa",
                       bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _pixels(image: torch.Tensor) -> torch.Tensor:
    """uint8 (batch, H, W, 3) -> float (batch, 3, H, W) in [-1, 1], as lf's recipes."""
    return image.permute(0, 3, 1, 2).float() * (2.0 / 255.0) - 1.0


class _Prefix(nn.Module):
    """Image patches, instruction embeddings and one state token: (batch, P, dim) and key padding (batch, P)."""

    def __init__(self, cfg, embed: nn.Embedding):
        super().__init__()
        self.vision = _siglip(cfg)
        self.proj = nn.Linear(cfg.vision_dim, cfg.dim)
        self.state_proj = nn.Linear(cfg.state_dim, cfg.dim)
        self.embed = embed

    def forward(self, image, instruction_ids, instruction_mask, state):
        patches = self.proj(self.vision(pixel_values=_pixels(image)).last_hidden_state)
        text = self.embed(instruction_ids)
        x_bsd = torch.cat([patches, text.to(patches.dtype), self.state_proj(state)[:, None].to(patches.dtype)], 1)
        ones = torch.ones(image.shape[0], patches.shape[1], dtype=torch.bool, device=image.device)
        return x_bsd, torch.cat([ones, instruction_mask.bool(), ones[:, :1]], dim=1)


class TokenVLA(nn.Module):
    """OpenVLA-style token VLA of a ``lf_ir.recipes.vla.VLAConfig`` (SwiGLU backbone sizes)."""

    def __init__(self, cfg):
        super().__init__()
        from transformers import LlamaForCausalLM

        self.cfg = cfg
        self.llm = LlamaForCausalLM(_llama_config(cfg.vocab_size, cfg.dim, cfg.mlp_hidden, cfg.layers, cfg.heads,
                                                  cfg.kv_heads, cfg.dim // cfg.heads))
        self.prefix = _Prefix(cfg, self.llm.get_input_embeddings())

    def training_loss(self, batch) -> torch.Tensor:
        """Mean cross-entropy (float32) of the action tokens; ``batch`` as lf's ``VLAModel.training_loss``."""
        prefix, pad = self.prefix(batch["image"], batch["instruction_ids"], batch["instruction_mask"], batch["state"])
        actions = self.llm.get_input_embeddings()(batch["action_in_ids"]).to(prefix.dtype)
        x_bsd = torch.cat([prefix, actions], dim=1)
        s, p = x_bsd.shape[1], prefix.shape[1]
        pos = torch.arange(s, device=x_bsd.device)
        allowed = (pos[None, :] < p) | (pos[None, :] <= pos[:, None])  # prefix-LM: (query, key)
        key_pad = torch.cat([pad, torch.ones_like(batch["action_in_ids"], dtype=torch.bool)], dim=1)
        mask = allowed[None, None] & key_pad[:, None, None, :]
        labels = batch["labels"]
        logits = self.llm(inputs_embeds=x_bsd, attention_mask=mask, logits_to_keep=labels.shape[1]).logits
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)


def _sincos(sigma_b: torch.Tensor, width: int, min_period: float = 4e-3, max_period: float = 4.0) -> torch.Tensor:
    """pi0's ``posemb_sincos`` of the flow time: (batch,) -> (batch, width) float32."""
    fraction = torch.linspace(0.0, 1.0, width // 2, device=sigma_b.device, dtype=torch.float32)
    period = min_period * (max_period / min_period) ** fraction
    angle = sigma_b.float()[:, None] / period[None] * 2 * math.pi
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)


class FlowVLA(nn.Module):
    """pi0-style flow VLA of a ``lf_ir.recipes.vla_flow.VLAFlowConfig`` (``mlp_activation="swiglu"`` sizes)."""

    def __init__(self, cfg):
        super().__init__()
        from transformers import LlamaModel

        self.cfg = cfg
        self.checkpoint = False
        """Activation checkpointing of each joint layer (``torch.utils.checkpoint``, non-reentrant)."""
        self.backbone = LlamaModel(_llama_config(cfg.text_vocab_size, cfg.dim, cfg.hidden, cfg.layers, cfg.heads,
                                                 cfg.kv_heads, cfg.head_dim))
        self.expert = LlamaModel(_llama_config(1, cfg.expert_dim, cfg.expert_hidden, cfg.layers, cfg.heads,
                                               cfg.kv_heads, cfg.head_dim))
        self.expert.embed_tokens = None  # the suffix enters as the action/time MLP's output
        last = self.backbone.layers[-1]  # its prefix outputs are never read: keys and values only
        last.self_attn.q_proj = last.self_attn.o_proj = last.mlp = last.post_attention_layernorm = None
        self.backbone.norm = None
        self.prefix = _Prefix(cfg, self.backbone.embed_tokens)
        w = cfg.expert_dim
        self.action_in, self.time_in = nn.Linear(cfg.action_dim, w), nn.Linear(2 * w, w)
        self.time_out, self.action_out = nn.Linear(w, w), nn.Linear(w, cfg.action_dim)

    @staticmethod
    def _qkv(layer, x_bsd, cos, sin):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        attn, h = layer.self_attn, layer.input_layernorm(x_bsd)
        shape = (*x_bsd.shape[:2], -1, attn.head_dim)
        k = attn.k_proj(h).view(shape).transpose(1, 2)
        v = attn.v_proj(h).view(shape).transpose(1, 2)
        if attn.q_proj is None:  # keys and values only
            return None, apply_rotary_pos_emb(k, k, cos, sin)[1], v
        q, k = apply_rotary_pos_emb(attn.q_proj(h).view(shape).transpose(1, 2), k, cos, sin)
        return q, k, v

    @staticmethod
    def _post(layer, x_bsd, o_bhsd):
        x_bsd = x_bsd + layer.self_attn.o_proj(o_bhsd.transpose(1, 2).flatten(2))
        return x_bsd + layer.mlp(layer.post_attention_layernorm(x_bsd))

    def velocity(self, image, instruction_ids, instruction_mask, state, noisy_bha, sigma_b) -> torch.Tensor:
        """Velocity (batch, H, action_dim) at noisy actions (batch, H, action_dim) and times sigma (batch,)."""
        x_pre, pad = self.prefix(image, instruction_ids, instruction_mask, state)
        t = _sincos(sigma_b, self.cfg.expert_dim)[:, None].expand(-1, noisy_bha.shape[1], -1)
        a = self.action_in(noisy_bha)
        x_suf = self.time_out(F.silu(self.time_in(torch.cat([a, t.to(a.dtype)], dim=-1))))
        p, h = x_pre.shape[1], x_suf.shape[1]
        pos = torch.arange(p + h, device=x_pre.device)
        cos, sin = self.backbone.rotary_emb(x_pre, pos[None])
        allowed = (pos[None, :] < p) | (pos[:, None] >= p)  # (query, key): prefix sees prefix, suffix sees all
        key_pad = torch.cat([pad, torch.ones(pad.shape[0], h, dtype=torch.bool, device=pad.device)], dim=1)
        mask = allowed[None, None] & key_pad[:, None, None, :]
        n = len(self.backbone.layers)
        for i, (lp, ls) in enumerate(zip(self.backbone.layers, self.expert.layers, strict=True)):
            args = (lp, ls, x_pre, x_suf, cos, sin, mask, i == n - 1)
            if self.checkpoint and torch.is_grad_enabled():
                x_pre, x_suf = torch.utils.checkpoint.checkpoint(self._joint_layer, *args, use_reentrant=False)
            else:
                x_pre, x_suf = self._joint_layer(*args)
        return self.action_out(self.expert.norm(x_suf))

    def _joint_layer(self, lp, ls, x_pre, x_suf, cos, sin, mask, last: bool):
        p = x_pre.shape[1]
        qp, kp, vp = self._qkv(lp, x_pre, cos[:, :p], sin[:, :p])
        qs, ks, vs = self._qkv(ls, x_suf, cos[:, p:], sin[:, p:])
        k, v = torch.cat([kp, ks.to(kp.dtype)], 2), torch.cat([vp, vs.to(vp.dtype)], 2)
        if not last:
            o = F.scaled_dot_product_attention(torch.cat([qp, qs.to(qp.dtype)], 2), k, v, attn_mask=mask,
                                               enable_gqa=True)
            x_pre, o_suf = self._post(lp, x_pre, o[:, :, :p]), o[:, :, p:]
        else:  # the last layer: suffix queries only
            o_suf = F.scaled_dot_product_attention(qs.to(kp.dtype), k, v, attn_mask=mask[:, :, p:], enable_gqa=True)
        return x_pre, self._post(ls, x_suf, o_suf)

    def training_loss(self, batch) -> torch.Tensor:
        """Mean squared velocity error (float32) on the real action steps; ``batch`` as lf's ``VLAFlowModel``."""
        x0, noise, sigma = batch["actions"], batch["noise"], batch["sigma"]
        s = sigma[:, None, None]
        x_t = (1 - s) * x0 + s * noise
        pred = self.velocity(batch["image"], batch["instruction_ids"], batch["instruction_mask"], batch["state"],
                             x_t, sigma)
        keep = batch["action_mask"].float()[..., None]
        err = (pred.float() - (noise - x0).float()) ** 2 * keep
        return err.sum() / (keep.sum() * x0.shape[-1]).clamp(min=1)
