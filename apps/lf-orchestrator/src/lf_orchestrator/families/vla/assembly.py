"""Build the pieces of a VLA run from a config: data encoder and model (token ``vla`` or flow ``vla_flow``).

Used by training and by evaluation, so both see the same tokenizers,
normalization and model shape. Everything a run needs to act again is written
to (and read back from) its run folder:

    instruction_tokenizer.json   HF tokenizers file
    action_tokenizer.json        lf-tokenize-action binning or FAST tokenizer
    action_tokens.json           FAST only: the target layout (max_action_tokens; :mod:`._fast_actions`)
    normalization.json           state mean/std (vla_flow: and action mean/std)
    model.json                   the recipe name, its config and its IR graph

A ``vla_flow`` run has no action tokenizer: its actions are continuous, normalized
by the dataset's mean/std (:mod:`lf_orchestrator.families.vla.flow_batch`).
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import torch
from tokenizers import Tokenizer

from lf_data import DataError, LeRobotDataset, VLABatchEncoder, build_instruction_tokenizer, check_action_stats
from lf_ir import VLAConfig, VLAModel, materialize, to_json, use_fused_ops, vla_config
from lf_ir.recipes.vla_flow import VLAFlowConfig, VLAFlowModel, vla_flow_config
from lf_orchestrator.checkpoint import write_text_atomic
from lf_orchestrator.config import Config, ConfigError
from lf_orchestrator.families.vla._action_clip import check_clipped_actions
from lf_orchestrator.families.vla._fast_actions import FastBatchEncoder, fit_fast_encoder, load_fast_encoder
from lf_orchestrator.families.vla.flow_batch import FlowBatchEncoder
from lf_tokenize_action import BinningTokenizer

STATE_KEY, ACTION_KEY = "observation.state", "action"


def _stats(dataset: LeRobotDataset, key: str) -> dict[str, list[float]]:
    if key not in dataset.stats:
        raise ConfigError(f"data.path: dataset {dataset.root} has no statistics for feature "
                          f"{key!r} in meta/stats.json (found {sorted(dataset.stats)})")
    return dataset.stats[key]


def _tokenizer_stats(dataset: LeRobotDataset, bounds: str) -> dict[str, list[float]]:
    """The ``action`` statistics the action tokenizer's ``bounds`` come from, checked (``check_action_stats``:
    finite, lower <= upper, no zero-width bounds where the actions vary); ConfigError naming the file otherwise."""
    stats = _stats(dataset, ACTION_KEY)
    try:
        check_action_stats(stats, ACTION_KEY, str(Path(dataset.root) / "meta/stats.json"), bounds,
                           dataset.frame_actions)
    except DataError as err:
        raise ConfigError(f"action_tokenizer.bounds: {err}") from None
    return stats


def build_encoder(cfg: Config, dataset: LeRobotDataset) -> VLABatchEncoder | FlowBatchEncoder:
    """Fit the tokenizers and the normalization on ``dataset`` (fresh runs).

    Raises:
        ConfigError: missing or unusable statistics (not finite, q01 > q99, zero-width bounds), or an action
            tokenizer that clips more of the training actions than ``action_tokenizer.max_clipped_fraction`` allows
            with ``on_clipped = "error"`` (:mod:`lf_orchestrator.families.vla._action_clip`).
    """
    if cfg.model.recipe == "vla_flow":
        state, action = _stats(dataset, STATE_KEY), _stats(dataset, ACTION_KEY)
        return FlowBatchEncoder(build_instruction_tokenizer(dataset.tasks), state["mean"], state["std"],
                                action["mean"], action["std"], max_instruction_len=cfg.data.max_instruction_len)
    tok = cfg.action_tokenizer
    action_stats = _tokenizer_stats(dataset, tok.bounds)
    if tok.kind == "fast":
        state = _stats(dataset, STATE_KEY)
        encoder = fit_fast_encoder(cfg, dataset, build_instruction_tokenizer(dataset.tasks),
                                   action_stats, state["mean"], state["std"])
    else:
        action_tokenizer = BinningTokenizer.fit(action_stats, n_bins=tok.n_bins, bounds=tok.bounds)
        state = _stats(dataset, STATE_KEY)
        encoder = VLABatchEncoder(build_instruction_tokenizer(dataset.tasks), action_tokenizer,
                                  state["mean"], state["std"],
                                  max_instruction_len=cfg.data.max_instruction_len)
    check_clipped_actions(tok, encoder.action_tokenizer, dataset.frame_actions, Path(dataset.root), action_stats)
    return encoder


def save_encoder(encoder: VLABatchEncoder | FlowBatchEncoder, run_dir: Path) -> None:
    """Write the encoder's tokenizers and normalization into ``run_dir``."""
    if isinstance(encoder, FlowBatchEncoder):
        encoder.save(run_dir)
        return
    run_dir = Path(run_dir)
    write_text_atomic(run_dir / "instruction_tokenizer.json",
                      encoder.instruction_tokenizer.to_str())
    encoder.action_tokenizer.save(run_dir / "action_tokenizer.json")
    write_text_atomic(run_dir / "normalization.json", json.dumps(
        {"state_mean": encoder.state_mean.tolist(), "state_std": encoder.state_std.tolist()}))
    if isinstance(encoder, FastBatchEncoder):
        encoder.save_layout(run_dir)


