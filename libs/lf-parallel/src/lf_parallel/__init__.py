"""lf-parallel: parallel plans, process groups and data parallelism for LoongForge."""

from lf_parallel._data_parallel import apply_data_parallel, global_sum, unwrap
from lf_parallel._dist import DistContext, init_distributed, resolve_device, shutdown
from lf_parallel._plan import Plan, PlanError, check_plan, choose_plan

__version__ = "0.1.0"

__all__ = ["DistContext", "Plan", "PlanError", "apply_data_parallel", "check_plan",
           "choose_plan", "global_sum", "init_distributed", "resolve_device", "shutdown", "unwrap"]
