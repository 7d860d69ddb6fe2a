"""Context parallelism (``parallel.spec = "cp=2"``) in the trainer: which families, the cp-rank loss shares.

Every cp rank of a data-parallel group reads the *same* samples (the sampler is
indexed by the dp rank only); :func:`lf_parallel.parallelize` makes each lowered
self-attention context-parallel (ring or Ulysses over the mesh's ``cp`` dim), and the
caller feeds each rank its zigzag shard of the tokens (``ContextParallel.shard``;
parallelize does not shard inputs). So a family's context-parallel loss returns this
rank's *share* of the sample loss: the shares of the cp ranks sum to the whole
loss (:func:`video_loss_share`, :func:`lm_batch_shard`). The trainer then

- scales each share by ``dp * cp / units`` before backward: DDP / FSDP average the
  gradients over the ``dp x cp`` ranks (``lf_parallel.dp_mesh``), so the sum over
  cp of the shares' gradients, averaged over dp, is the one-process gradient;
- sums the logged loss over all ranks and divides by the tp replicas only (each
  share is counted once), the target units by ``tp * cp`` (every cp rank counts
  the same samples), so ``train/loss`` equals the one-process value.

Evaluation under cp runs the same shards and sums them over the cp group
(:func:`cp_all_sum`). Recipes wired: those whose ``lf_ir.RecipeSpec.context_parallel`` names the kind
(wan_dit of the video family, llama3 of the llm family); cp with tp or
pp, the vlm family and ``cp_kind = "ring+ulysses"`` are refused before any work
(:func:`cp_unsupported`, called by the config check and the plan resolution).

Legend: ``x0_bcfhw`` (batch, z, latent frames, h, w); ``x_bsd`` (batch, local tokens, dim).
"""

from __future__ import annotations

import torch

CP_KINDS = ("ring", "ulysses")
"""``cp_kind`` values :func:`lf_parallel.parallelize` applies from the plan."""


def cp_unsupported(plan, recipe: str) -> str | None:
    """Why the trainer cannot run ``plan`` (cp > 1) for ``model.recipe = recipe``; None when it can."""
    if plan.cp <= 1:
        return None
    from lf_ir import RECIPES, recipe_spec

    kinds = recipe_spec(recipe, where="model.recipe").context_parallel
    if not kinds:
        wired = sorted(name for name, spec in RECIPES.items() if spec.context_parallel)
        return (f"cp > 1 is wired into the trainer for model.recipe in {wired} only (the recipes whose "
                f"RecipeSpec.context_parallel is set), got model.recipe = {recipe!r}")
    if plan.cp_kind not in CP_KINDS:
        return (f"parallel.cp_kind = {plan.cp_kind!r} is not run by the trainer (expected one of "
                f"{list(CP_KINDS)}; 'ring+ulysses' needs a 2-D split of the cp group the plan does not describe)")
    if plan.cp_kind not in kinds:
        return f"parallel.cp_kind = {plan.cp_kind!r}: model.recipe = {recipe!r} runs cp_kind in {list(kinds)} only"
    if plan.tp > 1 or plan.pp > 1:
        return f"cp > 1 with tp > 1 or pp > 1 is not wired into the trainer yet (got tp={plan.tp}, pp={plan.pp})"
    return None


def cp_group(cp):
    """The process group of all ranks of ``cp`` (its ring group, else its Ulysses group)."""
    return cp.ring_group if cp.ring_group is not None else cp.ulysses_group


def cp_all_sum(value: torch.Tensor, cp) -> torch.Tensor:
    """Sum of ``value`` over the cp group (a detached copy; for evaluation and logging, not differentiable)."""
    out = value.detach().clone()
    torch.distributed.all_reduce(out, group=cp_group(cp))
    return out


