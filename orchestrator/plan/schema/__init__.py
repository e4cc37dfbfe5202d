"""Typed schemas of the configuration: one dataclass per Hydra group.

YAML under conf/ and recipes/ holds values; these dataclasses hold types, defaults
and the meaning of every field. Python computes derived values (resolve.py).
A key that is not declared here, or a value of the wrong type, fails at compose
time with the key's full path.
"""

from orchestrator.plan.schema.data import DataConfig, DatasetEntry
from orchestrator.plan.schema.launcher import LauncherConfig
from orchestrator.plan.schema.logger import LoggerConfig
from orchestrator.plan.schema.lora import LoraConfig, LrGroup
from orchestrator.plan.schema.model import AdapterConfig, DecoderConfig, EncoderConfig, ModelConfig
from orchestrator.plan.schema.optim import OptimConfig
from orchestrator.plan.schema.parallel import ParallelConfig, RecomputeConfig
from orchestrator.plan.schema.root import AudioLLMConfig, RunConfig, TrainConfig

__all__ = [
    "AdapterConfig",
    "AudioLLMConfig",
    "DataConfig",
    "DatasetEntry",
    "DecoderConfig",
    "EncoderConfig",
    "LauncherConfig",
    "LoggerConfig",
    "LoraConfig",
    "LrGroup",
    "ModelConfig",
    "OptimConfig",
    "ParallelConfig",
    "RecomputeConfig",
    "RunConfig",
    "TrainConfig",
]
