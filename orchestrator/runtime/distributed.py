"""Process-group and megatron parallel-state set-up for one job rank."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist

from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.runtime import cpu_compat


def megatron_parallel_fields(dims: ParallelDims) -> dict:
    """The TransformerConfig fields that say the sizes (the job's one config takes them from
    the Plan's dims, as megatron's parallel state does)."""
    return dict(
        tensor_model_parallel_size=dims.tp,
        pipeline_model_parallel_size=dims.pp,
        virtual_pipeline_model_parallel_size=dims.vpp,
        context_parallel_size=dims.cp,  # megatron's rotary embedding then takes this rank's chunks
        cp_comm_type="all_gather" if dims.cp > 1 else None,  # what orchestrator.models.attention does
        sequence_parallel=dims.sp,
    )


def cuda_device_index(local_rank: int, device_count: int, visible: Optional[str]) -> int:
    """The CUDA device of this task, among the `device_count` it can see.

    Two set-ups are common and both must work: every task of a node sees all the node's
    GPUs (torchrun, `srun` with `--gres=gpu:N`): take the LOCAL_RANK-th; or the cluster
    gives each task exactly one (`--gpus-per-task=1`, `--gpu-bind`): take it, whatever
    the local rank. Anything else is a mismatch between tasks and GPUs per node.
    """
    if device_count == 1:
        return 0
    if 0 <= local_rank < device_count:
        return local_rank
    raise RuntimeError(
        f"local rank {local_rank} has no GPU of its own: this task sees {device_count} CUDA devices "
        f"(CUDA_VISIBLE_DEVICES={visible!r}). The launcher starts launcher.gpus_per_node tasks per node, one "
        f"per GPU: set launcher.gpus_per_node to the GPUs a node really has, or let every task see all of them")


def cuda_environment(sizes: ParallelDims) -> dict:
    """Environment the job sets before CUDA starts (values a user set are kept).

    CUDA_DEVICE_MAX_CONNECTIONS=1: with tensor (and sequence) parallelism megatron
    issues communication kernels that must be scheduled before the compute kernels
    that follow them in program order; one hardware queue guarantees that order
    (Megatron-LM requires it with TP/SP and refuses to start without it).
    """
    env = {}
    if sizes.tp > 1 or sizes.cp > 1:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    return env


def _setup_cuda(sizes: ParallelDims, allow_tf32: bool) -> None:
    for name, value in cuda_environment(sizes).items():
        os.environ.setdefault(name, value)
    index = cuda_device_index(int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count(),
                              os.environ.get("CUDA_VISIBLE_DEVICES"))
    torch.cuda.set_device(index)
    if allow_tf32:
        # fp32 matmuls (a frozen Whisper encoder kept in fp32) on TF32 tensor cores:
        # ~7x the fp32 rate on H100, inputs rounded to a 10-bit mantissa, fp32
        # accumulation. cuDNN convolutions use TF32 by default already.
        torch.set_float32_matmul_precision("high")


def init_distributed(sizes: ParallelDims, seed: int, timeout_s: int = 600, allow_tf32: bool = True) -> str:
    """Initialise torch.distributed from the RANK/WORLD_SIZE/MASTER_* environment,
    megatron's parallel state on `sizes` (ValueError naming every factor where they do not
    tile the world) and its RNG tracker. Returns the device type used.

    gloo on CPU (with the CPU compatibility layer), nccl on GPU. `allow_tf32=False`
    keeps fp32 matmuls exact (numerical comparisons in fp32).
    """
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        _setup_cuda(sizes, allow_tf32)
    else:
        cpu_compat.activate()
        cpu_compat.require_active()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if on_gpu else "gloo", timeout=timedelta(seconds=timeout_s))

    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    sizes.at_world(dist.get_world_size(), "WORLD_SIZE of the job")
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
