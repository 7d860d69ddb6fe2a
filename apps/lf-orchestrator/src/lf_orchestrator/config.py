"""The run config: typed msgspec structs decoded from one TOML file.

Every section is a frozen, keyword-only struct whose fields carry a one-line
docstring. Decoding rejects unknown keys and wrong types; :func:`load_config`
turns msgspec's messages into one line naming the file and the dotted key.
This module imports no torch so that config errors appear in well under a
second.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, Literal

import msgspec

from lf_orchestrator._config_check import check_config
from lf_orchestrator._config_errors import ConfigError, explain, fit_warmup, struct_at, unknown_key
from lf_orchestrator._config_unread import check_unread, drop_unread, recipe_family
from lf_orchestrator.families.sections import CorpusSection, VAESection, VideoSection, VLMSection, family_reads

ALL_TASKS = "*"
"""``data.tasks = ["*"]``: every task of a LeRobot dataset."""


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class RunSection(_Section):
    """``[run]``: the run's name, output folder, seed and device."""

    name: str = "metaworld-vla"
    """Run name; the run folder is ``{out_dir}/{name}-{timestamp}``."""
    out_dir: str = "runs"
    """Folder that holds run folders."""
    seed: int = 0
    """Seed for weight initialization and data order (evaluation uses ``eval.seed``)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to compute: ``auto`` takes the GPU when there is one."""
    threads: int = 0
    """CPU threads for torch (0 = all cores)."""


class DataSection(_Section):
    """``[data]``: the dataset of the VLA recipes (``vla``, ``vla_flow``) and the Meta-World episodes the vlm /
    video / video_vae families train on: where it comes from, its tasks and the sample layout."""

    source: Literal["metaworld", "lerobot"] = "metaworld"
    """``metaworld``: generate expert demonstrations into ``path`` if absent; ``lerobot``: read ``path``."""
    path: str = ".lf-cache/metaworld-vla"
    """Dataset folder (LeRobot v3.0)."""
    tasks: list[str] = msgspec.field(
        default_factory=lambda: ["reach-v3", "push-v3", "drawer-close-v3"])
    """Meta-World tasks to generate and evaluate; with ``source = "lerobot"`` task strings of the dataset or
    Meta-World names standing for their instructions, or ``["*"]``: every task of the dataset."""
    episodes_per_task: int = 40
    """Expert episodes per task."""
    image_size: int = 64
    """Camera image side, pixels."""
    max_steps: int = 150
    """Episode length limit, steps."""
    workers: int = 2
    """Processes for generation."""
    seed: int = 0
    """Base seed of the generated demonstrations (part of the dataset's cache key)."""
    action_horizon: int = 4
    """Action steps predicted per sample (action chunk)."""
    max_instruction_len: int = 8
    """Instruction tokens per sample."""
    prefetch: bool = True
    """Collate the next step's micro-batches on a background thread while this step trains (pinned memory on
    CUDA); the batches are the same either way (``lf_orchestrator.prefetch``)."""


class ActionTokenizerSection(_Section):
    """``[action_tokenizer]``: how the ``vla`` recipe turns action chunks into tokens (lf-tokenize-action)."""

    kind: Literal["binning", "fast"] = "binning"
    """Action tokenizer (lf-tokenize-action): ``binning`` (one token per action value, OpenVLA) or ``fast``
    (DCT + BPE, a variable number of tokens per chunk and an end-of-action token, pi0-FAST)."""
    n_bins: int = 256
    """Binning: bins per action dimension."""
    bounds: Literal["q01_q99", "min_max"] = "q01_q99"
    """Normalization bounds taken from the dataset statistics (both kinds)."""
    scale: float = 10.0
    """FAST: DCT coefficients are ``round(scale * dct(normalized chunk))`` (the paper's 10)."""
    vocab_size: int = 1024
    """FAST: BPE vocabulary size (ids; the end-of-action token comes on top)."""
    max_action_tokens: int = 0
    """FAST: tokens per chunk before the end-of-action token; 0 = the longest encoding of the training chunks.
    A training chunk that encodes longer than a set value is an error."""
    max_clipped_fraction: float = 0.05
    """Largest share of the training actions, per dimension, that the tokenizer's bounds may clip (exact
    q01/q99 clip about 0.02; quantiles averaged over episodes can clip most); a larger share is handled by
    ``on_clipped``. In [0, 1]; 1 turns the check off."""
    on_clipped: Literal["error", "warn"] = "error"
    """A dimension past ``max_clipped_fraction``: ``error`` stops the run naming the dimensions and their clipped
    fractions, ``warn`` prints that and trains on."""


