"""lf-parallel: hybrid parallel plans for LoongForge, applied from the IR's annotations.

- :class:`Plan` / :func:`parse_plan` / :func:`check_plan`: dp (replicate x shard, ZeRO
  stage), tp (+ sp), pp (schedule, virtual stages), cp (ring, Ulysses, both),
  micro-batch, gradient accumulation, per-component overrides; checked before launch.
- :func:`build_mesh`: the DeviceMesh a plan implies.
- :func:`parallelize`: TP/SP from each lowered node's ``tp_dims`` (DTensor
  ``parallelize_module``), recomputation, then DDP / ZeRO-1 / ZeRO-2 / ZeRO-3 (FSDP2).
- :func:`split_stages` / :func:`build_pipeline`: pipeline stages balanced by IR cost on
  ``torch.distributed.pipelining`` schedules.
- :func:`ring_attention` / :func:`ulysses_attention` / :func:`apply_context_parallel`:
  context parallelism that runs on CPU (gloo) and supports the IR's mask kinds.
- :func:`search_plans` / :func:`step_cost` / :func:`make_cluster`: the auto-tuner's
  cluster description, cost model (compute, alpha-beta communication, bubbles, memory)
  and ranked search over plans (``lf plan``); :func:`calibrate` / :func:`calibration_for`: rates measured on
  the local GPU, cached, and used for clusters of that GPU model.
- :func:`save_checkpoint` / :func:`load_checkpoint`: atomic DCP checkpoints that load
  under another plan; read without running code from the folder (:class:`SafeFileSystemReader`,
  :class:`SafeLoadPlanner`, :func:`safe_torch_load`, :class:`UnsafeCheckpointError`).
- :func:`clip_grad_norm_` / :func:`total_norm`: the whole model's gradient norm (and clipping by it) over
  any mix of plain tensors and DTensors on any meshes, combined over pipeline stages.
- :func:`context_parallel_of`: a rank's :class:`ContextParallel` under a plan; :func:`measure_collectives`: the
  collectives' rates timed in a process group.
- The correctness harness (``lf parallel check``): :class:`CheckJob` / :func:`run_checks` train a recipe's tiny
  model under plans in one gloo world against one process (:class:`CheckResult`); :func:`resolve_plan`,
  :func:`harness_unsupported`, :func:`harness_graph`; the losses it trains, :func:`llama_cp_loss` and
  :func:`wan_flow_loss_class`.
"""

from lf_parallel._calibrate import (
    Calibration,
    calibrate,
    calibration_for,
    default_calibration,
    load_calibration,
    save_calibration,
)
from lf_parallel._calibrate_comm import measure_collectives
from lf_parallel._checkpoint import (
    MARKER,
    PendingCheckpoint,
    async_save_checkpoint,
    checkpoint_extra,
    is_complete,
    latest_checkpoint,
    load_checkpoint,
    read_full_tensors,
    save_checkpoint,
)
from lf_parallel._cluster import GPU_CATALOGUE, Cluster, ClusterError, GPUSpec, detect_cluster, gpu_spec, make_cluster
from lf_parallel._comm_model import bubble_fraction, bubble_micro_batches, collective_time
from lf_parallel._context import (
    ContextParallel,
    apply_context_parallel,
    context_attention,
    context_parallel_of,
    gather_sequence,
    shard_sequence,
    zigzag_positions,
)
from lf_parallel._cost_model import StepCost, step_cost
from lf_parallel._data_parallel import apply_data_parallel, global_sum, unwrap
from lf_parallel._dist import DistContext, init_distributed, resolve_device, shutdown
from lf_parallel._grad_norm import clip_grad_norm_, total_norm
from lf_parallel._harness import CheckResult, harness_graph, harness_unsupported, resolve_plan
from lf_parallel._harness import Job as CheckJob
from lf_parallel._harness import run_jobs as run_checks
from lf_parallel._harness_mm import wan_flow_loss_class
from lf_parallel._harness_recipes import llama_cp_loss
from lf_parallel._mesh import MESH_DIMS, build_mesh, dp_mesh, flat_dp_group, mesh_shape
from lf_parallel._parallelize import parallelize
from lf_parallel._pipeline import (
    SCHEDULES,
    SIDE_KWARGS,
    PipelineStageModule,
    build_pipeline,
    build_stage_module,
    pipeline_step,
)
from lf_parallel._pipeline_mm import MultimodalStageModule, build_multimodal_pipeline
from lf_parallel._plan import ComponentPlan, Plan, PlanError, PPSchedule, check_plan, choose_plan, parse_plan
from lf_parallel._ring import ring_attention
from lf_parallel._safe_load import (
    SafeFileSystemReader,
    SafeLoadPlanner,
    UnsafeCheckpointError,
    pickle_globals,
    safe_torch_load,
)
from lf_parallel._search import Candidate, NoFeasiblePlan, SearchResult, search_plans
from lf_parallel._stages import StageSpec, balanced_partition, split_stages, stage_ranks, trunk_component
from lf_parallel._tensor_parallel import apply_tensor_parallel, loss_parallel_context, tensor_parallel_styles
from lf_parallel._ulysses import check_ulysses_heads, head_to_seq, seq_to_head, ulysses_attention
from lf_parallel._zero import apply_zero, build_optimizer, mixed_precision_policy, tensor_kind_groups

__version__ = "0.7.0"

__all__ = [
    "MultimodalStageModule", "build_multimodal_pipeline",
    "CheckJob", "CheckResult", "PPSchedule", "context_parallel_of", "harness_graph", "harness_unsupported",
    "llama_cp_loss", "measure_collectives", "resolve_plan", "run_checks", "wan_flow_loss_class",
    "Calibration", "Candidate", "Cluster", "ClusterError", "ComponentPlan", "ContextParallel", "DistContext",
    "GPUSpec", "GPU_CATALOGUE", "MARKER", "MESH_DIMS", "NoFeasiblePlan", "PendingCheckpoint", "PipelineStageModule",
    "Plan", "PlanError", "SCHEDULES", "SIDE_KWARGS", "SafeFileSystemReader", "SafeLoadPlanner", "SearchResult",
    "StageSpec", "StepCost", "UnsafeCheckpointError", "apply_context_parallel",
    "apply_data_parallel", "apply_tensor_parallel", "apply_zero", "async_save_checkpoint", "balanced_partition",
    "bubble_fraction", "bubble_micro_batches", "build_mesh", "build_optimizer", "build_pipeline",
    "build_stage_module", "calibrate", "calibration_for", "check_plan", "check_ulysses_heads", "checkpoint_extra",
    "choose_plan", "clip_grad_norm_", "collective_time", "context_attention", "default_calibration",
    "detect_cluster", "dp_mesh",
    "flat_dp_group", "gather_sequence", "global_sum", "gpu_spec", "head_to_seq", "init_distributed", "is_complete",
    "latest_checkpoint", "load_calibration", "load_checkpoint", "loss_parallel_context", "make_cluster",
    "mesh_shape", "mixed_precision_policy", "parallelize", "parse_plan", "pickle_globals", "pipeline_step",
    "read_full_tensors", "resolve_device", "ring_attention", "safe_torch_load", "save_calibration", "save_checkpoint",
    "search_plans", "seq_to_head",
    "shard_sequence", "shutdown", "split_stages", "stage_ranks", "step_cost", "tensor_kind_groups",
    "tensor_parallel_styles", "total_norm", "trunk_component", "ulysses_attention", "unwrap", "zigzag_positions",
]
