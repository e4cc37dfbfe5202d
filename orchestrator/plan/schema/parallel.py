"""`parallel` group: how the model is split over GPUs."""

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class RecomputeConfig:
    """Activation recomputation, in Megatron-LM's terms."""

    granularity: Optional[str] = None  # None | "full" | "selective"
    method: Optional[str] = None  # with full: "uniform" | "block"
    num_layers: Optional[int] = None  # with full: layers per recompute chunk (uniform) or per stage (block)


@dataclass
class ParallelConfig:
    tp: int = 1  # tensor-model-parallel size
    pp: int = 1  # pipeline-model-parallel size
    cp: int = 1  # context-parallel size (sequence split in 2*cp load-balanced chunks)
    vpp: Optional[int] = None  # virtual pipeline stages per rank (interleaved 1F1B); needs pp > 1
    sp: bool = False  # sequence parallel (needs tp > 1)
    distributed_optimizer: bool = False  # shard optimizer state over data-parallel ranks
    recompute: RecomputeConfig = field(default_factory=RecomputeConfig)
    # How global ranks map to groups, fastest-varying first (see orchestrator/plan/topology.py):
    # megatron's default, or "tp-cp-ep-pp-dp" (Megatron-LM --use-tp-pp-dp-mapping).
    rank_order: str = "tp-cp-ep-dp-pp"
