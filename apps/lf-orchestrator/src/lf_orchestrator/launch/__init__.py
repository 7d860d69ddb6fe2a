"""`lf launch`: start a run under torchrun, Slurm (``srun torchrun``) or Kubernetes (Kubeflow PyTorchJob).

Every backend starts the same worker command, ``python -m lf_orchestrator run CONFIG --run-dir DIR``,
so a restarted worker (torchrun ``--max-restarts``, a Slurm requeue, a restarted pod) continues
the same run folder from its latest complete checkpoint.
"""
