"""`lf plan`: the auto-tuner's ranked plans (`lf memory`, the per-GPU memory of one plan: :mod:`.memory_cmd`).

The model comes from a run config (``model.recipe``, ``model.size``, ``model.overrides``,
``train.global_batch``) or from ``--recipe`` / ``--size`` (any recipe of ``lf_ir.recipes``,
``wan_dit`` included, whose video size is ``--frames``, ``--height``, ``--width``). The
cluster is detected on this machine or described with ``--gpus`` and ``--gpu``. The cost model's
rates are this GPU's cached measurement when it is the cluster's model, else the defaults
(:func:`lf_parallel.calibration_for`); ``--calibrate`` measures them first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
from rich.table import Table

from lf_orchestrator._console import fail, make_console
from lf_orchestrator._options import SetOpt

console = make_console(stderr=True)
GIB = 1024 ** 3

ConfigArg = Annotated[Optional[Path], typer.Argument(help="Run config (TOML); or give --recipe and --size.")]
RecipeOpt = Annotated[Optional[str], typer.Option(help="Recipe (llama3, qwen2_vl, wan_dit, vla, ...).")]
SizeOpt = Annotated[Optional[str], typer.Option(help="Named size of the recipe, e.g. 8B, 70B, 14B.")]
SeqOpt = Annotated[Optional[int], typer.Option(min=1, help="Tokens per sample of the main component.")]
FramesOpt = Annotated[Optional[int], typer.Option(help="wan_dit / wan_vae: video frames (4k+1).")]
HeightOpt = Annotated[Optional[int], typer.Option(help="wan_dit / wan_vae: video height, pixels.")]
WidthOpt = Annotated[Optional[int], typer.Option(help="wan_dit / wan_vae: video width, pixels.")]
BatchOpt = Annotated[Optional[int], typer.Option(help="Samples per optimizer step (default: the config's, "
                                                      "else one per GPU).")]
GpusOpt = Annotated[Optional[int], typer.Option(min=1, help="GPUs to plan for (default: detect this machine).")]
PerNodeOpt = Annotated[Optional[int], typer.Option(help="GPUs per node (NVLink domain); default min(gpus, 8).")]
GpuOpt = Annotated[str, typer.Option(help="GPU model when planning ahead: h200, h100, a100-80g, ...")]
InterOpt = Annotated[float, typer.Option(help="Network bandwidth between nodes per GPU, Gbit/s.")]
PrecisionOpt = Annotated[Literal["bf16", "fp16", "fp32"], typer.Option(help="Compute precision.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
CalibrateOpt = Annotated[bool, typer.Option("--calibrate", help="Measure this GPU's matmul, attention and copy "
                                            "rates first (a few seconds) and cache them for later plans.")]


def _fail(message: str) -> None:
    fail(console, message)


def _recipe(name: str):
    """The registered :class:`lf_ir.RecipeSpec` of ``--recipe`` / ``model.recipe`` (ValueError naming them)."""
    from lf_ir import recipe_spec

    return recipe_spec(name, where="--recipe")


def _clip_tokens(cfg, rcfg) -> int:
    """Latent tokens per clip of a wan_dit run, as :class:`.families.video.VideoFamily` trains them: the VAE
    (``video.vae_size``) latents of a ``video.frames`` clip of ``data.image_size`` (``video.latents = "vae"``)
    or of ``video.height`` x ``video.width`` (``"synthetic"``, :mod:`.families._video_synthetic`), divided by
    the DiT's patch."""
    import math

    from lf_ir.recipes.wan_vae import latent_shape, wan_vae_config

    v = cfg.video
    side = (v.height, v.width) if v.latents == "synthetic" else (cfg.data.image_size, cfg.data.image_size)
    grid = latent_shape(wan_vae_config(v.vae_size), v.frames, *side)
    return math.prod(g // p for g, p in zip(grid, rcfg.patch, strict=True))


def _llm_sample(cfg, rcfg) -> tuple[int | None, dict]:
    return cfg.corpus.seq_len, {}


def _vlm_sample(cfg, rcfg) -> tuple[int | None, dict]:
    from lf_orchestrator.families.vlm import PROMPT_TOKENS, image_tokens

    tokens = image_tokens(cfg.vlm.image_size, rcfg)
    return tokens + PROMPT_TOKENS, {"image_patches": tokens * rcfg.spatial_merge_size ** 2}


def _video_sample(cfg, rcfg) -> tuple[int | None, dict]:
    return _clip_tokens(cfg, rcfg), {}


def _video_vae_sample(cfg, rcfg) -> tuple[int | None, dict]:
    side = cfg.data.image_size
    return None, {"frames": cfg.video.frames, "height": side, "width": side}


_FAMILY_SAMPLE = {"llm": (_llm_sample, "the run config's corpus.seq_len"),
                  "vlm": (_vlm_sample, "the run config's sample: one vlm.image_size image and the prompt"),
                  "video": (_video_sample, "the run config's sample: the latent tokens of one video.frames clip"),
                  "video_vae": (_video_vae_sample, "the run config's sample: one video.frames clip of data.image_size")}
"""Family (``lf_ir.RecipeSpec.family`` of ``model.recipe``) -> (the sample a run config trains on, where it comes
from, as the commands print it). A family not listed trains on its recipe graph's default sample."""


def _run_sample(cfg) -> tuple[int | None, dict, str]:
    """(tokens per sample, more ``build_graph`` arguments, where they come from) of the sample a run config trains
    on, by the family of its recipe, where the recipe's default graph is not it: llm rows of ``corpus.seq_len``
    (not llama3's 131,072-token ``max_seq_len``), vlm samples of one ``vlm.image_size`` image
    (:mod:`.families.vlm`), video clips of ``video.frames`` (:func:`_clip_tokens`), video_vae clips of
    ``video.frames`` x ``data.image_size`` squared (:mod:`.families.video_vae`), not the recipes' 81 x 480 x 832;
    else (None, {}, the recipe graph's sample)."""
    family = _recipe(cfg.model.recipe).family
    if family not in _FAMILY_SAMPLE:
        return None, {}, "the recipe graph's sample"
    sample, source = _FAMILY_SAMPLE[family]
    rcfg = None
    if family in ("vlm", "video"):
        from lf_orchestrator.families.recipes import recipe_config

        rcfg, _ = recipe_config(cfg.model.recipe, cfg.model.size, cfg.model.overrides)
    return *sample(cfg, rcfg), source


def load_run_config(config: Optional[Path], overrides: Optional[list[str]] = None, recipe: Optional[str] = None):
    """The decoded run config with its ``--set`` overrides, or None without one (ConfigError from the file or the
    overrides; :func:`._options.load_with_overrides`). The run's data need not exist yet: planning sizes the
    sample from the config alone (:func:`_run_sample`)."""
    from lf_orchestrator._options import load_with_overrides

    return load_with_overrides(config, overrides, recipe=recipe)


def resolve_model(config: Optional[Path], recipe: Optional[str], size: Optional[str], seq: Optional[int],
                  frames: Optional[int] = None, height: Optional[int] = None, width: Optional[int] = None, *,
                  run_cfg=None, seq_from: Optional[list[str]] = None):
    """(IR graph, tokens per sample of the main component, global batch from the config or None).

    With a run CONFIG (or ``run_cfg``, the config already loaded with its ``--set`` overrides) the graph is sized
    by what ``lf run`` trains (:func:`_run_sample`); ``--seq`` and, for wan_dit / wan_vae, ``--frames`` /
    ``--height`` / ``--width`` override it. Without either, a recipe that takes a sequence length gets its typical
    training length (:func:`.ir_cmd.default_seq`: Llama 3 8,192, not its 131,072-token maximum). ``seq_from``, when
    given, receives where the tokens per sample came from (the commands print it).

    Raises:
        ValueError: no model given, unknown recipe/size, or a bad video size; ConfigError from the config.
    """
    overrides, batch, graph_kw, source = {}, None, {}, "--seq" if seq is not None else ""
    cfg = run_cfg if run_cfg is not None else load_run_config(config)
    if cfg is not None:
        same_recipe = recipe in (None, cfg.model.recipe)
        recipe, size = recipe or cfg.model.recipe, size or cfg.model.size
        overrides, batch = dict(cfg.model.overrides), cfg.train.global_batch
        if seq is None and same_recipe:
            seq, graph_kw, source = _run_sample(cfg)
    if recipe and not size:
        from lf_orchestrator.ir_cmd import missing_size

        raise ValueError(missing_size(recipe))
    if not recipe or not size:
        raise ValueError("give a run CONFIG, or --recipe and --size (e.g. --recipe llama3 --size 70B)")
    spec = _recipe(recipe)
    cfg = spec.config(size, **overrides)
    if recipe in ("wan_dit", "wan_vae") and (frames or height or width):
        source = "--frames / --height / --width"
    if recipe == "wan_dit" and (frames or height or width):
        from lf_ir import video_tokens

        seq = video_tokens(cfg, frames, height, width)
    if recipe == "wan_vae" and (frames or height or width):
        clip = {"frames": frames, "height": height, "width": width}
        graph_kw = {**(graph_kw or {"frames": 81, "height": 480, "width": 832}),
                    **{k: v for k, v in clip.items() if v}}
    takes_seq = spec.takes_seq_len
    if seq is not None and not takes_seq:
        raise ValueError(f"--seq: the {recipe} recipe's sequence length follows from its config")
    if seq is None and takes_seq and not source:  # not the model's maximum, silently
        from lf_orchestrator.ir_cmd import default_seq

        seq, source = default_seq(recipe, cfg)
    if seq_from is not None:
        source = source or "the recipe graph's sample"
        seq_from.append(source if source.startswith("--") or not takes_seq else f"{source} (--seq to change)")
    graph = spec.build_graph(cfg, **({"seq_len": seq} if seq else {}), **graph_kw)
    from lf_memory import graph_view

    return graph, graph.component(graph_view(graph).main).seq_len, batch


def resolve_cluster(gpus: Optional[int], gpus_per_node: Optional[int], gpu: str, inter_node_gbps: float):
    """The described cluster when ``gpus`` is given, else the detected one (ClusterError without a GPU)."""
    from lf_parallel import detect_cluster, make_cluster

    if gpus is None:
        return detect_cluster()
    return make_cluster(gpus=gpus, gpu=gpu, gpus_per_node=gpus_per_node, inter_node_gbps=inter_node_gbps)


def _cost_row(cand) -> dict:
    c = cand.cost
    return {"plan": cand.plan.describe(), "recompute": cand.recompute, "step_s": c.step_s,
            "tokens_per_s_per_gpu": c.tokens_per_s_per_gpu, "tflops_per_gpu": c.tflops_per_gpu, "mfu": c.mfu,
            "peak_gib": c.memory.total / GIB, "breakdown_s": {"compute": c.compute_s, "recompute": c.recompute_s,
                                                               "exposed_comm": c.exposed_comm_s, "bubble": c.bubble_s,
                                                               "optimizer": c.optimizer_s,
                                                               "host_launch": c.launch_host_s, **{
                                                                   f"comm.{k}": v for k, v in c.comm.items()}},
            "memory_gib": {k: v / GIB for k, v in c.memory.breakdown().items()}}


def _runnable(cfg, graph, tokens: int):
    """With a run config: plan -> why ``lf run`` cannot run it (None: it can); without one None (no column)."""
    if cfg is None:
        return None
    from lf_orchestrator.families._plan import trainer_unsupported

    return lambda plan: trainer_unsupported(plan, cfg, graph, tokens)


def _calibrate(cluster) -> None:
    """``--calibrate``: measure this GPU's rates and cache them (exit 2 without CUDA); warns on stderr when the
    plan is for another GPU model, whose rates the measurement does not give."""
    import torch

    import lf_parallel

    if not torch.cuda.is_available():
        _fail("--calibrate needs a CUDA GPU to measure (none is available here); without it lf plan uses the "
              "cached rates of this GPU or the defaults")
    cal = lf_parallel.calibrate(save=True)
    console.print(f"calibrated: {cal.source}: matmul {cal.matmul_tflops:.0f} TFLOP/s, attention "
                  f"{cal.attention_tflops['causal']:.0f} (causal), copy {cal.copy_tbps:.2f} TB/s", highlight=False)
    used = lf_parallel.calibration_for(cluster)
    if used.source != cal.source:
        console.print(f"warning: --calibrate measured this machine's {torch.cuda.get_device_name(0)}, but the "
                      f"plan is for {cluster.gpu.name} (--gpu), so its rates come from: {used.source}", highlight=False)


def plan_cmd(config: ConfigArg = None, recipe: RecipeOpt = None, size: SizeOpt = None, seq: SeqOpt = None,
             frames: FramesOpt = None, height: HeightOpt = None, width: WidthOpt = None,
             global_batch: BatchOpt = None, gpus: GpusOpt = None, gpus_per_node: PerNodeOpt = None,
             gpu: GpuOpt = "h100", inter_node_gbps: InterOpt = 400.0, precision: PrecisionOpt = "bf16",
             top: Annotated[int, typer.Option(help="Plans to list.")] = 5, as_json: JsonOpt = False,
             calibrate: CalibrateOpt = False, overrides: SetOpt = None):
    """Rank parallel plans by predicted step time: tokens/s/GPU, MFU, peak memory, and the winner's breakdown.

    With a run CONFIG (``--set`` overrides its values, as for ``lf run``) the ranking is the one ``lf run``
    (``parallel.plan = "auto"``) picks from: micro-batches up to ``parallel.micro_batch``
    (:func:`.families._plan.rank_plans`). The breakdown's ``host_launch`` is the time the host spends issuing
    kernels; it overlaps compute, so a host-bound step holds it instead of compute.

    The rates come from the calibration cache (``$LF_CACHE_DIR/calibration.json``, default ``~/.cache/lf``) when
    this machine's GPU is the cluster's model and was measured with this torch, else from the BENCH.md defaults;
    ``--calibrate`` measures this GPU once the arguments check out (needs CUDA), caches it, and warns on stderr
    when ``--gpu`` names another model (whose rates it does not give). The footer and ``--json``
    (``calibration``) say which rates were used."""
    from lf_orchestrator.config import ConfigError
    from lf_orchestrator.families._plan import rank_plans
    from lf_parallel import ClusterError, NoFeasiblePlan, calibration_for, search_plans

    if top < 1:
        _fail(f"--top must be >= 1, got {top}")
    try:
        run_cfg, seq_from = load_run_config(config, overrides, recipe), []
        graph, tokens, batch = resolve_model(config, recipe, size, seq, frames, height, width, run_cfg=run_cfg,
                                             seq_from=seq_from)
        cluster = resolve_cluster(gpus, gpus_per_node, gpu, inter_node_gbps)
        batch = global_batch or batch or cluster.gpus
        if calibrate:  # after the arguments are checked: a typo costs no measurement
            _calibrate(cluster)
        cal = calibration_for(cluster)
        if run_cfg is not None:
            result = rank_plans(run_cfg, graph, cluster, seq=tokens, precision=precision, global_batch=batch,
                                top=top, calibration=cal)
        else:
            result = search_plans(graph, cluster, global_batch=batch, seq=tokens, precision=precision, top=top,
                                  calibration=cal)
        runnable = _runnable(run_cfg, graph, tokens)
    except NoFeasiblePlan as err:
        _fail(f"{graph.name} on {cluster.describe()}, global batch {batch}: {err}")
    except (ConfigError, ClusterError, ValueError) as err:
        _fail(str(err))
    rows = [_cost_row(c) for c in result.ranked]
    if runnable is not None:  # the reason `lf run` (parallel.plan = "auto") skips a plan
        for row, cand in zip(rows, result.ranked, strict=True):
            row["lf_run"] = runnable(cand.plan) or "yes"
    if as_json:
        print(json.dumps({"model": graph.name, "tokens_per_sample": tokens, "tokens_per_sample_from": seq_from[0],
                          "global_batch": batch,
                          "cluster": cluster.describe(), "calibration": cal.source, "considered": result.considered,
                          "over_memory": result.over_memory, "seconds": result.seconds, "plans": rows}))
        return
    out = make_console()
    table = Table(title=f"{graph.name}, {tokens:,} tokens/sample, global batch {batch} on {cluster.describe()}")
    cols = ("#", "plan", "recompute", "step s", "tokens/s/GPU", "MFU", "peak GiB") + (("lf run",) if runnable else ())
    for col in cols:
        table.add_column(col, justify="left" if col in ("plan", "recompute", "lf run") else "right")
    for i, r in enumerate(rows, 1):
        short = r["plan"].split(" (global batch")[0].replace(f" precision={precision}", "")
        table.add_row(str(i), short, r["recompute"], f"{r['step_s']:.3f}", f"{r['tokens_per_s_per_gpu']:,.0f}",
                      f"{100 * r['mfu']:.1f}%", f"{r['peak_gib']:.1f}", *([r["lf_run"]] if runnable else []))
    out.print(table)
    best = rows[0]["breakdown_s"]
    out.print("winner, seconds per step: " + ", ".join(f"{k} {v:.3f}" for k, v in best.items())
              + " (host_launch overlaps compute + recompute: the step holds the larger)", highlight=False)
    out.print(f"{result.considered:,} plans considered, {result.over_memory:,} over memory, "
              f"{result.seconds:.1f} s; rates: {cal.source}", highlight=False)
    print_sample_and_legend(out, tokens, seq_from[0], [r["plan"] for r in rows])


def print_sample_and_legend(out, tokens: int, seq_from: str, plans: list[str]) -> None:
    """The footer of `lf plan` / `lf memory`: where the tokens per sample came from and what the plan keys mean
    (:func:`._plan_legend.plan_legend`)."""
    from lf_orchestrator._plan_legend import plan_legend

    out.print(f"tokens per sample: {tokens:,}, from {seq_from}", highlight=False)
    out.print("plan keys:\n" + "\n".join(f"  {line}" for line in plan_legend(plans)), highlight=False)
