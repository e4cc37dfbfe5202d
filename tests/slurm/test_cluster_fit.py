"""A request the cluster can never run is refused before submission, naming the numbers
and the fix (launchers/slurm_fit.py), on the real local SLURM cluster: its partition
`debug` has one node with this machine's CPUs and memory and no GPUs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launchers.checks import NEVER_STARTS
from launchers.runs import EXIT_INVALID, EXIT_OK
from launchers.status import cancel, status
from launchers.train import train
from tests.distributed_run import REPO
from tests.launchers.helpers import tiny_overrides

pytestmark = pytest.mark.slurm

SLURM = ["launcher=slurm", "launcher.accelerator=cpu", "launcher.cpus_per_task=1", "launcher.timeout_min=5"]


def _train(tmp_path, capsys, *extra):
    capsys.readouterr()
    code = train([*SLURM, *tiny_overrides(tmp_path, "run.name=neverstarts", ranks=1), *extra])
    return code, capsys.readouterr()


def _queued() -> str:
    return subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True, timeout=30).stdout


@pytest.mark.parametrize("extra, expected", [
    (["launcher.cpus_per_task=4096"], ["launcher.cpus_per_task=4096 = 4096 CPUs per node",
                                       "the nodes of partition debug have at most", "set launcher.cpus_per_task="]),
    (["launcher.nodes=3", "optim.global_batch_size=48"], ["launcher.nodes=3 but partition debug has 1 node(s) (localhost)",
                            "set launcher.nodes=1 or less"]),
    (["launcher.accelerator=gpu"], ["launcher.gpus_per_node=1 but the nodes of partition debug have at most 0 GPUs",
                                    "set launcher.accelerator=cpu"]),
    (["launcher.mem_gb=100000"], ["launcher.mem_gb=100000 per node, but the nodes of partition debug have at most",
                                  "set launcher.mem_gb="]),
    (["launcher.partition=gpu_large"], ["launcher.partition=gpu_large: the cluster has no such partition (it has "
                                        "debug)"]),
    (["launcher.account=nobody"], ["launcher.account=nobody: the cluster has no such account"]),
    (["launcher.qos=platinum"], ["launcher.qos=platinum: the cluster has no such qos (it has normal)"]),
], ids=["cpus", "nodes", "gpus", "memory", "partition", "account", "qos"])
def test_a_job_that_could_never_start_is_refused_naming_the_numbers(slurm_cluster, tmp_path, capsys, extra,
                                                                    expected):
    code, out = _train(tmp_path, capsys, *extra)
    assert code == EXIT_INVALID, out
    assert NEVER_STARTS in out.err
    for text in expected:
        assert text in out.err, out.err
    assert not (tmp_path / "tiny_cpu" / "neverstarts").exists()  # nothing written, nothing queued
    assert "neverstarts" not in _queued()


def test_plan_shows_the_same_check_and_a_fitting_request_passes_it(slurm_cluster, tmp_path, capsys):
    argv = ["+recipe=tiny_cpu", *SLURM, "launcher.gpus_per_node=1", "launcher.nodes=3", "optim.global_batch_size=48"]
    proc = subprocess.run([sys.executable, "-c", "import sys; from orchestrator.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", "plan", "--json", *argv],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    problems = json.loads(proc.stdout)["cluster_problems"]
    assert len(problems) == 1 and problems[0].startswith("launcher.nodes=3 but partition debug has 1 node(s)")
    proc = subprocess.run([sys.executable, "-c", "import sys; from orchestrator.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", "plan", "+recipe=tiny_cpu", *SLURM],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0 and "cluster check (this SLURM cluster's partitions and nodes): the request fits" \
        in proc.stdout, proc.stdout[-2000:] + proc.stderr
    # A dry run prints what would be submitted and says why it could not start, submitting nothing.
    code, out = _train(tmp_path, capsys, "launcher.dry_run=true", "launcher.nodes=3",
                       "optim.global_batch_size=48")
    assert code == EXIT_OK and "#SBATCH --nodes=3" in out.out
    assert "this cluster could never start the job" in out.err and "launcher.nodes=3" in out.err


def test_status_says_why_a_queued_job_waits(slurm_cluster, tmp_path, capsys):
    """A job SLURM holds back (here: a begin time 10 minutes ahead) is PENDING with the
    scheduler's reason in words, not a bare PENDING."""
    code, out = _train(tmp_path, capsys, "+launcher.additional_sbatch.begin=now+600")
    assert code == EXIT_OK, out
    run_dir = tmp_path / "tiny_cpu" / "neverstarts"
    try:
        assert status(run_dir) == 0
        story = capsys.readouterr().out
        assert "state     PENDING" in story and "waiting   BeginTime: not eligible yet" in story, story
    finally:
        cancel(run_dir)
