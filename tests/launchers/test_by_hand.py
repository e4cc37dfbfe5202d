"""A prepared run started by hand (launchers/by_hand.py, what `audiollm prepare` prints):
two ranks on this machine with the variables torchrun gives them, the launchers' minimal
job as the run's launcher.entry. A stop signal to every task (a time limit, `scancel`)
checkpoints at the next step and the same command resumes with an uninterrupted run's
losses; a frozen rank is found, named and recorded, and no rank is left waiting.
(On several nodes under srun and torchrun: tests/slurm/test_multinode.py.)"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from launchers import watchdog
from launchers.prepare import prepare_only
from launchers.status import cancel, status
from launchers.summary import run_state
from launchers.train import train
from orchestrator.runtime.ports import free_port
from tests.distributed_run import REPO

from .helpers import losses, tiny_overrides, wait_for_step, wait_until

ITERS = 8


def _prepared(root, name: str, *extra: str, iters: int = ITERS):
    assert prepare_only(tiny_overrides(root, f"run.name={name}", *extra, iters=iters)) == 0
    return root / "tiny_cpu" / name


def _start(run_dir, step_delay: str = "0", save_delay: str = "0", freeze_in_save: str = "") -> list:
    """Both ranks of the run, as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR, ...);
    the minimal job's delays and freeze (tests/launchers/minimal_job.py)."""
    port = str(free_port())
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    base.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", AUDIOLLM_MINIMAL_STEP_DELAY_S=step_delay,
                AUDIOLLM_MINIMAL_SAVE_DELAY_S=save_delay, AUDIOLLM_MINIMAL_FREEZE_IN_SAVE=freeze_in_save,
                WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    return [subprocess.Popen([sys.executable, "-m", "launchers.by_hand", str(run_dir)], cwd=REPO, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)})
            for rank in (0, 1)]