def _recipe_names() -> tuple[str, ...]:
    """The recipes registered in lf-ir (imports ``lf_ir``, so torch: only for the schema and the model check)."""
    from lf_ir import recipe_names

    return recipe_names()


class ModelSection(_Section):
    """``[model]``: the IR recipe, its named size and field overrides."""

    field_choices: ClassVar[dict[str, Callable[[], tuple[str, ...]]]] = {"recipe": _recipe_names}
    """Fields whose accepted values come from a registry, read when asked (``lf config schema``)."""

    recipe: str = "vla"
    """IR recipe, one registered in lf-ir (``lf_ir.recipe_names()``; checked when the config loads):
    ``vla`` (action tokens, cross-entropy) or ``vla_flow`` (pi0-style flow-matching action expert);
    ``llama3`` / ``qwen2_vl`` / ``wan_dit`` / ``wan_vae`` train the llm / vlm / video / video_vae families
    (``lf_orchestrator.families``)."""
    size: str = "small"
    """Named size of the recipe, matched in any case (``8b`` = ``8B``)."""
    overrides: dict[str, int | float | bool | str | list[int | float]] = msgspec.field(default_factory=dict)
    """Recipe config fields to override (e.g. ``dim = 256``, ``norm_eps = 1e-5``, ``mrope_section = [8, 12, 12]``);
    each value is checked against the recipe field's type when the config loads."""
    fused_ops: bool = False
    """Run the lowered model's RMSNorm, SwiGLU, RoPE (1D, M-RoPE, Wan 3D) and adaLN modulation through
    lf-kernels' fused Triton ops (``lf_ir.use_fused_ops``; CUDA, else each op's PyTorch reference). Weights and
    checkpoints are the same either way; DTensor (tensor-parallel) inputs keep the plain code. Off until its
    speed and memory are measured on the GPU."""


