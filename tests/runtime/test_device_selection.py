"""Which CUDA device a task takes, and what the job sets before CUDA starts.

This machine has no GPU: the device count and `torch.cuda.set_device` are faked (the
test names say so); the selection rule itself is the real code.
"""

import pytest
import torch

from orchestrator.runtime import distributed
from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.runtime.distributed import cuda_device_index, cuda_environment


@pytest.mark.parametrize("local_rank", range(8))
def test_every_task_sees_all_gpus_of_its_node_and_takes_its_local_rank(local_rank):
    assert cuda_device_index(local_rank, 8, "0,1,2,3,4,5,6,7") == local_rank


@pytest.mark.parametrize("local_rank", range(4))
def test_a_task_given_one_gpu_by_the_cluster_takes_it_whatever_its_local_rank(local_rank):
    # --gpus-per-task=1: each task's CUDA_VISIBLE_DEVICES names one (different) device.
    assert cuda_device_index(local_rank, 1, str(local_rank + 4)) == 0


def test_more_tasks_than_visible_gpus_is_refused_with_the_numbers():
    with pytest.raises(RuntimeError) as err:
        cuda_device_index(5, 4, "0,1,2,3")
    message = str(err.value)
    assert "local rank 5" in message and "4 CUDA devices" in message and "'0,1,2,3'" in message
    assert "launcher.gpus_per_node" in message


def test_device_max_connections_is_one_with_tensor_or_context_parallelism_only():
    assert cuda_environment(ParallelDims(tp=2)) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert cuda_environment(ParallelDims(cp=2)) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert cuda_environment(ParallelDims(tp=1, pp=2)) == {}


def test_setup_cuda_with_a_faked_device_count_picks_the_local_rank_and_keeps_the_users_settings(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(torch, "set_float32_matmul_precision", lambda value: chosen.append(value))
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    distributed._setup_cuda(ParallelDims(tp=4), allow_tf32=True)
    assert chosen == [3, "high"]  # device 3, then fp32 matmuls on TF32 tensor cores
    assert distributed.os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    # The launcher no longer narrows CUDA_VISIBLE_DEVICES: every task still sees the node.
    assert distributed.os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"

    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8")  # a user's own value wins
    distributed._setup_cuda(ParallelDims(tp=4), allow_tf32=False)
    assert distributed.os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"
    assert chosen == [3, "high", 3]  # exact fp32 kept when asked
