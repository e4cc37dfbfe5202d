"""`logger` group: experiment tracking."""

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class LoggerConfig:
    backend: str = "wandb"  # wandb | none
    # offline: always offline (sync later). online: online when an API key is configured
    # (WANDB_API_KEY or ~/.netrc), otherwise offline with a warning; system metrics (GPU
    # charts) on. disabled: no W&B. The key itself never enters the run directory or the logs.
    # null: $WANDB_MODE where the job runs (SLURM passes the submitting shell's environment
    # on), else offline. The job says which it took and from where.
    mode: Optional[str] = None  # offline | online | disabled | null
    # W&B group = run.experiment (the sweep), name = run.name. null: $WANDB_PROJECT, else
    # "audiollm"; entity null: $WANDB_ENTITY, else wandb's default. Set here, they win over
    # the environment.
    project: Optional[str] = None
    entity: Optional[str] = None
    tags: List[str] = field(default_factory=list)