class TrainSection(_Section):
    """``[train]``: optimizer, schedule, checkpoints, fault handling, LoRA / freezing and profiling."""

    steps: int = 1500
    """Optimizer steps."""
    global_batch: int = 64
    """Samples per optimizer step over all processes."""
    lr: float = 1e-3
    """Peak learning rate (AdamW)."""
    min_lr_ratio: float = 0.05
    """Cosine schedule floor as a fraction of ``lr``."""
    warmup_steps: int = 100
    """Linear warm-up steps; more than ``steps`` is clamped to ``steps`` (a note says so; config.toml records it)."""
    weight_decay: float = 0.01
    """AdamW weight decay on matrices."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 disables)."""
    log_every: int = 10
    """Steps between scalar logs."""
    ckpt_every: int = 250
    """Steps between checkpoints (and the last step); 0 = no checkpoints at all, not even at the end or on
    SIGTERM (runs whose optimizer state is not worth the disk, e.g. 200-step full-size throughput runs)."""
    keep_checkpoints: int = 2
    """Checkpoints kept (oldest deleted)."""
    async_checkpoint: bool = False
    """Write checkpoints in the background (DCP ``async_save``); the state is copied to CPU memory at the step,
    the previous save is awaited before the next one and at exit."""
    on_nonfinite: Literal["stop", "skip", "rollback"] = "stop"
    """NaN/inf loss or gradient norm: ``stop`` the run, ``skip`` the update, or ``rollback`` to the latest
    checkpoint without replaying the batches since (see ``lf_orchestrator.faults``)."""
    hang_timeout_s: float = 0.0
    """Seconds without a finished step after which the watchdog dumps all stacks (0 disables)."""
    on_hang: Literal["abort", "dump"] = "abort"
    """After the hang dump: ``abort`` exits (so torchrun restarts from the checkpoint) or only ``dump``."""
    lora_rank: int = 0
    """LoRA rank (llm/vlm/video families; 0 = off): matching nn.Linear get a low-rank adapter, base frozen."""
    lora_alpha: float = 16.0
    """LoRA scale numerator: the adapter output is multiplied by ``lora_alpha / lora_rank``."""
    lora_targets: list[str] = msgspec.field(default_factory=lambda: ["*.q", "*.v"])
    """fnmatch patterns of the module names LoRA wraps (``components.`` prefix optional)."""
    freeze: list[str] = msgspec.field(default_factory=list)
    """fnmatch patterns of parameter names to freeze (e.g. ``"vision.*"``; ``components.`` prefix optional)."""
    profile_steps: list[int] = msgspec.field(default_factory=list)
    """``[first, last]``: profile the finished steps ``first..last`` (1-based, inclusive) with ``torch.profiler``
    on every rank and write kernel-time summaries, op tables and rank 0's trace to ``<run>/profile/``
    (:mod:`lf_orchestrator.profiling`); ``[]`` (default) = off."""


class MemorySection(_Section):
    """``[memory]``: activation recomputation, offload and compute precision (lf-memory)."""

    recompute: Literal["none", "full", "selective", "every_k", "auto"] = "none"
    """Activation recomputation of transformer blocks (lf-memory ``apply_recompute``); ``auto``: the
    knapsack planner (``plan_recompute``) picks per block under ``memory.budget_gib``."""
    recompute_every: int = 2
    """With ``every_k``: recompute every k-th block."""
    budget_gib: float = 0.0
    """With ``recompute = "auto"``: memory per GPU, GiB; activations get what weights, gradients and
    AdamW state (16 bytes per parameter) leave. Required (> 0) with ``auto``."""
    offload: bool = False
    """Keep the activations saved for backward in (pinned) host memory (``save_on_cpu``)."""
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    """Compute precision (lf-memory); ``auto`` is bf16 on GPUs that support it; ``fp16`` adds dynamic loss scaling."""


class ParallelSection(_Section):
    """``[parallel]``: how the job is split over processes (lf-parallel plans: dp, ZeRO, tp, pp, cp)."""

    plan: Literal["auto", "manual"] = "auto"
    """``auto``: the fastest plan of ``lf plan``'s ranking that the trainer can run (llm / vlm / video families:
    dp, ZeRO, tp, and cp / pp where the recipe supports them, every family the VLA included); ``manual`` uses
    the fields below."""
    dp: int = 1
    """Manual plan: data-parallel processes."""
    micro_batch: int = 64
    """Manual plan: samples per process per micro-step; auto: the largest allowed."""
    grad_accum: int = 1
    """Manual plan: micro-batches per step."""
    spec: str = ""
    """Manual plan (every family): an lf-parallel plan string (e.g. ``"tp=2,zero=3"``), parsed and checked against
    the model before launch; replaces ``dp``; without ``micro_batch`` in the string each data-parallel rank takes
    ``train.global_batch / dp`` samples in ``grad_accum`` micro-batches (the string's, else ``parallel.grad_accum``;
    ``parallel.micro_batch`` is then not used). Context parallel:
    ``"cp=2"`` or ``"dp=2,cp=2"`` (video and llm families; every cp rank of a dp group reads the same samples and
    holds 1/cp of each sample's tokens)."""
    cp_kind: Literal["", "ring", "ulysses", "ring+ulysses"] = ""
    """Context-parallel attention of a ``spec`` with ``cp > 1``: ``ring`` (k/v passed around the cp group, any
    mask; dense block scores) or ``ulysses`` (all-to-all to heads, then flash/SDPA; heads must divide by cp).
    ``""`` (unset): the spec's ``cp_kind=...``, else ``ring``. The trainer runs ``ring`` and ``ulysses``."""
    tune: Literal["predict", "measure"] = "predict"
    """With ``plan = "auto"`` (llm / vlm / video families): ``predict`` trains with the cost model's fastest runnable
    plan; ``measure`` (``lf run --tune measure``) first trains ``tune_top`` of the top runnable plans for
    ``tune_steps`` timed steps each on this job's hardware and keeps the measured fastest
    (``lf_orchestrator.families._tune``)."""
    tune_top: int = 3
    """``tune = "measure"``: plans tried, the first of the ranking the trainer can run."""
    tune_steps: int = 3
    """``tune = "measure"``: timed optimizer steps per plan (the median counts), after one warm-up step."""


