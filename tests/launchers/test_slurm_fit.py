"""The cluster fit check's reading of `scontrol` output and its rules, on the output of
a GPU cluster written out here (the real single-node cluster has no GPUs, time or node
limits: tests/slurm/test_cluster_fit.py runs the check against it)."""

import pytest

from launchers.slurm_fit import ClusterView, parse_cluster, request_problems, time_minutes

PARTITIONS = """\
PartitionName=gpu AllowGroups=ALL AllowAccounts=speech,vision AllowQos=ALL AllocNodes=ALL Default=YES QoS=N/A DefaultTime=NONE MaxNodes=4 MaxTime=2-00:00:00 MinNodes=0 MaxCPUsPerNode=UNLIMITED Nodes=g[1-3] State=UP TotalCPUs=192 TotalNodes=3 DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED
PartitionName=cpu AllowGroups=ALL AllowAccounts=ALL AllowQos=normal AllocNodes=ALL Default=NO MaxNodes=UNLIMITED MaxTime=04:00:00 MaxCPUsPerNode=32 Nodes=c1 State=UP TotalNodes=1 MaxMemPerNode=65536
"""
NODES = """\
NodeName=g1 Arch=x86_64 CPUAlloc=0 CPUTot=64 Gres=gpu:h100:8(S:0-1) NodeAddr=g1 OS=Linux 6.1 #1 SMP RealMemory=1024000 State=IDLE Partitions=gpu
NodeName=g2 Arch=x86_64 CPUAlloc=0 CPUTot=64 Gres=gpu:h100:8(S:0-1) RealMemory=1024000 State=DOWN+DRAIN Reason=Not responding [slurm@2026-11-23T10:00:00] Partitions=gpu
NodeName=g3 Arch=x86_64 CPUAlloc=0 CPUTot=64 Gres=gpu:a100:4,shard:16 RealMemory=512000 State=MIXED Partitions=gpu
NodeName=c1 Arch=x86_64 CPUAlloc=0 CPUTot=128 Gres=(null) RealMemory=256000 State=IDLE Partitions=cpu
"""
VIEW = ClusterView(parse_cluster(PARTITIONS, NODES), accounts=["speech", "vision", "ops"], qos=["normal", "high"])


def launcher(**changes):
    base = {"kind": "slurm", "nodes": 2, "gpus_per_node": 8, "cpus_per_task": 8, "accelerator": "gpu",
            "mem_gb": None, "timeout_min": 240, "partition": None, "account": "speech", "qos": None}
    return {**base, **changes}


def test_scontrol_output_is_read_into_partitions_and_nodes():
    gpu, cpu = VIEW.partitions["gpu"], VIEW.partitions["cpu"]
    assert VIEW.default_partition() is gpu
    assert [(n.name, n.cpus, n.gpus, n.memory_mb) for n in gpu.nodes] == [
        ("g1", 64, 8, 1024000), ("g2", 64, 8, 1024000), ("g3", 64, 4, 512000)]
    assert (gpu.max_nodes, gpu.max_time_min, gpu.allow_accounts, gpu.allow_qos) == (4, 2880, ["speech", "vision"], None)
    assert (cpu.max_time_min, cpu.max_cpus_per_node, cpu.max_mem_per_node_mb) == (240, 32, 65536)
    assert gpu.nodes[1].state == "DOWN+DRAIN"  # a drained node still counts: it comes back


@pytest.mark.parametrize("value, minutes", [("30", 30), ("30:15", 31), ("2:00:00", 120), ("1-00", 1440),
                                            ("1-02:30", 1590), ("1-00:00:01", 1441), ("UNLIMITED", None)])
def test_slurm_time_formats(value, minutes):
    assert time_minutes(value) == minutes


def test_a_request_that_fits_has_no_problems():
    assert request_problems(launcher(), VIEW) == []
    assert request_problems(launcher(partition="cpu", nodes=1, accelerator="cpu", gpus_per_node=4, account=None),
                            VIEW) == []


