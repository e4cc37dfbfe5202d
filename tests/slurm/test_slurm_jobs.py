"""Jobs on the real local SLURM cluster (tests/slurm/conftest.py starts it if needed).

Every run directory, and so every submitit folder, lives under pytest's tmp_path:
job ids restart at 1 on a fresh cluster and must never meet an old result file.
Every wait has a deadline; on timeout the job is cancelled and the test fails.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from launchers import commands
from launchers.rundir import read_json, read_metrics
from tests.launchers.helpers import launches, losses, tiny_overrides, wait_for_end, wait_for_step, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.multiprocess]

ITERS = 10
# 1 CPU and 1 GB per task, so that two tasks (one 2-rank job, or two sweep points) run at once on 2 cores.
SLURM = ["launcher=slurm", "launcher.cpus_per_task=1", "launcher.mem_gb=1", "launcher.timeout_min=15"]


def _slurm_run(root, *extra, ranks=2, iters=ITERS):
    return tiny_overrides(root, *SLURM, *extra, ranks=ranks, iters=iters)


@pytest.fixture(scope="module")
def submitted(slurm_cluster, tmp_path_factory):
    """Queue the 2-rank reference job and the 3-point sweep together; tests wait on them."""
    root = tmp_path_factory.mktemp("slurm")
    t0 = time.time()
    ref_code = commands.train(_slurm_run(root, "run.name=ref"))
    sweep_code = commands.train(
        _slurm_run(root, "run.name=sweep", "optim.lr=1e-3,3e-3,1e-2", ranks=1, iters=4), multirun=True
    )
    return {"root": root, "t0": t0, "ref_code": ref_code, "sweep_code": sweep_code,
            "ref": root / "tiny_cpu" / "ref", "sweep": root / "tiny_cpu" / "sweep"}


def test_two_rank_job_trains_to_completion(submitted, capsys):
    assert submitted["ref_code"] == 0  # returned once queued
    run_dir = submitted["ref"]
    (launch,) = launches(run_dir)
    assert launch["kind"] == "slurm" and launch["job_ids"][0].isdigit()
    info = wait_for_end(run_dir, timeout=240)
    assert info["state"] == "COMPLETED", info
    assert sorted(losses(run_dir)) == list(range(1, ITERS + 1))
    for rank in (0, 1):
        assert f"rank {rank}/2 pid" in (run_dir / "logs" / f"rank{rank}.log").read_text()
    capsys.readouterr()
    assert commands.status(run_dir) == 0
    out = capsys.readouterr().out
    assert "COMPLETED" in out and f"{ITERS}/{ITERS}" in out
    first_step = read_metrics(run_dir)[0]["time"]
    print(f"measured: SLURM submit -> first step {first_step - launch['submitted_at']:.1f} s")


def test_sweep_is_one_job_array_with_a_summary(submitted):
    assert submitted["sweep_code"] == 0
    sweep_dir = submitted["sweep"]
    points = read_json(sweep_dir / "sweep.json")["points"]
    assert [p["swept"] for p in points] == [["optim.lr=0.001"], ["optim.lr=0.003"], ["optim.lr=0.01"]]
    job_ids = [launches(sweep_dir / p["dir"])[0]["job_ids"][0] for p in points]
    array_id = job_ids[0].split("_")[0]
    assert job_ids == [f"{array_id}_{i}" for i in range(3)]
    finals = []
    for point in points:
        info = wait_for_end(sweep_dir / point["dir"], timeout=240)
        assert info["state"] == "COMPLETED", (point, info)
        finals.append(info["loss"])
    assert len(set(finals)) == 3  # different learning rates, different runs
    assert commands.status(sweep_dir) == 0
    table = (sweep_dir / "summary.txt").read_text().splitlines()
    assert table[0].split() == ["point", "overrides", "state", "step", "final", "loss"]
    rows = table[2:]
    assert len(rows) == 3 and all("COMPLETED" in row and "4/4" in row for row in rows)
    assert [float(row.split()[-1]) for row in rows] == pytest.approx(finals, rel=1e-5)


def test_preempted_job_requeues_and_reproduces_every_loss(submitted, tmp_path, monkeypatch):
    ref_dir = submitted["ref"]
    assert wait_for_end(ref_dir, timeout=240)["state"] == "COMPLETED"
    monkeypatch.setenv("AUDIOLLM_MINIMAL_STEP_DELAY_S", "0.3")
    assert commands.train(_slurm_run(tmp_path, "run.name=pre")) == 0
    run_dir = tmp_path / "tiny_cpu" / "pre"
    job_id = launches(run_dir)[0]["job_ids"][0]
    wait_for_step(run_dir, 3, timeout=240)
    signalled = time.time()
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=30)
    wait_until(lambda: (read_json(run_dir / "state.json") or {}).get("attempt", 0) >= 2, 180,
               "the requeued job to start again", [run_dir])
    info = wait_for_end(run_dir, timeout=240)
    assert info["state"] == "COMPLETED", info
    state = read_json(run_dir / "state.json")
    assert state["requeues"] == 1 and state["signal"] == "SIGUSR2" and state["job_id"] == job_id
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "resumed from step_" in log
    assert losses(run_dir) == losses(ref_dir)
    stopped_at = int(log.split("resumed from step_")[1].split()[0])
    first_after = next(m["time"] for m in read_metrics(run_dir) if m["step"] == stopped_at + 1)
    print(f"measured: USR2 -> first step after requeue {first_after - signalled:.1f} s")