class EvalSection(_Section):
    """``[eval]``: closed-loop evaluation of VLA policies in Meta-World."""

    episodes: int = 20
    """Closed-loop episodes per task."""
    max_steps: int = 150
    """Steps per episode before it counts as a failure."""
    seed: int = 100_000
    """First reset seed of evaluation (disjoint from training seeds)."""
    at_end: bool = True
    """Evaluate when training ends."""
    random_baseline: bool = True
    """Also measure a uniform random-action policy."""


class Config(_Section):
    """One run: every section of the TOML file."""

    run: RunSection = RunSection()
    data: DataSection = DataSection()
    action_tokenizer: ActionTokenizerSection = ActionTokenizerSection()
    model: ModelSection = ModelSection()
    train: TrainSection = TrainSection()
    memory: MemorySection = MemorySection()
    parallel: ParallelSection = ParallelSection()
    eval: EvalSection = EvalSection()
    corpus: CorpusSection = CorpusSection()
    vlm: VLMSection = VLMSection()
    video: VideoSection = VideoSection()
    vae: VAESection = VAESection()


DEFAULT_NAME = "metaworld_vla.toml"


def default_config_text() -> str:
    """The embedded default config (Meta-World VLA) as TOML text."""
    return resources.files("lf_orchestrator.defaults").joinpath(DEFAULT_NAME).read_text()