def load_encoder(cfg: Config, run_dir: Path) -> VLABatchEncoder | FlowBatchEncoder:
    """The encoder a run saved (FileNotFoundError naming the missing file)."""
    if cfg.model.recipe == "vla_flow":
        return FlowBatchEncoder.load(run_dir, cfg.data.max_instruction_len)
    run_dir = Path(run_dir)
    for name in ("instruction_tokenizer.json", "action_tokenizer.json", "normalization.json"):
        if not (run_dir / name).is_file():
            raise FileNotFoundError(f"run folder {run_dir}: missing {name}")
    norm = json.loads((run_dir / "normalization.json").read_text())
    if cfg.action_tokenizer.kind == "fast":
        return load_fast_encoder(cfg, run_dir, Tokenizer.from_file(str(run_dir / "instruction_tokenizer.json")),
                                 norm["state_mean"], norm["state_std"])
    return VLABatchEncoder(Tokenizer.from_file(str(run_dir / "instruction_tokenizer.json")),
                           BinningTokenizer.load(run_dir / "action_tokenizer.json"),
                           norm["state_mean"], norm["state_std"],
                           max_instruction_len=cfg.data.max_instruction_len)


def model_config(cfg: Config, encoder: VLABatchEncoder | FlowBatchEncoder) -> VLAConfig | VLAFlowConfig:
    """The recipe config implied by the run config and the fitted encoder."""
    from lf_orchestrator.families.recipes import recipe_overrides

    try:
        overrides = recipe_overrides(VLAFlowConfig if cfg.model.recipe == "vla_flow" else VLAConfig,
                                     cfg.model.overrides, cfg.model.recipe)
        if cfg.model.recipe == "vla_flow":
            return vla_flow_config(cfg.model.size, **{
                "image_size": cfg.data.image_size, "text_vocab_size": encoder.text_vocab_size,
                "max_instruction_len": cfg.data.max_instruction_len, "state_dim": int(encoder.state_mean.shape[0]),
                "action_dim": encoder.action_dim, "action_horizon": cfg.data.action_horizon, **overrides})
        return vla_config(cfg.model.size, **{
            "image_size": cfg.data.image_size,
            "text_vocab_size": encoder.text_vocab_size,
            "n_action_bins": encoder.vocab.n_bins,
            "max_instruction_len": cfg.data.max_instruction_len,
            "state_dim": int(encoder.state_mean.shape[0]),
            "action_dim": encoder.action_tokenizer.action_dim,
            "action_horizon": cfg.data.action_horizon,
            **({"action_tokens": encoder.max_action_tokens + 1} if isinstance(encoder, FastBatchEncoder) else {}),
            **overrides})
    except (TypeError, ValueError) as err:
        raise ConfigError(f"model: {err}") from None


def fit_images(batch: dict[str, torch.Tensor], side: int) -> dict[str, torch.Tensor]:
    """``batch`` with its ``image`` (n, H, W, 3) uint8 resized to the model's ``side`` x ``side`` when it differs.

    The model's ``image_size`` follows ``data.image_size`` unless ``model.overrides`` sets it, e.g. the 3B VLA's
    SigLIP-style 224 x 224 (patch 14) on 64-pixel Meta-World frames (``examples/full/vla_3b.toml``): the frames
    are resized bilinearly with antialiasing and rounded back to uint8 (the model's own pixel scaling follows).
    Works on any device; a batch of the right size is returned unchanged.
    """
    image = batch["image"]
    if image.shape[1] == side and image.shape[2] == side:
        return batch
    x = image.permute(0, 3, 1, 2).float()
    x = torch.nn.functional.interpolate(x, size=(side, side), mode="bilinear", antialias=True, align_corners=False)
    resized = x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()
    return {**batch, "image": resized}


def build_graph(vla_cfg: VLAConfig | VLAFlowConfig):
    """The IR graph of a VLA recipe config (token or flow, by the config type)."""
    if isinstance(vla_cfg, VLAFlowConfig):
        from lf_ir.recipes.vla_flow import build_graph as flow_graph

        return flow_graph(vla_cfg)
    from lf_ir.recipes.vla import build_graph as token_graph

    return token_graph(vla_cfg)


def build_model(vla_cfg: VLAConfig | VLAFlowConfig, device: torch.device, seed: int, *,
                fused_ops: bool = False) -> VLAModel | VLAFlowModel:
    """Lower the VLA graph (token or flow, by the config type) on the meta device and materialize it on ``device``.

    ``fused_ops`` (``model.fused_ops``): switch its modules to lf-kernels' fused ops (``lf_ir.use_fused_ops``).
    """
    with torch.device("meta"):
        model = VLAFlowModel(vla_cfg) if isinstance(vla_cfg, VLAFlowConfig) else VLAModel(vla_cfg)
    model = materialize(model, device, seed)
    if fused_ops:
        use_fused_ops(model)
    return model


def save_model_spec(vla_cfg: VLAConfig | VLAFlowConfig, graph, run_dir: Path) -> None:
    """``model.json``: the recipe name, config and IR graph, for people and for `lf eval`."""
    spec = {"recipe": graph.recipe, "config": msgspec.to_builtins(vla_cfg), "graph": json.loads(to_json(graph))}
    write_text_atomic(Path(run_dir) / "model.json", json.dumps(spec, indent=1))


def load_model_config(run_dir: Path) -> VLAConfig | VLAFlowConfig:
    """The recipe config stored in a run's ``model.json`` (VLAFlowConfig for a ``vla_flow`` run)."""
    spec = json.loads((Path(run_dir) / "model.json").read_text())
    return msgspec.convert(spec["config"], VLAFlowConfig if spec.get("recipe") == "vla_flow" else VLAConfig)
