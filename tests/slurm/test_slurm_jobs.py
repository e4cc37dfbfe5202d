"""The real AudioLLM trainer (the default job entry, orchestrator.train.entry.main) on
the real local SLURM cluster (tests/slurm/conftest.py starts it if needed): the tiny
AudioLLM trained on a tone corpus made here (tests/train/audiollm_runs.py).

Every run directory, and so every submitit folder, lives under pytest's tmp_path:
job ids restart at 1 on a fresh cluster and must never meet an old result file.
Every wait has a deadline; on timeout the job is cancelled and the test fails.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import time

import pytest

from launchers.status import status
from launchers.train import train
from orchestrator.plan.rundir import read_json
from orchestrator.runtime.ports import port_for_job
from tests.launchers.helpers import launches, losses, wait_for_end, wait_for_step
from tests.slurm.runs import JOB_TIMEOUT, preempt_and_wait_for_resume, slurm_run, wandb_runs
from tests.train.audiollm_runs import make_corpus

pytestmark = [pytest.mark.slurm, pytest.mark.multiprocess]

# Enough steps that the preempted run is still training when its signal arrives: a step
# takes ~0.1 s here, the signal is seen 2-3 steps after it was sent.
ITERS = 30
SIGNAL_AFTER = 2
SWEEP_ITERS = 4
KEEP_THREE = ["train.save_interval=10", "train.keep_last=3"]  # checkpoints of steps 10, 20 and 30 to evaluate


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("tones"))


@pytest.fixture(scope="module")
def submitted(slurm_cluster, corpus, tmp_path_factory):
    """Queue the 2-rank reference job and the 3-point sweep together; tests wait on them."""
    root = tmp_path_factory.mktemp("slurm")
    ref_code = train(slurm_run(root, corpus, "run.name=ref", *KEEP_THREE, iters=ITERS))
    sweep_code = train(
        slurm_run(root, corpus, "run.name=sweep", "optim.lr=1e-3,3e-3,1e-2", ranks=1, iters=SWEEP_ITERS),
        multirun=True,
    )
    return {"root": root, "ref_code": ref_code, "sweep_code": sweep_code,
            "ref": root / "tiny_cpu" / "ref", "sweep": root / "tiny_cpu" / "sweep"}


def test_two_rank_job_trains_to_completion(submitted, capsys, measured):
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
        log = (run_dir / "logs" / f"rank{rank}.log").read_text()
        assert f"rank {rank}/2 pid" in log
        # Every task derives the same rendezvous port from the job id, below the ephemeral ports.
        assert re.findall(r" master \S+:(\d+)", log) == [str(port_for_job(launch["job_ids"][0]))], log[-2000:]
    rank0 = (run_dir / "logs" / "rank0.log").read_text()
    assert f"step {ITERS}/{ITERS} | loss" in rank0 and f"eval at step {ITERS}: val_loss" in rank0
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{ITERS:06d}"
    capsys.readouterr()
    assert status(run_dir) == 0
    out = capsys.readouterr().out
    assert "COMPLETED" in out and f"{ITERS}/{ITERS}" in out
    measured(f"SLURM submit -> first step seen {first_step_seen - launch['submitted_at']:.1f} s")


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


def test_preempted_job_requeues_and_reproduces_every_loss(submitted, corpus, capsys, measured):
    """USR2 (SLURM's preemption / time-limit warning) mid-training: the trainer writes a
    checkpoint at the next step boundary, the launcher requeues the job, the next attempt
    resumes from that checkpoint and reproduces the uninterrupted run's loss at every step."""
    ref_dir = submitted["ref"]
    assert wait_for_end(ref_dir, timeout=JOB_TIMEOUT)["state"] == "COMPLETED"
    # The same configuration as the reference run but for run.name.
    assert train(slurm_run(submitted["root"], corpus, "run.name=pre", *KEEP_THREE, iters=ITERS)) == 0
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
    measured(f"USR2 at step >= {SIGNAL_AFTER}, checkpoint of step {stopped_at}; "
             f"USR2 -> first step after requeue seen {resume_s:.1f} s")


def test_peers_that_exit_for_a_requeue_while_rank_0_ends_its_own_way_are_no_failure(slurm_cluster, tmp_path,
                                                                                  monkeypatch):
    """A 2-task SLURM job of the launchers' minimal job, preempted (USR2): both ranks stop
    after the same step, rank 1 exits for the requeue (srun reports its exit code 1) while
    rank 0 stays longer than the grace past its loop's last collective, as a logger's end
    can. Rank 0's watchdog, which follows srun's report, takes that exit for no failure:
    the job requeues once and completes."""
    from launchers.slurm_records import srun_log
    from launchers.watchdog import BEAT_S, PEERS_GRACE_S
    from tests.launchers.helpers import tiny_overrides
    from tests.slurm.runs import SLURM

    monkeypatch.setenv("AUDIOLLM_MINIMAL_STEP_DELAY_S", "0.25")
    monkeypatch.setenv("AUDIOLLM_MINIMAL_STOP_END_DELAY_S", str(PEERS_GRACE_S + 3 * BEAT_S))
    assert train(["+recipe=tiny_cpu", *tiny_overrides(tmp_path, "run.name=slow_end", iters=40), *SLURM]) == 0
    run_dir = tmp_path / "tiny_cpu" / "slow_end"
    (job_id,) = launches(run_dir)[0]["job_ids"]
    preempt_and_wait_for_resume(run_dir, job_id, SIGNAL_AFTER)
    assert wait_for_end(run_dir, timeout=JOB_TIMEOUT)["state"] == "COMPLETED"
    state = read_json(run_dir / "state.json")
    assert state["requeues"] == 1 and state["signal"] == "SIGUSR2" and not state.get("error"), state
    first_attempt = srun_log(run_dir / "submitit", job_id).read_text()
    assert re.search(r"srun: error: \S+: task 1: Exited with exit code 1", first_attempt), first_attempt[-2000:]
    assert "a peer ended" not in (run_dir / "logs" / "rank0.log").read_text()


def test_status_names_why_a_slurm_job_failed_an_error_in_one_rank_or_a_rank_killed(slurm_cluster, tmp_path,
                                                                                  monkeypatch):
    """Two 2-task SLURM jobs of the launchers' minimal job. In one, rank 1 raises at step
    3 while rank 0 waits for it without an error, as a NCCL collective waits for a peer
    that is gone (a stand-in: gloo's would fail on the closed connection): rank 0 follows
    srun's report, ends the job PEERS_GRACE_S after rank 1's end, FAILED and not requeued
    (the hang bound, minutes, never comes into it); without launcher.wait, `audiollm
    status` names the rank, its host and its own error, and the rank that failed after
    it. In the other, rank 1 is SIGKILLed (the out-of-memory killer) as its
    interpreter starts: srun reports it, and rank 0, which would wait for it at the
    rendezvous for the process group's 10 minutes, ends the job PEERS_GRACE_S later;
    `audiollm train launcher.wait=true` and `audiollm status` name rank 1 and the signal
    from srun's report, then rank 0. (A rank SIGKILLed mid-run, whose peer fails on its
    own: tests/launchers/test_local.py, the same cause from the local controller.)"""
    import os
    import signal
    import subprocess
    import sys

    from launchers.watchdog import BEAT_S, PEERS_GRACE_S
    from tests.distributed_run import REPO
    from tests.launchers.helpers import signal_at_start, status_cause, tiny_overrides
    from tests.slurm.runs import SLURM

    def argv(name, iters, *extra):
        return ["+recipe=tiny_cpu", *tiny_overrides(tmp_path, f"run.name={name}", iters=iters), *SLURM,
                "launcher.gpus_per_node=2", *extra]

    # Queued first: the node's 2 CPUs run one of these jobs at a time.
    monkeypatch.setenv("AUDIOLLM_MINIMAL_FAIL", "1:3")
    monkeypatch.setenv("AUDIOLLM_MINIMAL_PEERS_WAIT", "1")
    assert train(argv("raises", 12)) == 0
    monkeypatch.delenv("AUDIOLLM_MINIMAL_FAIL")
    monkeypatch.delenv("AUDIOLLM_MINIMAL_PEERS_WAIT")
    hook = signal_at_start(tmp_path, 1, signal.SIGKILL, rank_variable="SLURM_PROCID")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([hook, str(REPO)])}  # sbatch exports it to the job
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "train",
                             *argv("stillborn", 12, "launcher.wait=true")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    try:
        out = proc.communicate(timeout=JOB_TIMEOUT)[0]
    finally:
        proc.kill()
    raised, stillborn = tmp_path / "tiny_cpu" / "raises", tmp_path / "tiny_cpu" / "stillborn"
    host = socket.gethostname()  # the one node's processes' host name
    state = wait_for_end(raised, timeout=JOB_TIMEOUT)
    assert state["state"] == "FAILED" and not state.get("requeues"), state
    log = (raised / "logs" / "rank0.log").read_text()
    waited = float(re.search(r"a peer ended after step 2 \(train\) (\d+) s ago: rank 1 on ", log).group(1))
    assert PEERS_GRACE_S <= waited < PEERS_GRACE_S + 2 * BEAT_S, log[-2000:]
    assert "ending the tasks of step" in log and "[watchdog] rank 0: no progress" not in log, log[-2000:]
    assert re.fullmatch(rf"rank 1 on {re.escape(host)}: ValueError: batch of step 3 has 3 columns, the model takes 16 "
                        r"\(AUDIOLLM_MINIMAL_FAIL\) \(raised in tests/launchers/minimal_job\.py:\d+\) "
                        + re.escape(f"(log: {raised}/logs/rank1.log); rank 0 failed after it"), status_cause(raised))

    # Rank 1 wrote nothing, not even a heartbeat: its host is srun's name of the node.
    cause = status_cause(stillborn)
    assert re.fullmatch(r"rank 1 on \S+ was killed by signal 9 \(SIGKILL: the out-of-memory killer or a kill -9\) "
                        + re.escape(f"(log: {stillborn}/logs/rank1.log); rank 0 failed after it"), cause), cause
    (job_id,) = launches(stillborn)[0]["job_ids"]
    assert proc.returncode == 1, out
    assert out.strip().splitlines()[-1] == f"job {job_id} failed: {cause}", out[-3000:]
    assert read_json(stillborn / "state.json")["state"] == "FAILED"
    log = (stillborn / "logs" / "rank0.log").read_text()
    waited = float(re.search(r"a peer ended while this rank started (\d+) s ago", log).group(1))
    assert PEERS_GRACE_S <= waited < PEERS_GRACE_S + 2 * BEAT_S, log[-2000:]