def _set_dotted(tree: dict[str, Any], key: str, raw: str, where: str) -> None:
    parts = key.split(".")
    if len(parts) < 2 or not all(parts):
        raise ConfigError(f"{where}: --set {key}={raw}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError as err:
        if raw and raw[0] in "{[\"'":  # meant as a table, array or quoted string: say why it did not parse
            raise ConfigError(f"{where}: --set {key}={raw}: not a valid TOML value ({err})") from None
        value = raw  # a bare word is a string
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: --set {key}: {p!r} is not a section")
    node[parts[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, *,
                check_paths: bool = True) -> Config:
    """Read ``path`` (or the embedded default), apply ``--set`` overrides, validate. ``check_paths=False`` skips the
    checks that need the run's data on disk (``lf plan`` / ``lf memory`` plan ahead of it).

    Raises:
        ConfigError: unreadable file, bad TOML, unknown key, wrong type or bad value;
            the message names the file and the dotted key.
    """
    where = str(path) if path is not None else f"<default {DEFAULT_NAME}>"
    if overrides:
        where += " with --set"
    if path is None:
        text = default_config_text()
    else:
        p = Path(path)
        if p.is_dir():
            raise ConfigError(f"{where}: is a directory, expected a TOML config file")
        if not p.is_file():
            raise ConfigError(f"{where}: config file not found")
        text = p.read_text()
    try:
        tree = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{where}: invalid TOML: {err}") from None
    if path is not None and _in_run_folder(Path(path)):  # written by lf: earlier versions wrote every section
        known = {f.name: set(f.type.__struct_fields__) for f in msgspec.structs.fields(Config)}
        tree = drop_unread(tree, tree.get("model", {}).get("recipe", ModelSection().recipe), known)
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"{where}: --set {item}: expected section.key=value")
        _set_dotted(tree, key.strip(), raw.strip(), where)
    try:
        cfg = msgspec.convert(tree, Config)
    except msgspec.ValidationError as err:
        raise explain(err, where, Config, tree) from None
    check_unread(tree, cfg.model.recipe, where)
    return check_config(fit_warmup(cfg, where), where, check_paths=check_paths)


def _in_run_folder(path: Path) -> bool:
    """Whether ``path`` is a run folder's own ``config.toml`` (written by `lf run`, next to its plan.json or
    checkpoints)."""
    return path.name == "config.toml" and ((path.parent / "plan.json").is_file()
                                            or (path.parent / "checkpoints").is_dir())


RESUME_KEYS = ("train.steps", "train.log_every", "train.ckpt_every", "train.keep_checkpoints",
               "train.async_checkpoint", "train.on_nonfinite", "train.hang_timeout_s", "train.on_hang",
               "train.profile_steps", "run.device", "run.threads", "eval.")
"""Keys ``--set`` may change on ``--resume``; the rest are fixed by the checkpoint."""


def check_resume_overrides(overrides: list[str] | None) -> None:
    """ConfigError naming the first override that a resumed run cannot take."""
    check_override_keys(overrides, RESUME_KEYS, "--resume", "on resume (the checkpoint fixes it)",
                        "To continue the run under another parallel plan or world size, start it from its config "
                        "into the same folder: `lf run RUN/config.toml --run-dir RUN --set parallel.spec=...` (the "
                        "checkpoint is resharded)")


def check_override_keys(overrides: list[str] | None, allowed: tuple[str, ...], context: str, why: str,
                        hint: str = "") -> None:
    """Refuse the first ``--set`` override whose key ``allowed`` lacks (an entry ending in ``.`` allows its whole
    section): ``{context}: --set KEY cannot change {why}; allowed: ...``, a misspelled key first with the closest
    valid one (``did you mean``). ``hint`` ends the refusal.

    Raises:
        ConfigError: naming the key and the allowed ones (or the closest valid key).
    """
    shown = ", ".join(k + "*" if k.endswith(".") else k for k in allowed)
    for item in overrides or []:
        key = item.partition("=")[0].strip()
        section, _, field = key.partition(".")
        struct = struct_at(Config, section) if section in Config.__struct_fields__ else None
        # a typo: name the closest valid key before the rule
        if struct is None or (field and field.split(".")[0] not in struct.__struct_fields__):
            at, name = (section, field.split(".")[0]) if struct is not None else ("", section)
            raise ConfigError(f"{context}: --set {key}: {unknown_key(Config, at, name)}")
        if not any(key == k or (k.endswith(".") and key.startswith(k)) for k in allowed):
            raise ConfigError(f"{context}: --set {key} cannot change {why}; allowed: {shown}"
                              + (f". {hint}" if hint else ""))


def to_toml(cfg: Config) -> str:
    """The resolved config as TOML text (what the run folder stores): the sections and keys the recipe's family
    reads (``families.sections.FAMILY_READS``), every one of them with its value, so the text loads again (a key
    the family does not read is an error, ``lf_orchestrator._config_unread``)."""
    reads = family_reads(recipe_family(cfg.model.recipe))
    tree = {section: {k: v for k, v in table.items() if reads[section] is None or k in reads[section]}
            for section, table in msgspec.to_builtins(cfg).items() if section in reads}
    return msgspec.toml.encode(tree).decode()


def json_schema() -> dict[str, Any]:
    """JSON Schema of the config (``lf config schema``), each field's docstring as its ``description``
    (see :mod:`lf_orchestrator.config_schema`)."""
    from lf_orchestrator.config_schema import schema_with_docs

    return schema_with_docs(Config)