def _torchrun(run_dir, step_delay: str):
    """Both ranks under torchrun, as `audiollm prepare` prints it (its shutdown grace set),
    in a process group of its own, as a terminal's foreground job."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", AUDIOLLM_MINIMAL_STEP_DELAY_S=step_delay,
               TORCH_ELASTIC_SHUTDOWN_TIMEOUT="120")
    return subprocess.Popen([str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node=2",
                             "-m", "launchers.by_hand", str(run_dir)], cwd=REPO, text=True, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def _ends(procs, timeout: float = 120) -> list:
    try:
        return [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_a_stop_signal_to_every_task_checkpoints_and_the_same_command_resumes_exactly(tmp_path, capsys):
    iters = 16
    straight, stopped = _prepared(tmp_path, "straight", iters=iters), _prepared(tmp_path, "stopped", iters=iters)
    said = capsys.readouterr().out  # what prepare prints: these ranks' command
    assert f"srun --nodes=1 --ntasks-per-node=2 {sys.executable} -m launchers.by_hand {stopped}" in said, said
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=120 " in said, said  # launcher.signal_delay_s, not torchrun's 30 s
    procs = _start(straight)
    outputs = _ends(procs)
    assert [p.returncode for p in procs] == [0, 0], outputs
    procs = _start(stopped, step_delay="0.25")
    wait_for_step(stopped, 3, timeout=120)
    for p in procs:  # as SLURM signals every task at a time limit
        p.send_signal(signal.SIGTERM)
    outputs = _ends(procs)
    assert [p.returncode for p in procs] == [0, 0], outputs
    stopped_at = max(losses(stopped))
    assert 3 <= stopped_at < iters, outputs
    assert int((stopped / "checkpoints" / "latest").read_text().strip().split("_")[1]) == stopped_at
    assert "rank 0: stopped by SIGTERM after a checkpoint; the same command resumes from it" in outputs[0], outputs[0]
    # Ctrl-C to torchrun: it passes SIGINT on to its workers, which checkpoint likewise
    torchrun = _torchrun(stopped, step_delay="0.25")
    wait_for_step(stopped, stopped_at + 1, timeout=120)
    os.killpg(torchrun.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to torchrun's whole process group
    said = _ends([torchrun])[0]
    interrupted_at = max(losses(stopped))
    assert stopped_at < interrupted_at < iters, said
    assert int((stopped / "checkpoints" / "latest").read_text().strip().split("_")[1]) == interrupted_at, said
    assert "rank 0: stopped by SIGINT after a checkpoint; the same command resumes from it" in said, said
    assert "state     STOPPED (started by hand: " in _status(stopped, capsys)
    # `audiollm cancel` stops it likewise: it asks the ranks on this host (one would do)
    procs = _start(stopped, step_delay="0.25")
    wait_for_step(stopped, interrupted_at + 1, timeout=120)
    capsys.readouterr()
    assert cancel(stopped) == 0
    said = capsys.readouterr().out
    assert "asked rank(s) 0, 1 on this host to stop (started by hand: by-hand)" in said, said
    outputs = _ends(procs)
    assert [p.returncode for p in procs] == [0, 0], outputs
    cancelled_at = max(losses(stopped))
    assert interrupted_at < cancelled_at < iters, outputs
    assert int((stopped / "checkpoints" / "latest").read_text().strip().split("_")[1]) == cancelled_at
    assert "state     STOPPED (started by hand: by-hand)" in _status(stopped, capsys)
    assert cancel(stopped) == 0 and "STOPPED: nothing to stop" in capsys.readouterr().out
    procs = _start(stopped)
    outputs = _ends(procs)
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert losses(stopped) == losses(straight)
    assert "state     COMPLETED (started by hand: by-hand)" in _status(stopped, capsys)
    assert "[by hand" in (stopped / "logs" / "rank1.log").read_text()  # each rank's output in its log too


def test_a_rank_frozen_inside_a_save_is_named_and_recorded_and_no_rank_is_left_waiting(tmp_path, capsys):
    """Rank 1 stops inside the save of step 4 (as a process stuck in a file system): rank 0
    waits in that save, and the watchdog bounds it by 10 x the slowest save seen (step 2's,
    about 1 s here), neither by the step bound (train.hang_timeout) nor by the half hour
    before any save was timed."""
    run_dir = _prepared(tmp_path, "frozen", "train.hang_timeout=4", "train.save_interval=2")
    procs = _start(run_dir, step_delay="0.25", save_delay="1.0", freeze_in_save="1:4")
    outputs = _ends(procs, timeout=120)
    # rank 0 found it, recorded it, ended the frozen rank on this host, and ended
    assert procs[0].returncode == 1 and procs[1].returncode == -signal.SIGKILL, outputs
    record = json.loads((run_dir / "logs" / "failure_rank0.json").read_text())
    cause = record["message"]
    assert record["type"] == "RuntimeError" and record["job_id"] == "by-hand", record
    assert cause.startswith("hang: no progress for") and f"rank 1 (pid {procs[1].pid}" in cause, cause
    assert "frozen or dead (its last:" in cause, cause  # (its last heartbeat, up to a beat before it froze)
    bound = float(re.search(r"after step 4 \(bound (\d+) s\)", cause).group(1))
    assert 10 <= bound < 60, cause  # 10 x step 2's save (1 s and its barrier), a whole-second figure
    assert "in save after step 4" in (run_dir / "logs" / "rank0.log").read_text()
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "this rank's threads:" in log and "ending this rank (the same command resumes" in log, log[-3000:]
    said = _status(run_dir, capsys)  # the cause in one line, as for a submitted run
    assert "state     FAILED (started by hand: by-hand)" in said and "hang: no progress for" in said, said


def test_a_run_whose_ranks_all_died_without_a_word_is_said_to_have_died(tmp_path, capsys, monkeypatch):
    run_dir = _prepared(tmp_path, "killed")
    procs = _start(run_dir, step_delay="0.25")
    wait_for_step(run_dir, 2, timeout=120)
    assert "state     RUNNING (started by hand: by-hand)" in _status(run_dir, capsys)
    # no second job on a run that runs
    assert train(tiny_overrides(tmp_path, "run.name=killed", iters=ITERS)) == 2
    refused = capsys.readouterr().err
    assert f"run {run_dir} runs, started by hand (by-hand)" in refused and "audiollm cancel" in refused, refused
    for p in procs:  # as the out-of-memory killer or `kill -9` would
        p.kill()
    _ends(procs)
    time.sleep(watchdog.STALE_BEATS * watchdog.BEAT_S + 1)  # their heartbeats now older than the stale bound
    assert "state     DIED (started by hand: by-hand)" in _status(run_dir, capsys)
    # submitted now, the same run continues from its checkpoint and is a submitted run's ...
    monkeypatch.setenv("AUDIOLLM_MINIMAL_STEP_DELAY_S", "0.25")
    assert train(tiny_overrides(tmp_path, "run.name=killed", "launcher.wait=false", iters=ITERS)) == 0
    submitted = json.loads((run_dir / "state.json").read_text())
    # ... and no start by hand beside it: rank 0 refuses before it touches the run directory
    by_hand = _start(run_dir)
    by_hand[1].kill()  # waits for rank 0 in the process group's set-up: torchrun or srun ends it
    refused = _ends(by_hand)[0]
    assert by_hand[0].returncode == 2, refused
    assert f"not started: run {run_dir} already has job " in refused, refused
    assert "audiollm cancel" in refused, refused
    state = json.loads((run_dir / "state.json").read_text())
    # The submission's record, or the job's own once it started (it may start while the
    # refused ranks end): never the refused start's.
    launch_index = json.loads((run_dir / "launch.json").read_text())["launches"][-1]["launch_index"]
    assert not state.get("by_hand") and state.get("launch") in (submitted.get("launch"), launch_index), state
    wait_until(lambda: run_state(run_dir)["scheduler"] == "ENDED", 120, "the submitted job's end", [run_dir])
    said = _status(run_dir, capsys)
    assert "state     COMPLETED (scheduler: ENDED" in said and f"step      {ITERS}/{ITERS}" in said, said


def _status(run_dir, capsys) -> str:
    capsys.readouterr()
    assert status(run_dir) == 0
    return capsys.readouterr().out