def test_every_checkpoint_is_scored_by_one_slurm_eval_job_that_survives_preemption(submitted, tmp_path, capsys):
    """`audiollm eval RUN --all --tp 2 launcher=slurm` on the reference run (checkpoints of
    steps 10, 20, 30): one 2-task job in RUN/eval/job, where the training ran (its
    recorded launcher settings). USR2 (preemption) reaches it while it starts: it scores
    one checkpoint, stops, is requeued, and its next attempt scores the other two only.
    The table, the plot and the best checkpoint are written, and the scores go to the
    training run's W&B run (offline, resumed by its id). A second submission while it
    runs is refused; `status` and `cancel` work on an evaluation job. The scores equal
    those of `audiollm eval --all --tp 2` on this machine (fp32 reduction order: the
    same ranks, other threads)."""
    import shutil
    import subprocess

    from launchers.eval_job import eval_job_dir, eval_main
    from launchers.status import cancel
    from tests.launchers.helpers import wait_until
    from tests.distributed_run import REPO, rank_env

    run_dir = submitted["ref"]
    assert wait_for_end(run_dir, timeout=JOB_TIMEOUT)["state"] == "COMPLETED"
    copy = tmp_path / "copy"  # scored again, on this machine, at the end
    shutil.copytree(run_dir, copy, symlinks=True, ignore=shutil.ignore_patterns("eval", "wandb"))
    kept = [f"step_{s:06d}" for s in (10, 20, 30)]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == kept
    job_dir = eval_job_dir(run_dir)

    capsys.readouterr()
    assert eval_main([str(run_dir), "--all", "--tp", "2", "launcher=slurm"]) == 0
    said = capsys.readouterr().out
    (job_id,) = launches(job_dir)[0]["job_ids"]
    assert f"submitted SLURM job {job_id} (1 node(s) x 2 process(es))" in said, said
    # Each rank installs its handlers right after it logs its start (launchers/job.py), and
    # rank 0's watchdog beats after that; the model is still being built. Before, USR2 could
    # reach rank 1 still starting on a busy machine, which it killed.
    def started(rank):
        log = job_dir / "logs" / f"rank{rank}.log"
        return log.exists() and f"] rank {rank}/2 pid " in log.read_text()

    wait_until(lambda: started(0) and started(1) and (job_dir / "heartbeats" / "rank0.json").exists(),
               JOB_TIMEOUT, "the eval job's ranks to start", [job_dir])
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=30)
    assert eval_main([str(run_dir), "--all", "launcher=slurm"]) == 2  # one evaluation job at a time
    assert f"already has job {job_id}" in capsys.readouterr().err
    info = wait_for_end(job_dir, timeout=JOB_TIMEOUT)
    assert info["state"] == "COMPLETED" and info["requeues"] == 1, info
    log = (job_dir / "logs" / "rank0.log").read_text()
    first, second = log.split("attempt 2", 1)
    scored_first = re.findall(r"^(step_\d{6}): val_loss", first, re.M)
    assert "stopped by SIGUSR2 before" in first and 1 <= len(scored_first) < 3, first[-3000:]
    assert scored_first + re.findall(r"^(step_\d{6}): val_loss", second, re.M) == kept  # each once
    table = (run_dir / "eval" / "steps.tsv").read_text().splitlines()
    assert [row.split("\t")[1] for row in table[1:]] == kept
    best = read_json(run_dir / "eval" / "best.json")
    assert best["checkpoint"] in kept and (run_dir / "eval_curve.png").stat().st_size > 0
    run_id = (run_dir / "wandb_id").read_text().strip()
    (logged,) = [p for p in (run_dir / "wandb").glob(f"offline-run-*-{run_id}")
                 if b"eval/step" in (p / f"run-{run_id}.wandb").read_bytes()]
    capsys.readouterr()
    assert status(job_dir) == 0
    story = capsys.readouterr().out
    assert "state     COMPLETED" in story and "requeues  1" in story and f"scored    {', '.join(kept)}" in story, story

    # cancel: the job on the copy stops after its first checkpoint (unless SLURM's KillWait
    # ran out first); SLURM says CANCELLED
    copy_job = eval_job_dir(copy)
    assert eval_main([str(copy), "--all", "--tp", "2", "launcher=slurm"]) == 0
    wait_until(lambda: (copy_job / "heartbeats" / "rank0.json").exists(), JOB_TIMEOUT, "the eval job to start",
               [copy_job])
    assert cancel(copy_job) == 0
    assert wait_for_end(copy_job, timeout=JOB_TIMEOUT)["state"] == "CANCELLED"
    scored_before = sorted(p.stem for p in (copy / "eval").glob("step_*.json"))
    assert len(scored_before) <= 1, scored_before

    # the rest on this machine: the same figures
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "eval", str(copy), "--all", "--tp", "2"],
                          capture_output=True, text=True, cwd=REPO, env=rank_env(), timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not any(f"{name}:" in proc.stdout for name in scored_before)  # scored by the cancelled job already
    for name in kept:
        job, here = (json.loads((d / "eval" / f"{name}.json").read_text()) for d in (run_dir, copy))
        assert {k: v for k, v in here.items() if not k.startswith(("val_loss", "rtfx", "scoring"))} == \
            {k: v for k, v in job.items() if not k.startswith(("val_loss", "rtfx", "scoring"))}, name  # (speeds vary)
        for key in (k for k in job if k.startswith("val_loss")):
            assert here[key] == pytest.approx(job[key], rel=1e-5), (name, key)
