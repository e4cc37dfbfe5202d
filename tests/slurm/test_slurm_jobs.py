"""The real AudioLLM trainer (the default job entry, orchestrator.train.entry.main) on
the real local SLURM cluster (tests/slurm/conftest.py starts it if needed): the tiny
AudioLLM trained on a tone corpus made here (tests/train/audiollm_runs.py).

Every run directory, and so every submitit folder, lives under pytest's tmp_path:
job ids restart at 1 on a fresh cluster and must never meet an old result file.
Every wait has a deadline; on timeout the job is cancelled and the test fails.
"""

from __future__ import annotations

import re
import time

import pytest

from launchers.status import status
from launchers.train import train
from orchestrator.plan.rundir import read_json
from tests.launchers.helpers import launches, losses, wait_for_end, wait_for_step
from tests.slurm.runs import JOB_TIMEOUT, preempt_and_wait_for_resume, slurm_run, wandb_runs
from tests.train.audiollm_runs import make_corpus

pytestmark = [pytest.mark.slurm, pytest.mark.multiprocess]

# Enough steps that the preempted run is still training when its signal arrives: a step
# takes ~0.1 s here, the signal is seen 2-3 steps after it was sent.
ITERS = 30
SIGNAL_AFTER = 2
SWEEP_ITERS = 4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("tones"))


@pytest.fixture(scope="module")
def submitted(slurm_cluster, corpus, tmp_path_factory):
    """Queue the 2-rank reference job and the 3-point sweep together; tests wait on them."""
    root = tmp_path_factory.mktemp("slurm")
    ref_code = train(slurm_run(root, corpus, "run.name=ref", iters=ITERS))
    sweep_code = train(
        slurm_run(root, corpus, "run.name=sweep", "optim.lr=1e-3,3e-3,1e-2", ranks=1, iters=SWEEP_ITERS),
        multirun=True,
    )
    return {"root": root, "ref_code": ref_code, "sweep_code": sweep_code,
            "ref": root / "tiny_cpu" / "ref", "sweep": root / "tiny_cpu" / "sweep"}


def test_two_rank_job_trains_to_completion(submitted, capsys):
    assert submitted["ref_code"] == 0  # returned once queued
    run_dir = submitted["ref"]
    (launch,) = launches(run_dir)
    assert launch["kind"] == "slurm" and launch["job_ids"][0].isdigit()
    assert read_json(run_dir / "plan.json")["dp"] == 2
    # The trainer's metrics rows carry no wall-clock time: note when step 1 appears.
    wait_for_step(run_dir, 1, timeout=JOB_TIMEOUT)
    first_step_seen = time.time()
    info = wait_for_end(run_dir, timeout=JOB_TIMEOUT)
    assert info["state"] == "COMPLETED", info
    by_step = losses(run_dir)
    assert sorted(by_step) == list(range(1, ITERS + 1))
    curve = [by_step[s] for s in range(1, ITERS + 1)]
    assert sum(curve[-3:]) < 0.8 * sum(curve[:3]), f"the loss did not fall: {curve}"
    for rank in (0, 1):
        assert f"rank {rank}/2 pid" in (run_dir / "logs" / f"rank{rank}.log").read_text()
    rank0 = (run_dir / "logs" / "rank0.log").read_text()
    assert f"step {ITERS}/{ITERS} | loss" in rank0 and f"eval at step {ITERS}: val_loss" in rank0
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{ITERS:06d}"
    capsys.readouterr()
    assert status(run_dir) == 0
    out = capsys.readouterr().out
    assert "COMPLETED" in out and f"{ITERS}/{ITERS}" in out
    with capsys.disabled():
        print(f"\nmeasured: SLURM submit -> first step seen {first_step_seen - launch['submitted_at']:.1f} s")


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
        info = wait_for_end(sweep_dir / point["dir"], timeout=JOB_TIMEOUT)
        assert info["state"] == "COMPLETED", (point, info)
        finals.append(info["loss"])
    assert len(set(finals)) == 3  # different learning rates, different runs
    assert status(sweep_dir) == 0
    table = (sweep_dir / "summary.txt").read_text().splitlines()
    assert table[0].split() == ["point", "overrides", "state", "step", "requeues", "final", "loss"]
    rows = table[2:]
    assert len(rows) == 3 and all("COMPLETED" in row and f"{SWEEP_ITERS}/{SWEEP_ITERS}" in row for row in rows)
    assert [float(row.split()[-1]) for row in rows] == pytest.approx(finals, rel=1e-5)