@pytest.mark.parametrize("changes, expected", [
    ({"nodes": 3}, "only 2 node(s) of partition gpu have 64 CPUs, 8 GPUs and 0 GB together; launcher.nodes=3 needs 3"),
    ({"nodes": 5}, "launcher.nodes=5 but partition gpu allows at most 4 nodes per job (MaxNodes)"),
    ({"gpus_per_node": 16, "cpus_per_task": 4},
     "launcher.gpus_per_node=16 but the nodes of partition gpu have at most 8 GPUs; set launcher.gpus_per_node=8"),
    ({"cpus_per_task": 16}, "= 128 CPUs per node, but the nodes of partition gpu have at most 64 CPUs; set "
                            "launcher.cpus_per_task=8"),
    ({"timeout_min": 3000}, "launcher.timeout_min=3000 exceeds the time limit of partition gpu (2880 min, MaxTime)"),
    ({"mem_gb": 2000}, "launcher.mem_gb=2000 per node, but the nodes of partition gpu have at most 1000 GB"),
    ({"account": "ops"}, "launcher.account=ops may not use partition gpu (it allows speech, vision)"),
    ({"qos": "gold"}, "launcher.qos=gold: the cluster has no such qos (it has normal, high)"),
    ({"partition": "cpu", "accelerator": "cpu", "gpus_per_node": 4, "cpus_per_task": 16},
     "4 tasks x launcher.cpus_per_task=16 = 64 CPUs per node but partition cpu lets a job use 32 CPUs of a node "
     "(MaxCPUsPerNode); set launcher.cpus_per_task=8"),
    ({"partition": "cpu", "accelerator": "cpu", "mem_gb": 100},
     "launcher.mem_gb=100 exceeds partition cpu's MaxMemPerNode (64 GB); set launcher.mem_gb=64 or less"),
    ({"partition": "cpu", "account": None, "qos": "high"}, "launcher.qos=high may not use partition cpu"),
    ({"partition": "cpu", "account": None},
     "launcher.gpus_per_node=8 but the nodes of partition cpu have at most 0 GPUs; set launcher.accelerator=cpu"),
], ids=["nodes_with_everything", "max_nodes", "gpus", "cpus", "time", "memory", "account_not_allowed", "unknown_qos",
        "max_cpus_per_node", "max_mem_per_node", "qos_not_allowed", "no_gpus"])
def test_each_limit_is_named_with_its_numbers_and_fix(changes, expected):
    problems = request_problems(launcher(**changes), VIEW)
    assert any(expected in p for p in problems), problems


def test_unknown_partition_lists_the_partitions():
    (problem,) = request_problems(launcher(partition="h200"), VIEW)
    assert problem == ("launcher.partition=h200: the cluster has no such partition (it has cpu, gpu); set "
                       "launcher.partition to one of them")


def test_plan_skips_the_cluster_check_saying_so_when_the_controller_does_not_answer(tmp_path):
    """SLURM's client installed, its controller not answering (a laptop, a controller being
    restarted): each scontrol query retries for about 9 s before it fails. `audiollm plan`
    asks once, all queries side by side, waits at most the query timeout, and says that
    the check was skipped and why; the plan itself is printed in full."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    from launchers.slurm_fit import DEFAULT_QUERY_TIMEOUT_S
    from orchestrator.runtime.ports import free_port
    from tests.distributed_run import REPO

    if shutil.which("scontrol") is None:
        pytest.fail("SLURM's client is not installed (bash setup.sh --test installs it)")
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=unanswered\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={free_port()}\n"
                    "NodeName=n1 CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=n1 Default=YES\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "SLURM_CONF": str(conf)}
    env.pop("AUDIOLLM_SLURM_QUERY_TIMEOUT_S", None)  # the default wait (tests/slurm/conftest.py raises it)
    argv = [sys.executable, "-m", "orchestrator.cli", "plan", "+recipe=tiny_cpu", "launcher=slurm", "launcher.accelerator=cpu"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (f"cluster check skipped: the controller at localhost(127.0.0.1) ({conf}) did not answer in "
            f"{DEFAULT_QUERY_TIMEOUT_S:g} s") in proc.stdout, proc.stdout
    assert "memory/GPU" in proc.stdout and "megatron argv" in proc.stdout
    as_json = subprocess.run([*argv, "--json"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    plan = json.loads(as_json.stdout)
    assert plan["cluster_problems"] is None and "did not answer" in plan["cluster_check_skipped"]
