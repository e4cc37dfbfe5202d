"""Checkpoints: megatron dist_checkpointing (reshardable over TP/PP/DP), published
atomically, the last K kept.

Layout under <run_dir>/checkpoints/:
  step_000010/            one published checkpoint (dist_checkpointing format)
    rank_state/rank_00000.pt   per-rank RNG states and data-loader state
  latest                  name of the newest published checkpoint (replaced atomically)
  .tmp-step_000020/       a save in progress (never read; removed by the next save)

Every rank writes into the temporary directory; after a barrier rank 0 renames it to
its final name and only then points `latest` at it (write + os.replace), so a crash
at any moment leaves `latest` naming a complete checkpoint.

Contents: model chunks ("model" or "model0", "model1", ... with virtual pipeline
stages), optimizer (distributed-optimizer state in the dp_reshardable layout), LR
scheduler, step, W&B run id, and per rank: python/numpy/torch/CUDA/megatron-tracker
RNG states and the BatchSource state.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from orchestrator.convert.dist_format import use_in_process_results_queue

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d{6,})$")
# megatron-core 0.16.1: the default fully_sharded_model_space layout fails on load
# ("ShardedTensor.flattened_range is not supported"); dp_reshardable works.
_SHARDING_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def latest_checkpoint(run_dir: str | Path) -> Optional[Path]:
    """The checkpoint `latest` names, or None when the run has none."""
    root = checkpoints_dir(run_dir)
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    if not path.is_dir():
        raise FileNotFoundError(f"{pointer} names {path.name}, which does not exist: the run directory was edited by hand")
    return path


def _model_key(index: int, count: int) -> str:
    return "model" if count == 1 else f"model{index}"


def _unwrap_ddp(chunk):
    """megatron's DDP has no sharded_state_dict of its own (the generic one would
    prefix every key with `module.`): checkpoint the wrapped module."""
    from megatron.core.distributed import DistributedDataParallel

    return chunk.module if isinstance(chunk, DistributedDataParallel) else chunk


def _model_sharded_state_dict(chunks: Sequence) -> dict:
    return {_model_key(i, len(chunks)): _unwrap_ddp(c).sharded_state_dict(metadata=dict(_SHARDING_METADATA))
            for i, c in enumerate(chunks)}


def _rng_state() -> dict:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    state = {
        "python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
        "tracker": {k: v.clone() for k, v in get_cuda_rng_tracker().get_states().items()},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    get_cuda_rng_tracker().set_states(state["tracker"])


def save_checkpoint(run_dir, step: int, chunks: Sequence, optimizer, scheduler, batch_source,
                    wandb_run_id: Optional[str], keep_last: int) -> Path:
    from megatron.core import dist_checkpointing

    use_in_process_results_queue()
    root = checkpoints_dir(run_dir)
    name = f"step_{step:06d}"
    final, tmp = root / name, root / f".tmp-{name}"
    rank = dist.get_rank()
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):  # a save that crashed earlier
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():  # the same step saved by a run that crashed before publishing
            shutil.rmtree(final)
        tmp.mkdir()
    dist.barrier()
    model_sd = _model_sharded_state_dict(chunks)
    state = dict(model_sd)
    state["optimizer"] = optimizer.sharded_state_dict(model_sd, metadata=dict(_SHARDING_METADATA))
    state["scheduler"] = scheduler.state_dict()
    state["step"] = step
    state["wandb_run_id"] = wandb_run_id
    dist_checkpointing.save(state, str(tmp))
    rank_dir = tmp / "rank_state"
    if rank == 0:
        rank_dir.mkdir(exist_ok=True)
    dist.barrier()
    torch.save({"rng": _rng_state(), "data": batch_source.state_dict(), "world_size": dist.get_world_size()},
               rank_dir / f"rank_{rank:05d}.pt")
    dist.barrier()
    if rank == 0:
        os.replace(tmp, final)
        pointer_tmp = root / "latest.tmp"
        pointer_tmp.write_text(name + "\n")
        os.replace(pointer_tmp, root / "latest")
        _prune(root, keep_last)
    dist.barrier()
    return final


def _prune(root: Path, keep_last: int) -> None:
    published = sorted((p for p in root.iterdir() if _STEP_DIR.match(p.name)), key=lambda p: p.name)
    for old in published[: max(len(published) - max(keep_last, 1), 0)]:
        shutil.rmtree(old, ignore_errors=True)


def _prime_distributed_optimizer(chunks: Sequence, optimizer) -> None:
    """megatron's DistributedOptimizer builds its loading state dict only once Adam
    has state ('step'); take one step with zero gradients (everything it changes is
    overwritten by the load)."""
    for chunk in chunks:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    optimizer.step()


def load_checkpoint(path: Path, chunks: Sequence, optimizer, scheduler, batch_source) -> dict:
    """Restore everything save_checkpoint wrote. Returns {'step', 'wandb_run_id'}."""
    from megatron.core import dist_checkpointing

    if getattr(optimizer.config, "use_distributed_optimizer", False):
        _prime_distributed_optimizer(chunks, optimizer)
    model_sd = _model_sharded_state_dict(chunks)
    request = dict(model_sd)
    request["optimizer"] = optimizer.sharded_state_dict(model_sd, is_loading=True, metadata=dict(_SHARDING_METADATA))
    loaded = dist_checkpointing.load(request, str(path))
    for i, chunk in enumerate(chunks):
        _unwrap_ddp(chunk).load_state_dict(loaded[_model_key(i, len(chunks))])
    # fp32 distributed optimizer: main params are views of requires-grad model params.
    with torch.no_grad():
        optimizer.load_state_dict(loaded["optimizer"])
    scheduler.load_state_dict(loaded["scheduler"])
    rank = dist.get_rank()
    own = path / "rank_state" / f"rank_{rank:05d}.pt"
    state = torch.load(own, weights_only=False) if own.exists() else {"world_size": None}
    if state["world_size"] == dist.get_world_size():
        _set_rng_state(state["rng"])
    else:
        log.warning("checkpoint was written by %d ranks, this job has %d: RNG states start fresh",
                    state["world_size"], dist.get_world_size())
        state = torch.load(path / "rank_state" / "rank_00000.pt", weights_only=False)
    batch_source.load_state_dict(state["data"])
    return {"step": int(loaded["step"]), "wandb_run_id": loaded.get("wandb_run_id")}


def load_model_weights(path: Path, chunks: Sequence, strict: bool = True) -> None:
    """Model weights only (evaluation, init_checkpoint, another parallel layout):
    dist_checkpointing reshards to this job's TP/PP."""
    from megatron.core import dist_checkpointing

    model_sd = _model_sharded_state_dict(chunks)
    loaded = dist_checkpointing.load(model_sd, str(path))
    for i, chunk in enumerate(chunks):
        _unwrap_ddp(chunk).load_state_dict(loaded[_model_key(i, len(chunks))], strict=strict)
