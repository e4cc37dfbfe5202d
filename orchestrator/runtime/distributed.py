"""Process-group and megatron parallel-state set-up for one job rank."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist

from orchestrator.runtime import cpu_compat


@dataclass(frozen=True)
class ParallelSizes:
    tp: int = 1
    pp: int = 1
    cp: int = 1
    vpp: Optional[int] = None
    # Rank order (parallel.rank_order; orchestrator/topology.py describes the layouts).
    order: str = "tp-cp-ep-dp-pp"


def init_distributed(sizes: ParallelSizes, seed: int, timeout_s: int = 600) -> str:
    """Initialise torch.distributed from the RANK/WORLD_SIZE/MASTER_* environment,
    megatron's parallel state and its RNG tracker. Returns the device type used.

    gloo on CPU (with the CPU compatibility layer), nccl on GPU.
    """
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:
        cpu_compat.activate()
        cpu_compat.require_active()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if on_gpu else "gloo", timeout=timedelta(seconds=timeout_s))

    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=sizes.tp,
            pipeline_model_parallel_size=sizes.pp,
            context_parallel_size=sizes.cp,
            virtual_pipeline_model_parallel_size=sizes.vpp,
            order=sizes.order,
        )
    # Same seed on every rank: with use_cpu_initialization the full master weights are
    # created identically everywhere and then split, so TP=1 and TP=2 start equal.
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    return "cuda" if on_gpu else "cpu"


def shutdown() -> None:
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
