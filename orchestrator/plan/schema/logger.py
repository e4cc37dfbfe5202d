"""`logger` group: experiment tracking."""

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class LoggerConfig:
    backend: str = "wandb"  # wandb | none
    # offline: always offline (sync later). online: online when an API key is configured
    # (WANDB_API_KEY or ~/.netrc), otherwise offline with a warning. disabled: no W&B.
    # The key itself never enters the run directory or the logs.
    mode: str = "offline"  # offline | online | disabled
    project: str = "audiollm"  # W&B group = run.experiment (the sweep), name = run.name
    entity: Optional[str] = None
    tags: List[str] = field(default_factory=list)