def patchify(x_bcfhw: torch.Tensor, patch: tuple[int, int, int]) -> torch.Tensor:
    """(batch, c, f*pt, h*ph, w*pw) -> tokens (batch, f*h*w, pt*ph*pw*c): the token layout ``WanDiTModel``'s
    head predicts (the inverse of ``WanDiTModel.unpatchify``)."""
    b, c, ft, hp, wp = x_bcfhw.shape
    pt, ph, pw = patch
    x = x_bcfhw.reshape(b, c, ft // pt, pt, hp // ph, ph, wp // pw, pw)
    return x.permute(0, 2, 4, 6, 3, 5, 7, 1).reshape(b, (ft // pt) * (hp // ph) * (wp // pw), -1)


def video_loss_share(model, batch: dict[str, torch.Tensor], cp) -> torch.Tensor:
    """This cp rank's share (float32 scalar) of the video family's summed per-sample velocity MSE.

    The patch tokens are split after the patch embedding (zigzag layout of ``cp``), the DiT blocks run on this
    rank's tokens (their self-attention spans the cp group; the text and time embeddings are computed whole on
    every rank), and the squared error of this rank's tokens is divided by each sample's *whole* element count:
    the shares of the cp ranks sum to ``lf_ir.flow.flow_matching_loss(..., per_sample=True).sum()``.

    Args:
        model: a ``WanDiTModel`` whose self-attention :func:`lf_parallel.apply_context_parallel` switched.
        batch: ``x0``, ``noise`` (batch, z, f, h, w), ``sigma`` (batch,), ``text`` (batch, text_len, text_dim).
        cp: this rank's :class:`lf_parallel.ContextParallel`.

    Raises:
        ValueError: the video tokens do not divide by ``2 * cp`` (zigzag), naming both.
    """
    from lf_ir.flow import interpolate, timesteps_from_sigmas, velocity_target

    x0, noise, sigma_b = batch["x0"], batch["noise"], batch["sigma"]
    x_t = interpolate(x0, noise, sigma_b).to(x0.dtype)
    x_bsd, context, emb_bcd, temb_bd, cos, sin = model.embed_inputs(x_t, timesteps_from_sigmas(sigma_b), batch["text"])
    if x_bsd.shape[1] % (2 * cp.cp):
        raise ValueError(f"context parallel: {x_bsd.shape[1]} video tokens per sample do not divide by 2 * cp = "
                         f"{2 * cp.cp} (zigzag layout); change video.frames or the image size")
    x_bsd = model.trunk_blocks(cp.shard(x_bsd, dim=1), context, emb_bcd, temb_bd, cos, sin)
    pred_bsk = model.components["video"]["head"](x_bsd, temb_bd).float()
    target_bsk = cp.shard(patchify(velocity_target(x0, noise), model.cfg.patch), dim=1)
    return ((pred_bsk - target_bsk).square().sum(dim=(1, 2)) / x0[0].numel()).sum()


LM_KEYS = ("input_ids", "labels", "position_ids", "document_ids")
"""Per-token (batch, seq) tensors of an llm batch that are split over the cp ranks."""


def lm_batch_shard(batch: dict[str, torch.Tensor], cp) -> dict[str, torch.Tensor]:
    """This cp rank's zigzag shard of an llm batch's per-token tensors (labels are already shifted, so each
    token keeps its own target; rotary positions and document ids travel with their tokens).

    Raises:
        ValueError: ``corpus.seq_len`` does not divide by ``2 * cp``, naming both.
    """
    seq = batch["input_ids"].shape[1]
    if seq % (2 * cp.cp):
        raise ValueError(f"context parallel: corpus.seq_len = {seq} does not divide by 2 * cp = {2 * cp.cp} "
                         "(zigzag layout)")
    return {k: cp.shard(v, dim=1) if k in LM_KEYS else v for k, v in batch.items()}


def with_cp_kind(plan, spec: str, cp_kind: str):
    """``plan`` parsed from ``parallel.spec`` with ``parallel.cp_kind`` applied (``""``: unset, the spec's own
    ``cp_kind`` or the plan default stays).

    Raises:
        lf_parallel.PlanError: the spec and ``parallel.cp_kind`` name different kinds (both are named).
    """
    import msgspec

    from lf_parallel import PlanError

    if not cp_kind:
        return plan
    in_spec = any(item.split("=")[0].strip() == "cp_kind" for item in spec.split(","))
    if in_spec and plan.cp_kind != cp_kind:
        raise PlanError(f"parallel.spec {spec!r} says cp_kind={plan.cp_kind} but parallel.cp_kind = {cp_kind!r}; "
                        "give the kind in one place")
    return msgspec.structs.replace(plan, cp_kind=cp_kind)
