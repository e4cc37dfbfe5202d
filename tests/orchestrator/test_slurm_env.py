"""torch.distributed's variables from a SLURM task's (orchestrator/runtime/slurm_env.py);
the real srun start is tests/slurm/test_multinode.py."""

import pytest

from orchestrator.runtime import slurm_env
from orchestrator.runtime.ports import port_for_job
from orchestrator.runtime.slurm_env import expand_nodelist, export_from_slurm

TASK = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_ID": "123456"}


@pytest.fixture
def no_scontrol(monkeypatch):
    monkeypatch.setattr(slurm_env.shutil, "which", lambda name: None)  # the by-hand expansion


def test_a_slurm_task_gets_rank_world_and_the_first_node_as_master(no_scontrol):
    env = dict(TASK)
    assert export_from_slurm(env)
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")} == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "gpu07"}
    assert env["MASTER_PORT"] == str(port_for_job("123456"))  # the same on every task of the job


def test_torchrun_or_the_launcher_environment_is_left_alone():
    env = {**TASK, "RANK": "0", "MASTER_ADDR": "x"}
    assert not export_from_slurm(env) and env["MASTER_ADDR"] == "x" and "WORLD_SIZE" not in env
    assert not export_from_slurm({"PATH": "/bin"})  # not a SLURM task


def test_a_user_master_port_is_kept(no_scontrol):
    env = {**TASK, "MASTER_PORT": "29500"}
    export_from_slurm(env)
    assert env["MASTER_PORT"] == "29500"


@pytest.mark.parametrize("nodelist, hosts", [
    ("aunode[1-2]", ["aunode1", "aunode2"]), ("gpu[07-08,10],cpu3", ["gpu07", "gpu08", "gpu10", "cpu3"]),
    ("single", ["single"])])
def test_compressed_node_lists_expand_in_order(no_scontrol, nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts
