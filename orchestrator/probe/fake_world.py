"""A fake process group of the plan's world size, seen from one rank, and megatron's
parallel state on it: every collective completes at once without touching data, so a
single CPU process builds and steps the model exactly as that rank would.

Peers are taken as symmetric: ranks that differ only in their tensor- or data-parallel
index hold tensors of the same shapes (megatron shards evenly, the vocabulary is padded to
a multiple of TP, the micro-batch shapes are the plan's), so one rank stands for all of
them. Context-parallel ranks are not: each holds two chunks of a row and encodes the clips
whose placeholders fall in them, so every CP rank of a stage is a role of its own.

What an object collective would have returned from the others, this rank's own object
stands in for (`all_gather_object`, `broadcast_object_list`); megatron's coalesced
gradient collectives are issued one by one (torch has no fake kernel for coalescing).
"""

from __future__ import annotations

import torch.distributed as dist

from orchestrator.plan.parallel_dims import ParallelDims


def rank_of(stage: int, cp_rank: int, dims: ParallelDims) -> int:
    """The global rank of (tp 0, context-parallel rank `cp_rank`, dp 0, pipeline stage
    `stage`) under megatron's rank order (orchestrator/plan/topology.py)."""
    from orchestrator.plan.topology import global_rank

    return global_rank({"cp": cp_rank, "pp": stage}, {"tp": dims.tp, "cp": dims.cp, "dp": dims.dp, "pp": dims.pp},
                       dims.order)


def init_fake_world(rank: int, dims: ParallelDims, seed: int) -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from orchestrator.runtime import cpu_compat

    cpu_compat.activate()  # megatron's RNG tracker and device lookups on a machine without CUDA
    cpu_compat.require_active()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=dims.world_size)
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    # megatron's gloo copies of the groups are for CPU-side checkpoint gathers; a fake
    # world has no gloo and the probe saves nothing.
    ps.initialize_model_parallel(tensor_model_parallel_size=dims.tp, pipeline_model_parallel_size=dims.pp,
                                 context_parallel_size=dims.cp, virtual_pipeline_model_parallel_size=dims.vpp,
                                 order=dims.order,
                                 create_gloo_process_groups=False)
    model_parallel_cuda_manual_seed(seed)
    _own_objects_for_peers()
    _uncoalesced_collectives()


def _own_objects_for_peers() -> None:
    """Object collectives read their peers' pickled sizes back from tensors a fake group
    never fills: the symmetric peers' objects are taken to be this rank's own."""

    def all_gather_object(object_list, obj, group=None):
        for i in range(len(object_list)):
            object_list[i] = obj

    def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
        return None

    dist.all_gather_object = all_gather_object
    dist.broadcast_object_list = broadcast_object_list


def _uncoalesced_collectives() -> None:
    """torch's coalesced collectives (megatron's gradient buffers reduce all their buckets
    in one) have no fake-tensor kernels; issued one by one, each completes at once."""
    import contextlib

    import megatron.core.distributed.param_and_grad_buffer as buffers

    class _Done:
        def wait(self):
            return None

    @contextlib.contextmanager
    def one_by_one(group=None, device=None, async_ops=False):
        yield _Done()

    buffers._coalescing_manager = one_by_one
