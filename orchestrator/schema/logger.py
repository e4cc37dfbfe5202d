"""`logger` group: experiment tracking."""

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class LoggerConfig:
    backend: str = "wandb"  # wandb | none
    # offline unless an API key is configured; the key itself never enters the run directory.
    mode: str = "offline"  # offline | online | disabled
    project: str = "audiollm"
    entity: Optional[str] = None
    tags: List[str] = field(default_factory=list)