def test_preempted_job_requeues_and_reproduces_every_loss(submitted, corpus, capsys):
    """USR2 (SLURM's preemption / time-limit warning) mid-training: the trainer writes a
    checkpoint at the next step boundary, the launcher requeues the job, the next attempt
    resumes from that checkpoint and reproduces the uninterrupted run's loss at every step."""
    ref_dir = submitted["ref"]
    assert wait_for_end(ref_dir, timeout=JOB_TIMEOUT)["state"] == "COMPLETED"
    # The same configuration as the reference run but for run.name.
    assert train(slurm_run(submitted["root"], corpus, "run.name=pre", iters=ITERS)) == 0
    run_dir = submitted["root"] / "tiny_cpu" / "pre"
    job_id = launches(run_dir)[0]["job_ids"][0]
    done_before, resume_s = preempt_and_wait_for_resume(run_dir, job_id, SIGNAL_AFTER)
    info = wait_for_end(run_dir, timeout=JOB_TIMEOUT)
    assert info["state"] == "COMPLETED", info
    state = read_json(run_dir / "state.json")
    assert state["requeues"] == 1 and state["signal"] == "SIGUSR2" and state["job_id"] == job_id
    log = (run_dir / "logs" / "rank0.log").read_text()
    resumed = re.findall(r"resumed from (\S+) at step (\d+)", log)
    assert len(resumed) == 1, log[-3000:]
    path, stopped_at = resumed[0][0], int(resumed[0][1])
    assert path == str(run_dir / "checkpoints" / f"step_{stopped_at:06d}")
    assert SIGNAL_AFTER <= stopped_at == done_before < ITERS
    assert f"stop requested: checkpoint of step {stopped_at} written" in log
    assert sorted(losses(run_dir)) == list(range(1, ITERS + 1))
    assert losses(run_dir) == losses(ref_dir)
    # `audiollm status` tells the story: the requeue, on which node, after which step, and
    # the checkpoint the run continues from.
    capsys.readouterr()
    assert status(run_dir) == 0
    story = capsys.readouterr().out
    assert "requeues  1" in story and f"checkpoint step_{ITERS:06d}" in story, story
    (attempt,) = [line for line in story.splitlines() if "attempt 1 on" in line]
    assert attempt.startswith("history") and "requeued (preemption or time-limit signal" in attempt, story
    assert f"(steps kept: 1..{stopped_at})" in attempt and "localhost" in attempt, story
    # One W&B run continued across the requeue: both attempts logged under the run's id.
    run_id = (run_dir / "wandb_id").read_text().strip()
    assert [name.rsplit("-", 1)[-1] for name in wandb_runs(run_dir)] == [run_id, run_id]
    with capsys.disabled():
        print(f"\nmeasured: USR2 at step >= {SIGNAL_AFTER}, checkpoint of step {stopped_at}; "
              f"USR2 -> first step after requeue seen {resume_s:.1f} s")


def test_status_names_why_a_slurm_job_failed_an_error_in_one_rank_or_a_rank_killed(slurm_cluster, tmp_path,
                                                                                  monkeypatch):
    """Two 2-task SLURM jobs of the launchers' minimal job: in one, rank 1 raises at step 3;
    in the other, rank 1 is SIGKILLed (the out-of-memory killer) at step 2. Without
    launcher.wait, `audiollm status` names the rank, its host and its own error, or the
    signal from srun's report in the job's log, and the rank that failed after it; not
    rank 0's lost connection, the last line of its traceback. The second job's
    `audiollm train launcher.wait=true` ends on the same line."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    from tests.distributed_run import REPO
    from tests.launchers.helpers import rank_pids, status_cause, tiny_overrides
    from tests.slurm.runs import SLURM

    def argv(name, iters, *extra):
        return ["+recipe=tiny_cpu", *tiny_overrides(tmp_path, f"run.name={name}", iters=iters), *SLURM,
                "launcher.gpus_per_node=2", *extra]

    # Queued first: the node's 2 CPUs run one of these jobs at a time.
    monkeypatch.setenv("AUDIOLLM_MINIMAL_FAIL", "1:3")
    assert train(argv("raises", 12)) == 0
    monkeypatch.delenv("AUDIOLLM_MINIMAL_FAIL")
    env = {**os.environ, "PYTHONPATH": str(REPO), "AUDIOLLM_MINIMAL_STEP_DELAY_S": "0.25"}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "train",
                             *argv("killed", 40, "launcher.wait=true")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    raised, killed = tmp_path / "tiny_cpu" / "raises", tmp_path / "tiny_cpu" / "killed"
    try:
        wait_for_step(killed, 2, timeout=JOB_TIMEOUT)
        os.kill(rank_pids(killed, 1)[0], signal.SIGKILL)
        out = proc.communicate(timeout=JOB_TIMEOUT)[0]
    finally:
        proc.kill()
    host = socket.gethostname()  # the one node's processes' host name (SLURM calls it localhost)
    assert wait_for_end(raised, timeout=JOB_TIMEOUT)["state"] == "FAILED"
    assert re.fullmatch(rf"rank 1 on {re.escape(host)}: ValueError: batch of step 3 has 3 columns, the model takes 16 "
                        r"\(AUDIOLLM_MINIMAL_FAIL\) \(raised in tests/launchers/minimal_job\.py:\d+\) "
                        + re.escape(f"(log: {raised}/logs/rank1.log); rank 0 failed after it"), status_cause(raised))
    cause = (f"rank 1 on {host} was killed by signal 9 (SIGKILL: the out-of-memory killer or a kill -9) "
             f"(log: {killed}/logs/rank1.log); rank 0 failed after it")
    assert status_cause(killed) == cause
    (job_id,) = launches(killed)[0]["job_ids"]
    assert proc.returncode == 1, out
    assert out.strip().splitlines()[-1] == f"job {job_id} failed: {cause}", out[-3000:]
